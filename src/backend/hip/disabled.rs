//! Built without the `hip` feature: HIP is not available in this build.
