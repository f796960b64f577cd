//! demo (in progress).
