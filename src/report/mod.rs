//! Reporters. Exporters turn rows into bytes or strings; only [`RunDir`]
//! (and `--dump`) decide where they go, so every format can be tested
//! without touching the disk.

pub mod baseline;
pub mod csv;
pub mod dcp_steps;
pub mod dump;
mod format;
pub mod json;
pub mod junit;
pub mod kernel_ab;
pub mod markdown;
pub mod peers;
pub mod progress;
mod run_dir;
pub mod split_regret;
pub mod table;

pub use run_dir::RunDir;

use serde::Serialize;
use std::fmt;

use crate::backend::DeviceInfo;
use crate::result::{Check, Latency, Row, Status};

/// What a run was: enough to tell two result directories apart and rerun one.
#[derive(Serialize, serde::Deserialize, Clone, Debug)]
pub struct RunMeta {
    pub run_id: String,
    /// RFC 3339.
    pub started: String,
    pub mlabench_version: String,
    pub command: String,
    pub scenarios: Vec<String>,
    pub backend: String,
    pub device: DeviceInfo,
    /// Sampled query rows per case (`--check-rows`); `None` = every row.
    pub check_rows: Option<usize>,
    /// Throughput of the f64 CPU reference; filled at the end of the run.
    #[serde(default, with = "crate::serde_float::opt")]
    pub reference_gflops: Option<f64>,
    /// Commands that continued this run with `--resume`, in order.
    #[serde(default)]
    pub resumed: Vec<String>,
    /// The kernel sources the run compiled (absent in runs made before the
    /// stamp existed, and where the kernels dir holds no CUDA source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<crate::provenance::KernelsStamp>,
    /// How ps1 work lists were cut (`--ps1-schedule`).
    #[serde(default = "crate::case::Ps1Schedule::before_choice")]
    pub ps1_schedule: crate::case::Ps1Schedule,
    /// The V4 kernels' core (`--v4-core`); runs before the option: auto.
    #[serde(default)]
    pub v4_core: crate::case::V4CoreChoice,
    /// How the second kernels followed their forwards (`--handoff`).
    #[serde(default = "crate::backend::Handoff::before_choice")]
    pub handoff: crate::backend::Handoff,
    /// (case, variant) rows the run is to hold; `None` in runs made before
    /// the count was kept.
    #[serde(default)]
    pub planned: Option<usize>,
    /// The external implementations the run started: name, version, device, worker.
    #[serde(default)]
    pub implementations: Vec<String>,
}

/// Whether a run holds every row it set out to: a run cut short (killed,
/// device lost) must not read as a clean pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completeness {
    Complete,
    Incomplete {
        done: usize,
        of: usize,
    },
    /// A run from before the count was kept.
    Unknown,
}

impl Completeness {
    pub fn of(planned: Option<usize>, rows: usize) -> Completeness {
        match planned {
            None => Completeness::Unknown,
            Some(of) if rows >= of => Completeness::Complete,
            Some(of) => Completeness::Incomplete { done: rows, of },
        }
    }
    pub fn is_incomplete(self) -> bool {
        matches!(self, Completeness::Incomplete { .. })
    }
}

impl fmt::Display for Completeness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Completeness::Complete => f.write_str("complete"),
            Completeness::Incomplete { done, of } => write!(f, "incomplete: {done} of {of} cases"),
            Completeness::Unknown => f.write_str("unknown (a run from before completeness was recorded)"),
        }
    }
}

/// How many rows ended in each status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    /// Forced past a rejecting gate and failed as predicted; not a failure.
    pub xfailed: usize,
    pub skipped: usize,
    pub errors: usize,
}

impl Counts {
    pub fn of(rows: &[Row]) -> Counts {
        let mut c = Counts::default();
        for r in rows {
            match r.status {
                Status::Pass => c.passed += 1,
                Status::Fail => c.failed += 1,
                Status::XFail => c.xfailed += 1,
                Status::Skip => c.skipped += 1,
                Status::Error => c.errors += 1,
            }
        }
        c
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed, ", self.passed, self.failed)?;
        // Only mentioned when present: most runs force nothing.
        if self.xfailed > 0 {
            write!(f, "{} failed as the gate predicts (forced), ", self.xfailed)?;
        }
        write!(f, "{} skipped, {} errors", self.skipped, self.errors)
    }
}

/// The lowercase status word, as serde writes it in JSON.
pub fn status_word(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "fail",
        Status::XFail => "xfail",
        Status::Skip => "skip",
        Status::Error => "error",
    }
}

/// LSE checks are judged by `max_abs` alone (SPEC §4), so they are kept
/// apart from the output tensors when picking the worst one.
pub fn is_lse(check: &Check) -> bool {
    check.tensor == "lse" || check.tensor.starts_with("lse.")
}

/// The output tensor (not LSE) that decides the row: a failing check before
/// a passing one, then the largest `cos_diff` (NaN counts as worst).
pub fn worst_output(row: &Row) -> Option<&Check> {
    let key = |c: &Check| {
        let cos = if c.metrics.cos_diff.is_nan() {
            f64::INFINITY
        } else {
            c.metrics.cos_diff
        };
        (!c.pass, cos)
    };
    row.checks
        .iter()
        .filter(|c| c.level == "kernel" && !is_lse(c))
        .max_by(|a, b| {
            let (fa, ca) = key(a);
            let (fb, cb) = key(b);
            fa.cmp(&fb).then(ca.total_cmp(&cb))
        })
}

/// Largest kernel-level LSE error over the row's LSE checks (NaN wins).
pub fn lse_error(row: &Row) -> Option<f64> {
    row.checks
        .iter()
        .filter(|c| c.level == "kernel" && is_lse(c))
        .map(|c| c.metrics.max_abs)
        .reduce(|a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}

/// fp8 quantization noise: the reference on dequantized inputs against the
/// reference on unquantized ones (`cos_diff`); informative, never decides.
pub fn quant_noise(row: &Row) -> Option<f64> {
    row.checks
        .iter()
        .find(|c| c.level == "quant")
        .map(|c| c.metrics.cos_diff)
}

/// The timed region `kernel` or `variant`, when it was timed.
pub fn latency<'a>(row: &'a Row, region: &str) -> Option<&'a Latency> {
    row.latency.iter().find(|l| l.region == region)
}

/// The clock of a row's timings (`cuda-events`, `cuda-graph`, `cpu-wall`).
pub fn clock(row: &Row) -> Option<&str> {
    row.latency.first().map(|l| l.clock.as_str())
}

/// The tensor ceilings the rows' %TC divide by, each with its row count,
/// in order of first use.
pub fn tc_ceilings(rows: &[Row]) -> Vec<(&str, usize)> {
    let mut used: Vec<(&str, usize)> = Vec::new();
    for label in rows.iter().filter_map(Row::tc_ceiling_label) {
        match used.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => used.push((label, 1)),
        }
    }
    used
}

/// Whether any timing in the rows comes from the host wall clock, which
/// says nothing about GPU speed and must be labelled so.
pub fn has_cpu_timings(rows: &[Row]) -> bool {
    rows.iter().flat_map(|r| &r.latency).any(|l| l.clock == "cpu-wall")
}

/// Header for CPU-wall timings.
pub const CPU_TIMINGS: &str =
    "CPU timings (host emulation, not GPU): one wall-clock sample per row, never judged against a baseline";

#[cfg(test)]
pub(crate) mod testutil {
    //! Rows for the reporters' tests.

    use std::collections::BTreeMap;

    use crate::backend::DeviceInfo;
    use crate::metrics::ErrorMetrics;
    use crate::result::{Check, Latency, Row, Status};
    use crate::stats::Summary;

    use super::RunMeta;

    pub fn check(tensor: &str, cos_diff: f64, max_abs: f64, pass: bool) -> Check {
        Check {
            tensor: tensor.to_string(),
            level: "kernel".to_string(),
            metrics: ErrorMetrics {
                n: 1024,
                max_abs,
                max_rel: max_abs * 4.0,
                worst_index: 17,
                worst_out: 0.5,
                worst_ref: 0.5 - max_abs,
                rel_l2: cos_diff.sqrt(),
                cos_diff,
                mismatch: if pass { 0.0 } else { 0.25 },
                nonfinite_mismatch: 0,
                unwritten: 0,
            },
            pass,
            why: if pass {
                String::new()
            } else {
                format!("cos_diff {cos_diff:e} > 1e-5")
            },
        }
    }

    pub fn latency(region: &str, clock: &str, median: f64) -> Latency {
        Latency {
            region: region.to_string(),
            clock: clock.to_string(),
            summary: Summary {
                n: 20,
                median,
                p10: median * 0.9,
                p90: median * 1.2,
                min: median * 0.85,
                max: median * 1.5,
                mean: median * 1.05,
                rel_spread: 0.3,
                noise: 0.004,
            },
            capped: false,
        }
    }

    /// A row that passed, was timed on `clock`, and has throughput numbers.
    pub fn row(case_id: &str, variant: &str, status: Status, clock: &str) -> Row {
        let pass = status == Status::Pass;
        let mut params = BTreeMap::new();
        params.insert("batch".to_string(), "4".to_string());
        params.insert("s_q".to_string(), "2".to_string());
        Row {
            case_id: case_id.to_string(),
            data_id: case_id.to_string(),
            variant: variant.to_string(),
            contract: String::new(),
            implementation: "mlabench".to_string(),
            impl_version: String::new(),
            backend: "cuda".to_string(),
            status,
            reason: if pass {
                String::new()
            } else {
                "o: cos_diff 3.1e-2 > 1e-5".to_string()
            },
            gate: "eligible: ps1 applies the global mask".to_string(),
            forced: false,
            plan: "heads 96 (padded from 64), 37 work items".to_string(),
            rows_checked: 8,
            rows_total: 8,
            checks: vec![
                check("o", if pass { 2e-7 } else { 3.1e-2 }, 3e-3, pass),
                check("lse", 0.0, 4e-5, true),
            ],
            latency: vec![latency("kernel", clock, 0.021), latency("variant", clock, 0.025)],
            bytes: 1.5e8,
            flops: 2.0e10,
            gbps: Some(4000.0),
            tflops: Some(160.0),
            frac_bw: Some(0.9),
            frac_tc: Some(0.2),
            tc_ceiling: Some("wgmma e4m3".to_string()),
            params,
            repro: format!("mlabench run scenarios/smoke.toml --case {case_id} --variant {variant}"),
            dcp_step: None,
        }
    }

    /// A row the gate skipped: nothing checked or timed.
    pub fn skipped(case_id: &str, variant: &str) -> Row {
        let mut r = row(case_id, variant, Status::Skip, "cuda-events");
        r.reason = "rejected: page64 has no global mask for s_q > 1 under DCP".to_string();
        r.gate = r.reason.clone();
        r.rows_checked = 0;
        r.rows_total = 0;
        r.checks.clear();
        r.latency.clear();
        r.bytes = 0.0;
        r.flops = 0.0;
        r.gbps = None;
        r.tflops = None;
        r.frac_bw = None;
        r.frac_tc = None;
        r.tc_ceiling = None;
        r
    }

    pub fn meta() -> RunMeta {
        RunMeta {
            run_id: "20250101-000000".to_string(),
            started: "2025-01-01T00:00:00+00:00".to_string(),
            mlabench_version: "0.1.0".to_string(),
            command: "mlabench run scenarios/smoke.toml".to_string(),
            scenarios: vec!["scenarios/smoke.toml".to_string()],
            backend: "cuda".to_string(),
            device: DeviceInfo {
                backend: "cuda".to_string(),
                name: "NVIDIA H200".to_string(),
                compute_units: 132,
                l2_bytes: 60 << 20,
                copy_gbps: Some(4200.0),
                tensor: crate::tensor_ceiling::TensorRates {
                    mma_sync_bf16_tflops: Some(650.0),
                    wgmma_bf16_tflops: Some(800.0),
                    wgmma_e4m3_tflops: None,
                },
                details: vec![("driver".to_string(), "13.0".to_string())],
            },
            check_rows: None,
            reference_gflops: None,
            resumed: vec![],
            kernels: None,
            ps1_schedule: Default::default(),
            v4_core: Default::default(),
            handoff: Default::default(),
            planned: None,
            implementations: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{check, row, skipped};
    use super::*;

    #[test]
    fn counts_every_status_once() {
        let rows = vec![
            row("a", "ps1", Status::Pass, "cuda-events"),
            row("b", "ps1", Status::Fail, "cuda-events"),
            row("c", "page64", Status::XFail, "cuda-events"),
            skipped("d", "page64"),
            row("e", "ps1", Status::Error, "cuda-events"),
            row("f", "ps1", Status::Pass, "cuda-events"),
        ];
        let c = Counts::of(&rows);
        assert_eq!(
            c,
            Counts {
                passed: 2,
                failed: 1,
                xfailed: 1,
                skipped: 1,
                errors: 1
            }
        );
        assert_eq!(
            c.to_string(),
            "2 passed, 1 failed, 1 failed as the gate predicts (forced), 1 skipped, 1 errors"
        );
        let plain = Counts::of(&rows[..2]);
        assert_eq!(plain.to_string(), "1 passed, 1 failed, 0 skipped, 0 errors");
    }

    #[test]
    fn worst_output_prefers_failing_then_nan_then_largest() {
        let mut r = row("a", "ps1", Status::Fail, "cuda-events");
        r.checks = vec![
            check("o.r0", 5e-2, 1e-1, true),
            check("o.r1", 1e-6, 1e-3, false),
            check("lse", 9.0, 9.0, false),
        ];
        assert_eq!(worst_output(&r).unwrap().tensor, "o.r1");
        r.checks.push(check("o.r2", f64::NAN, 1e-3, false));
        assert_eq!(worst_output(&r).unwrap().tensor, "o.r2");
        assert_eq!(lse_error(&r), Some(9.0));
        r.checks.push(check("lse.r1", 0.0, f64::NAN, false));
        assert!(lse_error(&r).unwrap().is_nan());
    }

    #[test]
    fn a_run_from_before_the_handoff_option_reads_as_stream_order() {
        let mut json = serde_json::to_value(testutil::meta()).unwrap();
        assert_eq!(json["handoff"], "pdl");
        json.as_object_mut().unwrap().remove("handoff");
        let old: RunMeta = serde_json::from_value(json).unwrap();
        assert_eq!(old.handoff, crate::backend::Handoff::Stream);
    }

    #[test]
    fn a_run_from_before_the_wgmma_probes_reads_its_one_rate_as_mma_sync() {
        use crate::tensor_ceiling::MmaKind;
        let mut json = serde_json::to_value(testutil::meta()).unwrap();
        assert_eq!(
            json["device"]["wgmma_bf16_tflops"], 800.0,
            "rates sit flat in the device"
        );
        let dev = json["device"].as_object_mut().unwrap();
        for k in ["mma_sync_bf16_tflops", "wgmma_bf16_tflops", "wgmma_e4m3_tflops"] {
            dev.remove(k);
        }
        dev.insert("tensor_tflops".into(), 650.8.into());
        let old: RunMeta = serde_json::from_value(json).unwrap();
        assert_eq!(old.device.tensor.get(MmaKind::MmaSyncBf16), Some(650.8));
        assert_eq!(old.device.tensor.get(MmaKind::WgmmaE4m3), None);

        // Its rows name no ceiling: theirs was mma.sync bf16.
        let mut row = serde_json::to_value(row("a", "ps1", Status::Pass, "cuda-events")).unwrap();
        row.as_object_mut().unwrap().remove("tc_ceiling");
        let old: Row = serde_json::from_value(row).unwrap();
        assert_eq!(old.tc_ceiling, None);
        assert_eq!(old.tc_ceiling_label(), Some("mma.sync bf16"));
        assert_eq!(skipped("b", "ps1").tc_ceiling_label(), None, "no %TC, no ceiling");
    }

    #[test]
    fn a_run_from_before_the_schedule_option_reads_as_payload() {
        let mut json = serde_json::to_value(testutil::meta()).unwrap();
        assert_eq!(json["ps1_schedule"], "balanced");
        json.as_object_mut().unwrap().remove("ps1_schedule");
        let old: RunMeta = serde_json::from_value(json).unwrap();
        assert_eq!(old.ps1_schedule, crate::case::Ps1Schedule::Payload);
    }
}
