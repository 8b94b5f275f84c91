//! `mlabench compare` and the baseline judgement `run --baseline` shares.

use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::Path;

use crate::error::{exit, InputError};
use crate::report;

/// Compares two finished runs (no GPU): exit 1 on a regression.
pub fn compare(args: &crate::cli::CompareArgs) -> Result<u8> {
    let base = read_entries(&args.baseline, &args.regression.view.region)?;
    let cand = read_entries(&args.candidate, &args.regression.view.region)?;
    let planned = read_meta(&args.candidate).and_then(|m| m.planned);
    let done = crate::report::Completeness::of(planned, cand.len());
    if done.is_incomplete() && !args.regression.allow_incomplete {
        return Err(InputError::Usage(format!(
            "{} is {done}: its missing rows never ran, so it cannot be judged; finish it with `mlabench run ... --resume {}`, or pass --allow-incomplete to judge the rows it has",
            args.candidate.display(),
            args.candidate.display()
        ))
        .into());
    }
    let kernels = crate::provenance::compare_line(
        read_stamp(&args.baseline).as_ref(),
        read_stamp(&args.candidate).as_ref(),
    );
    let regressed = judge(&base, &cand, &args.regression, &args.baseline, &kernels, None)?;
    Ok(if regressed { exit::CHECK_FAILED } else { exit::OK })
}

/// The kernels stamp in a run's rows.json (beside its rows.csv), if any.
pub(super) fn read_stamp(path: &Path) -> Option<crate::provenance::KernelsStamp> {
    read_meta(path)?.kernels
}

/// What a run's rows.json says about how it was made; `None` fields when
/// the run predates them or the file is missing.
#[derive(serde::Deserialize, Default)]
pub(super) struct RunMetaView {
    #[serde(default)]
    pub kernels: Option<crate::provenance::KernelsStamp>,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub planned: Option<usize>,
}

pub(super) fn read_meta(path: &Path) -> Option<RunMetaView> {
    #[derive(serde::Deserialize)]
    struct Run {
        meta: RunMetaView,
    }
    let dir = if path.is_dir() { path } else { path.parent()? };
    let bytes = std::fs::read(dir.join("rows.json")).ok()?;
    Some(serde_json::from_slice::<Run>(&bytes).ok()?.meta)
}

/// A run directory's rows.csv, or the CSV itself.
pub(super) fn read_entries(path: &Path, region: &str) -> Result<Vec<crate::judge::baseline::Entry>, InputError> {
    report::baseline::check_region(region).map_err(|e| InputError::Usage(format!("--region: {e}")))?;
    let file = if path.is_dir() {
        path.join("rows.csv")
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&file).map_err(|e| {
        InputError::Usage(format!(
            "{}: {e}; pass a run directory (results/<run-id>) or its rows.csv",
            file.display()
        ))
    })?;
    report::baseline::entries_from_csv(&bytes, region, &file.display().to_string())
        .map_err(|e| InputError::Usage(format!("{e:#}")))
}

/// Prints the verdicts (and writes Markdown); true when something regressed.
pub(super) fn judge(
    base: &[crate::judge::baseline::Entry],
    cand: &[crate::judge::baseline::Entry],
    gate: &crate::cli::RegressionGate,
    baseline: &Path,
    kernels: &str,
    run_markdown: Option<&Path>,
) -> Result<bool> {
    if !(gate.threshold.is_finite() && gate.threshold >= 0.0) {
        return Err(InputError::Usage(format!("--threshold {}: give a percentage >= 0", gate.threshold)).into());
    }
    let thr = gate.threshold / 100.0;
    let deltas = crate::judge::baseline::compare(base, cand, thr);
    if !deltas.iter().any(|d| d.base.is_some() && d.cand.is_some()) {
        return Err(InputError::Usage(format!(
            "no (case, variant) row is in both the baseline ({}) and the candidate; compare runs of the same scenario",
            baseline.display()
        ))
        .into());
    }
    println!(
        "{}",
        report::baseline::table(&deltas, std::io::stdout().is_terminal(), gate.view.show)
    );
    println!(
        "against {}: {}",
        baseline.display(),
        report::baseline::summary_line(&deltas)
    );
    println!("{kernels}");
    let md = report::baseline::markdown(
        &deltas,
        &baseline.display().to_string(),
        thr,
        &gate.view.region,
        kernels,
    );
    for path in run_markdown.into_iter().chain(gate.view.markdown.as_deref()) {
        std::fs::write(path, &md).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(deltas.iter().any(|d| d.verdict.is_regression()))
}
