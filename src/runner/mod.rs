//! Runs one case end to end: its workload and references from the cache,
//! its variant's plan, the backend's launches, the variant's checks, then
//! the report row. Never panics outward: a panic becomes an error row.

mod cache;
mod pipeline;

pub use cache::{Caches, Inputs};
pub use pipeline::{run_all, Depth, StageTimes};

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::backend::worker::WorkerPool;
use crate::backend::{Backend, BackendError, DeviceInfo, Exec, RunOutput};
use crate::case::Case;
use crate::metrics;
use crate::reference::{self, RefSet};
use crate::result::{Check, Latency, Row, Status};
use crate::stats::Summary;
use crate::variants::output::find;
use crate::variants::{self, Decision, Job, OutTensor, Plan, PlanData};

/// What the runner needs of the run's options (app::options builds it).
#[derive(Clone, Debug)]
pub struct CaseOptions {
    pub check_rows: Option<usize>,
    /// Checked launches (compared bit for bit), hand-off and timing.
    pub exec: Exec,
    /// Flags every row's repro command repeats (backend, check rows, ...).
    pub repro_flags: String,
}

/// The further checked launches of a run. A deterministic variant must give
/// the first launch's bits again, element for element: a race shows even
/// when both launches are within tolerance. A variant whose registry entry
/// says it is not deterministic has each launch checked against the
/// reference instead.
fn repeat_checks(
    job: &Job,
    refs: &RefSet,
    first: &[OutTensor],
    repeats: &[Vec<OutTensor>],
) -> Result<Vec<Check>, String> {
    let unit = job.case.variant.unit();
    let mut cs = Vec::new();
    for (k, rep) in repeats.iter().enumerate() {
        let launch = k + 2;
        if unit.info().nondeterministic.is_some() {
            for mut c in unit.check(job, refs, rep, false)? {
                c.tensor = format!("{}.launch{launch}", c.tensor);
                cs.push(c);
            }
            continue;
        }
        let mut compared = 0usize;
        let mut diff: Option<(String, usize, metrics::BitDiff)> = None;
        // A repeat holds the first launch's main outputs (no replay steps).
        for r in rep {
            let t = find(first, &r.name)?;
            if r.data.len() != t.data.len() {
                return Err(format!(
                    "launch {launch} returned {} values of `{}`, launch 1 {}",
                    r.data.len(),
                    t.name,
                    t.data.len()
                ));
            }
            compared += t.data.len();
            if diff.is_none() {
                diff = metrics::bit_difference(&t.data, &r.data).map(|d| (t.name.clone(), t.data.len(), d));
            }
        }
        let m = match &diff {
            Some((_, _, d)) => metrics::ErrorMetrics {
                n: compared,
                worst_index: d.first,
                worst_out: d.b as f64,
                worst_ref: d.a as f64,
                mismatch: d.count as f64 / compared.max(1) as f64,
                ..Default::default()
            },
            None => metrics::ErrorMetrics {
                n: compared,
                ..Default::default()
            },
        };
        cs.push(Check {
            tensor: format!("repeat.launch{launch}"),
            level: "kernel".into(),
            pass: diff.is_none(),
            why: diff
                .map(|(name, len, d)| {
                    format!(
                        "nondeterministic: launch {launch} differs from launch 1 in {} of {len} elements of `{name}`; first at [{}]: {} vs {} (same inputs and plan, so a race or a read of unwritten memory)",
                        d.count,
                        d.first,
                        d.b,
                        d.a
                    )
                })
                .unwrap_or_default(),
            metrics: m,
        });
    }
    Ok(cs)
}

/// Facts the device reported (hca_persist's counters) as checks.
fn device_checks(out: &RunOutput) -> Vec<Check> {
    out.device_checks
        .iter()
        .map(|d| Check {
            tensor: d.name.clone(),
            level: "kernel".into(),
            pass: d.pass,
            why: d.why.clone(),
            metrics: metrics::ErrorMetrics::default(),
        })
        .collect()
}

fn repro(case: &Case, opts: &CaseOptions) -> String {
    format!(
        "mlabench run {} --case {} --variant {}{}",
        case.scenario.display(),
        case.exact_filter(),
        case.variant,
        opts.repro_flags
    )
}

fn base_row(case: &Case, backend: &str, opts: &CaseOptions) -> Row {
    Row {
        case_id: case.id.clone(),
        data_id: case.data_id.clone(),
        variant: case.variant.to_string(),
        contract: case.variant.info().kind.name().to_string(),
        implementation: match case.variant.unit().external() {
            Some(e) => e.decl.name.clone(),
            None => "mlabench".into(),
        },
        impl_version: String::new(),
        backend: backend.to_string(),
        status: Status::Pass,
        reason: String::new(),
        gate: String::new(),
        forced: false,
        plan: String::new(),
        rows_checked: 0,
        rows_total: reference::total_rows(case),
        checks: vec![],
        latency: vec![],
        bytes: 0.0,
        flops: 0.0,
        gbps: None,
        tflops: None,
        frac_bw: None,
        frac_tc: None,
        tc_ceiling: None,
        params: case.params_map(),
        repro: repro(case, opts),
        dcp_step: None,
    }
}

/// Outcome of one case: its row, and whether the device is gone.
pub struct CaseOutcome {
    pub row: Row,
    pub device_lost: bool,
    /// Tensors and plan, kept for `--dump`.
    pub output: Option<RunOutput>,
    /// Its inputs, kept for `--dump`.
    pub inputs: Option<Inputs>,
}

impl CaseOutcome {
    fn ended(row: Row) -> CaseOutcome {
        CaseOutcome {
            row,
            device_lost: false,
            output: None,
            inputs: None,
        }
    }
}

/// A case the device (or its worker) has run, waiting for its checks.
pub struct Ran {
    row: Row,
    decision: Decision,
    plan: Plan,
    inputs: Inputs,
    out: RunOutput,
}

/// Where a case stands after [`execute`].
pub enum Stage {
    /// Its row is final: skipped, or it could not run.
    Done(Box<CaseOutcome>),
    /// It ran; [`finish`] checks it.
    Ran(Box<Ran>),
}

/// Whether the case needs inputs at all (a row the gate skips does not).
pub fn needs_inputs(case: &Case) -> bool {
    variants::decide(case).skip.is_none()
}

/// Runs one case end to end. Never panics outward: a panic becomes an error row.
pub fn run_case(
    case: &Case,
    caches: &mut Caches,
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
) -> CaseOutcome {
    pipeline::run_case_timed(case, caches, backend, workers, opts, &mut StageTimes::default())
}

/// The case's plan from its inputs (the merges plan from the reference,
/// which costs as much as a kernel's emulation: the pipeline does it ahead).
pub fn plan_case(case: &Case, decision: &Decision, inputs: &Inputs) -> Result<Plan, variants::PlanError> {
    let data = PlanData {
        workload: &inputs.workload,
        refs: &inputs.refs,
    };
    case.variant.unit().plan(case, decision, Some(data))
}

/// The device half of a case: the gate, the plan and the launches (or the
/// worker's run). `inputs` is only read when the gate lets the case run.
pub fn execute(
    case: &Case,
    inputs: Result<Inputs, String>,
    prepared_plan: Option<Result<Plan, variants::PlanError>>,
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
) -> Stage {
    let bname = backend.info().backend.clone();
    let mut row = base_row(case, &bname, opts);
    let decision: Decision = variants::decide(case);
    row.gate = decision.gate.clone();
    row.forced = decision.forced;
    if let Some(why) = &decision.skip {
        row.status = Status::Skip;
        row.reason = why.clone();
        return Stage::Done(Box::new(CaseOutcome::ended(row)));
    }
    let inputs = match inputs {
        Ok(i) => i,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e;
            return Stage::Done(Box::new(CaseOutcome::ended(row)));
        }
    };
    let (wl, refs) = (&*inputs.workload, &*inputs.refs);
    row.rows_checked = refs.rows.len();
    let unit = case.variant.unit();
    let planned_at = std::time::Instant::now();
    let planned = match prepared_plan {
        Some(p) => p,
        None => plan_case(case, &decision, &inputs),
    };
    let plan = match planned {
        Ok(p) => p,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e.to_string();
            return Stage::Done(Box::new(CaseOutcome::ended(row)));
        }
    };
    row.plan = match &decision.fallback {
        Some(why) => format!("fallback v4_split ({why}): {}", unit.summary(&plan)),
        None => unit.summary(&plan),
    };
    let job = Job {
        case,
        workload: wl,
        plan: &plan,
        rows: &refs.rows,
    };
    let plan_secs = planned_at.elapsed().as_secs_f64();
    let cost = unit.cost(&job);
    (row.bytes, row.flops) = (cost.bytes, cost.flops);

    // An external implementation runs in its worker; the backend runs the rest.
    let ran = catch_unwind(AssertUnwindSafe(|| match unit.external() {
        Some(ext) => workers.run(ext, &job, &opts.exec),
        None => backend.run(unit, &job, &opts.exec),
    }));
    if let Some(h) = unit.external().and_then(|e| workers.hello(&e.decl.name)) {
        row.impl_version = h.version.clone();
        row.backend = format!("worker:{}", h.device_kind);
    }
    let out = match ran {
        Ok(Ok(mut o)) => {
            o.phases.insert(0, ("plan", plan_secs));
            o
        }
        Ok(Err(BackendError::Unsupported(why))) => {
            row.status = Status::Skip;
            row.reason = why;
            return Stage::Done(Box::new(CaseOutcome::ended(row)));
        }
        Ok(Err(e)) => {
            let lost = matches!(e, BackendError::DeviceLost(_));
            row.status = Status::Error;
            row.reason = e.to_string();
            let mut o = CaseOutcome::ended(row);
            o.device_lost = lost;
            return Stage::Done(Box::new(o));
        }
        Err(p) => {
            row.status = Status::Error;
            row.reason = format!("panic in backend: {}", panic_text(&p));
            return Stage::Done(Box::new(CaseOutcome::ended(row)));
        }
    };
    Stage::Ran(Box::new(Ran {
        row,
        decision,
        plan,
        inputs,
        out,
    }))
}

/// The host half of a case that ran: its checks, status and statistics.
/// `device` gives the ceilings for %BW and %TC (%TC against the variant's
/// tensor instruction mix). A panic in a check becomes an error row.
pub fn finish(case: &Case, ran: Ran, device: &DeviceInfo, opts: &CaseOptions) -> CaseOutcome {
    let Ran {
        mut row,
        decision,
        plan,
        inputs,
        out,
    } = ran;
    let job = Job {
        case,
        workload: &inputs.workload,
        plan: &plan,
        rows: &inputs.refs.rows,
    };
    let refs = &*inputs.refs;
    let unit = case.variant.unit();
    let judged = catch_unwind(AssertUnwindSafe(|| {
        unit.check(&job, refs, &out.tensors, true).and_then(|mut cs| {
            cs.extend(repeat_checks(&job, refs, &out.tensors, &out.repeats)?);
            cs.extend(device_checks(&out));
            Ok(cs)
        })
    }))
    .unwrap_or_else(|p| Err(format!("panic in the checks: {}", panic_text(&p))));
    match judged {
        Ok(cs) => row.checks = cs,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e;
        }
    }
    if row.status != Status::Error {
        let failed: Vec<&Check> = row.checks.iter().filter(|c| c.level == "kernel" && !c.pass).collect();
        if failed.is_empty() {
            row.status = Status::Pass;
            if decision.forced {
                row.reason = "forced past the gate, and passed on these lengths".into();
            }
        } else {
            let first = format!("{}: {}", failed[0].tensor, failed[0].why);
            if decision.forced {
                row.status = Status::XFail;
                row.reason = format!("fails as the gate predicts ({}) - {first}", decision.gate);
            } else {
                row.status = Status::Fail;
                row.reason = first;
            }
        }
    }
    if let Some(s) = &out.samples {
        let named = [("kernel", &s.kernel_ms), ("variant", &s.variant_ms)];
        let extra = s.regions.iter().map(|(n, v)| (n.as_str(), v));
        for (region, v) in named.into_iter().chain(extra) {
            if !v.is_empty() {
                let summary = Summary::from_samples(v);
                // One host sample is never judged, and so never capped.
                let capped = s.clock != "cpu-wall"
                    && opts
                        .exec
                        .timing
                        .target_noise
                        .is_some_and(|t| summary.noise.is_nan() || summary.noise > t);
                row.latency.push(Latency {
                    region: region.into(),
                    clock: s.clock.clone(),
                    summary,
                    capped,
                });
            }
        }
        row.dcp_step = out.step.clone();
        // A DCP step's time holds its collectives and every rank: rates of
        // rank 0's bytes over it would describe nothing. The one-GPU row
        // of the same case has the kernel's rates.
        let step = case.dcp_devices.is_some();
        if let Some(ms) = row.median_ms("variant").filter(|&ms| ms > 0.0 && !step) {
            let gbps = row.bytes / (ms * 1e-3) / 1e9;
            let tflops = row.flops / (ms * 1e-3) / 1e12;
            row.gbps = Some(gbps);
            row.tflops = Some(tflops);
            row.frac_bw = device.copy_gbps.map(|c| gbps / c);
            let mix = unit.tensor_mix(&job);
            row.frac_tc = mix.ceiling(&device.tensor).map(|c| tflops / c);
            row.tc_ceiling = row.frac_tc.map(|_| mix.label());
        }
    }
    CaseOutcome {
        row,
        device_lost: false,
        output: Some(out),
        inputs: Some(inputs),
    }
}

pub(crate) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The row of a case skipped before it ran (it does not fit the machine).
pub fn skipped_row(case: &Case, backend: &str, opts: &CaseOptions, why: &str) -> Row {
    let mut row = base_row(case, backend, opts);
    row.status = Status::Skip;
    row.reason = why.to_string();
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::TimingOptions;
    use crate::tensor_ceiling::TensorRates;

    /// %TC divides by the ceiling of the variant's own instruction mix
    /// (v4_split: mma.sync bf16), the row names it, and a device without
    /// that rate gives no %TC rather than one against another rate.
    #[test]
    fn frac_tc_is_of_the_variants_own_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tc.toml");
        let toml = "[[v4]]\nlayer = \"swa\"\nrows = 2\nheads = 16\nposition = 10\nvariants = [\"v4_split\"]\n";
        std::fs::write(&path, toml).unwrap();
        let case = crate::scenario::expand(&crate::scenario::load(&path).unwrap())
            .cases
            .remove(0);
        let opts = CaseOptions {
            check_rows: None,
            exec: Exec {
                timing: TimingOptions::default(),
                repeats: 1,
                handoff: Default::default(),
            },
            repro_flags: String::new(),
        };
        let mut backend = CpuBackend::new();
        let mut device = backend.info().clone();
        let rates = TensorRates {
            mma_sync_bf16_tflops: Some(500.0),
            wgmma_bf16_tflops: Some(800.0),
            wgmma_e4m3_tflops: Some(1600.0),
        };
        let mut row_with = |tensor: TensorRates| {
            let inputs = Caches::default().get(&case, opts.check_rows);
            let mut workers = WorkerPool::new();
            let Stage::Ran(ran) = execute(&case, inputs, None, &mut backend, &mut workers, &opts) else {
                panic!("the case did not run");
            };
            device.tensor = tensor;
            finish(&case, *ran, &device, &opts).row
        };
        let row = row_with(rates);
        let tflops = row.tflops.expect("timed on the host clock");
        assert_eq!(row.frac_tc, Some(tflops / 500.0));
        assert_eq!(row.tc_ceiling.as_deref(), Some("mma.sync bf16"));
        let none = row_with(TensorRates {
            mma_sync_bf16_tflops: None,
            ..rates
        });
        assert!(none.tflops.is_some());
        assert_eq!((none.frac_tc, none.tc_ceiling), (None, None));
    }
}
