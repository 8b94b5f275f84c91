//! `mlabench plan`: each case's data, gate, plan and length edges, without
//! building or running anything.

use anyhow::Result;

use crate::case::{Case, CaseParams, PoolOrder};
use crate::cli::PlanArgs;
use crate::error::{exit, InputError};
use crate::variants::{self, edges, mla, v4};

use super::resolve_cases;

pub fn plan(args: &PlanArgs) -> Result<u8> {
    let added = super::declare_impls(&args.impls)?;
    let (mut cases, notes) = resolve_cases(std::slice::from_ref(&args.scenario), &args.cases, &[], &added)?;
    let schedule = args.ps1_schedule.parse().map_err(InputError::Usage)?;
    let v4_core = args.v4_core.parse().map_err(InputError::Usage)?;
    for c in &mut cases {
        c.ps1_schedule = schedule;
        c.v4_core = v4_core;
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
        if let (Some(n), Some(p)) = (case.dcp_devices, case.mla()) {
            println!("      {}", group_line(n, p.dcp.world, case.dcp_reduce));
        }
        let unit = case.variant.unit();
        let plan = match unit.plan_note() {
            Some(note) => {
                println!("      {note}");
                None
            }
            None => match unit.plan(case, &d, None) {
                Ok(p) => {
                    println!("      plan: {}", unit.summary(&p));
                    for line in unit.details(&p, args.items) {
                        println!("      {line}");
                    }
                    Some(p)
                }
                Err(e) => {
                    println!("      PLAN ERROR: {e}");
                    continue;
                }
            },
        };
        println!("      edges: {}", edges::describe(&unit.edges(case, plan.as_ref())));
    }
    Ok(exit::OK)
}

/// Where a `-g<N>` case's ranks run and what crosses the GPUs.
fn group_line(n: usize, world: usize, reduce: crate::dcp::Reduce) -> String {
    let k = world / n.max(1);
    let gpus: Vec<String> = (0..n)
        .map(|g| match k {
            1 => format!("GPU {g}: r{g}"),
            _ => format!("GPU {g}: r{}-r{}", g * k, g * k + k - 1),
        })
        .collect();
    format!(
        "DCP group on {} ({}): Q all-gather, each rank's decode, LSE all-gather, local combine, {reduce} reduce-scatter (NCCL)",
        crate::backend::gpus(n),
        gpus.join(", ")
    )
}

fn describe_data(case: &Case) {
    match &case.params {
        CaseParams::Mla(p) => {
            println!(
                "  batch {} s_q {} heads {} {} ctx {:?}",
                p.batch,
                p.s_q,
                p.heads_label(),
                p.dtype,
                p.ctx
            );
            if p.pool == PoolOrder::Contiguous {
                println!("  pool: contiguous (pages in pool order)");
            }
            if p.dcp.sharded() {
                for r in p.dcp.ranks() {
                    let l = mla::local_lens(p, r);
                    println!("  rank {r} (S={}) local lengths {:?}", p.dcp.interleave, l);
                }
            }
            let (pick, _) = variants::mla_dispatch(&mla::gate_input(case, p));
            println!(
                "  dispatch on {}: {}",
                case.target,
                pick.map(|v| v.to_string())
                    .unwrap_or_else(|| "unsupported (no eligible kernel)".into())
            );
        }
        CaseParams::V4(p) => {
            let lens: Vec<usize> = p.positions.iter().map(|&pos| v4::row_len(p, pos)).collect();
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
