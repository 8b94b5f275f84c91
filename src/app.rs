//! The subcommands, each reading top to bottom: resolve, execute, report.

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use crate::backend::{self, Backend, TimingOptions};
use crate::case::{Case, CaseParams};
use crate::cli::{KernelsArgs, ListArgs, PlanArgs, RunArgs};
use crate::error::{exit, InputError};
use crate::report::{self, progress::Progress, RunDir, RunMeta};
use crate::result::Status;
use crate::runner::{self, Caches, RunOptions};
use crate::scenario::{self, data_id};
use crate::variants::{self, VariantId, VariantPlan, REGISTRY};
use crate::workload::dcp;

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
    };
    let mut repro_flags = format!(" --backend {}", backend.info().backend);
    if let Some(n) = e.check_rows {
        repro_flags.push_str(&format!(" --check-rows {n}"));
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
    }
}

pub fn run(args: &RunArgs) -> Result<u8> {
    let paths = default_scenarios(&args.scenarios);
    let (mut cases, notes) = resolve_cases(&paths, &args.cases, &parse_variants(&args.variants)?)?;
    let forced = parse_variants(&args.force)?;
    // A bad baseline fails before anything is measured.
    if args.baseline.is_none() && args.regression.markdown.is_some() {
        return Err(InputError::Usage("--markdown writes the baseline comparison: add --baseline RUN".into()).into());
    }
    let baseline = match &args.baseline {
        Some(b) => Some(read_entries(b, &args.regression.region)?),
        None => None,
    };
    for c in cases.iter_mut().filter(|c| forced.contains(&c.variant)) {
        c.force = true;
    }
    let e = &args.exec;
    let (mut backend, notice) = backend::select(e.backend, &e.kernels_dir)?;
    let meta = run_meta(e, backend.as_ref(), &paths, "");
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
            let cand = report::compare::entries_from_rows(rows, &args.regression.region);
            let md = dir.path().join("compare.md");
            judge(base, &cand, &args.regression, b, Some(&md))?
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
/// scenarios, backend and row sampling, or its rows would not be one report.
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
    dir.meta_mut().resumed.push(meta.command);
    Ok(dir)
}

/// Compares two finished runs (no GPU): exit 1 on a regression.
pub fn compare(args: &crate::cli::CompareArgs) -> Result<u8> {
    let base = read_entries(&args.baseline, &args.regression.region)?;
    let cand = read_entries(&args.candidate, &args.regression.region)?;
    let regressed = judge(&base, &cand, &args.regression, &args.baseline, None)?;
    Ok(if regressed { exit::CHECK_FAILED } else { exit::OK })
}

/// A run directory's rows.csv, or the CSV itself.
fn read_entries(path: &Path, region: &str) -> Result<Vec<crate::compare::Entry>, InputError> {
    report::compare::check_region(region).map_err(|e| InputError::Usage(format!("--region: {e}")))?;
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
    report::compare::entries_from_csv(&bytes, region, &file.display().to_string())
        .map_err(|e| InputError::Usage(format!("{e:#}")))
}

/// Prints the verdicts (and writes Markdown); true when something regressed.
fn judge(
    base: &[crate::compare::Entry],
    cand: &[crate::compare::Entry],
    gate: &crate::cli::RegressionGate,
    baseline: &Path,
    run_markdown: Option<&Path>,
) -> Result<bool> {
    if !(gate.threshold.is_finite() && gate.threshold >= 0.0) {
        return Err(InputError::Usage(format!("--threshold {}: give a percentage >= 0", gate.threshold)).into());
    }
    let thr = gate.threshold / 100.0;
    let deltas = crate::compare::compare(base, cand, thr);
    if !deltas.iter().any(|d| d.base.is_some() && d.cand.is_some()) {
        return Err(InputError::Usage(format!(
            "no (case, variant) row is in both the baseline ({}) and the candidate; compare runs of the same scenario",
            baseline.display()
        ))
        .into());
    }
    println!(
        "{}",
        report::compare::table(&deltas, std::io::stdout().is_terminal(), gate.show)
    );
    println!(
        "against {}: {}",
        baseline.display(),
        report::compare::summary_line(&deltas)
    );
    let md = report::compare::markdown(&deltas, &baseline.display().to_string(), thr, &gate.region);
    for path in run_markdown.into_iter().chain(gate.markdown.as_deref()) {
        std::fs::write(path, &md).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(deltas.iter().any(|d| d.verdict.is_regression()))
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Fail => "FAIL",
        Status::Error => "ERROR",
        _ => "",
    }
}

pub fn list(args: &ListArgs) -> Result<u8> {
    println!("Variants:");
    for v in REGISTRY {
        println!(
            "  {:<12} {:<4} kernels/{:<15} {}",
            v.name,
            format!("{:?}", v.family).to_lowercase(),
            v.kernel_file,
            v.contract
        );
    }
    println!("\nScenarios in {}:", args.scenarios_dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&args.scenarios_dir)
        .map_err(|e| {
            InputError::Usage(format!(
                "cannot read {}: {e}; pass --scenarios-dir",
                args.scenarios_dir.display()
            ))
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().map(|x| x == "toml").unwrap_or(false))
        .collect();
    files.sort();
    for f in files {
        match scenario::load(&f) {
            Ok(sc) => {
                let ex = scenario::expand(&sc);
                println!("  {:<28} {:>5} cases  {}", f.display(), ex.cases.len(), sc.description);
            }
            Err(e) => println!("  {:<28} INVALID: {e}", f.display()),
        }
    }
    Ok(exit::OK)
}

pub fn plan(args: &PlanArgs) -> Result<u8> {
    let (cases, notes) = resolve_cases(std::slice::from_ref(&args.scenario), &args.cases, &[])?;
    for n in notes {
        println!("note: {n}");
    }
    let mut last_data = String::new();
    for case in &cases {
        let did = data_id(case);
        if did != last_data {
            println!("\n== {did}");
            describe_data(case);
            last_data = did;
        }
        let d = variants::decide(case);
        print!(
            "  {:<12} {:<26}",
            case.variant.to_string(),
            case.id.trim_start_matches(&last_data)
        );
        if let Some(why) = &d.skip {
            println!(" skip: {why}");
            continue;
        }
        println!(" gate: {}{}", d.gate, if d.forced { " [forced]" } else { "" });
        match case.variant {
            VariantId::DcpCombine => println!("      merges the W per-rank (o, lse) with the LSE combine"),
            VariantId::SplitMerge => println!("      merges split partials with the sink (n from the v4_split plan)"),
            _ => match variants::plan(case, &d) {
                Ok(p) => describe_plan(&p, args.items),
                Err(e) => println!("      PLAN ERROR: {e}"),
            },
        }
    }
    Ok(exit::OK)
}

fn describe_data(case: &Case) {
    match &case.params {
        CaseParams::Mla(p) => {
            println!(
                "  batch {} s_q {} heads {}x{}={} {} ctx {:?}",
                p.batch,
                p.s_q,
                p.heads_local,
                p.dcp_world,
                p.heads(),
                p.dtype,
                p.ctx
            );
            if p.dcp_world > 1 {
                for r in 0..p.dcp_world {
                    let l: Vec<usize> = p
                        .ctx
                        .iter()
                        .map(|&l| dcp::local_len(r, l, p.dcp_world, p.interleave))
                        .collect();
                    println!("  rank {r} (S={}) local lengths {:?}", p.interleave, l);
                }
            }
            let (pick, _) = crate::plan::gate::mla_pick(&variants::gate_input(case, p));
            println!(
                "  dispatch on {}: {}",
                case.target,
                pick.map(|v| v.to_string())
                    .unwrap_or_else(|| "unsupported (no eligible kernel)".into())
            );
        }
        CaseParams::V4(p) => {
            let lens: Vec<usize> = p.positions.iter().map(|&pos| variants::v4_row_len(p, pos)).collect();
            println!(
                "  {} rows {} (T={}) heads {} verify {} KV lengths min {} max {} mean {:.0}",
                p.layer,
                p.rows,
                p.padded_rows,
                p.heads,
                p.verify,
                lens.iter().min().unwrap_or(&0),
                lens.iter().max().unwrap_or(&0),
                lens.iter().sum::<usize>() as f64 / lens.len().max(1) as f64
            );
        }
    }
}

fn describe_plan(p: &VariantPlan, items: bool) {
    println!("      plan: {}", variants::summary(p));
    if let VariantPlan::Ps1 { ranks, .. } = p {
        for (r, wl) in ranks.iter().enumerate() {
            let per_cta: Vec<i32> = wl.work_indptr.windows(2).map(|w| w[1] - w[0]).collect();
            println!(
                "      rank {r}: {} items over {} CTAs (per CTA {}..{}), {} split sequences, {} partial rows",
                wl.items.len(),
                wl.num_ctas,
                per_cta.iter().min().unwrap_or(&0),
                per_cta.iter().max().unwrap_or(&0),
                wl.reduce.len(),
                wl.num_partial_rows
            );
            if items {
                for c in 0..wl.num_ctas {
                    for it in &wl.items[wl.work_indptr[c] as usize..wl.work_indptr[c + 1] as usize] {
                        println!(
                            "        cta {c:>3}: seq {:>3} partial {:>5} q [{}, {}) kv [{}, {})",
                            it.seq, it.partial, it.q_start, it.q_end, it.kv_start, it.kv_end
                        );
                    }
                }
            }
        }
    }
}

pub fn kernels(args: &KernelsArgs) -> Result<u8> {
    backend::kernels_check(&args.kernels_dir, args.arch.as_deref(), args.check)
}

pub fn device(args: &crate::cli::DeviceArgs) -> Result<u8> {
    backend::device_report(&args.kernels_dir, !args.no_ceilings)
}

/// Times every split count of each V4 workload, the heuristic's pick and
/// hca_persist; writes splits.csv and splits.svg next to the run's rows.
pub fn splits(args: &crate::cli::SplitsArgs) -> Result<u8> {
    use crate::splits::{Point, Study};
    let (cases, _) = resolve_cases(
        std::slice::from_ref(&args.scenario),
        &args.cases,
        &[VariantId::V4Split, VariantId::HcaPersist],
    )?;
    if let Some(csv) = &args.from {
        return rescore_splits(&cases, csv);
    }
    let e = &args.exec;
    let (mut backend, notice) = backend::select(e.backend, &e.kernels_dir)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let opts = run_options(e, backend.as_ref(), true, true);
    let meta = run_meta(e, backend.as_ref(), std::slice::from_ref(&args.scenario), "splits-");
    let mut dir = RunDir::create(&e.out, meta)?;
    // One study per workload: the first case of each data id is its template.
    let mut seen = std::collections::HashSet::new();
    let bases: Vec<&Case> = cases.iter().filter(|c| seen.insert(data_id(c))).collect();
    let progress = Progress::new((bases.len() * 17) as u64, false);
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
        let bound = crate::plan::v4::kv_len_bound(p.layer, p.index_topk, p.max_model_len);
        let pick = crate::plan::v4::v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, base.cus, None);
        let lens: Vec<usize> = p.positions.iter().map(|&pos| variants::v4_row_len(p, pos)).collect();
        let mut study = Study {
            data_id: data_id(base),
            layer: p.layer.to_string(),
            rows: p.rows,
            heads: p.heads,
            mean_len: lens.iter().sum::<usize>() as f64 / lens.len().max(1) as f64,
            heuristic_n: pick.n,
            heuristic_source: format!("{:?}", pick.source).to_lowercase(),
            points: vec![],
            hca: None,
            hca_gate: None,
        };
        for n in 1..=16 {
            let mut c = base.clone();
            c.variant = VariantId::V4Split;
            c.v4.splits = Some(n);
            c.id = format!("{}-n{n}", study.data_id);
            progress.start(&c.key());
            let out = runner::run_case(&c, &mut caches, backend.as_mut(), &opts);
            if let Some(pt) = point(&out.row, n) {
                study.points.push(pt);
            }
            dir.push(out.row)?;
            progress.inc();
        }
        let mut c = base.clone();
        c.variant = VariantId::HcaPersist;
        c.id = study.data_id.clone();
        progress.start(&c.key());
        let d = variants::decide(&c);
        let out = runner::run_case(&c, &mut caches, backend.as_mut(), &opts);
        match d.fallback {
            Some(why) => study.hca_gate = Some(why),
            None => study.hca = point(&out.row, 0),
        }
        dir.push(out.row)?;
        progress.inc();
        studies.push(study);
    }
    progress.finish();
    dir.finish(|_| ())?;
    std::fs::write(dir.path().join("splits.csv"), report::splits::csv(&studies)?)?;
    std::fs::write(dir.path().join("splits.svg"), report::splits::svg(&studies)?)?;
    // The run's JSON writer: non-finite timings stay visible instead of turning into null.
    let json = serde_json::to_string_pretty(&studies)?;
    std::fs::write(dir.path().join("splits.json"), json)?;
    println!("{}", report::splits::table(&studies));
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
    let bound = crate::plan::v4::kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    let plan = crate::plan::v4::v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, c.cus, None);
    Some((plan.n, format!("{:?}", plan.source).to_lowercase()))
}

/// `splits --from`: today's heuristic scored on a committed run's timings.
fn rescore_splits(cases: &[Case], csv_path: &Path) -> Result<u8> {
    use crate::splits::{Point, Study};
    let mut rdr = csv::Reader::from_path(csv_path)
        .map_err(|e| InputError::Usage(format!("--from {}: {e}", csv_path.display())))?;
    let mut studies: Vec<Study> = Vec::new();
    for rec in rdr.deserialize::<std::collections::HashMap<String, String>>() {
        let r = rec.map_err(|e| InputError::Usage(format!("--from {}: {e}", csv_path.display())))?;
        let get = |k: &str| r.get(k).cloned().unwrap_or_default();
        let num = |k: &str| get(k).parse::<f64>().unwrap_or(f64::NAN);
        let id = get("data_id");
        let Some(case) = cases.iter().find(|c| data_id(c) == id) else {
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
    println!("{}", report::splits::table(&studies));
    println!(
        "(re-scored from {}: timings of that run, today's heuristic)",
        csv_path.display()
    );
    Ok(exit::OK)
}
