//! Runs one case end to end: its workload and references from the cache,
//! its variant's plan, the backend's launches, the variant's checks, then
//! the report row. Never panics outward: a panic becomes an error row.

mod cache;

pub use cache::Caches;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::backend::worker::WorkerPool;
use crate::backend::{Backend, BackendError, Exec, RunOutput};
use crate::case::Case;
use crate::metrics;
use crate::reference::{self, RefSet};
use crate::result::{Check, Latency, Row, Status};
use crate::stats::Summary;
use crate::variants::output::find;
use crate::variants::{self, Decision, Job, OutTensor, PlanData};
use crate::workload::Workload;

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
        params: case.params_map(),
        repro: repro(case, opts),
    }
}

/// Outcome of one case: its row, and whether the device is gone.
pub struct CaseOutcome {
    pub row: Row,
    pub device_lost: bool,
    /// Tensors and plan, kept for `--dump`.
    pub output: Option<RunOutput>,
}

/// Runs one case end to end. Never panics outward: a panic becomes an error row.
pub fn run_case(
    case: &Case,
    caches: &mut Caches,
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
) -> CaseOutcome {
    let bname = backend.info().backend.clone();
    let mut row = base_row(case, &bname, opts);
    let decision: Decision = variants::decide(case);
    row.gate = decision.gate.clone();
    row.forced = decision.forced;
    if let Some(why) = &decision.skip {
        row.status = Status::Skip;
        row.reason = why.clone();
        return CaseOutcome {
            row,
            device_lost: false,
            output: None,
        };
    }
    let got = catch_unwind(AssertUnwindSafe(|| {
        caches
            .get(case, opts.check_rows)
            .map(|(w, r)| (w as *const Workload, r as *const RefSet))
    }));
    let (wl, refs) = match got {
        Ok(Ok((w, r))) => {
            // SAFETY: both point into `caches`, which is not touched again until
            // this function returns; the pointers only shorten the borrow.
            unsafe { (&*w, &*r) }
        }
        Ok(Err(e)) => {
            row.status = Status::Error;
            row.reason = format!("building inputs: {e:#}");
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
        Err(p) => {
            row.status = Status::Error;
            row.reason = format!("panic while building inputs or reference: {}", panic_text(&p));
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
    };
    row.rows_checked = refs.rows.len();
    let unit = case.variant.unit();
    let plan = unit.plan(case, &decision, Some(PlanData { workload: wl, refs }));
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e.to_string();
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
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
        Ok(Ok(o)) => o,
        Ok(Err(BackendError::Unsupported(why))) => {
            row.status = Status::Skip;
            row.reason = why;
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
        Ok(Err(e)) => {
            let lost = matches!(e, BackendError::DeviceLost(_));
            row.status = Status::Error;
            row.reason = e.to_string();
            return CaseOutcome {
                row,
                device_lost: lost,
                output: None,
            };
        }
        Err(p) => {
            row.status = Status::Error;
            row.reason = format!("panic in backend: {}", panic_text(&p));
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
    };
    let judged = unit.check(&job, refs, &out.tensors, true).and_then(|mut cs| {
        cs.extend(repeat_checks(&job, refs, &out.tensors, &out.repeats)?);
        cs.extend(device_checks(&out));
        Ok(cs)
    });
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
        let info = backend.info();
        for (region, v) in [("kernel", &s.kernel_ms), ("variant", &s.variant_ms)] {
            if !v.is_empty() {
                row.latency.push(Latency {
                    region: region.into(),
                    clock: s.clock.clone(),
                    summary: Summary::from_samples(v),
                });
            }
        }
        if let Some(ms) = row.median_ms("variant").filter(|&ms| ms > 0.0) {
            let gbps = row.bytes / (ms * 1e-3) / 1e9;
            let tflops = row.flops / (ms * 1e-3) / 1e12;
            row.gbps = Some(gbps);
            row.tflops = Some(tflops);
            row.frac_bw = info.copy_gbps.map(|c| gbps / c);
            row.frac_tc = info.tensor_tflops.map(|c| tflops / c);
        }
    }
    CaseOutcome {
        row,
        device_lost: false,
        output: Some(out),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
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
