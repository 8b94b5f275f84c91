//! Built without the `hip` feature.

/// Why no HIP device can be used by this build.
pub const UNAVAILABLE: &str = "built without the `hip` feature; no HIP backend exists yet";
