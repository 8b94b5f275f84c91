//! Host-side plans: head padding, the dispatch gate, split counts and the
//! persistent work list. Each plan checks its own invariants.

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
