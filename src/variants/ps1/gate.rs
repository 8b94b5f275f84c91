//! ps1's dispatch rules: page size 1, a padded width it has, and the
//! causal mask on global positions that spec decode over DCP needs.

use crate::variants::heads::PaddedHeads;
use crate::variants::mla::gate::{finish, width_words, GateInput, SpecDcpPolicy, Verdict};

pub fn gate(g: &GateInput) -> Verdict {
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
    finish(super::ID, failures, ok, padded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Dtype, TargetProfile};

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

    #[test]
    fn ps1_reason_says_how_it_pads() {
        let d = gate(&input(TargetProfile::Gfx1250, 8, 4, 64, 1));
        assert!(d.eligible);
        assert_eq!(d.heads, Some(PaddedHeads { real: 64, kernel: 96 }));
        assert_eq!(
            d.reason,
            "ps1 runs fp8 H=64 padded to width 96 (s_q=4 takes widths 16, 96); it applies the causal mask on \
             global positions that s_q=4 with DCP world 8 needs; gfx1250 allows spec decode + DCP only on this kernel."
        );
        let d = gate(&input(TargetProfile::Sm90, 1, 1, 96, 1));
        assert_eq!(d.reason, "ps1 runs fp8 H=96 at its own width.");
    }

    #[test]
    fn every_failing_rule_is_listed() {
        let d = gate(&input(TargetProfile::Sm90, 1, 2, 128, 64));
        assert!(
            d.reason.contains("page size 64") && d.reason.contains("H=128"),
            "{}",
            d.reason
        );
        assert_eq!(d.heads, None);
    }
}
