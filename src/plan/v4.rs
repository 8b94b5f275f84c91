//! plan v4
