//! An implementation that runs in its own worker process (FlashMLA,
//! FlashInfer, aiter, your own kernel): one more unit of a contract, gated
//! by its declared capabilities and checked exactly as a built-in kernel
//! is. Its plan, cost and checks are the contract's; what it runs, and how
//! fast, its worker reports (backend/worker.rs speaks the protocol).

pub mod decl;
pub mod gate;
pub mod wire;

use std::collections::BTreeSet;
use std::sync::RwLock;

use super::edges::Edge;
use super::emulate::Emulation;
use super::{
    dcp_combine, mla, split_merge, v4, Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError,
    Program, Variant, VariantId, VariantInfo,
};
use crate::case::{Case, Dtype};
use crate::reference::RefSet;
use crate::result::Check;
use crate::tensor_ceiling::{MmaKind, MmaMix};
pub use decl::{Caps, Contract, ImplDecl, Mask};

/// The unit of one declared implementation.
pub struct External {
    pub decl: ImplDecl,
    info: &'static VariantInfo,
}

/// What the decode contracts plan: nothing, the worker plans for itself.
struct Unplanned;

impl External {
    fn new(decl: ImplDecl) -> External {
        let id = VariantId(Box::leak(decl.name.clone().into_boxed_str()));
        let family = match decl.contract {
            Contract::MlaDecode | Contract::DcpCombine => Family::Mla,
            Contract::V4Decode | Contract::SplitMerge => Family::V4,
        };
        let contract: &'static str = Box::leak(
            format!(
                "{} by an external worker ({}), declared in {}",
                decl.contract.name(),
                decl.command.join(" "),
                decl.source
            )
            .into_boxed_str(),
        );
        let nondeterministic =
            (!decl.deterministic).then_some("its declaration says two runs may differ in their bits");
        let info = Box::leak(Box::new(VariantInfo {
            id,
            kind: decl.contract,
            family,
            kernel_file: "",
            contract,
            nondeterministic,
            native_page_size: decl.caps.page_sizes.first().copied().unwrap_or(1),
            takes_split_axis: false,
        }));
        External { decl, info }
    }

    /// The contract's own unit, for the merges, whose plan (the poisoned
    /// inputs from the reference) and checks are the built-in ones.
    fn merge_unit(&self) -> Option<&'static dyn Variant> {
        match self.decl.contract {
            Contract::DcpCombine => Some(&dcp_combine::DcpCombine),
            Contract::SplitMerge => Some(&split_merge::SplitMerge),
            _ => None,
        }
    }
}

impl Variant for External {
    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn external(&self) -> Option<&External> {
        Some(self)
    }

    fn decide(&self, case: &Case) -> Decision {
        gate::decide(&self.decl, case)
    }

    fn plan(&self, case: &Case, d: &Decision, data: Option<PlanData>) -> Result<Plan, PlanError> {
        match self.merge_unit() {
            Some(u) => u.plan(case, d, data),
            None => Ok(Plan::new(Unplanned)),
        }
    }

    fn plan_note(&self) -> Option<&'static str> {
        match self.decl.contract {
            Contract::MlaDecode | Contract::V4Decode => {
                Some("plans in its worker (the contract's inputs, nothing else)")
            }
            _ => self.merge_unit().and_then(|u| u.plan_note()),
        }
    }

    fn summary(&self, plan: &Plan) -> String {
        let own = match self.merge_unit() {
            Some(u) => format!(" {}", u.summary(plan)),
            None => String::new(),
        };
        format!("external {}{own}", self.decl.name)
    }

    fn cost(&self, job: &Job) -> Cost {
        match self.decl.contract {
            // The partials an implementation writes are its own business:
            // count what the contract moves, so every implementation of it
            // is measured by the same bytes.
            Contract::MlaDecode => job
                .workload
                .mla()
                .map_or(Cost::default(), |w| mla::cost(job, w.heads(), 0)),
            Contract::V4Decode => v4::cost(job, 0),
            _ => self.merge_unit().map_or(Cost::default(), |u| u.cost(job)),
        }
    }

    /// Whatever the worker runs, it is held to the best rate of the case's
    /// inputs: wgmma of their dtype (V4 is native fp8). The merges are the
    /// built-in units'.
    fn tensor_mix(&self, job: &Job) -> MmaMix {
        match self.decl.contract {
            Contract::MlaDecode if job.case.mla().is_some_and(|p| p.dtype == Dtype::Bf16) => {
                MmaMix::one(MmaKind::WgmmaBf16)
            }
            Contract::MlaDecode | Contract::V4Decode => MmaMix::one(MmaKind::WgmmaE4m3),
            _ => self
                .merge_unit()
                .map_or(MmaMix::one(MmaKind::MmaSyncBf16), |u| u.tensor_mix(job)),
        }
    }

    fn edges(&self, case: &Case, plan: Option<&Plan>) -> BTreeSet<Edge> {
        match self.merge_unit() {
            Some(u) => u.edges(case, plan),
            None => BTreeSet::new(),
        }
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        vec![]
    }

    fn kernels(&self, _: &Case, _: &Decision) -> Vec<KernelSpec> {
        vec![]
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        match self.decl.contract {
            Contract::MlaDecode => mla::checks::decode(job, refs, out, replays),
            // No replay steps and no pad rows: a worker sees one call.
            Contract::V4Decode if self.decl.caps.lse => v4::checks::decode(job, refs, out, replays, None),
            // An implementation that returns no LSE is held to `o` alone:
            // the reference's own LSE stands in so the pair check runs, and
            // its LSE checks are dropped, not passed.
            Contract::V4Decode => {
                let w = v4::workload(job)?;
                let (h, rh) = (w.p.heads, refs.full.heads);
                let mut lse = vec![0f32; w.p.rows * h];
                for (k, &row) in refs.rows.iter().enumerate() {
                    for hh in 0..h {
                        lse[row * h + hh] = refs.full.lse[k * rh + hh] as f32;
                    }
                }
                let mut with_lse = out.to_vec();
                with_lse.push(OutTensor {
                    name: "lse".into(),
                    row_len: h,
                    data: lse,
                });
                let cs = v4::checks::decode(job, refs, &with_lse, replays, None)?;
                Ok(cs.into_iter().filter(|c| !c.tensor.starts_with("lse")).collect())
            }
            _ => self
                .merge_unit()
                .ok_or("no contract unit")?
                .check(job, refs, out, replays),
        }
    }

    fn emulate(&self, _: &Job, _: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        Err(format!(
            "{} runs in its worker, not in mlabench's emulation",
            self.decl.name
        ))
    }

    fn programs<'a>(&self, _: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        Err(format!(
            "{} runs in its worker, not on mlabench's device",
            self.decl.name
        ))
    }
}

/// The implementations declared so far (`--impl` files, scenario `[[impl]]`
/// tables). Units live for the process: their names are `&'static str`s like
/// the built-ins', so a declaration is leaked once.
static DECLARED: RwLock<Vec<&'static External>> = RwLock::new(Vec::new());

/// Every declared implementation.
pub fn declared() -> Vec<&'static External> {
    DECLARED.read().map(|v| v.clone()).unwrap_or_default()
}

/// Adds an implementation to the registry. The same declaration twice
/// (two scenarios naming one file) is one; a second, different declaration
/// under a taken name is an error, and so is a built-in's name.
pub fn declare(decl: ImplDecl, builtins: &[&dyn Variant]) -> Result<VariantId, String> {
    if builtins.iter().any(|u| u.info().id.name() == decl.name) {
        return Err(format!(
            "key `impl.name`: `{}` is a built-in variant; give the implementation another name",
            decl.name
        ));
    }
    let mut all = DECLARED
        .write()
        .map_err(|_| "the implementation registry is poisoned".to_string())?;
    if let Some(old) = all.iter().find(|e| e.decl.name == decl.name) {
        let same = serde_json::to_string(&old.decl.caps).ok() == serde_json::to_string(&decl.caps).ok()
            && old.decl.contract == decl.contract
            && old.decl.command == decl.command;
        return if same {
            Ok(old.info.id)
        } else {
            Err(format!(
                "key `impl.name`: `{}` is declared twice with different settings ({} and {}); rename one",
                decl.name, old.decl.source, decl.source
            ))
        };
    }
    let unit: &'static External = Box::leak(Box::new(External::new(decl)));
    all.push(unit);
    Ok(unit.info.id)
}
