//! Target profiles and what the dispatch gate (SPEC §1 "Dispatch gate")
//! looks at; each decode kernel's own rules live in its unit (`ps1::gate`,
//! `page64::gate`), the dispatcher in `variants::mla_dispatch`.
//!
//! The story (seeds/000): a speculative-decode verify pass (`s_q > 1`) over a
//! round-robin DCP shard (`W > 1`) must mask on global positions. Only a
//! kernel that takes `g_kv_indptr` can; page64 cannot, so the gate keeps it
//! off those cases and `--force` shows the wrong answer it would give.

use serde::Serialize;
use std::fmt;

use crate::case::{Dtype, TargetProfile};
use crate::variants::heads::{self, PaddedHeads};
use crate::variants::VariantId;

/// Which kernels a profile lets run a speculative decode (`s_q > 1`) over a
/// DCP shard (`W > 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SpecDcpPolicy {
    /// Any kernel that applies the causal mask on global positions.
    GlobalMaskKernels,
    /// Only the PS1 kernel, at one of its padded widths (seeds/000).
    Ps1Only,
}

impl TargetProfile {
    pub fn spec_dcp_policy(self) -> SpecDcpPolicy {
        match self {
            TargetProfile::Gfx950 | TargetProfile::Sm90 => SpecDcpPolicy::GlobalMaskKernels,
            TargetProfile::Gfx1250 => SpecDcpPolicy::Ps1Only,
        }
    }
}

/// Everything the gate looks at; nothing else may change its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GateInput {
    pub profile: TargetProfile,
    /// DCP world size `W`.
    pub w: usize,
    pub s_q: usize,
    /// Gathered heads `H = H_local * W`.
    pub heads: usize,
    pub dtype: Dtype,
    pub page_size: usize,
}

impl GateInput {
    /// A verify pass over a DCP shard: the case the gate exists for.
    pub fn spec_dcp(&self) -> bool {
        self.s_q > 1 && self.w > 1
    }
}

/// One decode kernel's verdict, in words a user can act on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub variant: VariantId,
    pub eligible: bool,
    /// Full sentences, without an "eligible:"/"rejected:" prefix (Display adds it).
    pub reason: String,
    /// The width the kernel would run, when one fits.
    pub heads: Option<PaddedHeads>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.eligible { "eligible" } else { "rejected" };
        write!(f, "{}: {verdict}: {}", self.variant, self.reason)
    }
}

pub fn width_words(p: PaddedHeads, s_q: usize) -> String {
    if p.is_padded() {
        let widths: Vec<String> = heads::ps1_widths(s_q).iter().map(|w| w.to_string()).collect();
        format!(
            "H={} padded to width {} (s_q={s_q} takes widths {})",
            p.real,
            p.kernel,
            widths.join(", ")
        )
    } else {
        format!("H={} at its own width", p.real)
    }
}

pub fn mask_words(g: &GateInput) -> String {
    format!(
        "s_q={} with DCP world {} needs the causal mask on global positions",
        g.s_q, g.w
    )
}

/// The verdict of a kernel's rules: eligible with `ok`'s words when none
/// failed, else rejected listing every failure.
pub fn finish(variant: VariantId, failures: Vec<String>, ok: String, heads: Option<PaddedHeads>) -> Verdict {
    if failures.is_empty() {
        Verdict {
            variant,
            eligible: true,
            reason: ok,
            heads,
        }
    } else {
        Verdict {
            variant,
            eligible: false,
            reason: format!("{}.", failures.join(". Also, ")),
            heads,
        }
    }
}
