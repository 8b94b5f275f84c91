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
pub mod worker;

pub use select::{dcp_preflight, gpus, select, select_with};

use serde::Serialize;
use thiserror::Error;

use crate::tensor_ceiling::TensorRates;
use crate::variants::{DeviceCheck, Job, OutTensor, Variant};

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
    /// Measured dense tensor rates, TFLOP/s, one per instruction kind
    /// (flattened: `mma_sync_bf16_tflops`, `wgmma_bf16_tflops`, ...; older
    /// runs' `tensor_tflops` reads as the mma.sync one it was).
    #[serde(flatten)]
    pub tensor: TensorRates,
    /// Driver / runtime / compiler versions and clocks, free-form.
    pub details: Vec<(String, String)>,
}

/// `--target-noise`'s default: 0.5%, as nvbench's.
pub const DEFAULT_TARGET_NOISE: f64 = 0.005;
/// `--max-time-ms`'s default.
pub const DEFAULT_MAX_TIME_MS: f64 = 1000.0;

/// How to time a run (SPEC §5).
#[derive(Clone, Debug)]
pub struct TimingOptions {
    pub enabled: bool,
    pub warmup: usize,
    pub min_samples: usize,
    pub min_time_ms: f64,
    /// Stop sampling once the median's 95% interval half-width
    /// (`stats::median_noise`) is at most this fraction; `None`: stop on
    /// the minimums alone.
    pub target_noise: Option<f64>,
    /// Wall-clock limit on sampling one timed case, all its regions
    /// together (the minimum sample count is still taken).
    pub max_time_ms: f64,
    /// Rotate input copies / flush L2 so each sample starts cold.
    pub cold_l2: bool,
    /// Time replays of a captured CUDA graph.
    pub graph: bool,
    /// Whether samples are queued in batches or one at a time.
    pub sampling: Sampling,
}

/// How a timer queues its samples. Batched samples run back to back on the
/// GPU; one at a time, the GPU idles while the host reads each sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sampling {
    /// Batched, and one at a time for regions under
    /// `cuda::timing::SHORT_SAMPLE_MS` (they run slower back to back).
    #[default]
    Auto,
    Batched,
    /// Each sample read before the next is queued (earlier versions).
    Serial,
}

impl Sampling {
    pub fn name(self) -> &'static str {
        match self {
            Sampling::Auto => "auto",
            Sampling::Batched => "batched",
            Sampling::Serial => "serial",
        }
    }
}

impl std::str::FromStr for Sampling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Sampling::Auto),
            "batched" => Ok(Sampling::Batched),
            "serial" => Ok(Sampling::Serial),
            _ => Err(format!("--sampling {s}: give auto, batched or serial")),
        }
    }
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            enabled: true,
            warmup: 3,
            min_samples: 10,
            min_time_ms: 0.0,
            target_noise: Some(DEFAULT_TARGET_NOISE),
            max_time_ms: DEFAULT_MAX_TIME_MS,
            cold_l2: true,
            graph: false,
            sampling: Sampling::Auto,
        }
    }
}

/// How a two-kernel variant's second kernel (ps1's reduce, page64's
/// merge) follows its forward (kernels/common/pdl.cuh). It changes what is
/// checked as much as what is timed, so it rides beside the timing options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Handoff {
    /// Programmatic dependent launch: the second kernel's blocks start
    /// during the forward and wait for its results on the device.
    #[default]
    Pdl,
    /// Plain stream order: the second kernel launches after the forward.
    Stream,
}

impl Handoff {
    /// Runs made before `--handoff` existed used stream order.
    pub fn before_choice() -> Self {
        Handoff::Stream
    }
}

impl std::str::FromStr for Handoff {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pdl" => Ok(Handoff::Pdl),
            "stream" => Ok(Handoff::Stream),
            _ => Err(format!("unknown hand-off `{s}`; use pdl or stream")),
        }
    }
}

impl std::fmt::Display for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handoff::Pdl => "pdl",
            Handoff::Stream => "stream",
        })
    }
}

/// How a backend runs one variant: checked launches, the hand-off, timing.
#[derive(Clone, Debug)]
pub struct Exec {
    pub timing: TimingOptions,
    /// Checked launches (>= 1); the outputs of each after the first go to
    /// [`RunOutput::repeats`].
    pub repeats: usize,
    pub handoff: Handoff,
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
    /// Further named regions (a DCP step's phases and ranks).
    pub regions: Vec<(String, Vec<f64>)>,
}

#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    pub tensors: Vec<OutTensor>,
    /// The outputs of each further checked launch, over the same inputs and
    /// plan, poisoned again before it.
    pub repeats: Vec<Vec<OutTensor>>,
    /// Checks only the device can make, such as hca_persist's counters
    /// being back at zero after each launch; a failed one fails the row
    /// without stopping the run.
    pub device_checks: Vec<DeviceCheck>,
    pub samples: Option<Samples>,
    /// Backend-specific notes for the report (e.g. compile cache hits).
    pub notes: Vec<String>,
    /// Host seconds per phase of the run (load, launch, download, time,
    /// ...), for the run's account of where its wall clock went.
    pub phases: Vec<(&'static str, f64)>,
    /// A DCP step on a group of GPUs: its shape, bandwidth and ideal.
    pub step: Option<crate::dcp_step::DcpStep>,
}

/// Adds `secs` to phase `name` of a phase list (see [`RunOutput::phases`]).
pub fn add_phase(phases: &mut Vec<(&'static str, f64)>, name: &'static str, secs: f64) {
    match phases.iter_mut().find(|(n, _)| *n == name) {
        Some((_, s)) => *s += secs,
        None => phases.push((name, secs)),
    }
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

/// A device that runs variants: it executes what the variant hands it
/// (a CPU emulation, or GPU programs) and knows no variant by name.
pub trait Backend {
    fn info(&self) -> &DeviceInfo;
    /// Device memory free now, in bytes; `None` for a backend that runs in
    /// host memory.
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// Runs one variant on one job. Outputs are poisoned before every checked
    /// launch so unwritten elements show up; returned tensors hold the real
    /// heads only.
    fn run(&mut self, unit: &dyn Variant, job: &Job, exec: &Exec) -> Result<RunOutput, BackendError>;
}
