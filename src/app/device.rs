//! `mlabench device`: the GPU's facts and its measured ceilings.

use anyhow::Result;

use crate::backend::cuda;
use crate::cli::DeviceArgs;
use crate::error::{exit, InputError};

pub fn device(args: &DeviceArgs) -> Result<u8> {
    let r = cuda::device_report(&args.kernels_dir, !args.no_ceilings)
        .map_err(|e| InputError::Environment(format!("{e}; run on a machine with an NVIDIA GPU")))?;
    for (k, v) in r.lines() {
        println!("{k:<28} {v}");
    }
    Ok(exit::OK)
}
