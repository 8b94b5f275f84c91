//! Picks the backend a run uses, and the GPU-only subcommands' entry points.

use std::path::Path;

use super::cpu::CpuBackend;
use super::{cuda, Backend};
use crate::cli::BackendChoice;
use crate::error::InputError;

/// `auto` falls back to the CPU with a one-line notice; `cuda` without a
/// usable GPU is an environment error (exit 2).
pub fn select(choice: BackendChoice, kernels_dir: &Path) -> Result<(Box<dyn Backend>, Option<String>), InputError> {
    match choice {
        BackendChoice::Cpu => Ok((Box::new(CpuBackend::new()), None)),
        BackendChoice::Cuda => match cuda::CudaBackend::open(kernels_dir) {
            Ok(b) => Ok((Box::new(b), None)),
            Err(e) => Err(InputError::Environment(format!(
                "--backend cuda: {e:#}. Run on a machine with an NVIDIA GPU and driver, or use --backend cpu"
            ))),
        },
        BackendChoice::Auto => match cuda::CudaBackend::open(kernels_dir) {
            Ok(b) => Ok((Box::new(b), None)),
            Err(e) => {
                let first = format!("{e:#}").lines().next().unwrap_or("").to_string();
                Ok((
                    Box::new(CpuBackend::new()),
                    Some(format!(
                        "notice: no usable GPU ({first}); running the CPU backend (f32 host emulation)"
                    )),
                ))
            }
        },
    }
}
