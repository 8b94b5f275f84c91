//! MLA family reference (SPEC §1): per DCP rank on its shard with the global
//! causal mask, and the unsharded attention the merged ranks must equal.

use std::collections::BTreeMap;
use std::ops::Range;

use super::engine::{self, Group, Source};
use super::{Inputs, NoSource, RefOut};
use crate::case::{MLA_D_QK, MLA_D_V};
use crate::workload::MlaWorkload;

/// Rank `r`'s local shard with the causal mask on GLOBAL positions, all
/// gathered heads `H = w.heads()`. Local token `j` of rank `r` is global
/// token `global_pos(j, r, W, S)`; it is read from the global arrays, so the
/// paged pools are not involved. `rows` index `total_q` query rows.
///
/// # Errors
/// [`NoSource`] for [`Inputs::Unquantized`] on a bf16 workload.
///
/// # Panics
/// If `r >= W` or a row is out of range.
pub fn rank(w: &MlaWorkload, r: usize, rows: &[usize], inputs: Inputs) -> Result<RefOut, NoSource> {
    assert!(w.p.dcp.ranks().contains(&r), "rank {r} of a world of {:?}", w.p.dcp);
    run(w, Some(r), rows, inputs)
}

/// The unsharded attention (what the DCP-merged result must equal).
///
/// # Errors
/// [`NoSource`] for [`Inputs::Unquantized`] on a bf16 workload.
///
/// # Panics
/// If a row is out of range.
pub fn full(w: &MlaWorkload, rows: &[usize], inputs: Inputs) -> Result<RefOut, NoSource> {
    run(w, None, rows, inputs)
}

/// Tokens query row `row` sees, as `(sequence, visible global prefix)`.
/// Row `i` of sequence `b` sits at `q_g = L_b - s_q + i` and sees `g <= q_g`.
pub fn visible(w: &MlaWorkload, row: usize) -> (usize, usize) {
    let total_q = *w.qo_indptr.last().expect("qo_indptr has B+1 entries") as usize;
    assert!(row < total_q, "query row {row} of {total_q}");
    let b = w.qo_indptr.partition_point(|&x| x as usize <= row) - 1;
    let i = row - w.qo_indptr[b] as usize;
    let s_q = (w.qo_indptr[b + 1] - w.qo_indptr[b]) as usize;
    let len = (w.g_kv_indptr[b + 1] - w.g_kv_indptr[b]) as usize;
    // q_g + 1 = len - s_q + i + 1, clamped at 0 for contexts shorter than s_q.
    (b, (len + i + 1).saturating_sub(s_q).min(len))
}

fn run(w: &MlaWorkload, rank: Option<usize>, rows: &[usize], inputs: Inputs) -> Result<RefOut, NoSource> {
    let (q, kv, q_scale, kv_scale) = match inputs {
        Inputs::Dequantized => (&w.q_vals, &w.kv_vals, w.q_scale as f64, w.kv_scale as f64),
        Inputs::Unquantized => (
            w.q_src.as_ref().ok_or(NoSource)?,
            w.kv_src.as_ref().ok_or(NoSource)?,
            1.0,
            1.0,
        ),
    };
    let dcp = w.p.dcp;
    let mut by_seq: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for (slot, &row) in rows.iter().enumerate() {
        let (b, n) = visible(w, row);
        let n = match rank {
            Some(r) => dcp.local_len(r, n),
            None => n,
        };
        by_seq.entry(b).or_default().push((slot, n));
    }
    let seqs: Vec<usize> = by_seq.keys().copied().collect();
    let groups: Vec<Group> = by_seq.into_values().map(Group::new).collect();
    let src = MlaSource {
        w,
        q,
        kv,
        rows,
        seqs,
        rank,
        logit_scale: w.p.sm_scale * q_scale * kv_scale,
        v_scale: kv_scale,
    };
    let (o, lse) = engine::attend(&src, &groups, rows.len());
    let tokens: usize = groups.iter().flat_map(|g| &g.vis).sum();
    Ok(RefOut {
        rows: rows.to_vec(),
        heads: w.heads(),
        d_v: MLA_D_V,
        o,
        lse,
        flops: engine::flops_per_token(&src) * tokens as f64,
    })
}

struct MlaSource<'a> {
    w: &'a MlaWorkload,
    q: &'a [f32],
    kv: &'a [f32],
    rows: &'a [usize],
    /// Sequence of each group.
    seqs: Vec<usize>,
    /// `None`: the unsharded sequence.
    rank: Option<usize>,
    logit_scale: f64,
    v_scale: f64,
}

impl Source for MlaSource<'_> {
    fn heads(&self) -> usize {
        self.w.heads()
    }
    fn d_qk(&self) -> usize {
        MLA_D_QK
    }
    fn d_v(&self) -> usize {
        MLA_D_V
    }
    fn logit_scale(&self) -> f64 {
        self.logit_scale
    }
    fn v_scale(&self) -> f64 {
        self.v_scale
    }
    fn q(&self, slot: usize, out: &mut [f64]) {
        let n = self.heads() * MLA_D_QK;
        let row = self.rows[slot];
        for (x, &y) in out.iter_mut().zip(&self.q[row * n..(row + 1) * n]) {
            *x = y as f64;
        }
    }
    fn k(&self, group: usize, tokens: Range<usize>, out: &mut [f64]) {
        let b = self.seqs[group];
        let base = self.w.g_kv_indptr[b] as usize;
        let dcp = self.w.p.dcp;
        for (t, dst) in tokens.zip(out.chunks_exact_mut(MLA_D_QK)) {
            let g = match self.rank {
                Some(r) => dcp.global_pos(t, r),
                None => t,
            };
            let o = (base + g) * MLA_D_QK;
            for (x, &y) in dst.iter_mut().zip(&self.kv[o..o + MLA_D_QK]) {
                *x = y as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Dtype, MlaParams, PoolOrder};
    use crate::dcp::Dcp;
    use crate::reference::combine::combine;
    use crate::workload::mla;

    fn params(ctx: Vec<usize>, heads_local: usize, w: usize, s: usize, s_q: usize, dtype: Dtype) -> MlaParams {
        MlaParams {
            batch: ctx.len(),
            ctx,
            ctx_label: "t".into(),
            heads_local,
            dcp: Dcp {
                world: w,
                interleave: s,
            },
            s_q,
            dtype,
            page_size: 1,
            pool: PoolOrder::Shuffled,
            sm_scale: 192f64.powf(-0.5),
        }
    }

    /// Two-pass scalar attention straight from SPEC §1, for comparison.
    fn naive(w: &MlaWorkload, rank: Option<usize>, row: usize, inputs: Inputs) -> (Vec<f64>, Vec<f64>) {
        let (q, kv, qs, ks) = match inputs {
            Inputs::Dequantized => (&w.q_vals, &w.kv_vals, w.q_scale as f64, w.kv_scale as f64),
            Inputs::Unquantized => (w.q_src.as_ref().unwrap(), w.kv_src.as_ref().unwrap(), 1.0, 1.0),
        };
        let h = w.heads();
        let b = (0..w.p.batch).find(|&b| row < w.qo_indptr[b + 1] as usize).unwrap();
        let len = w.p.ctx[b];
        let q_g = len as i64 - w.p.s_q as i64 + (row - w.qo_indptr[b] as usize) as i64;
        let dcp = w.p.dcp;
        let toks: Vec<usize> = match rank {
            Some(r) => (0..dcp.local_len(r, len)).map(|j| dcp.global_pos(j, r)).collect(),
            None => (0..len).collect(),
        };
        let toks: Vec<usize> = toks.into_iter().filter(|&g| (g as i64) <= q_g).collect();
        let mut o = vec![0f64; h * MLA_D_V];
        let mut lse = vec![f64::NEG_INFINITY; h];
        for hh in 0..h {
            let qv = &q[(row * h + hh) * MLA_D_QK..][..MLA_D_QK];
            let logits: Vec<f64> = toks
                .iter()
                .map(|&g| {
                    let kr = &kv[(w.g_kv_indptr[b] as usize + g) * MLA_D_QK..][..MLA_D_QK];
                    qv.iter().zip(kr).map(|(&a, &c)| a as f64 * c as f64).sum::<f64>() * w.p.sm_scale * qs * ks
                })
                .collect();
            if logits.is_empty() {
                continue;
            }
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|x| (x - m).exp()).sum();
            lse[hh] = m + z.ln();
            for (&g, x) in toks.iter().zip(&logits) {
                let p = (x - m).exp() / z;
                let kr = &kv[(w.g_kv_indptr[b] as usize + g) * MLA_D_QK..][..MLA_D_V];
                for (d, &v) in kr.iter().enumerate() {
                    o[hh * MLA_D_V + d] += p * v as f64 * ks;
                }
            }
        }
        (o, lse)
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            if x == f64::NEG_INFINITY || y == f64::NEG_INFINITY {
                assert_eq!(x, y, "{what}[{i}]");
            } else {
                assert!((x - y).abs() <= tol * y.abs().max(1.0), "{what}[{i}]: {x} vs {y}");
            }
        }
    }

    #[test]
    fn two_tokens_with_known_softmax() {
        // One head, one row; q = e0, k0 = 0, k1 = e0 * ln3 / sm_scale:
        // logits 0 and ln 3, weights 1/4 and 3/4.
        let mut w = mla::build(&params(vec![2], 1, 1, 1, 1, Dtype::Bf16), 1).unwrap();
        let sm = w.p.sm_scale;
        w.q_vals.fill(0.0);
        w.q_vals[0] = 1.0;
        w.kv_vals.fill(0.0);
        w.kv_vals[MLA_D_QK] = (3f64.ln() / sm) as f32;
        let k1 = w.kv_vals[MLA_D_QK] as f64;
        w.kv_vals[1] = 2.0; // v0[1]
        w.kv_vals[MLA_D_QK + 1] = 6.0; // v1[1]
        w.kv_vals[MLA_D_QK + 575] = 100.0; // rope dim of k1 only: q is 0 there, not in V
        let out = full(&w, &[0], Inputs::Dequantized).unwrap();
        let (z, e) = (1.0 + (k1 * sm).exp(), (k1 * sm).exp());
        assert!((out.lse[0] - z.ln()).abs() < 1e-15);
        assert!((out.lse[0] - 4f64.ln()).abs() < 1e-6);
        assert!((out.o[0] - e / z * k1).abs() < 1e-12, "{}", out.o[0]);
        assert!((out.o[1] - (2.0 + 6.0 * e) / z).abs() < 1e-12, "{}", out.o[1]);
        assert!((out.o[1] - 5.0).abs() < 1e-5);
        assert!(out.o[2..].iter().all(|&x| x == 0.0));
        assert_eq!(out.flops, 2.0 * 1.0 * 1088.0 * 2.0);
    }

    #[test]
    fn fp8_scales_enter_logits_and_output() {
        let mut w = mla::build(&params(vec![1], 1, 1, 1, 1, Dtype::Fp8), 1).unwrap();
        // One token: softmax weight 1, o = v * kv_scale whatever the logit.
        let out = full(&w, &[0], Inputs::Dequantized).unwrap();
        for d in 0..MLA_D_V {
            assert_eq!(out.o[d], w.kv_vals[d] as f64 * w.kv_scale as f64);
        }
        let dot: f64 = (0..MLA_D_QK).map(|d| w.q_vals[d] as f64 * w.kv_vals[d] as f64).sum();
        let lse = dot * w.p.sm_scale * w.q_scale as f64 * w.kv_scale as f64;
        assert!((out.lse[0] - lse).abs() < 1e-12 * lse.abs().max(1.0));
        w.kv_scale *= 2.0;
        assert_ne!(full(&w, &[0], Inputs::Dequantized).unwrap().lse[0], out.lse[0]);
    }

    #[test]
    fn global_causal_mask_for_multi_token_rows() {
        // s_q = 3 over L = 4: rows see 2, 3 and 4 tokens; L = 1: 0, 0, 1.
        let w = mla::build(&params(vec![4, 1], 2, 2, 1, 3, Dtype::Bf16), 2).unwrap();
        assert_eq!(
            (0..6).map(|r| visible(&w, r)).collect::<Vec<_>>(),
            vec![(0, 2), (0, 3), (0, 4), (1, 0), (1, 0), (1, 1)]
        );
        let rows: Vec<usize> = (0..6).collect();
        let out = full(&w, &rows, Inputs::Dequantized).unwrap();
        let h = w.heads();
        for &row in &rows {
            let (o, lse) = naive(&w, None, row, Inputs::Dequantized);
            assert_close(&out.o[row * h * MLA_D_V..][..h * MLA_D_V], &o, 1e-12, "o");
            assert_close(&out.lse[row * h..][..h], &lse, 1e-12, "lse");
        }
        // Rows 3 and 4 see nothing: o = 0, lse = -inf, never NaN.
        assert!(out.lse[3 * h..5 * h].iter().all(|&x| x == f64::NEG_INFINITY));
        assert!(out.o[3 * h * MLA_D_V..5 * h * MLA_D_V].iter().all(|&x| x == 0.0));
        assert_eq!(out.flops, 2.0 * h as f64 * 1088.0 * (2 + 3 + 4 + 1) as f64);
    }

    #[test]
    fn ranks_match_scalar_reference_on_their_shards() {
        let w = mla::build(&params(vec![37, 5, 300], 1, 4, 2, 2, Dtype::Fp8), 3).unwrap();
        let rows = [0, 1, 3, 5, 4];
        for r in 0..4 {
            let out = rank(&w, r, &rows, Inputs::Dequantized).unwrap();
            assert_eq!(out.rows, rows);
            let h = w.heads();
            for (k, &row) in rows.iter().enumerate() {
                let (o, lse) = naive(&w, Some(r), row, Inputs::Dequantized);
                assert_close(
                    &out.o[k * h * MLA_D_V..][..h * MLA_D_V],
                    &o,
                    1e-12,
                    &format!("o r{r} row{row}"),
                );
                assert_close(&out.lse[k * h..][..h], &lse, 1e-12, &format!("lse r{r} row{row}"));
            }
        }
    }

    #[test]
    fn merged_ranks_equal_full_attention() {
        for ww in [1, 2, 4, 8] {
            for s in [1, 2] {
                for (s_q, dtype) in [(1, Dtype::Bf16), (3, Dtype::Fp8)] {
                    // Lengths shorter than W*S leave some ranks empty.
                    let p = params(vec![3, 17, 64, 129, 1], 8 / ww.min(4), ww, s, s_q, dtype);
                    let w = mla::build(&p, (ww * 10 + s) as u64).unwrap();
                    let rows: Vec<usize> = (0..p.total_q()).collect();
                    let full = full(&w, &rows, Inputs::Dequantized).unwrap();
                    let parts: Vec<RefOut> = (0..ww)
                        .map(|r| rank(&w, r, &rows, Inputs::Dequantized).unwrap())
                        .collect();
                    let refs: Vec<(&[f64], &[f64])> = parts.iter().map(|p| (&p.o[..], &p.lse[..])).collect();
                    let (o, lse) = combine(&refs, MLA_D_V);
                    let what = format!("W{ww} S{s} s_q{s_q}");
                    assert_close(&o, &full.o, 1e-12, &what);
                    assert_close(&lse, &full.lse, 1e-12, &what);
                    let rank_flops: f64 = parts.iter().map(|p| p.flops).sum();
                    assert_eq!(rank_flops, full.flops, "{what}: every visible token counted once");
                }
            }
        }
    }

    #[test]
    fn long_contexts_cross_blocks_and_spans() {
        // 2 spans + a partial block, s_q = 2 so rows end mid-block.
        let len = 2 * engine::SPAN + 300;
        let w = mla::build(&params(vec![len, 40], 1, 2, 1, 2, Dtype::Bf16), 4).unwrap();
        let rows = [1, 0, 3];
        let out = full(&w, &rows, Inputs::Dequantized).unwrap();
        let r1 = rank(&w, 1, &rows, Inputs::Dequantized).unwrap();
        let h = w.heads();
        for (k, &row) in rows.iter().enumerate() {
            for (got, r) in [(&out, None), (&r1, Some(1))] {
                let (o, lse) = naive(&w, r, row, Inputs::Dequantized);
                assert_close(&got.o[k * h * MLA_D_V..][..h * MLA_D_V], &o, 1e-12, "o");
                assert_close(&got.lse[k * h..][..h], &lse, 1e-12, "lse");
            }
        }
    }

    #[test]
    fn unquantized_needs_an_fp8_source() {
        let wb = mla::build(&params(vec![9], 2, 1, 1, 1, Dtype::Bf16), 5).unwrap();
        assert_eq!(full(&wb, &[0], Inputs::Unquantized).unwrap_err(), NoSource);
        assert_eq!(rank(&wb, 0, &[0], Inputs::Unquantized).unwrap_err(), NoSource);
        let w = mla::build(&params(vec![90], 2, 1, 1, 1, Dtype::Fp8), 5).unwrap();
        let src = full(&w, &[0], Inputs::Unquantized).unwrap();
        let deq = full(&w, &[0], Inputs::Dequantized).unwrap();
        let (o, lse) = naive(&w, None, 0, Inputs::Unquantized);
        assert_close(&src.o, &o, 1e-12, "o");
        assert_close(&src.lse, &lse, 1e-12, "lse");
        let diff = src.o.iter().zip(&deq.o).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(
            diff > 1e-6 && diff < 0.5,
            "quantization noise is visible but small: {diff}"
        );
    }

    #[test]
    fn results_do_not_depend_on_row_order() {
        let w = mla::build(&params(vec![50, 70], 2, 2, 1, 2, Dtype::Bf16), 6).unwrap();
        let a = full(&w, &[0, 1, 2, 3], Inputs::Dequantized).unwrap();
        let b = full(&w, &[3, 1, 2, 0], Inputs::Dequantized).unwrap();
        let n = w.heads() * MLA_D_V;
        assert_eq!(a.o[..n], b.o[3 * n..]);
        assert_eq!(a.o[3 * n..], b.o[..n]);
        assert_eq!(a.o[n..3 * n], b.o[n..3 * n]);
    }
}
