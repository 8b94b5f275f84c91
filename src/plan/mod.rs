//! Host-side plans: head padding, the dispatch gate, split counts and the
//! persistent work list. Each plan checks its own invariants.

pub mod balance;
pub mod edges;
pub mod gate;
pub mod heads;
pub mod split;
pub mod v4;
pub mod worklist;

use thiserror::Error;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_accepts_exact_covers_and_rejects_gaps_overlaps_and_short_ends() {
        assert!(check_tiling(&[(0, 3), (3, 3), (3, 7)], 7).is_ok());
        assert!(check_tiling(&[], 0).is_ok());
        assert!(check_tiling(&[(0, 3), (4, 7)], 7).is_err(), "gap");
        assert!(check_tiling(&[(0, 4), (3, 7)], 7).is_err(), "overlap");
        assert!(check_tiling(&[(0, 3), (3, 6)], 7).is_err(), "short");
        assert!(check_tiling(&[(0, 3), (3, 2)], 2).is_err(), "reversed");
    }
}
