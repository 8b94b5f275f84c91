//! The narrow interface every backend implements: describe the device, run
//! one variant's plan on one workload, hand back outputs and timings.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_disabled.rs"]
pub mod cuda;
#[cfg(feature = "hip")]
#[path = "hip/enabled.rs"]
pub mod hip;
#[cfg(not(feature = "hip"))]
#[path = "hip/disabled.rs"]
pub mod hip;
mod select;

pub use select::{select, select_with};

use serde::Serialize;
use thiserror::Error;

use crate::case::Case;
use crate::variants::VariantPlan;
use crate::workload::Workload;

/// What a backend runs on, with the measured ceilings used for fraction-of-peak.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    pub backend: String,
    pub name: String,
    pub compute_units: usize,
    pub l2_bytes: usize,
    /// Measured device-to-device copy bandwidth, GB/s (read + write bytes).
    #[serde(default, with = "crate::serde_float::opt")]
    pub copy_gbps: Option<f64>,
    /// Measured dense tensor-core rate, TFLOP/s.
    #[serde(default, with = "crate::serde_float::opt")]
    pub tensor_tflops: Option<f64>,
    /// Driver / runtime / compiler versions and clocks, free-form.
    pub details: Vec<(String, String)>,
}

/// How to launch and time a run.
#[derive(Clone, Debug)]
pub struct TimingOptions {
    pub enabled: bool,
    pub warmup: usize,
    pub min_samples: usize,
    pub min_time_ms: f64,
    /// Rotate input copies / flush L2 so each sample starts cold.
    pub cold_l2: bool,
    /// Time replays of a captured CUDA graph.
    pub graph: bool,
    /// How ps1's reduce and page64's merge follow their forward, in every
    /// launch (checked and timed).
    pub handoff: crate::case::Handoff,
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            enabled: true,
            warmup: 3,
            min_samples: 10,
            min_time_ms: 50.0,
            cold_l2: true,
            graph: false,
            handoff: Default::default(),
        }
    }
}

/// An output tensor as the backend produced it, converted to f32.
#[derive(Clone, Debug)]
pub struct OutTensor {
    /// Matches the reference tensor's name (`o.r0`, `lse.r0`, `o`, `lse`).
    pub name: String,
    /// Elements per row (rows index dimension 0: query rows).
    pub row_len: usize,
    pub data: Vec<f32>,
}

/// Latency samples of one run, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// The attention kernel(s) alone.
    pub kernel_ms: Vec<f64>,
    /// Kernel plus merge/reduce: what a caller pays.
    pub variant_ms: Vec<f64>,
    /// `cuda-events`, `cuda-graph` or `cpu-wall`.
    pub clock: String,
}

#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    pub tensors: Vec<OutTensor>,
    /// The outputs of each further checked launch (`RunRequest::repeats` - 1
    /// of them), poisoned and run again over the same inputs and plan.
    pub repeats: Vec<Vec<OutTensor>>,
    /// Checks only the device can make, such as hca_persist's counters
    /// being back at zero after each launch; a failed one fails the row
    /// without stopping the run.
    pub device_checks: Vec<DeviceCheck>,
    pub samples: Option<Samples>,
    /// Backend-specific notes for the report (e.g. compile cache hits).
    pub notes: Vec<String>,
}

/// A pass/fail fact about device state after a launch.
#[derive(Clone, Debug)]
pub struct DeviceCheck {
    /// What was checked, e.g. `counters` or `counters.step2`.
    pub name: String,
    pub pass: bool,
    /// Why it failed (empty on pass).
    pub why: String,
}

#[derive(Debug, Error)]
pub enum BackendError {
    /// The backend cannot run this (variant not built, feature off): a skip.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The run broke (launch failure, kernel fault, compile error).
    #[error("{0}")]
    Failed(String),
    /// The device is unusable from now on (sticky CUDA error).
    #[error("device lost: {0}")]
    DeviceLost(String),
}

/// One variant run: the case, its inputs and plan, and how to time it.
pub struct RunRequest<'a> {
    pub case: &'a Case,
    pub workload: &'a Workload,
    pub plan: &'a VariantPlan,
    pub timing: &'a TimingOptions,
    /// Query rows that will be checked. A backend may leave other rows
    /// unwritten (the CPU emulation does, to keep sampled checks cheap).
    pub rows: &'a [usize],
    /// Checked launches to make (>= 1); the outputs of each after the first
    /// go to [`RunOutput::repeats`].
    pub repeats: usize,
}

pub trait Backend {
    fn info(&self) -> &DeviceInfo;
    /// Device memory free now, in bytes; `None` for a backend that runs in
    /// host memory.
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// Runs one variant's plan. Outputs are poisoned before the checked run so
    /// unwritten elements show up; returned tensors hold the real heads only.
    fn run(&mut self, req: &RunRequest) -> Result<RunOutput, BackendError>;
}

/// `mlabench kernels`: compile every kernel configuration with NVRTC (no
/// GPU needed). Exit 1 when any configuration fails; the NVRTC log is
/// printed verbatim with the file name.
pub fn kernels_check(kernels_dir: &std::path::Path, arch: Option<&str>, check: bool) -> anyhow::Result<u8> {
    use crate::error::{exit, InputError};
    let mut specs = crate::variants::kernels::all();
    specs.push(cuda::probe_spec());
    if !check {
        for s in &specs {
            println!("{}", s.label());
        }
        println!("{} configurations; add --check to compile them", specs.len());
        return Ok(exit::OK);
    }
    let arch = arch.unwrap_or("sm_90a");
    let t0 = std::time::Instant::now();
    let results = cuda::check_all(kernels_dir, &specs, arch).map_err(|e| InputError::Environment(format!("{e}")))?;
    let mut failed = 0;
    for (spec, r) in &results {
        match r {
            Ok(()) => println!("ok    {}", spec.label()),
            Err(e) => {
                failed += 1;
                println!("FAIL  {}\n{e}", spec.label());
            }
        }
    }
    println!(
        "{} of {} kernel configurations compiled for {arch} in {:.1} s",
        results.len() - failed,
        results.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(if failed > 0 { exit::CHECK_FAILED } else { exit::OK })
}

/// `mlabench device`: device facts and measured ceilings.
pub fn device_report(kernels_dir: &std::path::Path, ceilings: bool) -> anyhow::Result<u8> {
    let r = cuda::device_report(kernels_dir, ceilings)
        .map_err(|e| crate::error::InputError::Environment(format!("{e}; run on a machine with an NVIDIA GPU")))?;
    for (k, v) in r.lines() {
        println!("{k:<28} {v}");
    }
    Ok(crate::error::exit::OK)
}
