//! The subcommands, each reading top to bottom: resolve, execute, report.
//! One file a command; what several share is here.

mod ab;
mod compare;
mod inspect;
mod memory;
mod run;
mod selftest;
mod splits;

pub use ab::ab;
pub use compare::compare;
pub use inspect::{device, kernels, list, plan};
pub use run::run;
pub use selftest::selftest;
pub use splits::splits;

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;

use crate::backend::{Backend, TimingOptions};
use crate::case::Case;
use crate::error::InputError;
use crate::report::RunMeta;
use crate::runner::RunOptions;
use crate::scenario;
use crate::variants::VariantId;

/// Loads scenarios and expands them into cases, filtered and grouped by data
/// id. The same case twice (a scenario given twice, two identical blocks) runs
/// once, with a note; two different cases under one id are an error.
pub fn resolve_cases(
    paths: &[PathBuf],
    case_filter: &[String],
    variant_filter: &[VariantId],
) -> Result<(Vec<Case>, Vec<String>), InputError> {
    let mut cases = Vec::new();
    let mut notes = Vec::new();
    for p in paths {
        let sc = scenario::load(p)?;
        let ex = scenario::expand(&sc);
        if !ex.dropped.is_empty() {
            notes.push(format!(
                "{}: skipped {} impossible combinations (e.g. {})",
                p.display(),
                ex.dropped.len(),
                ex.dropped[0]
            ));
        }
        cases.extend(ex.cases);
    }
    let expanded = cases.len();
    cases.retain(|c| {
        (case_filter.is_empty() || case_filter.iter().any(|f| crate::case::filter_matches(f, &c.id)))
            && (variant_filter.is_empty() || variant_filter.contains(&c.variant))
    });
    if cases.is_empty() {
        let why = match (case_filter.is_empty(), variant_filter.is_empty(), expanded) {
            (_, _, 0) => "the scenarios expand to no case (every combination was impossible)".to_string(),
            (true, true, _) => "no case to run".to_string(),
            _ => format!(
                "no case matches the given {}; `mlabench plan SCENARIO` lists every case id (`--case =ID` matches one exactly)",
                match (case_filter.is_empty(), variant_filter.is_empty()) {
                    (false, false) => "--case and --variant filters",
                    (false, true) => "--case filter",
                    _ => "--variant filter",
                }
            ),
        };
        return Err(InputError::Usage(why));
    }
    let dropped = dedupe(&mut cases)?;
    if dropped > 0 {
        notes.push(format!(
            "{dropped} cases appear more than once (same id, variant and settings); each runs once"
        ));
    }
    // Group cases that share inputs so each workload and reference is built once.
    let mut first: HashMap<String, usize> = HashMap::new();
    for (i, c) in cases.iter().enumerate() {
        first.entry(c.data_id.clone()).or_insert(i);
    }
    cases.sort_by_key(|c| (first[&c.data_id], c.id.clone()));
    Ok((cases, notes))
}

/// Drops repeats of a (case id, variant), keeping the first; a repeat whose
/// settings differ shares an id it must not (a digest collision): error.
fn dedupe(cases: &mut Vec<Case>) -> Result<usize, InputError> {
    let mut seen: HashMap<(String, VariantId), (String, String)> = HashMap::new();
    let before = cases.len();
    let mut keep = Vec::with_capacity(before);
    for c in cases.drain(..) {
        let fp = scenario::fingerprint(&c);
        match seen.get(&(c.id.clone(), c.variant)) {
            Some((f, _)) if *f == fp => continue,
            Some((_, first)) => {
                return Err(InputError::Usage(format!(
                    "case id {} stands for two different cases ({} and {}); change the seed of one block",
                    c.id,
                    first,
                    c.scenario.display()
                )))
            }
            None => {
                seen.insert((c.id.clone(), c.variant), (fp, c.scenario.display().to_string()));
                keep.push(c);
            }
        }
    }
    *cases = keep;
    Ok(before - cases.len())
}

/// Variant names of a repeatable flag; errors name the flag (`--variant`, `--force`).
fn parse_variants(v: &[String], flag: &str) -> Result<Vec<VariantId>, InputError> {
    v.iter()
        .map(|s| {
            s.parse::<VariantId>()
                .map_err(|e| InputError::Usage(format!("{flag} {s}: {e}")))
        })
        .collect()
}

fn default_scenarios(v: &[PathBuf]) -> Vec<PathBuf> {
    if v.is_empty() {
        vec![PathBuf::from("scenarios/smoke.toml")]
    } else {
        v.to_vec()
    }
}

/// Refuses flags that would make a run check or time nothing, or lose its
/// outputs, before anything runs: a run that cannot fail must not pass.
fn validate_execution(e: &crate::cli::Execution, cases: &[Case]) -> Result<(), InputError> {
    let usage = |m: String| Err(InputError::Usage(m));
    if e.check_rows == Some(0) {
        return usage("--check-rows 0 checks no row, so every case would pass; give N >= 1, or leave the flag out to check every row".into());
    }
    if e.min_samples == 0 {
        return usage(
            "--min-samples 0 would report statistics of no sample; give at least 1 (the default is 10)".into(),
        );
    }
    if !(e.min_time_ms.is_finite() && e.min_time_ms >= 0.0) {
        return usage(format!(
            "--min-time-ms {}: give a time >= 0 in milliseconds",
            e.min_time_ms
        ));
    }
    if e.repeat_checks == Some(0) {
        return usage(
            "--repeat-checks 0 would run no checked launch; give at least 1 (2 compares two launches bit for bit)"
                .into(),
        );
    }
    // The kernels a run needs must be there on every backend: a CPU run that
    // passes while pointing at no kernels says nothing about them.
    if !e.kernels_dir.is_dir() {
        return usage(format!(
            "--kernels-dir {}: no such directory; point it at the repository's kernels/ (or a copy of it)",
            e.kernels_dir.display()
        ));
    }
    let mut missing: Vec<String> = cases
        .iter()
        .map(|c| c.variant.info().kernel_file)
        .filter(|f| !e.kernels_dir.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    missing.sort();
    missing.dedup();
    if !missing.is_empty() {
        return usage(format!(
            "--kernels-dir {}: has no {} for the variants this run asks for; point it at a copy of the repository's kernels/",
            e.kernels_dir.display(),
            missing.join(", ")
        ));
    }
    Ok(())
}

/// `--dump DIR` must be writable before the run starts, not fail case by case.
fn check_dump_dir(dir: &std::path::Path) -> Result<(), InputError> {
    let probe = dir.join(".mlabench-write-test");
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"ok"))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            InputError::Usage(format!(
                "--dump {}: cannot write there ({e}); give a directory you can write",
                dir.display()
            ))
        })
}

/// Cases that would not fit this machine, found before anything is allocated.
struct Budget {
    /// Row key (`id/variant`) -> why the case is skipped.
    too_big: HashMap<String, String>,
    notes: Vec<String>,
}

/// Sizes every case from its plan (nothing is allocated) against the host
/// memory free (or `--max-memory`) and the device's free memory. A case that
/// does not fit is skipped, saying what would; a count the kernels' i32
/// tables cannot hold is bad input; so is a run where no case fits.
fn fit_budget(
    cases: &[Case],
    e: &crate::cli::Execution,
    backend: &dyn Backend,
    opts: &RunOptions,
) -> Result<Budget, InputError> {
    use crate::budget::{footprint, human, largest_fitting, Options, Target};
    let host = match &e.max_memory {
        Some(t) => Some(memory::parse_size(t)?),
        None => memory::host_available(),
    };
    let device = backend.free_memory();
    let bo = Options {
        check_rows: opts.check_rows,
        target: if backend.info().backend == "cuda" {
            Target::Cuda
        } else {
            Target::Cpu
        },
        repeat_checks: opts.repeat_checks,
    };
    let (host_limit, device_limit) = (host.unwrap_or(u64::MAX), device.unwrap_or(u64::MAX));
    let mut too_big = HashMap::new();
    // Cases the gate skips need nothing and prove nothing: they do not count
    // as fitting.
    let mut runnable = 0;
    let mut smallest: Option<(u64, u64)> = None;
    for c in cases {
        let fp = footprint(c, &bo).map_err(|err| {
            InputError::Usage(format!(
                "{}: case {} cannot run: {err}; shrink the batch, the contexts or the rows of that block",
                c.scenario.display(),
                c.id
            ))
        })?;
        if fp.host == 0 && fp.device == 0 {
            continue;
        }
        runnable += 1;
        if smallest.map_or(true, |(h, d)| (fp.host, fp.device) < (h, d)) {
            smallest = Some((fp.host, fp.device));
        }
        let over_host = fp.host > host_limit;
        let over_device = fp.device > device_limit;
        if !(over_host || over_device) {
            continue;
        }
        let mut why = Vec::new();
        if over_host {
            why.push(format!(
                "{} of host memory, {} is free",
                human(fp.host),
                human(host_limit)
            ));
        }
        if over_device {
            why.push(format!(
                "{} of GPU memory, {} is free",
                human(fp.device),
                human(device_limit)
            ));
        }
        let big: Vec<String> = fp
            .parts
            .iter()
            .filter(|p| (over_host && p.host > 0) || (over_device && p.device > 0))
            .take(3)
            .map(|p| format!("{} {}", p.what, human(if over_host { p.host } else { p.device })))
            .collect();
        let unit = if c.mla().is_some() { "batch" } else { "rows" };
        let fits = match largest_fitting(c, &bo, host_limit, device_limit) {
            Some(n) => format!("{unit} <= {n} of this case would fit"),
            None => "no smaller batch of this case fits either".to_string(),
        };
        too_big.insert(
            c.key(),
            format!(
                "too big for this machine: needs {} ({}); {fits}",
                why.join(" and "),
                big.join(", ")
            ),
        );
    }
    if runnable > 0 && too_big.len() == runnable {
        let (h, d) = smallest.unwrap_or((0, 0));
        return Err(InputError::Usage(format!(
            "no case fits this machine: the smallest needs {} of host memory ({} free) and {} of GPU memory ({}); shrink the scenario or raise --max-memory",
            human(h),
            host.map(human).unwrap_or_else(|| "unknown".into()),
            human(d),
            device.map(human).unwrap_or_else(|| "no GPU".into()),
        )));
    }
    let mut notes = Vec::new();
    if !too_big.is_empty() {
        notes.push(format!(
            "{} of {} cases do not fit this machine and are skipped (their rows say what would fit)",
            too_big.len(),
            cases.len()
        ));
    }
    Ok(Budget { too_big, notes })
}

/// How `run` and `splits` check and time, and the flags every repro repeats.
fn run_options(e: &crate::cli::Execution, backend: &dyn Backend, timed: bool, cold_l2: bool) -> RunOptions {
    let timing = TimingOptions {
        enabled: timed,
        warmup: e.warmup,
        min_samples: e.min_samples.max(1),
        min_time_ms: e.min_time_ms,
        cold_l2,
        graph: e.graph,
        handoff: e.handoff,
    };
    let name = &backend.info().backend;
    let mut repro_flags = format!(" --backend {name}");
    if let Some(n) = e.check_rows {
        repro_flags.push_str(&format!(" --check-rows {n}"));
    }
    if e.handoff != crate::case::Handoff::default() {
        repro_flags.push_str(&format!(" --handoff {}", e.handoff));
    }
    // A GPU's launches can race, so two checked launches are compared there;
    // the CPU emulation is deterministic by construction.
    let default_repeats = if name == "cpu" { 1 } else { 2 };
    let repeat_checks = e.repeat_checks.unwrap_or(default_repeats);
    if repeat_checks != default_repeats {
        repro_flags.push_str(&format!(" --repeat-checks {repeat_checks}"));
    }
    RunOptions {
        check_rows: e.check_rows,
        timing,
        dump: None,
        repeat_checks,
        repro_flags,
    }
}

/// The run's directory: a given `--run-id` must be new, a default one (a
/// time stamp) takes the next free suffix.
fn create_run_dir(e: &crate::cli::Execution, meta: RunMeta) -> Result<crate::report::RunDir> {
    let made = if e.run_id.is_some() {
        crate::report::RunDir::create(&e.out, meta)
    } else {
        crate::report::RunDir::create_unique(&e.out, meta)
    };
    made.with_context(|| format!("creating the run directory under {}", e.out.display()))
}

/// What a run was, for its directory (`prefix` + UTC stamp when unnamed).
fn run_meta(e: &crate::cli::Execution, backend: &dyn Backend, scenarios: &[PathBuf], prefix: &str) -> RunMeta {
    RunMeta {
        run_id: e
            .run_id
            .clone()
            .unwrap_or_else(|| format!("{prefix}{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"))),
        started: chrono::Utc::now().to_rfc3339(),
        mlabench_version: env!("CARGO_PKG_VERSION").to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        scenarios: scenarios.iter().map(|p| p.display().to_string()).collect(),
        backend: backend.info().backend.clone(),
        device: backend.info().clone(),
        check_rows: e.check_rows,
        reference_gflops: None,
        resumed: vec![],
        kernels: crate::provenance::stamp_kernels(&e.kernels_dir),
        ps1_schedule: Default::default(),
        handoff: e.handoff,
        planned: None,
    }
}
