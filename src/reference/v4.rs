//! DeepSeek-V4 reference (SPEC §2): per-row KV lists, K = V = the 512-element
//! row (448 dequantized nope + 64 rope), attention sink.

use rayon::prelude::*;
use std::ops::Range;

use super::combine::combine_with_sink;
use super::engine::{self, Group, Source};
use super::{Inputs, RefOut};
use crate::case::V4_D;
use crate::workload::V4Workload;

/// V4 rows with the attention sink, kernel heads `w.heads` (pad heads
/// included, as the kernels compute them): `s = q . k * sm_scale` over all 512
/// dims, `o = softmax . v` with the sink in the denominator. A row of length 0
/// (a CUDA-graph pad row) gives `o = 0`, `lse = sink`. Counted FLOPs use the
/// kernel heads.
///
/// # Panics
/// If a row is `>= w.t`.
pub fn attend(w: &V4Workload, rows: &[usize], inputs: Inputs) -> RefOut {
    let (src, groups) = setup(w, rows, inputs);
    let (o, lse) = engine::attend(&src, &groups, rows.len());
    let sink: Vec<f64> = w.sink.iter().map(|&s| s as f64).collect();
    let (o, lse) = combine_with_sink(&[(&o, &lse)], V4_D, w.heads, &sink);
    let tokens: usize = rows.iter().map(|&i| w.row_len(i)).sum();
    RefOut {
        rows: rows.to_vec(),
        heads: w.heads,
        d_v: V4_D,
        o,
        lse,
        flops: engine::flops_per_token(&src) * tokens as f64,
    }
}

/// Tokens `[ceil(len*s/n), ceil(len*(s+1)/n))` of a length-`len` row: split
/// `s` of `n` in the v4_split contract.
pub fn split_range(len: usize, s: usize, n: usize) -> Range<usize> {
    (len * s).div_ceil(n)..(len * (s + 1)).div_ceil(n)
}

/// The per-split partials of the v4_split contract for `n` splits, on the
/// dequantized inputs and without the sink: one [`RefOut`] per split (same
/// rows), split `s` of row `i` covering [`split_range`]`(len_i, s, n)`. An
/// empty split has `o = 0`, `lse = -inf`. Merging them with
/// `combine_with_sink` gives [`attend`].
///
/// # Panics
/// If `n == 0` or a row is `>= w.t`.
pub fn split_partials(w: &V4Workload, rows: &[usize], n: usize) -> Vec<RefOut> {
    assert!(n > 0, "at least one split");
    let (src, groups) = setup(w, rows, Inputs::Dequantized);
    let per_row = w.heads * V4_D;
    (0..n)
        .map(|s| {
            let parts: Vec<engine::Partial> = groups
                .par_iter()
                .enumerate()
                .map(|(gi, g)| engine::over_range(&src, gi, g, split_range(g.max_vis(), s, n)))
                .collect();
            let mut o = Vec::with_capacity(rows.len() * per_row);
            let mut lse = Vec::with_capacity(rows.len() * w.heads);
            for p in parts {
                o.extend(p.o);
                lse.extend(p.lse);
            }
            let tokens: usize = groups.iter().map(|g| split_range(g.max_vis(), s, n).len()).sum();
            RefOut {
                rows: rows.to_vec(),
                heads: w.heads,
                d_v: V4_D,
                o,
                lse,
                flops: engine::flops_per_token(&src) * tokens as f64,
            }
        })
        .collect()
}

/// One group per row (each row has its own list), in the order of `rows`.
fn setup<'a>(w: &'a V4Workload, rows: &'a [usize], inputs: Inputs) -> (V4Source<'a>, Vec<Group>) {
    for &i in rows {
        assert!(i < w.t, "V4 row {i} of {}", w.t);
    }
    let (q, pool) = match inputs {
        Inputs::Dequantized => (&w.q_vals, &w.pool_vals),
        Inputs::Unquantized => (&w.q_src, &w.pool_src),
    };
    let groups = rows
        .iter()
        .enumerate()
        .map(|(slot, &i)| Group::new(vec![(slot, w.row_len(i))]))
        .collect();
    (
        V4Source {
            w,
            q,
            pool,
            rows,
            logit_scale: w.p.sm_scale,
        },
        groups,
    )
}

struct V4Source<'a> {
    w: &'a V4Workload,
    q: &'a [f32],
    pool: &'a [f32],
    /// Group `k` is row `rows[k]`.
    rows: &'a [usize],
    logit_scale: f64,
}

impl Source for V4Source<'_> {
    fn heads(&self) -> usize {
        self.w.heads
    }
    fn d_qk(&self) -> usize {
        V4_D
    }
    fn d_v(&self) -> usize {
        V4_D
    }
    fn logit_scale(&self) -> f64 {
        self.logit_scale
    }
    fn v_scale(&self) -> f64 {
        1.0
    }
    fn q(&self, slot: usize, out: &mut [f64]) {
        let n = self.w.heads * V4_D;
        let row = self.rows[slot];
        for (x, &y) in out.iter_mut().zip(&self.q[row * n..(row + 1) * n]) {
            *x = y as f64;
        }
    }
    fn k(&self, group: usize, tokens: Range<usize>, out: &mut [f64]) {
        let list = &self.w.row_list(self.rows[group])[tokens];
        for (&p, dst) in list.iter().zip(out.chunks_exact_mut(V4_D)) {
            let o = p as usize * V4_D;
            for (x, &y) in dst.iter_mut().zip(&self.pool[o..o + V4_D]) {
                *x = y as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{LayerType, V4Params};
    use crate::reference::combine::combine;
    use crate::workload::v4;

    fn params(layer: LayerType, heads: usize, positions: Vec<usize>) -> V4Params {
        V4Params {
            layer,
            rows: positions.len(),
            padded_rows: positions.len() + 2,
            heads,
            positions,
            pos_label: "t".into(),
            verify: 1,
            index_topk: 64,
            max_model_len: 1 << 16,
            sm_scale: 512f64.powf(-0.5),
            indptr_offset: 0,
            replay: 0,
        }
    }

    /// Scalar two-pass attention with the sink, straight from SPEC §2.
    fn naive(w: &V4Workload, row: usize, inputs: Inputs) -> (Vec<f64>, Vec<f64>) {
        let (q, pool) = match inputs {
            Inputs::Dequantized => (&w.q_vals, &w.pool_vals),
            Inputs::Unquantized => (&w.q_src, &w.pool_src),
        };
        let h = w.heads;
        let mut o = vec![0f64; h * V4_D];
        let mut lse = vec![0f64; h];
        for hh in 0..h {
            let qv = &q[(row * h + hh) * V4_D..][..V4_D];
            let kv = |p: i32| &pool[p as usize * V4_D..][..V4_D];
            let logits: Vec<f64> = w
                .row_list(row)
                .iter()
                .map(|&p| qv.iter().zip(kv(p)).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * w.p.sm_scale)
                .collect();
            let sink = w.sink[hh] as f64;
            let m = logits.iter().cloned().fold(sink, f64::max);
            let z: f64 = logits.iter().map(|x| (x - m).exp()).sum::<f64>() + (sink - m).exp();
            lse[hh] = m + z.ln();
            for (&p, x) in w.row_list(row).iter().zip(&logits) {
                for (d, &v) in kv(p).iter().enumerate() {
                    o[hh * V4_D + d] += (x - m).exp() / z * v as f64;
                }
            }
        }
        (o, lse)
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * y.abs().max(1.0), "{what}[{i}]: {x} vs {y}");
        }
    }

    #[test]
    fn rows_match_scalar_reference_with_sink() {
        for layer in [LayerType::Swa, LayerType::Csa, LayerType::Hca] {
            let w = v4::build(&params(layer, 8, vec![0, 3, 200, 300, 700]), 9).unwrap();
            let rows: Vec<usize> = (0..w.t).collect();
            for inputs in [Inputs::Dequantized, Inputs::Unquantized] {
                let out = attend(&w, &rows, inputs);
                let per = w.heads * V4_D;
                for &row in &rows[..w.p.rows] {
                    let (o, lse) = naive(&w, row, inputs);
                    assert_close(&out.o[row * per..][..per], &o, 1e-12, &format!("{layer} o row {row}"));
                    assert_close(
                        &out.lse[row * w.heads..][..w.heads],
                        &lse,
                        1e-12,
                        &format!("{layer} lse row {row}"),
                    );
                }
            }
        }
    }

    #[test]
    fn pad_rows_give_zero_output_and_sink_lse() {
        let w = v4::build(&params(LayerType::Swa, 4, vec![10, 20]), 3).unwrap();
        assert_eq!(w.heads, 16);
        let out = attend(&w, &[3, 2, 0], Inputs::Dequantized);
        for k in 0..2 {
            assert!(out.o[k * 16 * V4_D..(k + 1) * 16 * V4_D].iter().all(|&x| x == 0.0));
            let sink: Vec<f64> = w.sink.iter().map(|&s| s as f64).collect();
            assert_eq!(out.lse[k * 16..(k + 1) * 16], sink[..]);
        }
        assert!(out.lse[2 * 16] > w.sink[0] as f64, "a real row adds to the sink");
        assert_eq!(out.flops, 2.0 * 16.0 * 1024.0 * 11.0);
    }

    #[test]
    fn split_ranges_follow_the_ceil_rule() {
        let r: Vec<_> = (0..3).map(|s| split_range(5, s, 3)).collect();
        assert_eq!(r, vec![0..2, 2..4, 4..5]);
        let r: Vec<_> = (0..4).map(|s| split_range(2, s, 4)).collect();
        assert_eq!(r, vec![0..1, 1..1, 1..2, 2..2]);
    }

    #[test]
    fn merged_split_partials_with_sink_equal_attend() {
        // HCA row at 3000 has 128 + 23 tokens; n = 16 leaves the pad rows' splits empty.
        let w = v4::build(&params(LayerType::Hca, 16, vec![1, 130, 3000]), 5).unwrap();
        let rows: Vec<usize> = (0..w.t).collect();
        let full = attend(&w, &rows, Inputs::Dequantized);
        let sink: Vec<f64> = w.sink.iter().map(|&s| s as f64).collect();
        for n in [1, 3, 16] {
            let parts = split_partials(&w, &rows, n);
            assert_eq!(parts.len(), n);
            let refs: Vec<(&[f64], &[f64])> = parts.iter().map(|p| (&p.o[..], &p.lse[..])).collect();
            let (o, lse) = combine_with_sink(&refs, V4_D, w.heads, &sink);
            assert_close(&o, &full.o, 1e-12, &format!("o n={n}"));
            assert_close(&lse, &full.lse, 1e-12, &format!("lse n={n}"));
            assert_eq!(parts.iter().map(|p| p.flops).sum::<f64>(), full.flops);
            // Row 0 (2 tokens) has empty splits when n > 2.
            if n > 2 {
                assert_eq!(parts[n - 1].lse[0], f64::NEG_INFINITY);
                assert!(parts[n - 1].o[..V4_D].iter().all(|&x| x == 0.0));
            }
            // Without the sink the merge is the plain softmax, a different LSE.
            let (_, plain) = combine(&refs, V4_D);
            assert!(plain[w.heads * 2] < full.lse[w.heads * 2]);
        }
    }
}
