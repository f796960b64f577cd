//! conn (in progress).
