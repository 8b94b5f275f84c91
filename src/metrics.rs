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
    pub const BF16: Tolerances = Tolerances {
        cos_diff: 1e-5,
        mismatch: 1e-4,
        atol: 1e-2,
        rtol: 1e-2,
        lse_abs: 1e-3,
    };
    /// fp8 paths against the reference on the dequantized inputs.
    pub const FP8: Tolerances = Tolerances {
        cos_diff: 1e-4,
        mismatch: 1e-3,
        atol: 2e-2,
        rtol: 2e-2,
        lse_abs: 1e-3,
    };
}

/// Comparison of one output tensor against its reference.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ErrorMetrics {
    /// Elements compared.
    pub n: usize,
    #[serde(with = "crate::serde_float")]
    pub max_abs: f64,
    #[serde(with = "crate::serde_float")]
    pub max_rel: f64,
    /// Flat index of the worst element (by abs error) and both values there.
    pub worst_index: usize,
    #[serde(with = "crate::serde_float")]
    pub worst_out: f64,
    #[serde(with = "crate::serde_float")]
    pub worst_ref: f64,
    #[serde(with = "crate::serde_float")]
    pub rel_l2: f64,
    #[serde(with = "crate::serde_float")]
    pub cos_diff: f64,
    /// Fraction with `|o-r| > atol` and `|o-r| > rtol*|r|`.
    #[serde(with = "crate::serde_float")]
    pub mismatch: f64,
    /// Positions where finiteness differs from the reference (NaN where finite, etc.).
    pub nonfinite_mismatch: usize,
    /// Elements still holding the poison value (never written).
    pub unwritten: usize,
}

/// Fill pattern for outputs before a checked run: a quiet NaN whose low 16
/// bits are zero, so a bf16 buffer filled with [`POISON_BF16`] reads back as
/// exactly these f32 bits (bf16 to f32 conversions that quiet NaNs leave a
/// quiet one alone). Its payload is not the canonical NaN that hardware makes
/// and the workloads' NaN padding uses, so a computed NaN never matches it.
pub const POISON_BITS: u32 = 0x7FE5_0000;
/// [`POISON_BITS`] as a bf16 bit pattern (its upper half).
pub const POISON_BF16: u16 = (POISON_BITS >> 16) as u16;

/// Same class of non-finite value (NaN, +inf, -inf), or both finite.
fn same_class(o: f64, r: f64) -> bool {
    match (o.is_finite(), r.is_finite()) {
        (true, true) => true,
        (false, false) => (o.is_nan() && r.is_nan()) || o == r,
        _ => false,
    }
}

/// Compares a kernel output (f32, converted from bf16) with its f64 reference,
/// same layout. Elements holding the `poison` bits count as `unwritten` and
/// take no part in the other metrics. Values are compared where both are
/// finite; positions whose finiteness differs (NaN or inf against a finite
/// reference, -inf against +inf, ...) count as `nonfinite_mismatch`, and the
/// first of them is the reported worst element, since nothing is worse.
/// `mismatch` is a fraction of all `n` elements. Both all zero: `cos_diff`
/// and `rel_l2` are 0.
///
/// # Panics
/// If the lengths differ.
pub fn compare(out: &[f32], reference: &[f64], tol: &Tolerances, poison: Option<u32>) -> ErrorMetrics {
    assert_eq!(out.len(), reference.len(), "output and reference lengths differ");
    let mut m = ErrorMetrics {
        n: out.len(),
        ..ErrorMetrics::default()
    };
    let (mut diff2, mut ref2, mut dot, mut norms) = (0f64, 0f64, 0f64, 0f64);
    let mut mismatched = 0usize;
    let mut worst_abs = -1f64;
    let mut first_class_miss = None;
    for (i, (&of, &r)) in out.iter().zip(reference).enumerate() {
        if poison == Some(of.to_bits()) {
            m.unwritten += 1;
            continue;
        }
        let o = of as f64;
        if !same_class(o, r) {
            m.nonfinite_mismatch += 1;
            first_class_miss.get_or_insert((i, o, r));
            continue;
        }
        if !r.is_finite() {
            continue;
        }
        let d = (o - r).abs();
        if d > worst_abs {
            worst_abs = d;
            (m.worst_index, m.worst_out, m.worst_ref) = (i, o, r);
        }
        if r != 0.0 {
            m.max_rel = m.max_rel.max(d / r.abs());
        }
        if d > tol.atol && d > tol.rtol * r.abs() {
            mismatched += 1;
        }
        diff2 += d * d;
        ref2 += r * r;
        dot += o * r;
        norms += o * o + r * r;
    }
    m.max_abs = worst_abs.max(0.0);
    if let Some((i, o, r)) = first_class_miss {
        (m.worst_index, m.worst_out, m.worst_ref) = (i, o, r);
    }
    m.rel_l2 = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else if diff2 > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    m.cos_diff = if norms > 0.0 {
        (1.0 - 2.0 * dot / norms).max(0.0)
    } else {
        0.0
    };
    m.mismatch = if m.n > 0 { mismatched as f64 / m.n as f64 } else { 0.0 };
    m
}

/// Where two launches' outputs differ bit for bit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BitDiff {
    pub first: usize,
    pub count: usize,
    /// The values at `first`: first launch, then the other.
    pub a: f32,
    pub b: f32,
}

/// The elements of `b` whose bits differ from `a` (same length); `None`
/// when every bit matches. Bits, not values: `-0.0` against `0.0` or two
/// NaN payloads differ, as they would between two runs of a race.
pub fn bit_difference(a: &[f32], b: &[f32]) -> Option<BitDiff> {
    let mut d: Option<BitDiff> = None;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x.to_bits() != y.to_bits() {
            match &mut d {
                Some(d) => d.count += 1,
                None => {
                    d = Some(BitDiff {
                        first: i,
                        count: 1,
                        a: *x,
                        b: *y,
                    })
                }
            }
        }
    }
    d
}

/// The worst element of `m`, for error messages.
fn worst_element(m: &ErrorMetrics) -> String {
    format!(
        "worst element [{}]: out {} vs ref {}",
        m.worst_index, m.worst_out, m.worst_ref
    )
}

/// Checks shared by every tensor: finiteness pattern and full coverage.
fn judge_common(m: &ErrorMetrics) -> Result<(), String> {
    if m.nonfinite_mismatch > 0 {
        return Err(format!(
            "{} of {} positions differ from the reference in finiteness (NaN/inf); first at [{}]: out {} vs ref {}",
            m.nonfinite_mismatch, m.n, m.worst_index, m.worst_out, m.worst_ref
        ));
    }
    if m.unwritten > 0 {
        return Err(format!(
            "{} of {} elements never written (still hold the poison value)",
            m.unwritten, m.n
        ));
    }
    Ok(())
}

/// Pass/fail of an output tensor: non-finite positions match exactly, every
/// element written, `cos_diff < tol.cos_diff`, `mismatch <= tol.mismatch`.
/// The error names the failing metric, its value and threshold, and the
/// worst element.
pub fn judge_out(m: &ErrorMetrics, tol: &Tolerances) -> Result<(), String> {
    judge_common(m)?;
    // A NaN metric fails too.
    if m.cos_diff.is_nan() || m.cos_diff >= tol.cos_diff {
        return Err(format!(
            "cos_diff {:.3e} >= {:.1e}; {}",
            m.cos_diff,
            tol.cos_diff,
            worst_element(m)
        ));
    }
    if m.mismatch.is_nan() || m.mismatch > tol.mismatch {
        return Err(format!(
            "mismatch {:.3e} > {:.1e} (atol {:.0e}, rtol {:.0e}); {}",
            m.mismatch,
            tol.mismatch,
            tol.atol,
            tol.rtol,
            worst_element(m)
        ));
    }
    Ok(())
}

/// LSE: `max_abs <= tol.lse_abs` over finite entries; `-inf` (empty rows)
/// must match `-inf` exactly, and every entry must be written.
pub fn judge_lse(m: &ErrorMetrics, tol: &Tolerances) -> Result<(), String> {
    judge_common(m)?;
    if m.max_abs.is_nan() || m.max_abs > tol.lse_abs {
        return Err(format!(
            "lse max_abs {:.3e} > {:.1e}; {}",
            m.max_abs,
            tol.lse_abs,
            worst_element(m)
        ));
    }
    Ok(())
}

/// Empty rows: where the reference LSE is `-inf`, the output row (`d`
/// values of `o`, laid out `[lse_ref.len(), d]`) must be exactly zero.
pub fn empty_rows_zero(o: &[f32], lse_ref: &[f64], d: usize) -> Result<(), String> {
    if o.len() != lse_ref.len() * d {
        return Err(format!("o has {} values for {} rows of {d}", o.len(), lse_ref.len()));
    }
    let empty: Vec<usize> = (0..lse_ref.len())
        .filter(|&i| lse_ref[i] == f64::NEG_INFINITY)
        .collect();
    let bad: Vec<(usize, usize)> = empty
        .iter()
        .filter_map(|&i| o[i * d..(i + 1) * d].iter().position(|&x| x != 0.0).map(|k| (i, k)))
        .collect();
    match bad.first() {
        None => Ok(()),
        Some(&(i, k)) => Err(format!(
            "{} of {} empty (row, head) pairs have nonzero o; first: pair {i}, element {k} = {}",
            bad.len(),
            empty.len(),
            o[i * d + k]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Tolerances = Tolerances {
        cos_diff: 1e-5,
        mismatch: 0.25,
        atol: 0.1,
        rtol: 0.1,
        lse_abs: 1e-3,
    };
    const NAN: f64 = f64::NAN;
    const INF: f64 = f64::INFINITY;

    fn poison() -> f32 {
        f32::from_bits(POISON_BITS)
    }

    #[test]
    fn metrics_on_a_hand_made_vector() {
        // Errors 0, 0.5, -0.25, 0 against 1, 2, -4, 0.
        let m = compare(&[1.0, 2.5, -4.25, 0.0], &[1.0, 2.0, -4.0, 0.0], &T, None);
        assert_eq!(m.n, 4);
        assert_eq!(m.max_abs, 0.5);
        assert_eq!((m.worst_index, m.worst_out, m.worst_ref), (1, 2.5, 2.0));
        assert_eq!(m.max_rel, 0.25);
        // |o-r| = sqrt(0.3125), |r| = sqrt(21).
        assert!((m.rel_l2 - (0.3125f64 / 21.0).sqrt()).abs() < 1e-15);
        // sum(o r) = 1 + 5 + 17 = 23; sum(o^2 + r^2) = 2 + 10.25 + 34.0625 = 46.3125.
        assert!((m.cos_diff - (1.0 - 46.0 / 46.3125)).abs() < 1e-15);
        // Only index 1 exceeds both atol 0.1 and rtol*|r| = 0.2 (index 2: 0.25 <= 0.4).
        assert_eq!(m.mismatch, 0.25);
        assert_eq!((m.nonfinite_mismatch, m.unwritten), (0, 0));
    }

    #[test]
    fn identical_and_all_zero_vectors_are_perfect() {
        let m = compare(&[0.0; 3], &[0.0; 3], &T, Some(POISON_BITS));
        assert_eq!(
            (m.max_abs, m.max_rel, m.rel_l2, m.cos_diff, m.mismatch),
            (0.0, 0.0, 0.0, 0.0, 0.0)
        );
        let m = compare(&[1.5, -3.0], &[1.5, -3.0], &T, None);
        assert_eq!((m.max_abs, m.rel_l2, m.cos_diff), (0.0, 0.0, 0.0));
        // Output nonzero against a zero reference: no relative error defined, rel_l2 infinite.
        let m = compare(&[1.0], &[0.0], &T, None);
        assert_eq!((m.max_rel, m.rel_l2, m.cos_diff), (0.0, INF, 1.0));
    }

    #[test]
    fn opposite_vectors_have_cos_diff_two() {
        let m = compare(&[1.0, -2.0], &[-1.0, 2.0], &T, None);
        assert_eq!(m.cos_diff, 2.0);
        assert_eq!(m.rel_l2, 2.0);
    }

    #[test]
    fn nonfinite_positions_must_match_exactly() {
        let r = [1.0, NAN, -INF, INF, 2.0];
        let m = compare(&[1.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 2.0], &r, &T, None);
        assert_eq!(m.nonfinite_mismatch, 0);
        assert!(judge_out(&m, &T).is_ok());
        // NaN where finite, +inf where -inf, finite where NaN.
        let m = compare(&[f32::NAN, 0.0, f32::INFINITY, f32::INFINITY, 2.0], &r, &T, None);
        assert_eq!(m.nonfinite_mismatch, 3);
        assert_eq!(m.worst_index, 0, "the first non-finite mismatch is the worst element");
        assert!(m.worst_out.is_nan());
        let e = judge_out(&m, &T).unwrap_err();
        assert!(e.contains("3 of 5") && e.contains("[0]"), "{e}");
    }

    #[test]
    fn poison_counts_as_unwritten_and_nothing_else() {
        let m = compare(&[poison(), 1.0, f32::NAN], &[5.0, 1.0, 7.0], &T, Some(POISON_BITS));
        assert_eq!(m.unwritten, 1);
        assert_eq!(m.nonfinite_mismatch, 1, "an arithmetic NaN is not poison");
        let m = compare(&[poison(), 1.0], &[5.0, 1.0], &T, Some(POISON_BITS));
        assert_eq!((m.unwritten, m.max_abs), (1, 0.0));
        assert!(judge_out(&m, &T).unwrap_err().contains("never written"));
        assert!(judge_lse(&m, &T).unwrap_err().contains("never written"));
        // Without a poison pattern the same bits are just a NaN.
        assert_eq!(compare(&[poison()], &[5.0], &T, None).nonfinite_mismatch, 1);
    }

    #[test]
    fn bf16_poison_reads_back_as_poison_bits() {
        let f = half::bf16::from_bits(POISON_BF16).to_f32();
        assert_eq!(f.to_bits(), POISON_BITS);
        assert!(f.is_nan());
        // A computed NaN and the workloads' NaN padding are not poison.
        let zero = std::hint::black_box(0f32);
        assert_ne!((zero / zero).to_bits() & 0x7FFF_FFFF, POISON_BITS);
        assert_ne!(
            crate::workload::codec::bf16_from_bits(crate::workload::codec::BF16_NAN).to_bits(),
            POISON_BITS
        );
        assert_ne!(
            crate::workload::codec::e4m3_to_f32(crate::workload::codec::E4M3_NAN).to_bits(),
            POISON_BITS
        );
    }

    #[test]
    fn judge_out_names_metric_threshold_and_worst_element() {
        let m = compare(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0, 3.0], &T, None);
        let e = judge_out(&m, &T).unwrap_err();
        assert!(
            e.starts_with("cos_diff") && e.contains("1.0e-5") && e.contains("[3]: out 4 vs ref 3"),
            "{e}"
        );
        let loose = Tolerances {
            cos_diff: 1.0,
            mismatch: 0.2,
            ..T
        };
        let e = judge_out(&m, &loose).unwrap_err();
        assert!(e.starts_with("mismatch 2.500e-1 > 2.0e-1"), "{e}");
        assert!(e.contains("[3]: out 4 vs ref 3"), "{e}");
        let m = compare(&[1.0, 2.0, 3.0, 3.05], &[1.0, 2.0, 3.0, 3.0], &T, None);
        assert_eq!(m.mismatch, 0.0, "0.05 is within atol");
        assert!(judge_out(&m, &Tolerances { cos_diff: 1e-3, ..T }).is_ok());
    }

    #[test]
    fn mismatch_threshold_is_inclusive() {
        let m = compare(&[2.0, 0.0, 0.0, 0.0], &[1.0, 0.0, 0.0, 0.0], &T, None);
        assert_eq!(m.mismatch, 0.25);
        let tol = Tolerances { cos_diff: 1.0, ..T };
        assert!(judge_out(&m, &tol).is_ok(), "mismatch == threshold passes");
        assert!(judge_out(&m, &Tolerances { mismatch: 0.2, ..tol }).is_err());
    }

    #[test]
    fn judge_lse_uses_max_abs_and_exact_neg_inf() {
        let r = [0.5, -INF, 3.0];
        let m = compare(&[0.5005, f32::NEG_INFINITY, 3.0], &r, &T, None);
        assert!((m.max_abs - 0.0005).abs() < 1e-7);
        assert!(judge_lse(&m, &T).is_ok());
        let m = compare(&[0.502, f32::NEG_INFINITY, 3.0], &r, &T, None);
        assert!(judge_lse(&m, &T).unwrap_err().starts_with("lse max_abs"));
        // An empty row must be -inf, not a very negative number.
        let m = compare(&[0.5, -1e30, 3.0], &r, &T, None);
        assert_eq!(m.nonfinite_mismatch, 1);
        assert!(judge_lse(&m, &T).is_err());
    }

    #[test]
    fn bit_difference_counts_bits_not_values() {
        assert_eq!(bit_difference(&[1.0, 2.0], &[1.0, 2.0]), None);
        let d = bit_difference(&[1.0, 0.0, 3.0, 4.0], &[1.0, -0.0, 3.0, 4.5]).unwrap();
        assert_eq!((d.first, d.count, d.a, d.b), (1, 2, 0.0, -0.0));
        let quiet = f32::from_bits(0x7FC0_0000);
        let other = f32::from_bits(0x7FC0_0001);
        assert_eq!(
            bit_difference(&[quiet], &[quiet]),
            None,
            "the same NaN twice is the same"
        );
        assert_eq!(bit_difference(&[quiet], &[other]).unwrap().count, 1);
    }

    #[test]
    fn empty_rows_must_be_exactly_zero() {
        let lse = [1.0, -INF, -INF];
        assert!(empty_rows_zero(&[9.0, 9.0, 0.0, -0.0, 0.0, 0.0], &lse, 2).is_ok());
        let e = empty_rows_zero(&[9.0, 9.0, 0.0, 0.0, 0.0, 1e-30], &lse, 2).unwrap_err();
        assert!(e.contains("1 of 2") && e.contains("pair 2, element 1"), "{e}");
        assert!(empty_rows_zero(&[0.0, f32::NAN, 0.0, 0.0, 0.0, 0.0], &[-INF, 0.0, 0.0], 2).is_err());
        assert!(empty_rows_zero(&[0.0; 5], &lse, 2).unwrap_err().contains("5 values"));
    }
}
