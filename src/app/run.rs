//! `mlabench run`: every case x variant checked and timed, optionally
//! resumed or judged against a baseline.

use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::Path;

use crate::backend;
use crate::backend::worker::WorkerPool;
use crate::cli::RunArgs;
use crate::error::{exit, InputError};
use crate::report::{self, progress::Progress, RunDir, RunMeta};
use crate::result::Status;
use crate::runner;

use super::compare::{judge, read_entries, read_stamp};
use super::options::RunOptions;
use super::{
    create_run_dir, declare_impls, default_scenarios, fit_budget, parse_variants, resolve_cases, start_workers,
};

pub fn run(args: &RunArgs) -> Result<u8> {
    let added = declare_impls(&args.exec.impls)?;
    let paths = default_scenarios(&args.scenarios);
    let (mut cases, notes) = resolve_cases(
        &paths,
        &args.cases,
        &parse_variants(&args.variants, "--variant")?,
        &added,
    )?;
    let opts = RunOptions::from_run(args)?;
    opts.check_kernels(&cases)?;
    // A bad baseline fails before anything is measured.
    if args.baseline.is_none() && args.regression.view.markdown.is_some() {
        return Err(InputError::Usage("--markdown writes the baseline comparison: add --baseline RUN".into()).into());
    }
    let baseline = match &args.baseline {
        Some(b) => Some(read_entries(b, &args.regression.view.region)?),
        None => None,
    };
    opts.apply(&mut cases);
    let mut notes = notes;
    notes.extend(opts.add_device_twins(&mut cases)?);
    let group = cases.iter().filter_map(|c| c.dcp_devices).max();
    let gpu_skips = match group {
        Some(_) if opts.backend == crate::cli::BackendChoice::Cpu => {
            notes.push(
                "DCP groups on the cpu backend: the emulated ranks and a host model of the step's merge (no NCCL, no step timing)"
                    .into(),
            );
            Default::default()
        }
        Some(_) => {
            let (line, count) = backend::dcp_preflight()?;
            notes.push(line);
            opts.fit_groups(&cases, count)?
        }
        None => Default::default(),
    };
    let (mut backend, notice) =
        backend::select_with(opts.backend, &opts.kernels_dir, opts.cpu_fault, opts.timing.enabled)?;
    let on_cpu = opts.backend == crate::cli::BackendChoice::Cpu;
    if let (Some(n), "cpu", false) = (group, backend.info().backend.as_str(), on_cpu) {
        return Err(InputError::Environment(format!(
            "a DCP group of {} needs the cuda backend, which did not open ({}); fix that, or model the step on the host with --backend cpu",
            backend::gpus(n),
            notice.as_deref().unwrap_or("no notice")
        ))
        .into());
    }
    let budget = fit_budget(&cases, &opts, backend.as_ref())?;
    let mut workers = WorkerPool::new();
    let impl_lines = start_workers(&cases, &mut workers)?;
    let case_opts = opts.case_options(backend.as_ref());
    let mut meta = opts.meta(backend.as_ref(), &paths, "");
    // Known from the first write on, so a run killed at any point says it is incomplete.
    meta.planned = Some(cases.len());
    meta.implementations = impl_lines.clone();
    let mut dir = match &args.resume {
        Some(d) => resume_dir(d, meta)?,
        None => create_run_dir(&opts, meta)?,
    };
    let done: std::collections::HashSet<(&str, &str)> = dir
        .rows()
        .iter()
        .map(|r| (r.case_id.as_str(), r.variant.as_str()))
        .collect();
    let before = cases.len();
    cases.retain(|c| !done.contains(&(c.id.as_str(), c.variant.name())));
    let planned = dir.rows().len() + cases.len();
    dir.meta_mut().planned = Some(planned);
    let progress = Progress::new(cases.len() as u64, args.quiet);
    if let Some(n) = notice {
        progress.println(&n);
    }
    for n in notes.iter().chain(&budget.notes).chain(&impl_lines) {
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
    let mut lost: Option<String> = None;
    let pre = |case: &crate::case::Case| {
        (budget.too_big.get(&case.key()))
            .or_else(|| gpu_skips.get(&case.key()))
            .cloned()
    };
    let depth = if args.no_pipeline {
        runner::Depth::Sequential
    } else {
        runner::Depth::for_machine(
            budget.cases_that_fit,
            rayon::current_num_threads(),
            backend.info().backend == "cpu",
        )
    };
    let on_start = |case: &crate::case::Case| progress.start(&case.key());
    let mut sink = |case: &crate::case::Case, out: runner::CaseOutcome| -> Result<bool> {
        if let (Some(d), Some(o), Some(i)) = (&opts.dump, &out.output, &out.inputs) {
            if let Err(e) = report::dump::case(d, case, &i.workload, &i.refs, &o.tensors, &out.row) {
                progress.println(&format!("warning: --dump for {} failed: {e:#}", case.key()));
            }
        }
        let row = out.row;
        if matches!(row.status, Status::Fail | Status::Error) {
            progress.println(&format!("{} {}: {}", status_word(row.status), case.key(), row.reason));
        }
        dir.push(row)?;
        progress.inc();
        // Nothing after a lost device could be trusted: stop, and let the
        // run say it is incomplete, so `--resume` finishes it.
        if out.device_lost {
            lost = Some(case.key());
            return Ok(false);
        }
        Ok(true)
    };
    let times = runner::run_all(
        &cases,
        &pre,
        backend.as_mut(),
        &mut workers,
        &case_opts,
        depth,
        &on_start,
        &mut sink,
    )?;
    progress.finish();
    let (ref_flops, ref_secs) = (times.ref_flops, times.ref_secs);
    let gflops = (ref_secs > 0.0).then(|| ref_flops / ref_secs / 1e9);
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
            ref_secs
        );
    }
    println!("{times}");
    let steps = report::dcp_steps::table(rows);
    if !steps.is_empty() && !args.quiet {
        println!("{steps}");
    }
    let peers = super::write_peers(dir.path(), rows)?;
    if !peers.is_empty() && !args.quiet {
        println!("{}", report::peers::table(&peers, std::io::stdout().is_terminal()));
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
            let cand = report::baseline::entries_from_rows(rows, &args.regression.view.region);
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

/// Reopens a cut-short run for `--resume`; it must be a run of the same
/// scenarios, backend, row sampling and kernel sources, or its rows would not
/// be one report.
fn resume_dir(path: &Path, meta: RunMeta) -> Result<RunDir> {
    let mut dir = RunDir::resume(path).map_err(|e| InputError::Usage(format!("--resume: {e:#}")))?;
    if let Some((what, was, now)) = RunOptions::resume_conflict(dir.meta(), &meta) {
        return Err(InputError::Usage(format!(
            "--resume {}: that run's {what} was {was}, this one's is {now}; resume with the same {what}",
            path.display()
        ))
        .into());
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
