//! Built without the `cuda` feature.
