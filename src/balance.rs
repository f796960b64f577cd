//! balance (in progress).
