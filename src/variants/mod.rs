//! The one registry of decode variants. A variant is one unit (one folder or
//! file here): its contract, its gate, its plan, what it costs, the checks
//! it expects, its CPU emulation and the launches it asks a GPU for. The
//! backends execute what a variant hands them and know no variant by name.

use serde::Serialize;
use std::any::Any;
use std::collections::BTreeSet;
use std::str::FromStr;
use thiserror::Error;

use crate::case::Case;
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::{MmaKind, MmaMix};
use crate::workload::Workload;

pub mod checks;
pub mod dcp_combine;
pub mod edges;
pub mod emulate;
pub mod external;
pub mod hca_persist;
pub mod heads;
pub mod kernel_spec;
pub mod merge;
pub mod mla;
pub mod output;
pub mod page64;
pub mod program;
pub mod ps1;
pub mod split_merge;
pub mod v4;
pub mod v4_split;

pub use emulate::{Emulation, Fault};
pub use kernel_spec::KernelSpec;
pub use output::{DeviceCheck, OutTensor};
pub use program::Program;

pub use crate::case::VariantId;

/// The registry's side of a variant's name (the name itself lives with the
/// case, which carries it).
impl VariantId {
    /// The unit that implements this variant.
    pub fn unit(self) -> &'static dyn Variant {
        registry()
            .into_iter()
            .find(|v| v.info().id == self)
            .expect("every id names a registered variant")
    }
    pub fn info(self) -> &'static VariantInfo {
        self.unit().info()
    }
    pub fn family(self) -> Family {
        self.info().family
    }
}

impl FromStr for VariantId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let all = registry();
        all.iter().map(|v| v.info().id).find(|id| id.0 == s).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|v| v.info().id.0).collect();
            format!(
                "unknown variant `{s}`; known: {} (an external implementation needs its declaration: --impl FILE or an [[impl]] table)",
                names.join(", ")
            )
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Mla,
    V4,
}

/// Static facts about a variant.
pub struct VariantInfo {
    pub id: VariantId,
    /// The contract it implements: only implementations of one contract
    /// on one data id compare in the peers table.
    pub kind: external::Contract,
    pub family: Family,
    /// Its CUDA source under kernels/ (what `--kernels-dir` must hold).
    pub kernel_file: &'static str,
    /// One-line contract, for `mlabench list`.
    pub contract: &'static str,
    /// Why two launches on the same inputs may differ in their bits, if they
    /// may; `None`: repeated checked launches must match bit for bit.
    pub nondeterministic: Option<&'static str>,
    /// The page size a scenario block without `page_size` gives it.
    pub native_page_size: usize,
    /// Whether a V4 block's `splits` axis makes cases of it.
    pub takes_split_axis: bool,
}

/// A variant's decision for a case before anything runs.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// The gate's words (MLA kernels), or the support check's.
    pub gate: String,
    /// `Some(reason)`: the variant does not run this case (skip).
    pub skip: Option<String>,
    /// Runs although the gate rejected it.
    pub forced: bool,
    /// It runs another variant's plan instead (hca_persist's fallback to
    /// v4_split): which gate failed.
    pub fallback: Option<String>,
}

impl Decision {
    /// Runs, with the gate's words.
    pub fn runs(gate: impl Into<String>) -> Decision {
        Decision {
            gate: gate.into(),
            ..Default::default()
        }
    }
    /// Does not run, and why.
    pub fn skips(gate: impl Into<String>, why: impl Into<String>) -> Decision {
        Decision {
            gate: gate.into(),
            skip: Some(why.into()),
            ..Default::default()
        }
    }
}

/// A variant's plan: its own type, opaque to everyone else. Only the unit
/// that made it reads it ([`Plan::of`]).
pub struct Plan(Box<dyn Any + Send + Sync>);

impl Plan {
    pub fn new<T: Any + Send + Sync>(p: T) -> Plan {
        Plan(Box::new(p))
    }
    /// The plan as the type its variant made it.
    pub fn of<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
    pub fn expect<T: Any>(&self, who: &str) -> Result<&T, String> {
        self.of::<T>()
            .ok_or_else(|| format!("{who} was handed a plan it did not make"))
    }
}

/// What the merge variants plan from: their inputs are other kernels'
/// outputs, taken from the reference.
pub struct PlanData<'a> {
    pub workload: &'a Workload,
    pub refs: &'a RefSet,
}

/// One variant run: the case, its inputs and plan, the rows to be checked.
pub struct Job<'a> {
    pub case: &'a Case,
    pub workload: &'a Workload,
    pub plan: &'a Plan,
    /// Query rows that will be checked. An emulation may leave the others
    /// unwritten, to keep sampled checks cheap.
    pub rows: &'a [usize],
}

/// Bytes moved and FLOPs done by one run, from visible lengths (SPEC §5).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub bytes: f64,
    pub flops: f64,
}

/// One decode variant.
pub trait Variant: Sync {
    fn info(&self) -> &'static VariantInfo;
    /// An implementation that runs in its own worker process: the runner
    /// hands it to the worker pool instead of the backend.
    fn external(&self) -> Option<&external::External> {
        None
    }
    /// A decode kernel the MLA dispatcher may pick: its rules for a case.
    fn mla_gate(&self, _g: &mla::gate::GateInput) -> Option<mla::gate::Verdict> {
        None
    }
    /// The gate and support check: whether, and why, it runs the case.
    fn decide(&self, case: &Case) -> Decision;
    /// Its plan for the case; the merges plan from `data`, the others need none.
    fn plan(&self, case: &Case, d: &Decision, data: Option<PlanData>) -> Result<Plan, PlanError>;
    /// What `mlabench plan` says of a variant planned from other kernels'
    /// outputs, which it does not build; `None`: it shows the plan.
    fn plan_note(&self) -> Option<&'static str> {
        None
    }
    /// One line for tables: padded heads, splits, items, fallbacks.
    fn summary(&self, plan: &Plan) -> String;
    /// More lines for `mlabench plan` (`items`: every work item).
    fn details(&self, _plan: &Plan, _items: bool) -> Vec<String> {
        vec![]
    }
    fn cost(&self, job: &Job) -> Cost;
    /// Which tensor instructions its FLOP run on, by share: the ceiling its
    /// rows' %TC divides by. The default is the V4 kernels' path (mma.sync
    /// bf16 on dequantised tiles).
    fn tensor_mix(&self, _job: &Job) -> MmaMix {
        MmaMix::one(MmaKind::MmaSyncBf16)
    }
    /// The length edges the plan puts the case's sequences on.
    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<edges::Edge>;
    /// Every kernel configuration it can launch: all must compile.
    fn all_kernels(&self) -> Vec<KernelSpec>;
    /// The kernel configurations it launches for the case.
    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec>;
    /// The run's outputs against the references; `replays` adds the V4
    /// replay steps and pad rows (absent from a repeated launch's outputs).
    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String>;
    /// One checked launch, executed in f32 on the host.
    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String>;
    /// What a GPU must upload, launch and download for one checked launch:
    /// one program per sequential pass (an MLA variant's DCP ranks).
    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String>;
}

/// Every variant, in the order `mlabench list` shows them.
pub static REGISTRY: &[&dyn Variant] = &[
    &ps1::Ps1,
    &page64::Page64,
    &dcp_combine::DcpCombine,
    &v4_split::V4Split,
    &hca_persist::HcaPersist,
    &split_merge::SplitMerge,
];

/// The built-in units and every declared external implementation, in
/// that order.
pub fn registry() -> Vec<&'static dyn Variant> {
    let mut v: Vec<&'static dyn Variant> = REGISTRY.to_vec();
    v.extend(external::declared().into_iter().map(|e| e as &'static dyn Variant));
    v
}

/// Declares an external implementation (`--impl`, `[[impl]]`).
pub fn declare(decl: external::ImplDecl) -> Result<VariantId, String> {
    external::declare(decl, REGISTRY)
}

/// The MLA path an engine's dispatcher takes: the first decode kernel, in
/// registry order (ps1, then page64), whose rules accept the case, and
/// every kernel's verdict, for `mlabench plan`.
pub fn mla_dispatch(g: &mla::gate::GateInput) -> (Option<VariantId>, Vec<mla::gate::Verdict>) {
    let verdicts: Vec<mla::gate::Verdict> = REGISTRY.iter().filter_map(|u| u.mla_gate(g)).collect();
    let pick = verdicts.iter().find(|d| d.eligible).map(|d| d.variant);
    (pick, verdicts)
}

/// Whether (and why) a case's variant runs it.
pub fn decide(case: &Case) -> Decision {
    case.variant.unit().decide(case)
}

/// A plan that breaks its own invariants. Always names the case.
#[derive(Debug, Error)]
#[error("plan invariant violated for case {case}: {what}")]
pub struct PlanError {
    pub case: String,
    pub what: String,
}

impl PlanError {
    pub fn new(case: &str, what: impl Into<String>) -> Self {
        PlanError {
            case: case.to_string(),
            what: what.into(),
        }
    }
}

/// Checks that half-open ranges, in order, tile `[0, len)` exactly (empty
/// ranges allowed). Shared by every split rule so they fail the same way.
pub fn check_tiling(ranges: &[(usize, usize)], len: usize) -> Result<(), String> {
    let mut at = 0;
    for (i, &(a, b)) in ranges.iter().enumerate() {
        if a != at || b < a {
            return Err(format!(
                "range {i} is [{a}, {b}) but the previous one ended at {at} (len {len})"
            ));
        }
        at = b;
    }
    if at != len {
        return Err(format!("ranges end at {at}, not at the length {len}"));
    }
    Ok(())
}

/// Every kernel configuration any variant launches, each once.
pub fn all_kernels() -> Vec<KernelSpec> {
    let mut v: Vec<KernelSpec> = Vec::new();
    for k in REGISTRY.iter().flat_map(|u| u.all_kernels()) {
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// The kernel file of every variant, for `--kernels-dir` checks.
pub fn kernel_files() -> Vec<&'static str> {
    let mut v: Vec<&str> = REGISTRY
        .iter()
        .map(|u| u.info().kernel_file)
        .filter(|f| !f.is_empty())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Dtype, TargetProfile};
    use mla::gate::GateInput;

    #[test]
    fn tiling_accepts_exact_covers_and_rejects_gaps_overlaps_and_short_ends() {
        assert!(check_tiling(&[(0, 3), (3, 3), (3, 7)], 7).is_ok());
        assert!(check_tiling(&[], 0).is_ok());
        assert!(check_tiling(&[(0, 3), (4, 7)], 7).is_err(), "gap");
        assert!(check_tiling(&[(0, 4), (3, 7)], 7).is_err(), "overlap");
        assert!(check_tiling(&[(0, 3), (3, 6)], 7).is_err(), "short");
        assert!(check_tiling(&[(0, 3), (3, 2)], 2).is_err(), "reversed");
    }

    fn gate_input(profile: TargetProfile, w: usize, s_q: usize, heads: usize, page_size: usize) -> GateInput {
        GateInput {
            profile,
            w,
            s_q,
            heads,
            dtype: Dtype::Fp8,
            page_size,
        }
    }

    #[test]
    fn dispatch_decision_table() {
        use TargetProfile::*;
        const PS1: VariantId = ps1::ID;
        const PAGE64: VariantId = page64::ID;
        // (profile, W, s_q, H, page) -> (pick, ps1 eligible, page64 eligible)
        let table = [
            ((Sm90, 8, 4, 96, 1), (Some(PS1), true, false)),     // K3 target verify
            ((Sm90, 8, 4, 64, 1), (Some(PS1), true, false)),     // DSpark draft, padded
            ((Sm90, 8, 4, 64, 64), (None, false, false)),        // the bug the gate prevents
            ((Sm90, 1, 4, 64, 64), (Some(PAGE64), false, true)), // no DCP: local = global
            ((Sm90, 8, 1, 96, 64), (Some(PAGE64), false, true)), // one token: any mask
            ((Gfx950, 8, 1, 96, 1), (Some(PS1), true, false)),
            ((Gfx1250, 8, 4, 64, 1), (Some(PS1), true, false)),
            ((Gfx1250, 8, 4, 64, 64), (None, false, false)),
            ((Sm90, 2, 9, 16, 1), (None, false, false)), // no ps1 width past s_q 8
            ((Sm90, 8, 2, 128, 1), (None, false, false)), // 128 is single-token only
            ((Sm90, 1, 1, 200, 64), (None, false, false)), // page64 stops at 128
            ((Sm90, 1, 1, 24, 64), (Some(PAGE64), false, true)),
        ];
        for ((profile, w, s_q, h, ps), want) in table {
            let g = gate_input(profile, w, s_q, h, ps);
            let (pick, d) = mla_dispatch(&g);
            assert_eq!(
                d.iter().map(|d| d.variant).collect::<Vec<_>>(),
                [PS1, PAGE64],
                "dispatch order"
            );
            assert_eq!((pick, d[0].eligible, d[1].eligible), want, "{g:?}");
        }
    }

    #[test]
    fn only_decode_kernels_take_part_in_dispatch() {
        let g = gate_input(TargetProfile::Sm90, 8, 1, 96, 1);
        for u in REGISTRY {
            let decode = [ps1::ID, page64::ID].contains(&u.info().id);
            assert_eq!(u.mla_gate(&g).is_some(), decode, "{}", u.info().id);
        }
    }

    #[test]
    fn names_round_trip_through_the_registry() {
        for u in REGISTRY {
            let id = u.info().id;
            assert_eq!(id.to_string().parse::<VariantId>().unwrap(), id);
            assert!(std::ptr::eq(id.info(), u.info()));
        }
        assert!("ps9".parse::<VariantId>().unwrap_err().contains("known: ps1, page64"));
        let mut names: Vec<&str> = REGISTRY.iter().map(|u| u.info().id.0).collect();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len(), "one registry line per variant");
    }
}
