//! The subcommands, each reading top to bottom: resolve, execute, report.
//! One file a command; what several share is here.

mod ab;
mod compare;
mod inspect;
mod run;
mod splits;

pub use ab::ab;
pub use compare::compare;
pub use inspect::{device, kernels, list, plan};
pub use run::run;
pub use splits::splits;

use anyhow::Result;
use std::collections::HashMap;
use std::path::PathBuf;

use crate::backend::{Backend, TimingOptions};
use crate::case::Case;
use crate::error::InputError;
use crate::report::RunMeta;
use crate::runner::RunOptions;
use crate::scenario::{self, data_id};
use crate::variants::VariantId;

/// Loads scenarios and expands them into cases, filtered and grouped by data id.
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
    cases.retain(|c| {
        (case_filter.is_empty() || case_filter.iter().any(|f| c.id == *f || c.id.contains(f.as_str())))
            && (variant_filter.is_empty() || variant_filter.contains(&c.variant))
    });
    if cases.is_empty() {
        return Err(InputError::Usage(
            "no case matches the given --case/--variant filters; `mlabench plan SCENARIO` lists every case id".into(),
        ));
    }
    // Group cases that share inputs so each workload and reference is built once.
    let mut first: HashMap<String, usize> = HashMap::new();
    for (i, c) in cases.iter().enumerate() {
        first.entry(data_id(c)).or_insert(i);
    }
    cases.sort_by_key(|c| (first[&data_id(c)], c.id.clone()));
    Ok((cases, notes))
}

fn parse_variants(v: &[String]) -> Result<Vec<VariantId>, InputError> {
    v.iter()
        .map(|s| {
            s.parse::<VariantId>()
                .map_err(|e| InputError::Usage(format!("--variant: {e}")))
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
    let mut repro_flags = format!(" --backend {}", backend.info().backend);
    if let Some(n) = e.check_rows {
        repro_flags.push_str(&format!(" --check-rows {n}"));
    }
    if e.handoff != crate::case::Handoff::default() {
        repro_flags.push_str(&format!(" --handoff {}", e.handoff));
    }
    RunOptions {
        check_rows: e.check_rows,
        timing,
        dump: None,
        repro_flags,
    }
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
    }
}
