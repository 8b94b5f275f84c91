//! `mlabench splits`: the V4 split-count study and its `--from` re-score.

use anyhow::Result;
use std::path::Path;

use crate::backend;
use crate::case::{Case, CaseParams};
use crate::error::{exit, InputError};
use crate::report::{self, progress::Progress};
use crate::result::Status;
use crate::runner::{self, Caches};
use crate::variants::v4_split::plan::{kv_len_bound, v4_split_plan};
use crate::variants::{self, hca_persist, v4, v4_split};

use super::options::RunOptions;
use super::{create_run_dir, resolve_cases};

/// Times every split count of each V4 workload, the heuristic's pick and
/// hca_persist; writes splits.csv and splits.svg next to the run's rows.
pub fn splits(args: &crate::cli::SplitsArgs) -> Result<u8> {
    use crate::judge::split_regret::{Point, Study};
    super::declare_impls(&args.exec.impls)?;
    let (mut cases, _) = resolve_cases(
        std::slice::from_ref(&args.scenario),
        &args.cases,
        &[v4_split::ID, hca_persist::ID],
        &[],
    )?;
    if let Some(csv) = &args.from {
        return rescore_splits(&cases, csv);
    }
    let opts = RunOptions::from_exec(&args.exec, true, true)?;
    opts.apply(&mut cases);
    let peers: Vec<crate::variants::VariantId> = crate::variants::external::declared()
        .iter()
        .filter(|e| e.decl.contract == crate::variants::external::Contract::V4Decode)
        .map(|e| crate::variants::Variant::info(*e).id)
        .collect();
    opts.check_kernels(&cases)?;
    let (mut backend, notice) = backend::select(opts.backend, &opts.kernels_dir)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let case_opts = opts.case_options(backend.as_ref());
    let mut workers = crate::backend::worker::WorkerPool::new();
    for peer in &peers {
        if let Some(ext) = peer.unit().external() {
            let h = workers.start(&ext.decl).map_err(InputError::Environment)?;
            eprintln!("implementation {peer}: {} on {}", h.version, h.device);
        }
    }
    // One study per workload: the first case of each data id is its template.
    let mut seen = std::collections::HashSet::new();
    let bases: Vec<&Case> = cases.iter().filter(|c| seen.insert(c.data_id.clone())).collect();
    let mut meta = opts.meta(backend.as_ref(), std::slice::from_ref(&args.scenario), "splits-");
    meta.planned = Some(bases.len() * (17 + peers.len()));
    let mut dir = create_run_dir(&opts, meta)?;
    let progress = Progress::new((bases.len() * (17 + peers.len())) as u64, false);
    let mut caches = Caches::default();
    let mut studies = Vec::new();
    let point = |row: &crate::result::Row, n: usize| -> Option<Point> {
        let l = row.latency.iter().find(|l| l.region == "variant")?;
        Some(Point {
            n,
            median_ms: l.summary.median,
            p10_ms: l.summary.p10,
            p90_ms: l.summary.p90,
            pass: row.status == Status::Pass,
        })
    };
    for base in bases {
        let CaseParams::V4(p) = &base.params else { continue };
        let bound = kv_len_bound(p.layer, p.index_topk, p.max_model_len);
        let pick = v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, base.cus, None);
        let lens: Vec<usize> = p.positions.iter().map(|&pos| v4::row_len(p, pos)).collect();
        let mut study = Study {
            data_id: base.data_id.clone(),
            layer: p.layer.to_string(),
            rows: p.rows,
            heads: p.heads,
            mean_len: lens.iter().sum::<usize>() as f64 / lens.len().max(1) as f64,
            heuristic_n: pick.n,
            heuristic_source: format!("{:?}", pick.source).to_lowercase(),
            points: vec![],
            hca: None,
            hca_gate: None,
            peers: vec![],
        };
        for n in 1..=16 {
            let mut c = base.clone();
            c.variant = v4_split::ID;
            c.v4.splits = Some(n);
            c.id = crate::scenario::v4_case_id(&c.data_id, &c.v4);
            progress.start(&c.key());
            let out = runner::run_case(&c, &mut caches, backend.as_mut(), &mut workers, &case_opts);
            if let Some(pt) = point(&out.row, n) {
                study.points.push(pt);
            }
            dir.push(out.row)?;
            progress.inc();
        }
        let mut c = base.clone();
        c.variant = hca_persist::ID;
        c.v4.splits = None;
        c.id = crate::scenario::v4_case_id(&c.data_id, &c.v4);
        progress.start(&c.key());
        let d = variants::decide(&c);
        let out = runner::run_case(&c, &mut caches, backend.as_mut(), &mut workers, &case_opts);
        match d.fallback {
            Some(why) => study.hca_gate = Some(why),
            None => study.hca = point(&out.row, 0),
        }
        dir.push(out.row)?;
        progress.inc();
        for &peer in &peers {
            let mut c = base.clone();
            c.variant = peer;
            c.v4.splits = None;
            c.id = crate::scenario::v4_case_id(&c.data_id, &c.v4);
            progress.start(&c.key());
            let out = runner::run_case(&c, &mut caches, backend.as_mut(), &mut workers, &case_opts);
            if let Some(pt) = point(&out.row, 0) {
                study.peers.push((peer.to_string(), pt));
            }
            dir.push(out.row)?;
            progress.inc();
        }
        studies.push(study);
    }
    progress.finish();
    dir.finish(|_| ())?;
    std::fs::write(dir.path().join("splits.csv"), report::split_regret::csv(&studies)?)?;
    std::fs::write(dir.path().join("splits.svg"), report::split_regret::svg(&studies)?)?;
    // The run's JSON writer: non-finite timings stay visible instead of turning into null.
    let json = serde_json::to_string_pretty(&studies)?;
    std::fs::write(dir.path().join("splits.json"), json)?;
    println!("{}", report::split_regret::table(&studies));
    println!("{}", report::table::summary_line(dir.rows()));
    println!("results: {} (splits.csv, splits.svg)", dir.path().display());
    let failed = dir
        .rows()
        .iter()
        .any(|r| matches!(r.status, Status::Fail | Status::Error));
    Ok(if failed { exit::CHECK_FAILED } else { exit::OK })
}

/// The heuristic's pick for a V4 case, and where it came from.
fn heuristic_pick(c: &Case) -> Option<(usize, String)> {
    let CaseParams::V4(p) = &c.params else { return None };
    let bound = kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    let plan = v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, c.cus, None);
    Some((plan.n, format!("{:?}", plan.source).to_lowercase()))
}

/// `splits --from`: today's heuristic scored on a committed run's timings.
fn rescore_splits(cases: &[Case], csv_path: &Path) -> Result<u8> {
    use crate::judge::split_regret::{Point, Study};
    let mut rdr = csv::Reader::from_path(csv_path)
        .map_err(|e| InputError::Usage(format!("--from {}: {e}", csv_path.display())))?;
    let mut studies: Vec<Study> = Vec::new();
    for rec in rdr.deserialize::<std::collections::HashMap<String, String>>() {
        let r = rec.map_err(|e| InputError::Usage(format!("--from {}: {e}", csv_path.display())))?;
        let get = |k: &str| r.get(k).cloned().unwrap_or_default();
        let num = |k: &str| get(k).parse::<f64>().unwrap_or(f64::NAN);
        let id = get("data_id");
        let Some(case) = cases.iter().find(|c| c.data_id == id) else {
            continue;
        };
        if !studies.iter().any(|s| s.data_id == id) {
            let (n, src) = heuristic_pick(case).unwrap_or((1, "none".into()));
            studies.push(Study {
                data_id: id.clone(),
                layer: get("layer"),
                rows: get("rows").parse().unwrap_or(0),
                heads: get("heads").parse().unwrap_or(0),
                mean_len: num("mean_len"),
                heuristic_n: n,
                heuristic_source: src,
                points: vec![],
                hca: None,
                hca_gate: None,
                peers: vec![],
            });
        }
        let s = studies.iter_mut().find(|s| s.data_id == id).expect("inserted above");
        let pt = Point {
            n: get("n").parse().unwrap_or(0),
            median_ms: num("median_ms"),
            p10_ms: num("p10_ms"),
            p90_ms: num("p90_ms"),
            pass: get("pass") == "true",
        };
        match get("plan").as_str() {
            "fixed" => s.points.push(pt),
            "hca_persist" => s.hca = Some(pt),
            other if other.starts_with("impl:") => s.peers.push((other[5..].to_string(), pt)),
            _ => {}
        }
    }
    if studies.is_empty() {
        return Err(InputError::Usage(format!(
            "--from {}: no row matches a workload of the scenario",
            csv_path.display()
        ))
        .into());
    }
    println!("{}", report::split_regret::table(&studies));
    println!(
        "(re-scored from {}: timings of that run, today's heuristic)",
        csv_path.display()
    );
    Ok(exit::OK)
}
