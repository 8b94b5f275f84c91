//! The dispatch gate for a declared implementation, by its capabilities:
//! the same rules a built-in kernel meets. A local mask under DCP with
//! `s_q > 1` is rejected as page64 is (seed 000's bug, for any kernel), and
//! `--force` runs it to show the failure; what the implementation cannot
//! run at all (a page size, dtype, head count or `s_q` it does not take)
//! cannot be forced.

use super::decl::{Contract, ImplDecl, Mask};
use crate::case::{Case, CaseParams, Dtype};
use crate::variants::mla::gate::SpecDcpPolicy;
use crate::variants::Decision;

pub fn decide(d: &ImplDecl, case: &Case) -> Decision {
    let name = &d.name;
    match (d.contract, &case.params) {
        (Contract::MlaDecode, CaseParams::Mla(p)) => {
            let caps = &d.caps;
            let mut hard = Vec::new();
            if !caps.page_sizes.contains(&p.page_size) {
                hard.push(format!(
                    "{name} takes page sizes {:?}; this case has page size {}",
                    caps.page_sizes, p.page_size
                ));
            }
            if !caps.dtypes.contains(&p.dtype) {
                hard.push(format!("{name} does not take {} Q and KV", dtype_words(p.dtype)));
            }
            if let Some(hs) = &caps.heads {
                if !hs.contains(&p.heads()) {
                    hard.push(format!("{name} takes {hs:?} heads; this case has H={}", p.heads()));
                }
            }
            if p.s_q > caps.max_s_q {
                hard.push(format!(
                    "{name} takes s_q up to {}; this case has s_q={}",
                    caps.max_s_q, p.s_q
                ));
            }
            if let (Mask::Global, Some(ils), true) = (caps.mask, &caps.interleave, p.dcp.sharded()) {
                if !ils.contains(&p.dcp.interleave) {
                    hard.push(format!(
                        "{name} takes DCP interleave {ils:?}; this case has S={}",
                        p.dcp.interleave
                    ));
                }
            }
            let mut soft = Vec::new();
            let spec_dcp = p.s_q > 1 && p.dcp.sharded();
            if spec_dcp && caps.mask == Mask::Local {
                soft.push(format!(
                    "s_q={} with DCP world {} needs the causal mask on global positions; {name} masks bottom-right on local positions",
                    p.s_q, p.dcp.world
                ));
            } else if spec_dcp && case.target.spec_dcp_policy() == SpecDcpPolicy::Ps1Only {
                soft.push(format!(
                    "{} allows spec decode + DCP only on the PS1 kernel",
                    case.target
                ));
            }
            let ok = format!(
                "{name} runs {} H={} s_q={} at page size {} with its {} mask",
                dtype_words(p.dtype),
                p.heads(),
                p.s_q,
                p.page_size,
                match caps.mask {
                    Mask::Local => "local",
                    Mask::Global => "global",
                }
            );
            verdict(case, hard, soft, ok)
        }
        (Contract::V4Decode, CaseParams::V4(p)) => {
            let caps = &d.caps;
            let mut hard = Vec::new();
            if let Some(hs) = &caps.heads {
                if !hs.contains(&p.heads) {
                    hard.push(format!("{name} takes {hs:?} heads; this case has H={}", p.heads));
                }
            }
            if !caps.sink {
                hard.push(format!("{name} applies no attention sink; the V4 contract needs one"));
            }
            let ok = format!("{name} runs {} rows of {} heads", p.rows, p.heads);
            verdict(case, hard, vec![], ok)
        }
        (Contract::DcpCombine, CaseParams::Mla(_)) | (Contract::SplitMerge, CaseParams::V4(_)) => {
            Decision::runs("n/a (merge)")
        }
        (c, _) => Decision::skips(
            "",
            format!(
                "{name} implements {}, which does not take {} workloads",
                c.name(),
                match case.params {
                    CaseParams::Mla(_) => "MLA",
                    CaseParams::V4(_) => "V4",
                }
            ),
        ),
    }
}

fn dtype_words(d: Dtype) -> &'static str {
    match d {
        Dtype::Bf16 => "bf16",
        Dtype::Fp8 => "fp8 (e4m3, per-tensor scales)",
    }
}

/// Eligible when nothing failed; a policy failure runs when forced; a
/// capability failure never runs.
fn verdict(case: &Case, hard: Vec<String>, soft: Vec<String>, ok: String) -> Decision {
    if hard.is_empty() && soft.is_empty() {
        return Decision::runs(format!("eligible: {ok}."));
    }
    let all: Vec<String> = soft.iter().chain(&hard).cloned().collect();
    let reason = format!("{}.", all.join(". Also, "));
    let gate = format!("rejected: {reason}");
    if case.force && hard.is_empty() {
        Decision {
            gate,
            forced: true,
            ..Default::default()
        }
    } else {
        Decision::skips(gate, reason)
    }
}
