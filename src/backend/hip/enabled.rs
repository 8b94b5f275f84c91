//! The HIP backend is planned (the engine's own kernels are AMD assembly) but
//! not written yet; building with the feature says so instead of producing a
//! binary that cannot do what the flag promises.
compile_error!(
    "the `hip` feature has no backend yet: build without `--features hip` (the CUDA and CPU backends are available)"
);
