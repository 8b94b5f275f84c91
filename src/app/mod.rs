//! The subcommands, each reading top to bottom: resolve, execute, report.
//! One file a command; what several share is here.

mod ab;
mod compare;
mod device;
mod kernels;
mod list;
pub mod memory;
mod options;
mod plan;
mod report;
mod run;
mod selftest;
mod splits;

pub use ab::ab;
pub use compare::compare;
pub use device::device;
pub use kernels::kernels;
pub use list::list;
pub use plan::plan;
pub use report::report;
pub use run::run;
pub use selftest::selftest;
pub use splits::splits;

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;

use crate::backend::Backend;
use crate::case::Case;
use crate::error::InputError;
use crate::report::RunMeta;
use crate::scenario;
use crate::variants::VariantId;
use options::RunOptions;

/// Loads scenarios and expands them into cases, filtered and grouped by data
/// id. The same case twice (a scenario given twice, two identical blocks) runs
/// once, with a note; two different cases under one id are an error.
pub fn resolve_cases(
    paths: &[PathBuf],
    case_filter: &[String],
    variant_filter: &[VariantId],
    added: &[VariantId],
) -> Result<(Vec<Case>, Vec<String>), InputError> {
    let mut cases = Vec::new();
    let mut notes = Vec::new();
    for p in paths {
        let mut sc = scenario::load(p)?;
        sc.add_variants(added);
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
    // `=X` that is no case id but a data id (the `== shape@digest` line of
    // `mlabench plan`) selects every case on that input. A case id that is
    // also a data id (a V4 row with no knobs) keeps matching itself alone,
    // so a repro command reruns exactly its row.
    let by_data: Vec<Option<&str>> = case_filter
        .iter()
        .map(|f| f.strip_prefix('=').filter(|x| !cases.iter().any(|c| c.id == *x)))
        .collect();
    cases.retain(|c| {
        (case_filter.is_empty()
            || case_filter
                .iter()
                .zip(&by_data)
                .any(|(f, d)| crate::case::filter_matches(f, &c.id) || *d == Some(c.data_id.as_str())))
            && (variant_filter.is_empty() || variant_filter.contains(&c.variant))
    });
    if cases.is_empty() {
        let why = match (case_filter.is_empty(), variant_filter.is_empty(), expanded) {
            (_, _, 0) => "the scenarios expand to no case (every combination was impossible)".to_string(),
            (true, true, _) => "no case to run".to_string(),
            _ => format!(
                "no case matches the given {}; `mlabench plan SCENARIO` lists every input's data id and its variants' knobs (`--case =ID` matches one case id or every case of one data id)",
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

/// Cases that would not fit this machine, found before anything is allocated.
struct Budget {
    /// Row key (`id/variant`) -> why the case is skipped.
    too_big: HashMap<String, String>,
    notes: Vec<String>,
    /// How many of the largest case that fits fit in host memory at once:
    /// how far the pipeline may run ahead.
    cases_that_fit: u64,
}

/// Sizes every case from its plan (nothing is allocated) against the host
/// memory free (or `--max-memory`) and the device's free memory. A case that
/// does not fit is skipped, saying what would; a count the kernels' i32
/// tables cannot hold is bad input; so is a run where no case fits.
fn fit_budget(cases: &[Case], opts: &RunOptions, backend: &dyn Backend) -> Result<Budget, InputError> {
    use crate::budget::{footprint, human, largest_fitting, Options, Target};
    let host = opts.max_memory.or_else(memory::host_available);
    let device = backend.free_memory();
    let bo = Options {
        check_rows: opts.check_rows,
        target: if backend.info().backend == "cuda" {
            Target::Cuda
        } else {
            Target::Cpu
        },
        repeat_checks: opts.repeats(&backend.info().backend),
    };
    let (host_limit, device_limit) = (host.unwrap_or(u64::MAX), device.unwrap_or(u64::MAX));
    let mut too_big = HashMap::new();
    // Cases the gate skips need nothing and prove nothing: they do not count
    // as fitting.
    let mut runnable = 0;
    let mut smallest: Option<(u64, u64)> = None;
    let mut largest_host = 0u64;
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
            largest_host = largest_host.max(fp.host);
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
    let cases_that_fit = host_limit / largest_host.max(1);
    Ok(Budget {
        too_big,
        notes,
        cases_that_fit,
    })
}

/// The run's directory: a given `--run-id` must be new, a default one (a
/// time stamp) takes the next free suffix.
fn create_run_dir(opts: &RunOptions, meta: RunMeta) -> Result<crate::report::RunDir> {
    let made = if opts.run_id.is_some() {
        crate::report::RunDir::create(&opts.out, meta)
    } else {
        crate::report::RunDir::create_unique(&opts.out, meta)
    };
    made.with_context(|| format!("creating the run directory under {}", opts.out.display()))
}

/// Declares the `--impl FILE` implementations; each joins every block of
/// its contract's family in the scenarios (`resolve_cases`' `added`).
fn declare_impls(files: &[PathBuf]) -> Result<Vec<VariantId>, InputError> {
    let mut ids = Vec::new();
    for f in files {
        let decl = crate::variants::external::decl::load(f)
            .map_err(|e| InputError::Usage(format!("--impl {}: {e}", f.display())))?;
        ids.push(
            crate::variants::declare(decl).map_err(|e| InputError::Usage(format!("--impl {}: {e}", f.display())))?,
        );
    }
    Ok(ids)
}

/// Writes peers.svg beside a run's rows when implementations shared inputs;
/// returns the groups for the terminal table.
fn write_peers(dir: &std::path::Path, rows: &[crate::result::Row]) -> anyhow::Result<Vec<crate::report::peers::Group>> {
    let peers = crate::report::peers::groups(rows);
    let path = dir.join("peers.svg");
    if peers.is_empty() {
        return Ok(peers);
    }
    match crate::report::peers::svg(&peers) {
        Ok(svg) => std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?,
        Err(e) => println!("warning: peers.svg not drawn: {e:#}"),
    }
    Ok(peers)
}

/// Starts the worker of every external implementation the cases use, before
/// anything is measured: one that cannot start is an environment error
/// (exit 2) with its stderr, not an error row per case.
fn start_workers(cases: &[Case], pool: &mut crate::backend::worker::WorkerPool) -> Result<Vec<String>, InputError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut lines = Vec::new();
    for c in cases {
        let Some(ext) = c.variant.unit().external() else {
            continue;
        };
        if crate::variants::decide(c).skip.is_some() || !seen.insert(ext.decl.name.clone()) {
            continue;
        }
        let h = pool.start(&ext.decl).map_err(InputError::Environment)?;
        lines.push(format!(
            "implementation {}: {} on {} (worker `{}`)",
            ext.decl.name,
            if h.version.is_empty() { "no version" } else { &h.version },
            if h.device.is_empty() {
                "an unnamed device"
            } else {
                &h.device
            },
            ext.decl.command.join(" ")
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_data_id_selects_every_case_on_that_input_and_an_exact_case_id_itself() {
        // `plan` prints `== shape@digest` over each input's variants, so
        // that line pasted after `=` must select them.
        let smoke = [PathBuf::from("scenarios/smoke.toml")];
        let (all, _) = resolve_cases(&smoke, &[], &[], &[]).unwrap();
        let data_id = all.iter().find(|c| c.variant.0 == "page64").unwrap().data_id.clone();
        let on_input = all.iter().filter(|c| c.data_id == data_id).count();
        assert!(on_input >= 2, "ps1 and page64 share an MLA input");
        let filter = [format!("={data_id}")];
        let (cases, _) = resolve_cases(&smoke, &filter, &[], &[]).unwrap();
        assert_eq!(cases.len(), on_input);
        assert!(cases.iter().all(|c| c.data_id == data_id));
        let page64 = "page64".parse::<VariantId>().unwrap();
        let (one, _) = resolve_cases(&smoke, &filter, &[page64], &[]).unwrap();
        assert_eq!(one.len(), 1);
        // A case id still matches only itself, also where it is the data
        // id of other cases (a V4 row with no knobs beside its fixed splits).
        let (exact, _) = resolve_cases(&smoke, &[format!("={}", one[0].id)], &[], &[]).unwrap();
        assert_eq!(exact.len(), 1);
        let bare = all
            .iter()
            .find(|c| c.id == c.data_id && all.iter().filter(|o| o.data_id == c.data_id).count() > 1)
            .expect("a smoke case whose id is its siblings' data id");
        let (exact, _) = resolve_cases(&smoke, &[format!("={}", bare.id)], &[], &[]).unwrap();
        assert_eq!(exact.len(), all.iter().filter(|c| c.id == bare.id).count());
        assert!(exact.iter().all(|c| c.id == bare.id), "none of its siblings' knob ids");
    }
}
