//! Errors of the CUDA environment (libraries, driver, headers) and of NVRTC.
//! Pure data, shared with the build without the `cuda` feature.

use thiserror::Error;

/// The machine cannot run (or compile) CUDA kernels; each message names the fix.
#[derive(Debug, Error)]
pub enum EnvError {
    #[error("{lib} could not be loaded (tried: {tried}); {fix}")]
    LibraryMissing { lib: String, tried: String, fix: String },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error(
        "CUDA headers not found (need cuda_bf16.h and cuda_fp8.h); tried: {tried}. \
         Set MLABENCH_CUDA_INCLUDE to a CUDA 13 include directory \
         (pip: nvidia-cuda-runtime==13.0.96 puts one at site-packages/nvidia/cu13/include)"
    )]
    HeadersMissing { tried: String },
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A device operation failed while setting the backend up (probes, ceilings).
    #[error("CUDA setup: {0}")]
    Setup(String),
    #[error("built without the cuda feature; rebuild with --features cuda")]
    Disabled,
}

/// A kernel that did not compile, with NVRTC's log verbatim.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum CompileError {
    #[error("NVRTC failed to compile {label}:\n{log}")]
    Nvrtc { label: String, log: String },
    #[error("cannot read kernel source {path}: {err}")]
    Source { path: String, err: String },
    #[error("cannot write {path}: {err}")]
    Output { path: String, err: String },
    #[error("NVRTC {call} failed for {label}: {code}")]
    Api {
        label: String,
        call: &'static str,
        code: String,
    },
}
