//! Built without the `cuda` feature: the same public names as the CUDA
//! backend, each answering that this build has no CUDA.
//!
//! The pure-data types (kernel specs, reports, errors) are the very files of
//! the real backend, so variants and reports compile the same either way.

#[path = "cuda/error.rs"]
pub mod error;
#[path = "cuda/report.rs"]
pub mod report;

use std::convert::Infallible;
use std::path::Path;

pub use crate::variants::KernelSpec;
pub use error::{CompileError, EnvError};
pub use report::{Ceilings, DeviceProps, DeviceReport, LaunchOverhead};

use super::{Backend, BackendError, DeviceInfo, Exec, RunOutput};
use crate::variants::{Job, Variant};

#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    pub ordinal: usize,
    pub arch: Option<String>,
    pub measure_ceilings: bool,
    pub measure_launch: bool,
}

/// Cannot be constructed in this build.
pub struct CudaBackend {
    never: Infallible,
}

impl CudaBackend {
    pub fn open(_kernels_dir: &Path) -> Result<Self, EnvError> {
        Err(EnvError::Disabled)
    }

    pub fn open_with(_kernels_dir: &Path, _opts: &OpenOptions) -> Result<Self, EnvError> {
        Err(EnvError::Disabled)
    }

    pub fn report(&self) -> DeviceReport {
        match self.never {}
    }
}

pub fn device_report(_kernels_dir: &Path, _measure_ceilings: bool) -> Result<DeviceReport, EnvError> {
    Err(EnvError::Disabled)
}

/// Type of a `--check` result, as in the CUDA build.
pub type CheckResults = Vec<(KernelSpec, Result<(), CompileError>)>;

pub fn check_all(_kernels_dir: &Path, _specs: &[KernelSpec], _arch: &str) -> Result<CheckResults, EnvError> {
    Err(EnvError::Disabled)
}

pub fn dump_all(
    _kernels_dir: &Path,
    _specs: &[KernelSpec],
    _arch: &str,
    _dir: &Path,
) -> Result<CheckResults, EnvError> {
    Err(EnvError::Disabled)
}

/// Type of a `--resources` result, as in the CUDA build.
pub type ResourceResults = Vec<(KernelSpec, Result<Vec<EntryResources>, CompileError>)>;

/// What ptxas reports of one entry point, as in the CUDA build.
#[derive(Clone, Debug, Default)]
pub struct EntryResources {
    pub entry: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    pub smem_bytes: u32,
    pub barriers: u32,
    pub arrives_injected: u32,
    pub wgmma_serialized: Option<String>,
}

pub fn resources_all(_kernels_dir: &Path, _specs: &[KernelSpec], _arch: &str) -> Result<ResourceResults, EnvError> {
    Err(EnvError::Disabled)
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        match self.never {}
    }

    fn run(&mut self, _: &dyn Variant, _: &Job, _: &Exec) -> Result<RunOutput, BackendError> {
        match self.never {}
    }
}

pub fn dcp_preflight() -> Result<(String, usize), EnvError> {
    Err(EnvError::Disabled)
}

/// The ceiling probes' kernel configuration (nothing compiles without `cuda`).
pub fn probe_spec() -> KernelSpec {
    KernelSpec::new("probe.cu", &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_names_the_fix() {
        let k = Path::new("kernels");
        let msg = CudaBackend::open(k).err().unwrap().to_string();
        assert_eq!(msg, "built without the cuda feature; rebuild with --features cuda");
        assert!(matches!(device_report(k, true), Err(EnvError::Disabled)));
        assert!(matches!(check_all(k, &[], "sm_90a"), Err(EnvError::Disabled)));
    }
}
