//! route (in progress).
