//! Merging attention partials by their LSE (SPEC §1 DCP combine, §2 sink).
//!
//! One formula serves the DCP combine over ranks, split merges and the
//! reference's own span merges, so all of them agree on the edge cases.

/// SPEC §1 DCP combine. Each part is `(o [n*d], lse [n])` with `n` (row,
/// head) pairs. Per pair: NaN and `+inf` LSEs count as `-inf` (an empty
/// part); `G = ln(sum exp(lse_r - M)) + M`; `o = sum exp(lse_r - G) * o_r`,
/// where a zero weight contributes 0 even if `o_r` is NaN. All parts empty:
/// `o = 0`, `lse = -inf`. No parts: empty outputs.
///
/// # Panics
/// If the parts disagree in length or `o` is not `d` times `lse`.
pub fn combine(parts: &[(&[f64], &[f64])], d: usize) -> (Vec<f64>, Vec<f64>) {
    merge(parts, d, None)
}

/// [`combine`] plus an attention sink per head (SPEC §2): the sink of head
/// `i % heads` joins pair `i` as one more part whose value is 0, so it only
/// adds `exp(sink)` to the denominator and the merged LSE includes it. It goes
/// through the same mapping as the parts: a `-inf` (or NaN) sink is no sink.
/// All parts empty: `o = 0`, `lse = sink`.
///
/// # Panics
/// As [`combine`], and if `sink.len() != heads`.
pub fn combine_with_sink(parts: &[(&[f64], &[f64])], d: usize, heads: usize, sink: &[f64]) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(sink.len(), heads, "one sink logit per head");
    merge(parts, d, Some(sink))
}

/// NaN and `+inf` mean "this part holds nothing".
fn sanitize(lse: f64) -> f64 {
    if lse.is_nan() || lse == f64::INFINITY {
        f64::NEG_INFINITY
    } else {
        lse
    }
}

fn merge(parts: &[(&[f64], &[f64])], d: usize, sink: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
    let Some(first) = parts.first() else {
        return (Vec::new(), Vec::new());
    };
    let n = first.1.len();
    for (i, (o, lse)) in parts.iter().enumerate() {
        assert_eq!(lse.len(), n, "part {i}: {} LSEs, part 0 has {n}", lse.len());
        assert_eq!(o.len(), n * d, "part {i}: o has {} values for {n} x {d}", o.len());
    }
    let mut out = vec![0f64; n * d];
    let mut lse_out = vec![f64::NEG_INFINITY; n];
    let mut w = vec![0f64; parts.len()];
    for i in 0..n {
        let sink_i = sink.map(|s| sanitize(s[i % s.len()])).unwrap_or(f64::NEG_INFINITY);
        let m = parts.iter().map(|p| sanitize(p.1[i])).fold(sink_i, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let sum: f64 = parts.iter().map(|p| (sanitize(p.1[i]) - m).exp()).sum::<f64>() + (sink_i - m).exp();
        let g = m + sum.ln();
        lse_out[i] = g;
        for (wr, p) in w.iter_mut().zip(parts) {
            *wr = (sanitize(p.1[i]) - g).exp();
        }
        let dst = &mut out[i * d..(i + 1) * d];
        for (&wr, p) in w.iter().zip(parts) {
            if wr == 0.0 {
                continue;
            }
            for (x, &y) in dst.iter_mut().zip(&p.0[i * d..(i + 1) * d]) {
                *x += wr * y;
            }
        }
    }
    (out, lse_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-14 * b.abs().max(1.0)
    }

    #[test]
    fn two_parts_weighted_by_their_sums() {
        // Part sums 1 and 3: weights 1/4 and 3/4, merged sum 4.
        let (o, lse) = combine(&[(&[1.0, 10.0], &[0.0]), (&[5.0, -2.0], &[3f64.ln()])], 2);
        assert!(close(o[0], 4.0), "{}", o[0]);
        assert!(close(o[1], 10.0 / 4.0 - 6.0 / 4.0), "{}", o[1]);
        assert!(close(lse[0], 4f64.ln()));
    }

    #[test]
    fn nan_and_pos_inf_ranks_count_as_empty_even_with_nan_outputs() {
        let parts: [(&[f64], &[f64]); 4] = [
            (&[f64::NAN], &[f64::NAN]),
            (&[2.0], &[0.5]),
            (&[f64::NAN], &[INF]),
            (&[f64::NAN], &[-INF]),
        ];
        let (o, lse) = combine(&parts, 1);
        assert_eq!(o, vec![2.0]);
        assert_eq!(lse, vec![0.5]);
    }

    #[test]
    fn all_empty_gives_zero_and_neg_inf() {
        let (o, lse) = combine(&[(&[f64::NAN, 1.0], &[-INF]), (&[3.0, 4.0], &[f64::NAN])], 2);
        assert_eq!(o, vec![0.0, 0.0]);
        assert_eq!(lse, vec![-INF]);
        assert_eq!(combine(&[], 4), (vec![], vec![]));
    }

    #[test]
    fn underflowing_weight_skips_a_nan_output() {
        // exp(-2000) is 0 in f64: the NaN of the tiny part must not leak.
        let (o, lse) = combine(&[(&[7.0], &[0.0]), (&[f64::NAN], &[-2000.0])], 1);
        assert_eq!(o, vec![7.0]);
        assert_eq!(lse, vec![0.0]);
        // A part that does carry weight propagates its NaN.
        let (o, _) = combine(&[(&[7.0], &[0.0]), (&[f64::NAN], &[-1.0])], 1);
        assert!(o[0].is_nan());
    }

    #[test]
    fn large_lses_do_not_overflow() {
        // Weights exp(800 - G) lose the ~1e-13 absolute precision of G itself.
        let (o, lse) = combine(&[(&[1.0], &[800.0]), (&[3.0], &[800.0])], 1);
        assert!((o[0] - 2.0).abs() < 1e-12, "{}", o[0]);
        assert!(close(lse[0], 800.0 + 2f64.ln()));
    }

    #[test]
    fn sink_is_a_zero_valued_key_per_head() {
        // Head 0: part sum 1, sink exp(ln 3) = 3 -> o scaled by 1/4, lse ln 4.
        // Head 1: sink -inf -> plain combine.
        let (o, lse) = combine_with_sink(&[(&[2.0, 5.0], &[0.0, 1.5])], 1, 2, &[3f64.ln(), -INF]);
        assert!(close(o[0], 0.5), "{}", o[0]);
        assert!(close(lse[0], 4f64.ln()));
        assert_eq!(o[1], 5.0);
        assert_eq!(lse[1], 1.5);
    }

    #[test]
    fn sink_alone_gives_zero_output_and_sink_lse() {
        // Two rows of two heads: the sink is indexed by pair % heads.
        let (o, lse) = combine_with_sink(&[(&[1.0; 4], &[-INF; 4])], 1, 2, &[0.25, -1.0]);
        assert_eq!(o, vec![0.0; 4]);
        assert_eq!(lse, vec![0.25, -1.0, 0.25, -1.0]);
    }

    #[test]
    fn sink_merge_matches_combine_then_sink() {
        let a: (&[f64], &[f64]) = (&[1.0, -1.0, 0.5, 2.0], &[0.3, -0.7]);
        let b: (&[f64], &[f64]) = (&[4.0, 0.0, -3.0, 1.0], &[1.1, 0.2]);
        let sink = [0.9, -0.4];
        let (o1, l1) = combine_with_sink(&[a, b], 2, 2, &sink);
        let (o, l) = combine(&[a, b], 2);
        let (o2, l2) = combine_with_sink(&[(&o, &l)], 2, 2, &sink);
        for (x, y) in o1.iter().zip(&o2).chain(l1.iter().zip(&l2)) {
            assert!(close(*x, *y), "{x} vs {y}");
        }
    }
}
