//! The commands that describe without measuring: list, plan, kernels, device.

use anyhow::Result;
use std::path::PathBuf;

use crate::backend;
use crate::case::{Case, CaseParams, PoolOrder};
use crate::cli::{KernelsArgs, ListArgs, PlanArgs};
use crate::error::{exit, InputError};
use crate::scenario;
use crate::variants::{self, VariantId, VariantPlan, REGISTRY};
use crate::workload::dcp;

use super::resolve_cases;

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
        if let Some(why) = v.nondeterministic {
            println!("  {:<12} not bit-deterministic: {why}", "");
        }
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
    let w = files.iter().map(|f| f.display().to_string().len()).max().unwrap_or(0);
    for f in files {
        match scenario::load(&f) {
            Ok(sc) => {
                let ex = scenario::expand(&sc);
                println!("  {:<w$} {:>5} cases  {}", f.display(), ex.cases.len(), sc.description);
            }
            Err(e) => println!("  {:<w$} INVALID: {e}", f.display()),
        }
    }
    Ok(exit::OK)
}

pub fn plan(args: &PlanArgs) -> Result<u8> {
    let (mut cases, notes) = resolve_cases(std::slice::from_ref(&args.scenario), &args.cases, &[])?;
    for c in &mut cases {
        c.ps1_schedule = args.ps1_schedule;
    }
    for n in notes {
        println!("note: {n}");
    }
    let mut last_data = String::new();
    for case in &cases {
        if case.data_id != last_data {
            println!("\n== {}", case.data_id);
            describe_data(case);
            last_data = case.data_id.clone();
        }
        let d = variants::decide(case);
        // The id's knobs (`-p64`, `-n4`): what tells this case from its data.
        let shape = last_data.split('@').next().unwrap_or(&last_data);
        let knobs = case
            .id
            .strip_prefix(shape)
            .and_then(|k| k.split('@').next())
            .unwrap_or(&case.id);
        print!("  {:<12} {:<26}", case.variant.to_string(), knobs);
        if let Some(why) = &d.skip {
            println!(" skip: {why}");
            continue;
        }
        println!(" gate: {}{}", d.gate, if d.forced { " [forced]" } else { "" });
        let plan = match case.variant {
            VariantId::DcpCombine => {
                println!("      merges the W per-rank (o, lse) with the LSE combine; empty ranks get NaN o and a -inf/+inf/NaN lse");
                None
            }
            VariantId::SplitMerge => {
                println!("      merges split partials with the sink (n from the v4_split plan); empty splits get NaN o and a -inf/+inf/NaN lse");
                None
            }
            _ => match variants::plan(case, &d) {
                Ok(p) => {
                    describe_plan(&p, args.items);
                    Some(p)
                }
                Err(e) => {
                    println!("      PLAN ERROR: {e}");
                    continue;
                }
            },
        };
        println!(
            "      edges: {}",
            crate::plan::edges::describe(&variants::edges(case, plan.as_ref()))
        );
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
            if p.pool == PoolOrder::Contiguous {
                println!("  pool: contiguous (pages in pool order)");
            }
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
