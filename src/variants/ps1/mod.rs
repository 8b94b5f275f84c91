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
use super::mla::kernel::{self, Core};
use super::mla::{self, program::Rank};
use super::program::{Arg, Call, Fill, Program, Smem};
use super::{
    Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId, VariantInfo,
};
use crate::case::{Case, Dtype, Ps1Schedule, MLA_D_V};
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::{MmaKind, MmaMix};
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

/// The plan: the padded width, the core and one work list per DCP rank. On
/// the wgmma core a work list is cut for `num_ctas` groups of `n_rb` CTAs,
/// one per 64-row block, which read each KV tile together.
#[derive(Clone)]
pub struct Ps1Plan {
    pub kernel_heads: usize,
    pub core: Core,
    pub core_reason: String,
    pub n_rb: usize,
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

/// The wgmma core's configuration for `hk` heads.
pub fn spec_wg(hk: usize, fp8: bool) -> KernelSpec {
    kernel::wg_spec("ps1_wg.cu", &["ps1_fwd", "ps1_reduce"], hk, fp8)
}

/// The kernel a plan runs.
fn plan_spec(plan: &Ps1Plan, fp8: bool) -> KernelSpec {
    match plan.core {
        Core::Wg => spec_wg(plan.kernel_heads, fp8),
        Core::Mma { mt } => spec(plan.kernel_heads, fp8, mt),
    }
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
        let fp8 = p.dtype == Dtype::Fp8;
        let (core, core_reason) = kernel::mla_core(kernel_heads, p.s_q, fp8);
        // One unit: the tokens a pass of all consumer groups covers.
        let (n_rb, unit_tokens) = match core {
            Core::Wg => (kernel::wg_row_blocks(kernel_heads, p.s_q), kernel::WG_UNIT_TOKENS),
            Core::Mma { mt } => {
                let shape = kernel::mla_shape(fp8, mt);
                (1, shape.bn * shape.groups)
            }
        };
        let num_ctas = (case.cus / n_rb).max(1);
        let ranks = p
            .dcp
            .ranks()
            .map(|r| {
                let lens = mla::local_lens(p, r);
                // Both schedulers end in `assemble`, which checks SPEC's invariants.
                match case.ps1_schedule {
                    Ps1Schedule::Payload => {
                        build_worklist(&case.key(), &lens, &qo, num_ctas, KV_GRANULARITY, MAX_SPLITS)
                    }
                    Ps1Schedule::Balanced => {
                        let opts = BalanceOptions {
                            num_ctas,
                            granularity: KV_GRANULARITY,
                            max_splits: MAX_SPLITS,
                            unit_tokens,
                            overhead_tokens: BALANCED_OVERHEAD_TOKENS,
                        };
                        build_balanced(&case.key(), &lens, &qo, &opts)
                    }
                }
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        Ok(Plan::new(Ps1Plan {
            kernel_heads,
            core,
            core_reason,
            n_rb,
            ranks,
        }))
    }

    fn summary(&self, plan: &Plan) -> String {
        let Some(Ps1Plan {
            kernel_heads,
            core,
            n_rb,
            ranks,
            ..
        }) = plan.of::<Ps1Plan>()
        else {
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
        let groups = match core {
            Core::Wg => format!(" row-blocks={n_rb}"),
            Core::Mma { .. } => String::new(),
        };
        format!(
            "h{kernel_heads} core={} items={items} split-seqs={parts} ctas={}{groups} busy={busy}{schedule}",
            core.name(),
            ranks.first().map(|w| w.num_ctas).unwrap_or(0)
        )
    }

    fn details(&self, plan: &Plan, items: bool) -> Vec<String> {
        let Some(p) = plan.of::<Ps1Plan>() else { return vec![] };
        let mut out = vec![match p.core {
            Core::Wg => format!(
                "core wg ({}): {} row blocks of {} per item; CTA g*{} + rb runs row block rb of group g's items",
                p.core_reason,
                p.n_rb,
                kernel::WG_ROWS,
                p.n_rb
            ),
            Core::Mma { mt } => format!("core mma ({}): {} rows per pass", p.core_reason, 16 * mt),
        }];
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

    fn tensor_mix(&self, job: &Job) -> MmaMix {
        match job.plan.of::<Ps1Plan>() {
            Some(p) => kernel::tensor_mix(p.core, job.case.mla().is_some_and(|m| m.dtype == Dtype::Fp8)),
            None => MmaMix::one(MmaKind::MmaSyncBf16),
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
        kernel::every_shape(spec, spec_wg)
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        match (case.mla(), &d.skip) {
            (Some(p), None) => heads::kernel_heads(p.heads(), p.s_q)
                .map(|hk| {
                    let fp8 = p.dtype == Dtype::Fp8;
                    vec![match kernel::mla_core(hk, p.s_q, fp8).0 {
                        Core::Wg => spec_wg(hk, fp8),
                        Core::Mma { mt } => spec(hk, fp8, mt),
                    }]
                })
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
        let k = plan_spec(plan, fp8);
        let (block, smem, ctas_per_group) = match plan.core {
            Core::Wg => (kernel::WG_THREADS, kernel::wg_smem(), plan.n_rb),
            Core::Mma { mt } => {
                let shape = kernel::mla_shape(fp8, mt);
                (32 * shape.warps as u32, kernel::mla_smem(fp8, mt, shape), 1)
            }
        };
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
                grid: ((wl.num_ctas * ctas_per_group) as u32, 1, 1),
                block,
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
                .chain((plan.core == Core::Wg).then_some(Arg::I32(plan.n_rb as i32)))
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
                    smem: Smem::DependentMerge,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload;

    fn case(toml: &str) -> Case {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, toml).unwrap();
        let sc = crate::scenario::load(&path).unwrap();
        crate::scenario::expand(&sc).cases.remove(0)
    }

    /// The forward call of a planned case: its grid, block and last argument.
    fn forward(c: &Case) -> (Ps1Plan, (u32, u32, u32), u32, Option<i32>) {
        let d = Ps1.decide(c);
        let plan = Ps1.plan(c, &d, None).unwrap();
        let wl = workload::build(c).unwrap();
        let job = Job {
            case: c,
            workload: &wl,
            plan: &plan,
            rows: &[],
        };
        let progs = Ps1.programs(&job).unwrap();
        let call = &progs[0].calls[0];
        let last = match call.args.last() {
            Some(Arg::I32(v)) => Some(*v),
            _ => None,
        };
        (plan.of::<Ps1Plan>().unwrap().clone(), call.grid, call.block, last)
    }

    #[test]
    fn verify_rows_run_on_the_wgmma_core_in_groups_of_row_blocks() {
        let c = case(
            "[[mla]]\nbatch = 4\ncontext = 300\nheads_local = 96\ns_q = 8\nvariants = [\"ps1\"]\ndtype = \"bf16\"\n",
        );
        let (p, grid, block, last) = forward(&c);
        assert_eq!(p.core, Core::Wg, "{}", p.core_reason);
        assert_eq!(p.n_rb, 12); // 96 x 8 rows in blocks of 64
        assert_eq!(p.ranks[0].num_ctas, c.cus / 12);
        assert_eq!(grid, ((c.cus / 12 * 12) as u32, 1, 1));
        assert_eq!(block, kernel::WG_THREADS);
        assert_eq!(last, Some(12), "ps1_wg's n_rb argument");
        assert_eq!(plan_spec(&p, false).file, "ps1_wg.cu");
    }

    #[test]
    fn decode_rows_below_64_stay_on_the_mma_core() {
        for dtype in ["bf16", "fp8"] {
            let c = case(&format!(
                "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\ndtype = \"{dtype}\"\n"
            ));
            let (p, grid, _, last) = forward(&c);
            assert!(matches!(p.core, Core::Mma { .. }), "{}", p.core_reason);
            assert_eq!(grid.0 as usize, p.ranks[0].num_ctas);
            assert_eq!(last, None, "the mma core's ps1_fwd ends at part_lse");
        }
    }

    #[test]
    fn fp8_with_64_rows_runs_the_wgmma_core_at_e4m3() {
        let c = case("[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 128\nvariants = [\"ps1\"]\ndtype = \"fp8\"\n");
        let (p, _, block, last) = forward(&c);
        assert_eq!(p.core, Core::Wg, "{}", p.core_reason);
        assert_eq!((block, last), (kernel::WG_THREADS, Some(2)));
        let spec = plan_spec(&p, true);
        assert_eq!(spec.file, "ps1_wg.cu");
        assert!(
            spec.defines.iter().any(|(k, v)| k == "KV_FP8" && v == "1"),
            "{:?}",
            spec.defines
        );
    }
}
