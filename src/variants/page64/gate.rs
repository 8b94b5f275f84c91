//! page64's dispatch rules: page size 64, a width it has, and no spec
//! decode over DCP (its bottom-right mask is on local positions).

use crate::variants::heads::PaddedHeads;
use crate::variants::mla::gate::{finish, mask_words, GateInput, SpecDcpPolicy, Verdict};

pub fn gate(g: &GateInput) -> Verdict {
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
    fn page64_rejection_names_the_global_mask() {
        let g = input(TargetProfile::Gfx950, 8, 4, 64, 64);
        let d = gate(&g);
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
        let d = gate(&input(TargetProfile::Gfx1250, 8, 4, 64, 1));
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
    }
}
