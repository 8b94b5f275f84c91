//! v4_split: the DeepSeek-V4 native-FP8 decode kernel with a caller-built
//! split plan (SPEC §2 "Variant v4_split"): `n` from the heuristic per layer
//! type (or a fixed `n`, or the kernel's own pick), the split CSR a row of
//! the uniform `[16, T+1]` table, f32 partials without the sink, then
//! `split_merge`, a programmatic dependent, adds the sink once. A one-split
//! plan needs no merge: its entry writes o with the sink, as aiter's decode
//! skips its second stage at `num_kv_splits == 1`.

pub mod plan;

use std::collections::BTreeSet;

use super::edges::{union, Edge};
use super::emulate::{Emulation, Fault};
use super::program::{Arg, Call, Fill, Program, Smem};
use super::v4::checks::PadRows;
use super::v4::emulate::{rename, run_v4_rows, with_steps};
use super::v4::{self, program::Inputs, V4Core};
use super::{
    merge, Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId,
    VariantInfo,
};
use crate::case::{Case, V4_D};
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::{MmaKind, MmaMix};
use crate::workload::V4Workload;
use plan::{kv_len_bound, split_ranges, v4_split_plan, SplitPlan};

pub const ID: VariantId = VariantId("v4_split");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::V4Decode,
    family: Family::V4,
    kernel_file: "v4_split.cu",
    contract: "V4 native-FP8 decode with a caller-built split plan from the uniform [16, T+1] table (or its own pick), attention sink, split_merge (a one-split plan adds the sink in-kernel)",
    nondeterministic: None,
    native_page_size: 1,
    takes_split_axis: true,
};

pub struct V4Split;

/// The kernel of `core` for `hk` kernel heads.
pub fn spec(hk: usize, core: V4Core) -> KernelSpec {
    let mut k = core.spec("v4_split.cu", "v4_split_wg.cu", "v4_split", hk);
    k.entry_points.push(ONE_SPLIT_ENTRY);
    k
}

/// Either core's entry for a plan of one split a row: the whole row in
/// one pass, so it writes o with the sink and no merge follows.
pub const ONE_SPLIT_ENTRY: &str = "v4_split_one";

/// The split plan of a case: the scenario's fixed `n`, else the heuristic's.
pub fn split_plan(case: &Case) -> Result<SplitPlan, String> {
    let p = v4::params(case)?;
    let bound = kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    let lens: Vec<usize> = p.positions.iter().map(|&pos| v4::row_len(p, pos)).collect();
    let mut plan =
        v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, case.cus, case.v4.splits).with_lens(&lens);
    plan.core_choice = case.v4_core;
    plan.order = plan.piece_order(v4::launch_rows(p, case.v4.eager), case.cus);
    Ok(plan)
}

/// What v4_split does with a plan: the unit hca_persist falls back to.
pub(crate) struct Run;

impl Run {
    pub fn summary(s: &SplitPlan) -> String {
        let order = if s.order.longest_first { " longest-first" } else { "" };
        format!("n={} ({:?}) core={}{order}", s.n, s.source, s.core().0.name())
    }

    pub fn details(s: &SplitPlan) -> Vec<String> {
        let (core, why) = s.core();
        let mut d = vec![
            format!("core={}: {why}", core.name()),
            format!("order: {}", s.order.why),
        ];
        if let (plan::SplitSource::Heuristic, Some(n_why)) = (s.source, &s.why) {
            d.push(format!("n={}: {n_why}", s.n));
        }
        d
    }

    pub fn tensor_mix(s: &SplitPlan) -> MmaMix {
        s.core().0.tensor_mix()
    }

    pub fn cost(job: &Job, s: &SplitPlan) -> Cost {
        let t = v4::workload(job).map_or(0, |w| w.t);
        v4::cost(job, if s.n > 1 { t * s.n } else { 0 })
    }

    pub fn edges(case: &Case, n: usize) -> BTreeSet<Edge> {
        let Some(p) = case.v4() else { return BTreeSet::new() };
        let seqs: Vec<(usize, Vec<(usize, usize)>)> = p
            .positions
            .iter()
            .map(|&pos| {
                let len = v4::row_len(p, pos);
                (len, split_ranges(len, n))
            })
            .collect();
        union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
    }

    pub fn kernels(case: &Case) -> Vec<KernelSpec> {
        split_plan(case)
            .map(|s| vec![spec(s.heads, s.core().0), merge::spec()])
            .unwrap_or_default()
    }

    pub fn check(job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        // A graph-sized launch covers all T rows (pad rows get o = 0, lse =
        // sink); an eager one only the N real rows.
        let pad = if job.case.v4.eager {
            PadRows::Untouched
        } else {
            PadRows::Written
        };
        v4::checks::decode(job, refs, out, replays, Some(pad))
    }

    pub fn emulate(job: &Job, s: &SplitPlan, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        let w = v4::workload(job)?;
        let mut rows = job.rows.to_vec();
        if !job.case.v4.eager {
            rows.extend(w.p.rows..w.t);
        }
        emu.launch += 1;
        let steps = if emu.launch == 1 { w.steps.len() } else { 0 };
        let emu: &Emulation = emu;
        let n = s.n;
        let floor = emu.has(Fault::V4SplitFloor);
        with_steps(w, steps, |ws: &V4Workload, suffix| {
            let pieces = |i: usize| {
                let len = ws.row_len(i);
                let mut r = split_ranges(len, n);
                if floor {
                    for (k, p) in r.iter_mut().enumerate() {
                        p.1 = (len * (k + 1) / n).max(p.0);
                    }
                }
                r
            };
            Ok(rename(run_v4_rows(ws, &rows, pieces, emu), suffix))
        })
    }

    pub fn programs<'a>(job: &Job<'a>, s: &'a SplitPlan) -> Result<Vec<Program<'a>>, String> {
        let w = v4::workload(job)?;
        let hk = w.heads;
        let core = s.core().0;
        let mut p = Program::default();
        let inp = Inputs::add(&mut p, w);
        let launch_rows = v4::launch_rows(&w.p, job.case.v4.eager);
        debug_assert_eq!(v4::launch_rows(&w.p, false), w.t);
        // Stage 1 (or the one-split entry): the kv arguments, then `tail`.
        // The wgmma entries also take whether to run the longest pieces first.
        let order = (core == V4Core::Wg).then_some(Arg::I32(s.order.longest_first as i32));
        let stage1 = |entry, n: usize, tail: Vec<Arg>| Call {
            kernel: spec(hk, core),
            entry,
            grid: (v4::groups(hk), launch_rows as u32, n as u32),
            block: core.block(),
            smem: Smem::Fixed(core.smem(hk)),
            args: inp.kv_args().into_iter().chain(tail).chain(order).collect(),
            second: false,
            dependent: false,
        };
        let scale = Arg::F32(w.p.sm_scale as f32);
        if s.n == 1 {
            let tail = vec![
                Arg::Buf(inp.sink),
                scale,
                Arg::I32(launch_rows as i32),
                Arg::Buf(inp.o),
                Arg::Buf(inp.lse),
            ];
            p.calls.push(stage1(ONE_SPLIT_ENTRY, 1, tail));
            return Ok(vec![p]);
        }
        let plan = p.upload("split_indptr", &s.split_indptr);
        let slots = s.split_indptr[w.t] as usize;
        let part_o = p.poisoned("partials", slots.max(1) * hk * V4_D * 4, Fill::F32);
        let part_lse = p.poisoned("partial lse", slots.max(1) * hk * 4, Fill::F32);
        let tail = vec![
            Arg::Buf(plan),
            scale,
            Arg::I32(launch_rows as i32),
            Arg::Buf(part_o),
            Arg::Buf(part_lse),
        ];
        p.calls.push(stage1("v4_split", s.n, tail));
        let (entry, grid) = merge::split_merge_launch(launch_rows, hk, s.n);
        p.calls.push(Call {
            kernel: merge::spec(),
            entry,
            grid,
            block: 128,
            smem: Smem::DependentMerge,
            args: vec![
                Arg::Buf(part_o),
                Arg::Buf(part_lse),
                Arg::Buf(plan),
                Arg::Buf(inp.sink),
                Arg::I32(launch_rows as i32),
                Arg::I32(hk as i32),
                Arg::Buf(inp.o),
                Arg::Buf(inp.lse),
            ],
            second: true,
            dependent: true,
        });
        Ok(vec![p])
    }
}

fn split(plan: &Plan) -> Result<&SplitPlan, String> {
    plan.expect::<SplitPlan>("v4_split")
}

impl Variant for V4Split {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn decide(&self, case: &Case) -> Decision {
        match case.v4() {
            Some(_) => Decision::runs("n/a"),
            None => Decision::skips("", "v4_split does not run MLA workloads"),
        }
    }

    fn plan(&self, case: &Case, _: &Decision, _: Option<PlanData>) -> Result<Plan, PlanError> {
        let s = split_plan(case).map_err(|e| PlanError::new(&case.key(), e))?;
        s.check(&case.key())?;
        Ok(Plan::new(s))
    }

    fn summary(&self, plan: &Plan) -> String {
        split(plan).map(Run::summary).unwrap_or_default()
    }

    fn details(&self, plan: &Plan, _items: bool) -> Vec<String> {
        split(plan).map(Run::details).unwrap_or_default()
    }

    fn tensor_mix(&self, job: &Job) -> MmaMix {
        split(job.plan)
            .map(Run::tensor_mix)
            .unwrap_or_else(|_| MmaMix::one(MmaKind::MmaSyncBf16))
    }

    fn cost(&self, job: &Job) -> Cost {
        split(job.plan).map(|s| Run::cost(job, s)).unwrap_or_default()
    }

    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<Edge> {
        match plan.and_then(|p| p.of::<SplitPlan>()) {
            Some(s) => Run::edges(case, s.n),
            None => BTreeSet::new(),
        }
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        let mma = [16, 32, 64, 128].map(|h| spec(h, V4Core::Mma));
        let wg = [64, 128].map(|h| spec(h, V4Core::Wg));
        mma.into_iter().chain(wg).chain([merge::spec()]).collect()
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        if d.skip.is_some() {
            return vec![];
        }
        Run::kernels(case)
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        Run::check(job, refs, out, replays)
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        Run::emulate(job, split(job.plan)?, emu)
    }

    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        Run::programs(job, split(job.plan)?)
    }
}
