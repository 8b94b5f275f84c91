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
use super::{
    check_dump_dir, create_run_dir, default_scenarios, fit_budget, parse_variants, resolve_cases, run_meta,
    run_options, validate_execution,
};

pub fn run(args: &RunArgs) -> Result<u8> {
    let paths = default_scenarios(&args.scenarios);
    let (mut cases, notes) = resolve_cases(&paths, &args.cases, &parse_variants(&args.variants, "--variant")?)?;
    let forced = parse_variants(&args.force, "--force")?;
    let e = &args.exec;
    validate_execution(e, &cases)?;
    if let Some(d) = &args.dump {
        check_dump_dir(d)?;
    }
    if let Some(j) = &args.junit {
        check_writable(j, "--junit")?;
    }
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
    let fault = args
        .cpu_fault
        .as_deref()
        .map(|f| {
            f.parse::<backend::cpu::Fault>()
                .map_err(|m| InputError::Usage(format!("--cpu-fault: {m}")))
        })
        .transpose()?;
    let (mut backend, notice) = backend::select_with(e.backend, &e.kernels_dir, fault, !args.no_timing)?;
    let mut opts = run_options(e, backend.as_ref(), !args.no_timing, !args.warm_l2);
    let budget = fit_budget(&cases, e, backend.as_ref(), &opts)?;
    let mut meta = run_meta(e, backend.as_ref(), &paths, "");
    meta.ps1_schedule = args.ps1_schedule;
    // Known from the first write on, so a run killed at any point says it is incomplete.
    meta.planned = Some(cases.len());
    let mut dir = match &args.resume {
        Some(d) => resume_dir(d, meta)?,
        None => create_run_dir(e, meta)?,
    };
    let done: std::collections::HashSet<(&str, &str)> = dir
        .rows()
        .iter()
        .map(|r| (r.case_id.as_str(), r.variant.as_str()))
        .collect();
    let before = cases.len();
    cases.retain(|c| !done.contains(&(c.id.as_str(), c.variant.to_string().as_str())));
    let planned = dir.rows().len() + cases.len();
    dir.meta_mut().planned = Some(planned);
    let progress = Progress::new(cases.len() as u64, args.quiet);
    if let Some(n) = notice {
        progress.println(&n);
    }
    for n in notes.iter().chain(&budget.notes) {
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
        let row = match budget.too_big.get(&case.key()) {
            Some(why) => runner::skipped_row(case, backend.info().backend.as_str(), &opts, why),
            None => {
                let out = runner::run_case(case, &mut caches, backend.as_mut(), &opts);
                if out.device_lost {
                    lost = Some(case.key());
                }
                if let (Some(d), Some(o)) = (&opts.dump, &out.output) {
                    if let Err(e) = runner::dump_case(d, case, &mut caches, o, &out.row) {
                        progress.println(&format!("warning: --dump for {} failed: {e:#}", case.key()));
                    }
                }
                out.row
            }
        };
        if matches!(row.status, Status::Fail | Status::Error) {
            progress.println(&format!("{} {}: {}", status_word(row.status), case.key(), row.reason));
        }
        dir.push(row)?;
        progress.inc();
        // Nothing after a lost device could be trusted: stop, and let the
        // run say it is incomplete, so `--resume` finishes it.
        if lost.is_some() {
            break;
        }
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
    let completeness = report::Completeness::of(dir.meta().planned, rows.len());
    println!("{} ({completeness})", report::table::summary_line(rows));
    if let Some(at) = &lost {
        println!(
            "the device was lost at {at}: {} cases did not run; finish them on a healthy device with --resume {}",
            planned - rows.len(),
            dir.path().display()
        );
    }
    println!("results: {}", dir.path().display());
    if let Some(j) = &args.junit {
        let xml = report::junit::render(dir.meta(), rows);
        std::fs::write(j, xml).with_context(|| format!("writing {}", j.display()))?;
        println!("junit: {}", j.display());
    }
    let failed = rows.iter().any(|r| matches!(r.status, Status::Fail | Status::Error));
    let checked = rows
        .iter()
        .any(|r| matches!(r.status, Status::Pass | Status::Fail | Status::XFail));
    if !checked && !failed {
        println!("no row was checked: every case was skipped (see the reasons above), so nothing passed");
    }
    let regressed = match (&args.baseline, &baseline) {
        (Some(b), Some(_)) if completeness.is_incomplete() && !args.regression.allow_incomplete => {
            println!(
                "not compared with {}: this run is {completeness} (--allow-incomplete judges the rows it has)",
                b.display()
            );
            false
        }
        (Some(b), Some(base)) => {
            let cand = report::compare::entries_from_rows(rows, &args.regression.view.region);
            let md = dir.path().join("compare.md");
            let kernels = crate::provenance::compare_line(read_stamp(b).as_ref(), dir.meta().kernels.as_ref());
            judge(base, &cand, &args.regression, b, &kernels, Some(&md))?
        }
        _ => false,
    };
    Ok(if failed || regressed || !checked || completeness.is_incomplete() {
        exit::CHECK_FAILED
    } else {
        exit::OK
    })
}

/// A file a flag will write at the end: its directory must exist and take writes now.
fn check_writable(path: &Path, flag: &str) -> Result<(), InputError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let probe = dir.join(format!(".mlabench-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"ok")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|err| {
            InputError::Usage(format!(
                "{flag} {}: cannot write in {} ({err}); give a path in a directory you can write",
                path.display(),
                dir.display()
            ))
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
    if !same_files(&old.scenarios, &meta.scenarios) {
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

/// Whether two lists name the same scenario files, however the paths were
/// spelled (`./scenarios/x.toml` and `scenarios/x.toml` are one file).
fn same_files(a: &[String], b: &[String]) -> bool {
    let norm = |p: &String| {
        std::fs::canonicalize(p).unwrap_or_else(|_| Path::new(p).components().collect::<std::path::PathBuf>())
    };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| norm(x) == norm(y))
}
