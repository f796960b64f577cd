//! testbed (in progress).
