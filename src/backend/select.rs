//! Picks the backend a run uses, and the GPU-only subcommands' entry points.

use std::path::Path;

use super::cpu::CpuBackend;
use super::{cuda, Backend};
use crate::cli::BackendChoice;
use crate::error::InputError;

/// `auto` falls back to the CPU with a one-line notice; `cuda` without a
/// usable GPU is an environment error (exit 2).
pub fn select(choice: BackendChoice, kernels_dir: &Path) -> Result<(Box<dyn Backend>, Option<String>), InputError> {
    select_with(choice, kernels_dir, None, true)
}

/// [`select`], with a bug planted in the CPU emulation (selftest only), and
/// the ceilings measured only when something will be timed against them.
pub fn select_with(
    choice: BackendChoice,
    kernels_dir: &Path,
    fault: Option<crate::variants::Fault>,
    ceilings: bool,
) -> Result<(Box<dyn Backend>, Option<String>), InputError> {
    let open = || {
        let opts = cuda::OpenOptions {
            measure_ceilings: ceilings,
            ..Default::default()
        };
        cuda::CudaBackend::open_with(kernels_dir, &opts)
    };
    if let Some(f) = fault {
        if choice != BackendChoice::Cpu {
            return Err(InputError::Usage(format!(
                "--cpu-fault {f} plants a bug in the CPU emulation: add --backend cpu"
            )));
        }
        return Ok((Box::new(CpuBackend::with_fault(f)), None));
    }
    match choice {
        BackendChoice::Cpu => Ok((Box::new(CpuBackend::new()), None)),
        BackendChoice::Cuda => match open() {
            Ok(b) => Ok((Box::new(b), None)),
            Err(e) => Err(InputError::Environment(format!(
                "--backend cuda: {e:#}. Run on a machine with an NVIDIA GPU and driver, or use --backend cpu"
            ))),
        },
        BackendChoice::Auto => match open() {
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

/// What a run whose cases put DCP ranks on GPU groups needs on a GPU
/// backend, checked before anything runs: NCCL and the driver, each
/// missing piece an exit-2 error that names it. Returns the line the run
/// prints and the GPUs visible.
pub fn dcp_preflight() -> Result<(String, usize), InputError> {
    cuda::dcp_preflight().map_err(|e| {
        InputError::Environment(format!(
            "a DCP group: {e} (--backend cpu models the step on the host instead)"
        ))
    })
}

/// `1 GPU`, `8 GPUs`.
pub fn gpus(n: usize) -> String {
    format!("{n} GPU{}", if n == 1 { "" } else { "s" })
}
