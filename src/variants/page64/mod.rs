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
use super::mla::kernel::{self, Core};
use super::mla::{self, program::Rank};
use super::program::{Arg, Call, Fill, Program, Smem, TileMap};
use super::{
    Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId, VariantInfo,
};
use crate::case::{Case, Dtype, MLA_D_QK, MLA_D_V};
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::{MmaKind, MmaMix};
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

/// The plan: the padded width, the core and each DCP rank's split count.
pub struct Page64Plan {
    pub kernel_heads: usize,
    pub core: Core,
    pub core_reason: String,
    /// CTAs per (sequence, split) the split search counts (SPEC's `tg_factor`).
    pub tg_factor: usize,
    pub splits: Vec<usize>,
}

/// The split search's `tg_factor` for a core, as aiter's callers set it: the
/// wgmma core launches a CTA per 64-row block, as aiter's V4 kernel does per
/// 64 heads (its wrapper passes `ceil(H/64)`); the mma core's head groups
/// count once, as aiter's V3 caller leaves it at 1.
/// Counted as 1, a 768-row sequence of 12 row blocks looks like a twelfth
/// of a wave and takes two splits, whose merge cost 11% at B64 H96 s_q 8.
pub fn split_tg_factor(core: Core, kernel_heads: usize, s_q: usize) -> usize {
    match core {
        Core::Wg => kernel::wg_row_blocks(kernel_heads, s_q),
        Core::Mma { .. } => 1,
    }
}

/// One rank's split count: SPEC's search with the `tg_factor` of the core
/// these heads and `s_q` run on (the plan, and the memory budget without one).
pub fn rank_splits(batch: usize, total_kv: usize, kernel_heads: usize, s_q: usize, dtype: Dtype, cus: usize) -> usize {
    let core = kernel::mla_core(kernel_heads, s_q, dtype == Dtype::Fp8).0;
    let tg = split_tg_factor(core, kernel_heads, s_q);
    split::fallback_splits(batch, total_kv, kernel_heads, s_q, dtype, cus, tg)
}

pub struct Page64;

/// The kernel configuration for `hk` heads.
pub fn spec(hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    kernel::spec("page64.cu", &["page64_fwd", "page64_merge"], hk, fp8, mt)
}

/// The wgmma core's configuration for `hk` heads.
pub fn spec_wg(hk: usize, fp8: bool) -> KernelSpec {
    kernel::wg_spec("page64_wg.cu", &["page64_fwd", "page64_merge"], hk, fp8)
}

fn core_spec(core: Core, hk: usize, fp8: bool) -> KernelSpec {
    match core {
        Core::Wg => spec_wg(hk, fp8),
        Core::Mma { mt } => spec(hk, fp8, mt),
    }
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
        let (core, core_reason) = kernel::mla_core(kernel_heads, p.s_q, p.dtype == Dtype::Fp8);
        let tg_factor = split_tg_factor(core, kernel_heads, p.s_q);
        let splits = p
            .dcp
            .ranks()
            .map(|r| {
                let total: usize = mla::local_lens(p, r).iter().sum();
                rank_splits(p.batch, total, kernel_heads, p.s_q, p.dtype, case.cus)
            })
            .collect();
        Ok(Plan::new(Page64Plan {
            kernel_heads,
            core,
            core_reason,
            tg_factor,
            splits,
        }))
    }

    fn summary(&self, plan: &Plan) -> String {
        let Some(Page64Plan {
            kernel_heads,
            core,
            splits,
            ..
        }) = plan.of::<Page64Plan>()
        else {
            return String::new();
        };
        let lo = splits.iter().min().copied().unwrap_or(0);
        let hi = splits.iter().max().copied().unwrap_or(0);
        let core = core.name();
        if lo == hi {
            format!("h{kernel_heads} core={core} splits={lo}")
        } else {
            format!("h{kernel_heads} core={core} splits={lo}..{hi}")
        }
    }

    fn details(&self, plan: &Plan, _items: bool) -> Vec<String> {
        let Some(p) = plan.of::<Page64Plan>() else {
            return vec![];
        };
        vec![
            format!("core {} ({})", p.core.name(), p.core_reason),
            format!(
                "split search: tg_factor {} (CTAs per sequence and split it counts)",
                p.tg_factor
            ),
        ]
    }

    fn cost(&self, job: &Job) -> Cost {
        let Some(p) = job.plan.of::<Page64Plan>() else {
            return Cost::default();
        };
        let rows = job.case.mla().map_or(0, |m| m.total_q());
        let partial_rows = if p.splits[0] > 1 { rows * p.splits[0] } else { 0 };
        mla::cost(job, p.kernel_heads, partial_rows)
    }

    fn tensor_mix(&self, job: &Job) -> MmaMix {
        match job.plan.of::<Page64Plan>() {
            Some(p) => kernel::tensor_mix(p.core, job.case.mla().is_some_and(|m| m.dtype == Dtype::Fp8)),
            None => MmaMix::one(MmaKind::MmaSyncBf16),
        }
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
        kernel::every_shape(spec, spec_wg)
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        match (case.mla(), &d.skip) {
            (Some(p), None) => heads::page64_heads(p.heads())
                .map(|hk| {
                    let fp8 = p.dtype == Dtype::Fp8;
                    vec![core_spec(kernel::mla_core(hk, p.s_q, fp8).0, hk, fp8)]
                })
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
        let k = core_spec(plan.core, hk, fp8);
        // The wgmma core: one CTA per 64-row block, adjacent for a split.
        let (row_groups, block, smem) = match plan.core {
            Core::Wg => (
                kernel::wg_row_blocks(hk, w.p.s_q),
                kernel::WG_THREADS,
                kernel::wg_smem(),
            ),
            Core::Mma { mt } => {
                let shape = kernel::mla_shape(fp8, mt);
                (hk / 16, 32 * shape.warps as u32, kernel::mla_smem(fp8, mt, shape))
            }
        };
        let n = w.p.total_q();
        let mut programs = Vec::with_capacity(plan.splits.len());
        for (r, &ns) in plan.splits.iter().enumerate() {
            let mut p = Program::default();
            let b = Rank::add(&mut p, w, r, hk);
            let parts = if ns > 1 { n * ns } else { 1 };
            let part_o = p.poisoned("partials", parts * hk * MLA_D_V * 4, Fill::F32);
            let part_lse = p.poisoned("partial lse", parts * hk * 4, Fill::F32);
            let mut args = vec![
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
            ];
            // The wgmma core copies whole bf16 pages by TMA (kernels/ABI.md).
            if plan.core == Core::Wg && !fp8 {
                args.push(Arg::TileMap(TileMap {
                    buf: b.kv,
                    row_elems: MLA_D_QK as u32,
                    row_bytes: (MLA_D_QK * 2) as u32,
                    box_rows: 64,
                }));
            }
            p.calls.push(Call {
                kernel: k.clone(),
                entry: "page64_fwd",
                grid: (row_groups as u32, ns as u32, w.p.batch as u32),
                block,
                smem: Smem::Fixed(smem),
                args,
                second: false,
                dependent: false,
            });
            if ns > 1 {
                p.calls.push(Call {
                    kernel: k.clone(),
                    entry: "page64_merge",
                    grid: (n as u32, hk as u32, 1),
                    block: 128,
                    smem: Smem::DependentMerge,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::cases_of;
    use crate::workload;

    #[test]
    fn the_wgmma_core_grid_is_row_blocks_by_splits_by_sequences() {
        let c = cases_of(
            "[[mla]]\nbatch = 3\ncontext = 640\nheads_local = 16\ns_q = 4\nvariants = [\"page64\"]\ndtype = \"bf16\"\n",
        )
        .remove(0);
        let d = Page64.decide(&c);
        let plan = Page64.plan(&c, &d, None).unwrap();
        let p = plan.of::<Page64Plan>().unwrap();
        assert_eq!(p.core, Core::Wg, "{}", p.core_reason);
        let wl = workload::build(&c).unwrap();
        let job = Job {
            case: &c,
            workload: &wl,
            plan: &plan,
            rows: &[],
        };
        let call = &Page64.programs(&job).unwrap()[0].calls[0];
        assert_eq!(call.kernel.file, "page64_wg.cu");
        assert_eq!(call.grid, (1, p.splits[0] as u32, 3));
        assert_eq!(call.block, kernel::WG_THREADS);
        assert_eq!(call.smem, Smem::Fixed(kernel::wg_smem()));
        // bf16 pages by TMA: the pool as rows of 576 bf16, 64-token boxes.
        let Some(Arg::TileMap(m)) = call.args.last() else {
            panic!("no tile map last: {:?}", call.args)
        };
        assert_eq!(call.args[1], Arg::Buf(m.buf), "the map covers the kv pool");
        assert_eq!((m.row_elems, m.row_bytes, m.box_rows), (576, 1152, 64));
        let pool_rows = m.rows(wl.mla().unwrap().shards[0].pool.as_bytes().len());
        assert_eq!(pool_rows as usize % 64, 0, "whole pages");
        assert!(pool_rows >= 3 * 640, "every token of every sequence: {pool_rows}");
    }

    #[test]
    fn the_split_search_counts_the_wgmma_cores_row_blocks() {
        // B64 L4096: 768 rows at H96 s_q 8 make 12 row blocks a sequence, so
        // one split already fills 5.8 waves; H32 s_q 1 stays on the mma core.
        let cases = cases_of(
            "[[mla]]\nbatch = 64\ncontext = 4096\nheads_local = [32, 96]\ns_q = [1, 8]\nvariants = [\"page64\"]\ndtype = \"bf16\"\n",
        );
        let mut seen = Vec::new();
        for c in &cases {
            let plan = Page64.plan(c, &Page64.decide(c), None).unwrap();
            let p = plan.of::<Page64Plan>().unwrap();
            let m = c.mla().unwrap();
            let rows = p.kernel_heads * m.s_q;
            let tg = if p.core == Core::Wg {
                rows.div_ceil(kernel::WG_ROWS)
            } else {
                1
            };
            assert_eq!(p.tg_factor, tg, "{}", c.key());
            let want = split::fallback_splits(64, 64 * 4096, p.kernel_heads, m.s_q, Dtype::Bf16, c.cus, tg);
            assert_eq!(p.splits, vec![want], "{}", c.key());
            seen.push((p.kernel_heads, m.s_q, p.splits[0]));
        }
        seen.sort();
        // Counted as one CTA a sequence, 64 sequences would take 2 splits.
        assert_eq!(split::fallback_splits(64, 64 * 4096, 96, 8, Dtype::Bf16, 132, 1), 2);
        assert_eq!(seen, vec![(32, 1, 2), (32, 8, 1), (96, 1, 1), (96, 8, 1)]);
    }

    #[test]
    fn only_the_bf16_wgmma_core_takes_a_tile_map() {
        let cases = cases_of(
            "[[mla]]\nbatch = 2\ncontext = 200\nheads_local = [16, 64]\ns_q = [1, 4]\nvariants = [\"page64\"]\ndtype = [\"bf16\", \"fp8\"]\n",
        );
        assert_eq!(cases.len(), 8);
        for c in &cases {
            let d = Page64.decide(c);
            let plan = Page64.plan(c, &d, None).unwrap();
            let p = plan.of::<Page64Plan>().unwrap();
            let wl = workload::build(c).unwrap();
            let job = Job {
                case: c,
                workload: &wl,
                plan: &plan,
                rows: &[],
            };
            let prog = &Page64.programs(&job).unwrap()[0];
            prog.validate().unwrap();
            let maps = prog.calls[0]
                .args
                .iter()
                .filter(|a| matches!(a, Arg::TileMap(_)))
                .count();
            let fp8 = wl.mla().unwrap().p.dtype == Dtype::Fp8;
            assert_eq!(maps, usize::from(p.core == Core::Wg && !fp8), "{}", c.key());
            assert_eq!(prog.calls[0].args.len(), 14 + maps, "{}", c.key());
        }
    }
}
