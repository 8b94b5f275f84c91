//! Target profiles and the dispatch gate (SPEC §1 "Dispatch gate").
//!
//! The story (seeds/000): a speculative-decode verify pass (`s_q > 1`) over a
//! round-robin DCP shard (`W > 1`) must mask on global positions. Only a
//! kernel that takes `g_kv_indptr` can; page64 cannot, so the gate keeps it
//! off those cases and `--force` shows the wrong answer it would give.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

use super::heads::{self, PaddedHeads};
use crate::case::Dtype;
use crate::variants::VariantId;

/// The hardware a plan is made for. Plans use its CU count; kernels run on
/// whatever device the backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetProfile {
    Gfx950,
    Gfx1250,
    Sm90,
}

impl TargetProfile {
    pub fn compute_units(self) -> usize {
        match self {
            TargetProfile::Gfx950 => 256,
            TargetProfile::Gfx1250 => 256,
            TargetProfile::Sm90 => 132,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TargetProfile::Gfx950 => "gfx950",
            TargetProfile::Gfx1250 => "gfx1250",
            TargetProfile::Sm90 => "sm90",
        }
    }
}

impl fmt::Display for TargetProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TargetProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gfx950" => Ok(TargetProfile::Gfx950),
            "gfx1250" => Ok(TargetProfile::Gfx1250),
            "sm90" => Ok(TargetProfile::Sm90),
            _ => Err(format!("unknown target profile `{s}`; known: gfx950, gfx1250, sm90")),
        }
    }
}

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

/// One variant's verdict, in words a user can act on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub variant: VariantId,
    pub eligible: bool,
    /// Full sentences, without an "eligible:"/"rejected:" prefix (Display adds it).
    pub reason: String,
    /// The width the kernel would run, when one fits.
    pub heads: Option<PaddedHeads>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.eligible { "eligible" } else { "rejected" };
        write!(f, "{}: {verdict}: {}", self.variant, self.reason)
    }
}

fn width_words(p: PaddedHeads, s_q: usize) -> String {
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

fn mask_words(g: &GateInput) -> String {
    format!(
        "s_q={} with DCP world {} needs the causal mask on global positions",
        g.s_q, g.w
    )
}

fn finish(variant: VariantId, failures: Vec<String>, ok: String, heads: Option<PaddedHeads>) -> Decision {
    if failures.is_empty() {
        Decision {
            variant,
            eligible: true,
            reason: ok,
            heads,
        }
    } else {
        Decision {
            variant,
            eligible: false,
            reason: format!("{}.", failures.join(". Also, ")),
            heads,
        }
    }
}

fn ps1_gate(g: &GateInput) -> Decision {
    let mut failures = Vec::new();
    if g.w == 0 {
        failures.push("the DCP world size must be at least 1".to_string());
    }
    if g.page_size != 1 {
        failures.push(format!(
            "ps1 reads a page-size-1 KV pool; this case has page size {}",
            g.page_size
        ));
    }
    let padded = match PaddedHeads::ps1(g.heads, g.s_q) {
        Ok(p) => Some(p),
        Err(e) => {
            failures.push(e.0);
            None
        }
    };
    let mut ok = match padded {
        Some(p) => format!("ps1 runs {} {}", g.dtype, width_words(p, g.s_q)),
        None => String::new(),
    };
    if g.spec_dcp() {
        ok.push_str(&format!(
            "; it applies the causal mask on global positions that s_q={} with DCP world {} needs",
            g.s_q, g.w
        ));
        if g.profile.spec_dcp_policy() == SpecDcpPolicy::Ps1Only {
            ok.push_str(&format!("; {} allows spec decode + DCP only on this kernel", g.profile));
        }
    }
    ok.push('.');
    finish(VariantId::Ps1, failures, ok, padded)
}

fn page64_gate(g: &GateInput) -> Decision {
    let mut failures = Vec::new();
    if g.w == 0 {
        failures.push("the DCP world size must be at least 1".to_string());
    }
    if g.spec_dcp() {
        let mut why = format!("{}; page64 takes no g_kv_indptr", mask_words(g));
        if g.profile.spec_dcp_policy() == SpecDcpPolicy::Ps1Only {
            why.push_str(&format!(
                ", and {} allows spec decode + DCP only on the PS1 kernel",
                g.profile
            ));
        }
        failures.push(why);
    }
    if g.page_size != 64 {
        failures.push(format!(
            "page64 reads a page-size-64 KV pool; this case has page size {}",
            g.page_size
        ));
    }
    let padded = match PaddedHeads::page64(g.heads) {
        Ok(p) => Some(p),
        Err(e) => {
            failures.push(e.0);
            None
        }
    };
    let why_local_is_enough = if g.w <= 1 {
        "without DCP the local bottom-right mask is the global one"
    } else {
        "a single query token sees every local token under either mask"
    };
    let ok = match padded {
        Some(p) if p.is_padded() => {
            format!(
                "page64 runs {} H={} padded to width {}; {why_local_is_enough}.",
                g.dtype, p.real, p.kernel
            )
        }
        Some(p) => format!(
            "page64 runs {} H={} at its own width; {why_local_is_enough}.",
            g.dtype, p.real
        ),
        None => String::new(),
    };
    finish(VariantId::Page64, failures, ok, padded)
}

/// The gate's verdict on one variant for one case.
pub fn mla_gate(variant: VariantId, g: &GateInput) -> Decision {
    match variant {
        VariantId::Ps1 => ps1_gate(g),
        VariantId::Page64 => page64_gate(g),
        other => Decision {
            variant: other,
            eligible: false,
            reason: format!("{other} is not an MLA decode kernel; the dispatcher never picks it."),
            heads: None,
        },
    }
}

/// The decode kernels the dispatcher chooses from, in order of preference.
pub const DISPATCH_ORDER: [VariantId; 2] = [VariantId::Ps1, VariantId::Page64];

/// The path the dispatcher picks (ps1 preferred when eligible, else page64,
/// else none) and every decision, for `mlabench plan`.
pub fn mla_pick(g: &GateInput) -> (Option<VariantId>, Vec<Decision>) {
    let decisions: Vec<Decision> = DISPATCH_ORDER.iter().map(|&v| mla_gate(v, g)).collect();
    let pick = decisions.iter().find(|d| d.eligible).map(|d| d.variant);
    (pick, decisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(profile: TargetProfile, w: usize, s_q: usize, heads: usize, page_size: usize) -> GateInput {
        GateInput {
            profile,
            w,
            s_q,
            heads,
            dtype: Dtype::Fp8,
            page_size,
        }
    }

    fn verdicts(g: &GateInput) -> (Option<VariantId>, bool, bool) {
        let (pick, d) = mla_pick(g);
        (pick, d[0].eligible, d[1].eligible)
    }

    #[test]
    fn decision_table() {
        use TargetProfile::*;
        use VariantId::*;
        // (profile, W, s_q, H, page) -> (pick, ps1 eligible, page64 eligible)
        let table = [
            ((Sm90, 8, 4, 96, 1), (Some(Ps1), true, false)),     // K3 target verify
            ((Sm90, 8, 4, 64, 1), (Some(Ps1), true, false)),     // DSpark draft, padded
            ((Sm90, 8, 4, 64, 64), (None, false, false)),        // the bug the gate prevents
            ((Sm90, 1, 4, 64, 64), (Some(Page64), false, true)), // no DCP: local = global
            ((Sm90, 8, 1, 96, 64), (Some(Page64), false, true)), // one token: any mask
            ((Gfx950, 8, 1, 96, 1), (Some(Ps1), true, false)),
            ((Gfx1250, 8, 4, 64, 1), (Some(Ps1), true, false)),
            ((Gfx1250, 8, 4, 64, 64), (None, false, false)),
            ((Sm90, 2, 9, 16, 1), (None, false, false)), // no ps1 width past s_q 8
            ((Sm90, 8, 2, 128, 1), (None, false, false)), // 128 is single-token only
            ((Sm90, 1, 1, 200, 64), (None, false, false)), // page64 stops at 128
            ((Sm90, 1, 1, 24, 64), (Some(Page64), false, true)),
        ];
        for ((profile, w, s_q, h, ps), want) in table {
            let g = input(profile, w, s_q, h, ps);
            assert_eq!(verdicts(&g), want, "{g:?}");
        }
    }

    #[test]
    fn page64_rejection_names_the_global_mask() {
        let g = input(TargetProfile::Gfx950, 8, 4, 64, 64);
        let d = mla_gate(VariantId::Page64, &g);
        assert!(!d.eligible);
        assert_eq!(
            d.reason,
            "s_q=4 with DCP world 8 needs the causal mask on global positions; page64 takes no g_kv_indptr."
        );
        assert_eq!(
            d.to_string(),
            "page64: rejected: s_q=4 with DCP world 8 needs the causal mask on global positions; page64 takes no g_kv_indptr."
        );
    }

    #[test]
    fn every_failing_rule_is_listed() {
        let d = mla_gate(VariantId::Page64, &input(TargetProfile::Gfx1250, 8, 4, 64, 1));
        assert!(
            d.reason.starts_with("s_q=4 with DCP world 8 needs the causal mask"),
            "{}",
            d.reason
        );
        assert!(
            d.reason
                .contains("gfx1250 allows spec decode + DCP only on the PS1 kernel"),
            "{}",
            d.reason
        );
        assert!(
            d.reason
                .contains("Also, page64 reads a page-size-64 KV pool; this case has page size 1"),
            "{}",
            d.reason
        );
        let d = mla_gate(VariantId::Ps1, &input(TargetProfile::Sm90, 1, 2, 128, 64));
        assert!(
            d.reason.contains("page size 64") && d.reason.contains("H=128"),
            "{}",
            d.reason
        );
        assert_eq!(d.heads, None);
    }

    #[test]
    fn ps1_reason_says_how_it_pads() {
        let d = mla_gate(VariantId::Ps1, &input(TargetProfile::Gfx1250, 8, 4, 64, 1));
        assert!(d.eligible);
        assert_eq!(d.heads, Some(PaddedHeads { real: 64, kernel: 96 }));
        assert_eq!(
            d.reason,
            "ps1 runs fp8 H=64 padded to width 96 (s_q=4 takes widths 16, 96); it applies the causal mask on \
             global positions that s_q=4 with DCP world 8 needs; gfx1250 allows spec decode + DCP only on this kernel."
        );
        let d = mla_gate(VariantId::Ps1, &input(TargetProfile::Sm90, 1, 1, 96, 1));
        assert_eq!(d.reason, "ps1 runs fp8 H=96 at its own width.");
    }

    #[test]
    fn non_decode_variants_are_never_picked() {
        let g = input(TargetProfile::Sm90, 8, 1, 96, 1);
        for v in [
            VariantId::DcpCombine,
            VariantId::V4Split,
            VariantId::HcaPersist,
            VariantId::SplitMerge,
        ] {
            assert!(!mla_gate(v, &g).eligible, "{v}");
        }
    }
}
