//! plan heads
