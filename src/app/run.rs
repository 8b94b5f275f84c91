//! `mlabench run`: every case x variant checked and timed, optionally
//! resumed or judged against a baseline.

use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::Path;

use crate::backend;
use crate::cli::RunArgs;
use crate::error::{exit, InputError};
use crate::report::{self, progress::Progress, RunDir, RunMeta};
use crate::result::Status;
use crate::runner::{self, Caches};

use super::compare::{judge, read_entries, read_stamp};
use super::{default_scenarios, parse_variants, resolve_cases, run_meta, run_options};

pub fn run(args: &RunArgs) -> Result<u8> {
    let paths = default_scenarios(&args.scenarios);
    let (mut cases, notes) = resolve_cases(&paths, &args.cases, &parse_variants(&args.variants)?)?;
    let forced = parse_variants(&args.force)?;
    // A bad baseline fails before anything is measured.
    if args.baseline.is_none() && args.regression.view.markdown.is_some() {
        return Err(InputError::Usage("--markdown writes the baseline comparison: add --baseline RUN".into()).into());
    }
    let baseline = match &args.baseline {
        Some(b) => Some(read_entries(b, &args.regression.view.region)?),
        None => None,
    };
    for c in cases.iter_mut() {
        c.force |= forced.contains(&c.variant);
        c.ps1_schedule = args.ps1_schedule;
    }
    let e = &args.exec;
    let (mut backend, notice) = backend::select(e.backend, &e.kernels_dir)?;
    let mut meta = run_meta(e, backend.as_ref(), &paths, "");
    meta.ps1_schedule = args.ps1_schedule;
    let mut dir = match &args.resume {
        Some(d) => resume_dir(d, meta)?,
        None => RunDir::create(&e.out, meta)
            .with_context(|| format!("creating the run directory under {}", e.out.display()))?,
    };
    let done: std::collections::HashSet<(&str, &str)> = dir
        .rows()
        .iter()
        .map(|r| (r.case_id.as_str(), r.variant.as_str()))
        .collect();
    let before = cases.len();
    cases.retain(|c| !done.contains(&(c.id.as_str(), c.variant.to_string().as_str())));
    let progress = Progress::new(cases.len() as u64, args.quiet);
    if let Some(n) = notice {
        progress.println(&n);
    }
    for n in &notes {
        progress.println(&format!("note: {n}"));
    }
    if args.resume.is_some() {
        progress.println(&format!(
            "resuming {}: {} rows kept, {} of {} cases to run",
            dir.path().display(),
            dir.rows().len(),
            cases.len(),
            before
        ));
    }
    let mut opts = run_options(e, backend.as_ref(), !args.no_timing, !args.warm_l2);
    opts.dump = args.dump.clone();
    if args.ps1_schedule != crate::case::Ps1Schedule::default() {
        opts.repro_flags
            .push_str(&format!(" --ps1-schedule {}", args.ps1_schedule));
    }
    for f in &args.force {
        opts.repro_flags.push_str(&format!(" --force {f}"));
    }
    let mut caches = Caches::default();
    let mut lost: Option<String> = None;
    for case in &cases {
        progress.start(&case.key());
        let row = if let Some(why) = &lost {
            let mut r = runner::run_case_skipped(case, backend.info().backend.as_str(), &opts);
            r.status = Status::Error;
            r.reason = format!("not run: {why}");
            r
        } else {
            let out = runner::run_case(case, &mut caches, backend.as_mut(), &opts);
            if out.device_lost {
                lost = Some(format!("the device was lost at {}", case.key()));
            }
            if let (Some(d), Some(o)) = (&opts.dump, &out.output) {
                if let Err(e) = runner::dump_case(d, case, &mut caches, o, &out.row) {
                    progress.println(&format!("warning: --dump for {} failed: {e:#}", case.key()));
                }
            }
            out.row
        };
        if matches!(row.status, Status::Fail | Status::Error) {
            progress.println(&format!("{} {}: {}", status_word(row.status), case.key(), row.reason));
        }
        dir.push(row)?;
        progress.inc();
    }
    progress.finish();
    let gflops = (caches.ref_secs > 0.0).then(|| caches.ref_flops / caches.ref_secs / 1e9);
    // A resumed run that computed no reference keeps the throughput it had.
    dir.finish(|m| m.reference_gflops = gflops.or(m.reference_gflops))?;
    let rows = dir.rows();
    if !args.quiet {
        println!("{}", report::table::errors_table(rows, std::io::stdout().is_terminal()));
        if rows.iter().any(|r| !r.latency.is_empty()) {
            println!(
                "{}",
                report::table::latency_table(rows, std::io::stdout().is_terminal())
            );
        }
    }
    if let Some(g) = gflops {
        println!(
            "reference: {:.1} GFLOP/s (f64, {} threads), {:.1} s",
            g,
            rayon::current_num_threads(),
            caches.ref_secs
        );
    }
    println!("{}", report::table::summary_line(rows));
    println!("results: {}", dir.path().display());
    let failed = rows.iter().any(|r| matches!(r.status, Status::Fail | Status::Error));
    let regressed = match (&args.baseline, &baseline) {
        (Some(b), Some(base)) => {
            let cand = report::compare::entries_from_rows(rows, &args.regression.view.region);
            let md = dir.path().join("compare.md");
            let kernels = crate::provenance::compare_line(read_stamp(b).as_ref(), dir.meta().kernels.as_ref());
            judge(base, &cand, &args.regression, b, &kernels, Some(&md))?
        }
        _ => false,
    };
    Ok(if failed || regressed {
        exit::CHECK_FAILED
    } else {
        exit::OK
    })
}

/// Reopens a cut-short run for `--resume`; it must be a run of the same
/// scenarios, backend, row sampling and kernel sources, or its rows would not
/// be one report.
fn resume_dir(path: &Path, meta: RunMeta) -> Result<RunDir> {
    let mut dir = RunDir::resume(path).map_err(|e| InputError::Usage(format!("--resume: {e:#}")))?;
    let old = dir.meta();
    let differs = |what: &str, was: String, now: String| {
        InputError::Usage(format!(
            "--resume {}: that run's {what} was {was}, this one's is {now}; resume with the same {what}",
            path.display()
        ))
    };
    if old.scenarios != meta.scenarios {
        return Err(differs("scenarios", old.scenarios.join(" "), meta.scenarios.join(" ")).into());
    }
    if old.backend != meta.backend {
        return Err(differs("backend", old.backend.clone(), meta.backend.clone()).into());
    }
    if old.check_rows != meta.check_rows {
        let show = |c: Option<usize>| c.map_or("all rows".to_string(), |n| format!("--check-rows {n}"));
        return Err(differs("row sampling", show(old.check_rows), show(meta.check_rows)).into());
    }
    if old.ps1_schedule != meta.ps1_schedule {
        let show = |s: crate::case::Ps1Schedule| format!("--ps1-schedule {s}");
        return Err(differs("ps1 schedule", show(old.ps1_schedule), show(meta.ps1_schedule)).into());
    }
    if old.handoff != meta.handoff {
        let show = |h: crate::case::Handoff| format!("--handoff {h}");
        return Err(differs("merge hand-off", show(old.handoff), show(meta.handoff)).into());
    }
    // A run stamped before stamps existed has none: nothing to hold it to.
    if let (Some(was), Some(now)) = (&old.kernels, &meta.kernels) {
        if was.sha256 != now.sha256 {
            let show = |k: &crate::provenance::KernelsStamp| format!("sha256 {} ({})", k.short(), k.dir);
            return Err(differs("kernel sources", show(was), show(now)).into());
        }
    }
    dir.meta_mut().resumed.push(meta.command);
    Ok(dir)
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Fail => "FAIL",
        Status::Error => "ERROR",
        _ => "",
    }
}
