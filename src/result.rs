//! One report row per (case, variant): what ran, how it was judged, how fast.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::metrics::ErrorMetrics;
use crate::stats::Summary;
use crate::tensor_ceiling::MmaKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Every check within tolerance.
    Pass,
    /// A check failed (exit 1).
    Fail,
    /// Forced past a gate that rejects it, and failed as the gate predicts.
    /// Shown, not counted as a failure: it is the bug the gate prevents.
    XFail,
    /// The variant cannot run this case (gate, width, backend); not a failure.
    Skip,
    /// The run itself broke (launch error, kernel fault); counts as a failure.
    Error,
}

/// One checked output tensor (e.g. `o.r3`, `lse`, `o`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    pub tensor: String,
    /// `kernel` (decides pass/fail) or `quant` (fp8 quantization noise, informative).
    pub level: String,
    pub metrics: ErrorMetrics,
    pub pass: bool,
    /// Why it failed, in words (empty on pass).
    pub why: String,
}

/// Latency of one timed region.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Latency {
    /// `kernel` (the attention kernel alone) or `variant` (kernel + merge/reduce).
    pub region: String,
    /// `cuda-events`, `cuda-graph` or `cpu-wall`.
    pub clock: String,
    pub summary: Summary,
    /// Sampling stopped at `--max-time-ms` before the median's noise
    /// reached `--target-noise`: `summary.noise` says what it reached.
    #[serde(default)]
    pub capped: bool,
}

impl Check {
    /// The metric or fact this check failed on, from its reason (which
    /// starts with it): `cos_diff`, `lse_max_abs`, `nondeterministic`, ...
    pub fn tripped(&self) -> &'static str {
        const KINDS: [(&str, &str); 7] = [
            ("nondeterministic", "nondeterministic"),
            ("counters non-zero", "counters"),
            ("in finiteness", "nonfinite"),
            ("elements never written", "unwritten"),
            ("lse max_abs", "lse_max_abs"),
            ("cos_diff", "cos_diff"),
            ("mismatch", "mismatch"),
        ];
        KINDS
            .iter()
            .find(|(k, _)| self.why.contains(k))
            .map_or("check", |(_, name)| name)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub case_id: String,
    /// The inputs' id: rows of one data id ran on the same bytes, so their
    /// times compare (the peers table groups by it).
    #[serde(default)]
    pub data_id: String,
    pub variant: String,
    /// The contract the variant implements (`mla_decode`, `v4_decode`,
    /// `dcp_combine`, `split_merge`); empty in rows made before it existed.
    #[serde(default)]
    pub contract: String,
    /// Whose code ran: `mlabench` for a built-in kernel, else the declared
    /// implementation's name.
    #[serde(default = "builtin")]
    pub implementation: String,
    /// The implementation's version, as its worker reports it (empty for built-ins).
    #[serde(default)]
    pub impl_version: String,
    pub backend: String,
    pub status: Status,
    /// Short reason for skip/fail/error; the gate's words when it decided.
    pub reason: String,
    /// The gate's decision and why, for MLA cases (`eligible: ...` / `rejected: ...`).
    pub gate: String,
    /// Run although the gate rejected it.
    pub forced: bool,
    /// Plan summary: padded heads, splits, work items, fallbacks.
    pub plan: String,
    /// Query rows checked against the reference, and of how many.
    pub rows_checked: usize,
    pub rows_total: usize,
    pub checks: Vec<Check>,
    pub latency: Vec<Latency>,
    /// Bytes and FLOPs from visible lengths (SPEC §5).
    #[serde(with = "crate::serde_float")]
    pub bytes: f64,
    #[serde(with = "crate::serde_float")]
    pub flops: f64,
    /// From the `variant` median when timed.
    #[serde(default, with = "crate::serde_float::opt")]
    pub gbps: Option<f64>,
    #[serde(default, with = "crate::serde_float::opt")]
    pub tflops: Option<f64>,
    #[serde(default, with = "crate::serde_float::opt")]
    pub frac_bw: Option<f64>,
    #[serde(default, with = "crate::serde_float::opt")]
    pub frac_tc: Option<f64>,
    /// The tensor ceiling `frac_tc` divides by: an instruction kind or the
    /// mix of the variant's FLOP (`wgmma e4m3`, `wgmma e4m3 53% + mma.sync
    /// bf16 47%`); see [`Row::tc_ceiling_label`] for rows made before it.
    #[serde(default)]
    pub tc_ceiling: Option<String>,
    /// Workload shape and knobs, as key/value (the fixed-schema CSV's params column).
    pub params: BTreeMap<String, String>,
    pub repro: String,
    /// A DCP step on a group of GPUs (`--dcp-devices`): its shape, NCCL,
    /// bandwidth and ideal; the phases are `latency` regions `step.*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dcp_step: Option<crate::dcp_step::DcpStep>,
}

/// What rows made before implementations existed ran.
fn builtin() -> String {
    "mlabench".into()
}

impl Row {
    /// The worst kernel-level check, for one-line summaries.
    pub fn worst(&self) -> Option<&Check> {
        self.checks.iter().filter(|c| c.level == "kernel").max_by(|a, b| {
            a.metrics
                .cos_diff
                .partial_cmp(&b.metrics.cos_diff)
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    }
    /// What `frac_tc` is a fraction of. Rows made before `tc_ceiling`
    /// existed had one ceiling, mma.sync bf16.
    pub fn tc_ceiling_label(&self) -> Option<&str> {
        self.frac_tc?;
        Some(self.tc_ceiling.as_deref().unwrap_or(MmaKind::MmaSyncBf16.label()))
    }
    pub fn median_ms(&self, region: &str) -> Option<f64> {
        self.latency
            .iter()
            .find(|l| l.region == region)
            .map(|l| l.summary.median)
    }
}
