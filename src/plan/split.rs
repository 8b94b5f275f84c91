//! plan split
