//! listener (in progress).
