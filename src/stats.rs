//! Sample statistics and noise-aware comparison. Pure functions, no I/O.

use serde::Serialize;

/// Summary of latency samples, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// `(p90 - p10) / median`.
    pub rel_spread: f64,
}
