//! relay (in progress).
