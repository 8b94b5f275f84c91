//! hca_persist: the persistent V4 HCA kernel with its in-kernel split and
//! merge (SPEC §2 "Variant hca_persist"): every call cuts the total work of
//! its real rows into `P` partitions on the GPU, a row inside one partition
//! is written directly, a cut row leaves partials in a workspace, and the
//! last partition to finish it merges them and resets its counter. When a
//! gate fails it runs v4_split's plan instead, and says which gate.

pub mod plan;

use std::collections::BTreeSet;

use super::edges::{union, Edge};
use super::emulate::{Emulation, Fault};
use super::program::{Arg, Call, Fill, Init, Program, Smem};
use super::v4::checks::PadRows;
use super::v4::emulate::{rename, run_v4_rows, with_steps};
use super::v4::{self, program::Inputs, V4Core};
use super::v4_split::plan::SplitPlan;
use super::v4_split::{self, Run as Fallback};
use super::{
    Cost, Decision, DeviceCheck, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId,
    VariantInfo,
};
use crate::case::{Case, V4CoreChoice, V4_D};
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::MmaMix;
use plan::{hca_call_plan, hca_gates, HcaPlan, HCA_MIN_TOKENS};

pub const ID: VariantId = VariantId("hca_persist");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::V4Decode,
    family: Family::V4,
    kernel_file: "hca_persist.cu",
    contract: "persistent V4 HCA decode: in-kernel split over P partitions from real lengths, last finisher merges and resets counters; gates fall back to v4_split",
    nondeterministic: Some(
        "the last CTA to finish a split row merges it, adding its own piece first: which CTA that is depends on scheduling, and f32 sums in another order differ in their last bits",
    ),
    native_page_size: 1,
    takes_split_axis: false,
};

/// The plan of a case whose gates pass: the workspace's partitions, the
/// split the kernel will compute from the real lengths, and the core its
/// partitions' length picks.
pub struct HcaPersistPlan {
    pub partitions: usize,
    pub plan: HcaPlan,
    pub core: V4Core,
    pub why: String,
}

pub struct HcaPersist;

/// The kernel of `core`; the host's partition floor reaches it as a define,
/// so the plan emulated here and the one computed on the GPU agree.
pub fn spec(hk: usize, core: V4Core) -> KernelSpec {
    core.spec("hca_persist.cu", "hca_persist_wg.cu", "hca_persist", hk)
        .define("HCA_MIN_TOKENS", HCA_MIN_TOKENS)
}

/// The core for a call plan, and why: `v4::core` with a partition as the
/// split (every partition streams all its tokens for each head group).
fn core_of(plan: &HcaPlan, hk: usize, choice: V4CoreChoice) -> (V4Core, String) {
    let (core, why) = v4::core(hk, plan.tokens_per_partition(), v4::WG_MIN_PARTITION_TOKENS, choice);
    let pair = match core {
        V4Core::Wg => "; a partition's two head groups run as one 2-CTA cluster, each CTA dequantizing half of every tile for both",
        V4Core::Mma => "",
    };
    (
        core,
        format!(
            "{why} (a split here is a partition: {} tokens over P_eff={}){pair}",
            plan.total, plan.partitions
        ),
    )
}

/// The call plan of a case whose gates pass.
fn call_plan(case: &Case) -> Result<HcaPersistPlan, String> {
    let p = v4::params(case)?;
    let lens: Vec<usize> = p.positions.iter().map(|&pos| v4::row_len(p, pos)).collect();
    let plan = hca_call_plan(&lens, case.v4.partitions, case.cus, p.kernel_heads())?;
    let (core, why) = core_of(&plan, p.kernel_heads(), case.v4_core);
    Ok(HcaPersistPlan {
        partitions: case.v4.partitions,
        plan,
        core,
        why,
    })
}

fn fallback(plan: &Plan) -> Option<&SplitPlan> {
    plan.of::<SplitPlan>()
}

impl Variant for HcaPersist {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn decide(&self, case: &Case) -> Decision {
        let Some(p) = case.v4() else {
            return Decision::skips("", "hca_persist does not run MLA workloads");
        };
        let gates = hca_gates(
            p.layer,
            p.kernel_heads(),
            p.rows,
            case.v4.min_rows,
            true,
            true,
            case.v4.workspace,
        );
        match gates {
            Ok(()) => Decision::runs("eligible: all hca_persist gates pass"),
            Err(why) => Decision {
                gate: format!("fallback: {why}"),
                fallback: Some(why),
                ..Default::default()
            },
        }
    }

    fn plan(&self, case: &Case, d: &Decision, data: Option<PlanData>) -> Result<Plan, PlanError> {
        if d.fallback.is_some() {
            return v4_split::V4Split.plan(case, d, data);
        }
        let plan = call_plan(case).map_err(|what| PlanError::new(&case.key(), what))?;
        Ok(Plan::new(plan))
    }

    fn summary(&self, plan: &Plan) -> String {
        if let Some(s) = fallback(plan) {
            return Fallback::summary(s);
        }
        plan.of::<HcaPersistPlan>()
            .map(|h| {
                format!(
                    "P={} (uses {}) split-rows={} core={}",
                    h.partitions,
                    h.plan.partitions,
                    h.plan.split_rows,
                    h.core.name()
                )
            })
            .unwrap_or_default()
    }

    fn details(&self, plan: &Plan, _items: bool) -> Vec<String> {
        match fallback(plan) {
            Some(s) => Fallback::details(s),
            None => plan
                .of::<HcaPersistPlan>()
                .map(|h| vec![format!("core={}: {}", h.core.name(), h.why)])
                .unwrap_or_default(),
        }
    }

    /// The fallback runs v4_split's kernel, and so its core.
    fn tensor_mix(&self, job: &Job) -> MmaMix {
        match (fallback(job.plan), job.plan.of::<HcaPersistPlan>()) {
            (Some(s), _) => Fallback::tensor_mix(s),
            (None, Some(h)) => h.core.tensor_mix(),
            (None, None) => V4Core::Mma.tensor_mix(),
        }
    }

    fn cost(&self, job: &Job) -> Cost {
        match fallback(job.plan) {
            Some(s) => Fallback::cost(job, s),
            None => v4::cost(job, 0),
        }
    }

    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<Edge> {
        let Some(plan) = plan else { return BTreeSet::new() };
        if let Some(s) = fallback(plan) {
            return Fallback::edges(case, s.n);
        }
        let (Some(p), Some(h)) = (case.v4(), plan.of::<HcaPersistPlan>()) else {
            return BTreeSet::new();
        };
        let seqs: Vec<(usize, Vec<(usize, usize)>)> = p
            .positions
            .iter()
            .enumerate()
            .map(|(i, &pos)| {
                let pieces = h
                    .plan
                    .pieces
                    .iter()
                    .filter(|pc| pc.row == i)
                    .map(|pc| (pc.start, pc.end));
                (v4::row_len(p, pos), pieces.collect())
            })
            .collect();
        union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        vec![spec(plan::HCA_HEADS, V4Core::Mma), spec(plan::HCA_HEADS, V4Core::Wg)]
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        match (case.v4(), &d.fallback) {
            (None, _) => vec![],
            (Some(_), Some(_)) => Fallback::kernels(case),
            (Some(p), None) => call_plan(case)
                .map(|h| vec![spec(p.kernel_heads(), h.core)])
                .unwrap_or_default(),
        }
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        if fallback(job.plan).is_some() {
            return Fallback::check(job, refs, out, replays);
        }
        // Rows of length 0, pad rows among them, are left unwritten.
        v4::checks::decode(job, refs, out, replays, Some(PadRows::Untouched))
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        if let Some(s) = fallback(job.plan) {
            return Fallback::emulate(job, s, emu);
        }
        let h = job.plan.expect::<HcaPersistPlan>("hca_persist")?;
        let w = v4::workload(job)?;
        emu.launch += 1;
        let k = emu.launch;
        let steps = if k == 1 { w.steps.len() } else { 0 };
        let (cus, parts) = (job.case.cus, h.partitions);
        with_steps(w, steps, |ws, suffix| {
            // The kernel plans from each call's real lengths: so does the emulation.
            let replanned;
            let plan = if suffix.is_empty() {
                &h.plan
            } else {
                let lens: Vec<usize> = (0..ws.p.rows).map(|i| ws.row_len(i)).collect();
                replanned = hca_call_plan(&lens, parts, cus, ws.p.kernel_heads())
                    .map_err(|e| format!("hca plan of a replay: {e}"))?;
                &replanned
            };
            let out = run(ws, plan, job.rows, emu);
            let name = match (k, suffix) {
                (1, "") => "counters".to_string(),
                (_, "") => format!("counters.launch{k}"),
                (_, s) => format!("counters{s}"),
            };
            let left = emu.counters.iter().filter(|&&c| c != 0).count();
            emu.counters.fill(0);
            emu.checks.push(DeviceCheck::counters(name, left));
            Ok(rename(out, suffix))
        })
    }

    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        if let Some(s) = fallback(job.plan) {
            return Fallback::programs(job, s);
        }
        let h = job.plan.expect::<HcaPersistPlan>("hca_persist")?;
        let w = v4::workload(job)?;
        let (hk, parts) = (w.heads, h.partitions);
        let mut p = Program::default();
        let inp = Inputs::add(&mut p, w);
        // The workspace: allocated once, before any launch or capture;
        // counters zero at rest, partial slots poison until written.
        let o_acc = p.poisoned("o_acc", 2 * parts * hk * V4_D * 4, Fill::F32);
        let lse_acc = p.poisoned("lse_acc", 2 * parts * hk * 4, Fill::F32);
        let counters = p.buffer("counters", w.t.max(1) * 4, Init::Zero);
        p.at_rest.push(counters);
        p.calls.push(Call {
            kernel: spec(hk, h.core),
            entry: "hca_persist",
            grid: (v4::groups(hk), parts as u32, 1),
            block: h.core.block(),
            smem: Smem::Fixed(h.core.smem(hk)),
            args: inp
                .kv_args()
                .into_iter()
                .chain([
                    Arg::Buf(inp.sink),
                    Arg::F32(w.p.sm_scale as f32),
                    Arg::I32(w.p.rows as i32),
                    Arg::I32(parts as i32),
                    Arg::Buf(o_acc),
                    Arg::Buf(lse_acc),
                    Arg::Buf(counters),
                    Arg::Buf(inp.o),
                    Arg::Buf(inp.lse),
                ])
                .collect(),
            second: false,
            dependent: false,
        });
        Ok(vec![p])
    }
}

/// One launch on the host, with the row counters: a split row's pieces
/// count up, and only the launch whose count started at zero merges the
/// row (the last finisher sees its own count), then resets the counter. A
/// row that is not merged stays unwritten, as on the device.
fn run(w: &crate::workload::V4Workload, plan: &HcaPlan, rows: &[usize], emu: &mut Emulation) -> Vec<OutTensor> {
    let no_reset = emu.has(Fault::HcaNoReset);
    let counters = &mut emu.counters;
    counters.resize(counters.len().max(w.t), 0);
    let mut merged = vec![true; w.t];
    for (i, &pieces) in plan.row_pieces.iter().enumerate() {
        if pieces > 1 {
            merged[i] = counters[i] == 0;
            counters[i] += pieces;
            if merged[i] && !no_reset {
                counters[i] -= pieces;
            }
        }
    }
    // Rows of length 0 are left unwritten; every other row merges one piece
    // per partition it touches, as the last finisher does.
    let live: Vec<usize> = rows
        .iter()
        .copied()
        .filter(|&i| w.row_len(i) > 0 && merged[i])
        .collect();
    let pieces = |i: usize| {
        plan.pieces
            .iter()
            .filter(|pc| pc.row == i)
            .map(|pc| (pc.start, pc.end))
            .collect()
    };
    run_v4_rows(w, &live, pieces, emu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::hca_partition_plan;

    #[test]
    fn partitions_long_enough_take_the_wgmma_core() {
        // 8 partitions of 1500 tokens: each CTA streams 1500 > 1024.
        let long = hca_partition_plan(&[3000, 9000], 8).unwrap();
        let (core, why) = core_of(&long, 128, V4CoreChoice::Auto);
        assert_eq!(core, V4Core::Wg);
        assert!(why.contains("12000 tokens over P_eff=8"), "{why}");
        assert!(why.contains("2-CTA cluster"), "{why}");
        assert_eq!(spec(128, core).file, "hca_persist_wg.cu");
        // The same lengths over 16 partitions: 750 tokens each.
        let short = hca_partition_plan(&[3000, 9000], 16).unwrap();
        let (mma, why) = core_of(&short, 128, V4CoreChoice::Auto);
        assert_eq!(mma, V4Core::Mma);
        assert!(!why.contains("cluster"), "{why}");
        assert_eq!(core_of(&short, 128, V4CoreChoice::Wg).0, V4Core::Wg);
        assert_eq!(spec(128, V4Core::Mma).file, "hca_persist.cu");
    }

    #[test]
    fn both_cores_get_the_partition_floor() {
        for core in [V4Core::Mma, V4Core::Wg] {
            let s = spec(128, core);
            assert!(s
                .defines
                .iter()
                .any(|(k, v)| k == "HCA_MIN_TOKENS" && v == &HCA_MIN_TOKENS.to_string()));
        }
    }
}
