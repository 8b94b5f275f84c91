//! Error metrics and tolerances (SPEC §4). Pure functions, no I/O.

use serde::{Deserialize, Serialize};

/// Pass/fail thresholds for one output tensor family.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerances {
    pub cos_diff: f64,
    pub mismatch: f64,
    pub atol: f64,
    pub rtol: f64,
    pub lse_abs: f64,
}

impl Tolerances {
    /// bf16 outputs against the f64 reference.
    pub const BF16: Tolerances = Tolerances { cos_diff: 1e-5, mismatch: 1e-4, atol: 1e-2, rtol: 1e-2, lse_abs: 1e-3 };
    /// fp8 paths against the reference on the dequantized inputs.
    pub const FP8: Tolerances = Tolerances { cos_diff: 1e-4, mismatch: 1e-3, atol: 2e-2, rtol: 2e-2, lse_abs: 1e-3 };
}

/// Comparison of one output tensor against its reference.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ErrorMetrics {
    /// Elements compared.
    pub n: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    /// Flat index of the worst element (by abs error) and both values there.
    pub worst_index: usize,
    pub worst_out: f64,
    pub worst_ref: f64,
    pub rel_l2: f64,
    pub cos_diff: f64,
    /// Fraction with `|o-r| > atol` and `|o-r| > rtol*|r|`.
    pub mismatch: f64,
    /// Positions where finiteness differs from the reference (NaN where finite, etc.).
    pub nonfinite_mismatch: usize,
    /// Elements still holding the poison value (never written).
    pub unwritten: usize,
}
