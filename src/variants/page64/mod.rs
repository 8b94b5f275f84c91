//! page64: the non-persistent MLA decode fallback over 64-token pages
//! (SPEC §1 "Variant page64"): a grid over (head group, split, sequence),
//! the split count from aiter's heuristic, the bottom-right mask on local
//! positions. Without `g_kv_indptr` it cannot mask on global positions, so
//! the gate keeps it off speculative decode under DCP.

pub mod gate;
pub mod split;

use rayon::prelude::*;
use std::collections::BTreeSet;

use super::edges::{union, Edge};
use super::emulate::{poison, wanted, Emulation, Fault};
use super::heads;
use super::mla::emulate::{merge_chunks, mla_chunk, mla_tensors, write_final, Chunk, RankOut, Span};
use super::mla::gate::{GateInput, Verdict};
use super::mla::{self, kernel, program::Rank};
use super::program::{Arg, Call, Fill, Program, Smem};
use super::{
    Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId, VariantInfo,
};
use crate::case::{Case, Dtype, MLA_D_V};
use crate::reference::RefSet;
use crate::result::Check;
use crate::workload::Workload;
use split::page64_split_ranges;

pub const ID: VariantId = VariantId("page64");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::MlaDecode,
    family: Family::Mla,
    kernel_file: "page64.cu",
    contract: "non-persistent fallback, page size 64, split heuristic, local bottom-right mask; heads multiple of 16 up to 128; stage 1 partials + stage 2 merge",
    nondeterministic: None,
    native_page_size: 64,
    takes_split_axis: false,
};

/// The plan: the padded width and each DCP rank's split count.
pub struct Page64Plan {
    pub kernel_heads: usize,
    pub splits: Vec<usize>,
}

pub struct Page64;

/// The kernel configuration for `hk` heads.
pub fn spec(hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    kernel::spec("page64.cu", &["page64_fwd", "page64_merge"], hk, fp8, mt)
}

impl Variant for Page64 {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn mla_gate(&self, g: &GateInput) -> Option<Verdict> {
        Some(gate::gate(g))
    }

    fn decide(&self, case: &Case) -> Decision {
        let hard = case
            .mla()
            .is_some_and(|p| p.page_size != 64 || heads::page64_heads(p.heads()).is_err());
        mla::decide(case, gate::gate, hard)
    }

    fn plan(&self, case: &Case, _: &Decision, _: Option<PlanData>) -> Result<Plan, PlanError> {
        let err = |what: String| PlanError::new(&case.key(), what);
        let p = mla::params(case).map_err(err)?;
        let kernel_heads = heads::page64_heads(p.heads()).map_err(|e| err(e.to_string()))?;
        let splits = p
            .dcp
            .ranks()
            .map(|r| {
                let total: usize = mla::local_lens(p, r).iter().sum();
                split::fallback_splits(p.batch, total, kernel_heads, p.s_q, p.dtype, case.cus)
            })
            .collect();
        Ok(Plan::new(Page64Plan { kernel_heads, splits }))
    }

    fn summary(&self, plan: &Plan) -> String {
        let Some(Page64Plan { kernel_heads, splits }) = plan.of::<Page64Plan>() else {
            return String::new();
        };
        let lo = splits.iter().min().copied().unwrap_or(0);
        let hi = splits.iter().max().copied().unwrap_or(0);
        if lo == hi {
            format!("h{kernel_heads} splits={lo}")
        } else {
            format!("h{kernel_heads} splits={lo}..{hi}")
        }
    }

    fn cost(&self, job: &Job) -> Cost {
        let Some(p) = job.plan.of::<Page64Plan>() else {
            return Cost::default();
        };
        let rows = job.case.mla().map_or(0, |m| m.total_q());
        let partial_rows = if p.splits[0] > 1 { rows * p.splits[0] } else { 0 };
        mla::cost(job, p.kernel_heads, partial_rows)
    }

    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<Edge> {
        let (Some(p), Some(plan)) = (case.mla(), plan.and_then(|p| p.of::<Page64Plan>())) else {
            return BTreeSet::new();
        };
        let mut seqs = Vec::new();
        for (r, &n) in plan.splits.iter().enumerate() {
            for len in mla::local_lens(p, r) {
                seqs.push((len, page64_split_ranges(len, n)));
            }
        }
        union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        kernel::every_shape(spec)
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        match (case.mla(), &d.skip) {
            (Some(p), None) => heads::page64_heads(p.heads())
                .map(|hk| vec![spec(hk, p.dtype == Dtype::Fp8, kernel::mla_mt(hk, p.s_q))])
                .unwrap_or_default(),
            _ => vec![],
        }
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        mla::checks::decode(job, refs, out, replays)
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        let (Workload::Mla(w), Some(plan)) = (job.workload, job.plan.of::<Page64Plan>()) else {
            return Err("page64 was handed another variant's plan or workload".into());
        };
        let (p, hk) = (&w.p, plan.kernel_heads);
        let outs = p
            .dcp
            .ranks()
            .map(|r| {
                let sh = &w.shards[r];
                let n_split = plan.splits[r];
                // The fallback's own mask: bottom-right on local positions.
                let vis_end = |i: usize| {
                    let b = i / p.s_q;
                    (sh.local_lens[b] + i % p.s_q + 1).saturating_sub(p.s_q)
                };
                let overlap = emu.has(Fault::Page64SplitOverlap);
                let tasks: Vec<(usize, usize, usize)> = (0..p.batch)
                    .filter(|&b| wanted(job.rows, b * p.s_q, (b + 1) * p.s_q))
                    .flat_map(|b| {
                        let len = sh.local_lens[b];
                        page64_split_ranges(len, n_split).into_iter().map(move |(a, e)| {
                            let e = if overlap && a < e && e < len { e + 1 } else { e };
                            (b, a, e)
                        })
                    })
                    .collect();
                let chunks: Vec<(usize, Chunk)> = tasks
                    .par_iter()
                    .map(|&(b, a, e)| {
                        let span = Span {
                            seq: b,
                            q: (b * p.s_q, (b + 1) * p.s_q),
                            kv: (a, e),
                        };
                        (b, mla_chunk(w, sh, span, hk, &vis_end, emu))
                    })
                    .collect();
                let mut out = RankOut {
                    o: poison(p.total_q() * hk * MLA_D_V),
                    lse: poison(p.total_q() * hk),
                };
                for b in 0..p.batch {
                    let parts: Vec<&Chunk> = chunks.iter().filter(|(s, _)| *s == b).map(|(_, c)| c).collect();
                    match parts.len() {
                        0 => {}
                        1 => write_final(&mut out, hk, parts[0]),
                        _ => merge_chunks(&mut out, hk, &parts, emu),
                    }
                }
                out
            })
            .collect();
        Ok(mla_tensors(w, outs, hk))
    }

    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        let (Workload::Mla(w), Some(plan)) = (job.workload, job.plan.of::<Page64Plan>()) else {
            return Err("page64 was handed another variant's plan or workload".into());
        };
        let (hk, fp8) = (plan.kernel_heads, w.p.dtype == Dtype::Fp8);
        let mt = kernel::mla_mt(hk, w.p.s_q);
        let k = spec(hk, fp8, mt);
        let shape = kernel::mla_shape(fp8, mt);
        let smem = kernel::mla_smem(fp8, mt, shape);
        let n = w.p.total_q();
        let mut programs = Vec::with_capacity(plan.splits.len());
        for (r, &ns) in plan.splits.iter().enumerate() {
            let mut p = Program::default();
            let b = Rank::add(&mut p, w, r, hk);
            let parts = if ns > 1 { n * ns } else { 1 };
            let part_o = p.poisoned("partials", parts * hk * MLA_D_V * 4, Fill::F32);
            let part_lse = p.poisoned("partial lse", parts * hk * 4, Fill::F32);
            p.calls.push(Call {
                kernel: k.clone(),
                entry: "page64_fwd",
                grid: ((hk / 16) as u32, ns as u32, w.p.batch as u32),
                block: 32 * shape.warps as u32,
                smem: Smem::Fixed(smem),
                args: vec![
                    Arg::Buf(b.q),
                    Arg::Buf(b.kv),
                    Arg::Buf(b.kv_indptr),
                    Arg::Buf(b.kv_indices),
                    Arg::Buf(b.last_page),
                    Arg::Buf(b.qo_indptr),
                    Arg::F32(w.q_scale),
                    Arg::F32(w.kv_scale),
                    Arg::F32(w.p.sm_scale as f32),
                    Arg::I32(ns as i32),
                    Arg::Buf(b.o),
                    Arg::Buf(b.lse),
                    Arg::Buf(part_o),
                    Arg::Buf(part_lse),
                ],
                second: false,
                dependent: false,
            });
            if ns > 1 {
                p.calls.push(Call {
                    kernel: k.clone(),
                    entry: "page64_merge",
                    grid: (n as u32, hk as u32, 1),
                    block: 128,
                    smem: Smem::DependentMerge { blocks: n * hk },
                    args: vec![
                        Arg::Buf(part_o),
                        Arg::Buf(part_lse),
                        Arg::I32(ns as i32),
                        Arg::Buf(b.o),
                        Arg::Buf(b.lse),
                    ],
                    second: true,
                    dependent: true,
                });
            }
            programs.push(p);
        }
        Ok(programs)
    }
}
