//! ps1: the persistent MLA decode kernel over a page-size-1 pool, with a
//! host-built work list and the causal mask on global DCP positions (SPEC
//! §1 "Variant ps1"): the kernel seed 000's speculative decode under DCP
//! needs. Widths 16..128 at s_q 1, 16 up to s_q 4 and 96 up to s_q 8; f32
//! partials of split sequences, merged by `ps1_reduce`.

pub mod balance;
pub mod gate;
pub mod worklist;

use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

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
use crate::case::{Case, Dtype, Ps1Schedule, MLA_D_V};
use crate::reference::RefSet;
use crate::result::Check;
use crate::workload::Workload;
use balance::{build_balanced, BalanceOptions, BALANCED_OVERHEAD_TOKENS};
use worklist::{build_worklist, WorkList, KV_GRANULARITY, MAX_SPLITS};

pub const ID: VariantId = VariantId("ps1");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::MlaDecode,
    family: Family::Mla,
    kernel_file: "ps1.cu",
    contract: "persistent MLA decode, page size 1, host work list, causal mask on global DCP positions; widths 16..128 (s_q=1), 16 (s_q<=4) and 96 (s_q<=8); f32 partials + reduce",
    nondeterministic: None,
    native_page_size: 1,
    takes_split_axis: false,
};

/// The plan: the padded width and one work list per DCP rank.
pub struct Ps1Plan {
    pub kernel_heads: usize,
    pub ranks: Vec<WorkList>,
}

pub struct Ps1;

/// The kernel configuration for `hk` heads.
pub fn spec(hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    // fp8 loads whole 128-byte lines per cp.async (scattered 576-byte rows
    // otherwise fill the SM's outstanding-request queue); Q's loads overlap
    // the first KV tiles'.
    kernel::spec("ps1.cu", &["ps1_fwd", "ps1_reduce"], hk, fp8, mt)
        .define("LD_LINES", fp8 as u8)
        .define("EARLY_Q", 1)
}

impl Variant for Ps1 {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn mla_gate(&self, g: &GateInput) -> Option<Verdict> {
        Some(gate::gate(g))
    }

    fn decide(&self, case: &Case) -> Decision {
        // A page size or a width it has no code for cannot be forced.
        let hard = case
            .mla()
            .is_some_and(|p| p.page_size != 1 || heads::kernel_heads(p.heads(), p.s_q).is_err());
        mla::decide(case, gate::gate, hard)
    }

    fn plan(&self, case: &Case, _: &Decision, _: Option<PlanData>) -> Result<Plan, PlanError> {
        let err = |what: String| PlanError::new(&case.key(), what);
        let p = mla::params(case).map_err(err)?;
        let kernel_heads = heads::kernel_heads(p.heads(), p.s_q).map_err(|e| err(e.to_string()))?;
        let qo: Vec<i32> = (0..=p.batch).map(|b| (b * p.s_q) as i32).collect();
        let shape = kernel::mla_shape(p.dtype == Dtype::Fp8, kernel::mla_mt(kernel_heads, p.s_q));
        let ranks = p
            .dcp
            .ranks()
            .map(|r| {
                let lens = mla::local_lens(p, r);
                // Both schedulers end in `assemble`, which checks SPEC's invariants.
                match case.ps1_schedule {
                    Ps1Schedule::Payload => {
                        build_worklist(&case.key(), &lens, &qo, case.cus, KV_GRANULARITY, MAX_SPLITS)
                    }
                    Ps1Schedule::Balanced => {
                        let opts = BalanceOptions {
                            num_ctas: case.cus,
                            granularity: KV_GRANULARITY,
                            max_splits: MAX_SPLITS,
                            // One unit: the tokens a pass of all consumer groups covers.
                            unit_tokens: shape.bn * shape.groups,
                            overhead_tokens: BALANCED_OVERHEAD_TOKENS,
                        };
                        build_balanced(&case.key(), &lens, &qo, &opts)
                    }
                }
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        Ok(Plan::new(Ps1Plan { kernel_heads, ranks }))
    }

    fn summary(&self, plan: &Plan) -> String {
        let Some(Ps1Plan { kernel_heads, ranks }) = plan.of::<Ps1Plan>() else {
            return String::new();
        };
        let items: usize = ranks.iter().map(|w| w.items.len()).sum();
        let parts: usize = ranks.iter().map(|w| w.reduce.len()).sum();
        let busy = ranks.iter().map(|w| w.busy_ctas()).min().unwrap_or(0);
        // Always named: rows of runs before the default changed say nothing.
        let schedule = ranks
            .first()
            .map(|w| format!(" schedule={}", w.schedule))
            .unwrap_or_default();
        format!(
            "h{kernel_heads} items={items} split-seqs={parts} ctas={} busy={busy}{schedule}",
            ranks.first().map(|w| w.num_ctas).unwrap_or(0)
        )
    }

    fn details(&self, plan: &Plan, items: bool) -> Vec<String> {
        let Some(p) = plan.of::<Ps1Plan>() else { return vec![] };
        let mut out = Vec::new();
        for (r, wl) in p.ranks.iter().enumerate() {
            let per_cta: Vec<i32> = wl.work_indptr.windows(2).map(|w| w[1] - w[0]).collect();
            out.push(format!(
                "rank {r}: {} items over {} CTAs (per CTA {}..{}), {} split sequences, {} partial rows",
                wl.items.len(),
                wl.num_ctas,
                per_cta.iter().min().unwrap_or(&0),
                per_cta.iter().max().unwrap_or(&0),
                wl.reduce.len(),
                wl.num_partial_rows
            ));
            if items {
                for c in 0..wl.num_ctas {
                    for it in &wl.items[wl.work_indptr[c] as usize..wl.work_indptr[c + 1] as usize] {
                        out.push(format!(
                            "  cta {c:>3}: seq {:>3} partial {:>5} q [{}, {}) kv [{}, {})",
                            it.seq, it.partial, it.q_start, it.q_end, it.kv_start, it.kv_end
                        ));
                    }
                }
            }
        }
        out
    }

    fn cost(&self, job: &Job) -> Cost {
        match job.plan.of::<Ps1Plan>() {
            Some(p) => mla::cost(job, p.kernel_heads, p.ranks[0].num_partial_rows),
            None => Cost::default(),
        }
    }

    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<Edge> {
        let (Some(p), Some(plan)) = (case.mla(), plan.and_then(|p| p.of::<Ps1Plan>())) else {
            return BTreeSet::new();
        };
        let mut seqs = Vec::new();
        for (r, wl) in plan.ranks.iter().enumerate() {
            let lens = mla::local_lens(p, r);
            let mut by: BTreeMap<(i32, i32), Vec<(usize, usize)>> = BTreeMap::new();
            for it in &wl.items {
                by.entry((it.seq, it.q_start))
                    .or_default()
                    .push((it.kv_start as usize, it.kv_end as usize));
            }
            for ((seq, _), mut pieces) in by {
                pieces.sort_unstable();
                seqs.push((lens[seq as usize], pieces));
            }
        }
        union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        kernel::every_shape(spec)
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        match (case.mla(), &d.skip) {
            (Some(p), None) => heads::kernel_heads(p.heads(), p.s_q)
                .map(|hk| vec![spec(hk, p.dtype == Dtype::Fp8, kernel::mla_mt(hk, p.s_q))])
                .unwrap_or_default(),
            _ => vec![],
        }
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        mla::checks::decode(job, refs, out, replays)
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        let (Workload::Mla(w), Some(plan)) = (job.workload, job.plan.of::<Ps1Plan>()) else {
            return Err("ps1 was handed another variant's plan or workload".into());
        };
        let hk = plan.kernel_heads;
        let p = &w.p;
        let outs = plan
            .ranks
            .iter()
            .enumerate()
            .map(|(r, wl)| {
                let sh = &w.shards[r];
                let vis_end = |i: usize| {
                    let b = i / p.s_q;
                    if emu.has(Fault::Ps1LocalMask) {
                        return (sh.local_lens[b] + i % p.s_q + 1).saturating_sub(p.s_q);
                    }
                    mla::visible(p, r, b, i % p.s_q)
                };
                let chunks: Vec<(i32, Chunk)> = wl
                    .items
                    .par_iter()
                    .filter(|it| wanted(job.rows, it.q_start as usize, it.q_end as usize))
                    .map(|it| {
                        let len = sh.local_lens[it.seq as usize];
                        let mut kv_end = it.kv_end as usize;
                        if emu.has(Fault::Ps1ItemOverlap) && kv_end < len {
                            kv_end += 1;
                        }
                        let span = Span {
                            seq: it.seq as usize,
                            q: (it.q_start as usize, it.q_end as usize),
                            kv: (it.kv_start as usize, kv_end),
                        };
                        (it.partial, mla_chunk(w, sh, span, hk, &vis_end, emu))
                    })
                    .collect();
                let n = p.total_q();
                let mut out = RankOut {
                    o: poison(n * hk * MLA_D_V),
                    lse: poison(n * hk),
                };
                for (_, c) in chunks.iter().filter(|(pt, _)| *pt < 0) {
                    write_final(&mut out, hk, c);
                }
                // Reduce: partials of one sequence, found by their partial slot.
                for red in &wl.reduce {
                    let rows_per = red.q_end - red.q_start;
                    let parts: Vec<&Chunk> = (0..red.n_parts)
                        .filter_map(|k| {
                            chunks
                                .iter()
                                .find(|(pt, _)| *pt == red.part_base + k * rows_per)
                                .map(|(_, c)| c)
                        })
                        .collect();
                    if parts.len() == red.n_parts as usize {
                        merge_chunks(&mut out, hk, &parts, emu);
                    }
                }
                out
            })
            .collect();
        Ok(mla_tensors(w, outs, hk))
    }

    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        let (Workload::Mla(w), Some(plan)) = (job.workload, job.plan.of::<Ps1Plan>()) else {
            return Err("ps1 was handed another variant's plan or workload".into());
        };
        let (hk, fp8) = (plan.kernel_heads, w.p.dtype == Dtype::Fp8);
        let mt = kernel::mla_mt(hk, w.p.s_q);
        let k = spec(hk, fp8, mt);
        let shape = kernel::mla_shape(fp8, mt);
        let smem = kernel::mla_smem(fp8, mt, shape);
        let mut programs = Vec::with_capacity(plan.ranks.len());
        for (r, wl) in plan.ranks.iter().enumerate() {
            let mut p = Program::default();
            let b = Rank::add(&mut p, w, r, hk);
            let (items, reduce) = wl.to_i32();
            let n_red = wl.reduce.len();
            let work_indptr = p.upload("work_indptr", &wl.work_indptr);
            let work_items = p.upload_owned("work_items", items);
            let reduce_items = p.upload_owned("reduce_items", if reduce.is_empty() { vec![0i32; 4] } else { reduce });
            let parts = wl.num_partial_rows.max(1);
            let part_o = p.poisoned("partials", parts * hk * MLA_D_V * 4, Fill::F32);
            let part_lse = p.poisoned("partial lse", parts * hk * 4, Fill::F32);
            p.calls.push(Call {
                kernel: k.clone(),
                entry: "ps1_fwd",
                grid: (wl.num_ctas as u32, 1, 1),
                block: 32 * shape.warps as u32,
                smem: Smem::Fixed(smem),
                args: vec![
                    Arg::Buf(b.q),
                    Arg::Buf(b.kv),
                    Arg::Buf(b.kv_indptr),
                    Arg::Buf(b.kv_indices),
                    Arg::Buf(b.qo_indptr),
                    Arg::Buf(b.g_kv_indptr),
                    Arg::Buf(work_indptr),
                    Arg::Buf(work_items),
                    Arg::F32(w.q_scale),
                    Arg::F32(w.kv_scale),
                    Arg::F32(w.p.sm_scale as f32),
                ]
                .into_iter()
                .chain(mla::program::rank_args(&w.p, r))
                .chain([Arg::Buf(b.o), Arg::Buf(b.lse), Arg::Buf(part_o), Arg::Buf(part_lse)])
                .collect(),
                second: false,
                dependent: false,
            });
            if n_red > 0 {
                p.calls.push(Call {
                    kernel: k.clone(),
                    entry: "ps1_reduce",
                    grid: (n_red as u32, hk as u32, 1),
                    block: 128,
                    smem: Smem::DependentMerge { blocks: n_red * hk },
                    args: vec![
                        Arg::Buf(part_o),
                        Arg::Buf(part_lse),
                        Arg::Buf(reduce_items),
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
