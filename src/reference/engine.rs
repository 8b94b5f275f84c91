//! Blocked f64 attention with an online softmax, shared by both families.
//!
//! MQA: every head of every query row reads the same K/V rows, so a block of
//! tokens is gathered once (as f64) and multiplied against all heads of all
//! rows of a group with two dgemms (`S = Q K^T`, `O += P V`). Rows of a group
//! see prefixes of one token list and differ only by how far they see.

use rayon::prelude::*;
use std::ops::Range;

use super::combine::combine;
use super::gemm::{dgemm, Strides};

/// Tokens per gathered block: K block (256 x 576 f64, 1.2 MB) stays in L2.
pub(crate) const BLOCK: usize = 256;
/// Tokens per parallel task; longer lists are split and merged by LSE so one
/// long sequence still uses every core.
pub(crate) const SPAN: usize = 8 * BLOCK;

/// Where a reference problem's numbers come from.
pub(crate) trait Source: Sync {
    fn heads(&self) -> usize;
    fn d_qk(&self) -> usize;
    /// V is the first `d_v` elements of the K row.
    fn d_v(&self) -> usize;
    /// Multiplies `q . k` (sm_scale and any scales the values exclude).
    fn logit_scale(&self) -> f64;
    /// Multiplies the output (a V scale the values exclude).
    fn v_scale(&self) -> f64;
    /// Q of query slot `slot`, all heads: `[heads, d_qk]`.
    fn q(&self, slot: usize, out: &mut [f64]);
    /// K rows of `tokens` of group `group`'s list: `[tokens.len(), d_qk]`.
    fn k(&self, group: usize, tokens: Range<usize>, out: &mut [f64]);
}

/// Query rows sharing one token list; row `k` sees its first `vis[k]` tokens.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// Output positions, ordered by non-decreasing `vis`.
    pub slots: Vec<usize>,
    pub vis: Vec<usize>,
}

impl Group {
    pub fn new(mut rows: Vec<(usize, usize)>) -> Group {
        rows.sort_by_key(|&(slot, vis)| (vis, slot));
        Group {
            slots: rows.iter().map(|r| r.0).collect(),
            vis: rows.iter().map(|r| r.1).collect(),
        }
    }
    pub fn max_vis(&self) -> usize {
        self.vis.last().copied().unwrap_or(0)
    }
}

/// Normalized attention over part of a list: `o [rows, heads, d_v]`, `lse [rows, heads]`
/// (natural log, `-inf` where the part holds no visible token).
pub(crate) struct Partial {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// `2 * H * (D_qk + D_v)` per visible token (SPEC §5).
pub(crate) fn flops_per_token<S: Source>(src: &S) -> f64 {
    2.0 * src.heads() as f64 * (src.d_qk() + src.d_v()) as f64
}

/// Attention of every group over its whole visible list, scattered to slots:
/// `o [n_slots, heads, d_v]`, `lse [n_slots, heads]`. Slots no group names stay
/// `o = 0`, `lse = -inf`.
pub(crate) fn attend<S: Source>(src: &S, groups: &[Group], n_slots: usize) -> (Vec<f64>, Vec<f64>) {
    let (h, dv) = (src.heads(), src.d_v());
    let parts: Vec<Partial> = groups
        .par_iter()
        .enumerate()
        .map(|(gi, g)| over_range(src, gi, g, 0..g.max_vis()))
        .collect();
    let mut o = vec![0f64; n_slots * h * dv];
    let mut lse = vec![f64::NEG_INFINITY; n_slots * h];
    for (g, p) in groups.iter().zip(&parts) {
        for (k, &slot) in g.slots.iter().enumerate() {
            o[slot * h * dv..(slot + 1) * h * dv].copy_from_slice(&p.o[k * h * dv..(k + 1) * h * dv]);
            lse[slot * h..(slot + 1) * h].copy_from_slice(&p.lse[k * h..(k + 1) * h]);
        }
    }
    (o, lse)
}

/// Attention of group `gi` over tokens `range` of its list (each row further
/// limited to its visible prefix). Long ranges run as parallel spans merged
/// in a fixed tree, so the result does not depend on scheduling.
pub(crate) fn over_range<S: Source>(src: &S, gi: usize, g: &Group, range: Range<usize>) -> Partial {
    let end = range.end.min(g.max_vis());
    if end <= range.start + SPAN {
        return span(src, gi, g, range.start..end.max(range.start));
    }
    let n_spans = (end - range.start).div_ceil(SPAN);
    let mid = range.start + n_spans / 2 * SPAN;
    let (a, b) = rayon::join(
        || over_range(src, gi, g, range.start..mid),
        || over_range(src, gi, g, mid..end),
    );
    let (o, lse) = combine(&[(&a.o, &a.lse), (&b.o, &b.lse)], src.d_v());
    Partial { o, lse }
}

/// One span, sequentially, block by block with a running max and sum per
/// (row, head).
fn span<S: Source>(src: &S, gi: usize, g: &Group, range: Range<usize>) -> Partial {
    let (h, dq, dv) = (src.heads(), src.d_qk(), src.d_v());
    let rows = g.vis.len();
    let mut o = vec![0f64; rows * h * dv];
    let mut lse = vec![f64::NEG_INFINITY; rows * h];
    let end = range.end.min(g.max_vis());
    if range.start >= end {
        return Partial { o, lse };
    }
    // Rows that see nothing of this span are left out of the products.
    let first = g.vis.partition_point(|&v| v <= range.start);
    let m = (rows - first) * h;
    let mut q = vec![0f64; m * dq];
    for (k, &slot) in g.slots[first..].iter().enumerate() {
        src.q(slot, &mut q[k * h * dq..(k + 1) * h * dq]);
    }
    let scale = src.logit_scale();
    let mut acc = vec![0f64; m * dv];
    let mut run_max = vec![f64::NEG_INFINITY; m];
    let mut run_sum = vec![0f64; m];
    let mut kb = vec![0f64; BLOCK * dq];
    let mut s = vec![0f64; m * BLOCK];

    let mut t0 = range.start;
    while t0 < end {
        let t1 = (t0 + BLOCK).min(end);
        let nb = t1 - t0;
        let a0 = (g.vis.partition_point(|&v| v <= t0) - first) * h;
        src.k(gi, t0..t1, &mut kb[..nb * dq]);
        // S[a0.., nb] = Q K^T; K^T is the gathered block read column-wise.
        dgemm(
            m - a0,
            dq,
            nb,
            &q[a0 * dq..],
            Strides(dq, 1),
            &kb,
            Strides(1, dq),
            0.0,
            &mut s[a0 * BLOCK..],
            Strides(BLOCK, 1),
        );
        for row in a0..m {
            let c = g.vis[first + row / h].min(t1) - t0;
            let sr = &mut s[row * BLOCK..row * BLOCK + nb];
            // max() skips NaN; a NaN logit still poisons the row through exp().
            let bmax = sr[..c].iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x * scale));
            let new_max = run_max[row].max(bmax);
            if new_max == f64::NEG_INFINITY {
                sr.fill(0.0);
                continue;
            }
            let mut sum = 0f64;
            for x in sr[..c].iter_mut() {
                *x = (*x * scale - new_max).exp();
                sum += *x;
            }
            sr[c..].fill(0.0);
            let alpha = (run_max[row] - new_max).exp();
            if alpha != 1.0 {
                acc[row * dv..(row + 1) * dv].iter_mut().for_each(|x| *x *= alpha);
            }
            run_sum[row] = run_sum[row] * alpha + sum;
            run_max[row] = new_max;
        }
        // acc[a0..] += P V; V is the first d_v columns of the same block.
        dgemm(
            m - a0,
            nb,
            dv,
            &s[a0 * BLOCK..],
            Strides(BLOCK, 1),
            &kb,
            Strides(dq, 1),
            1.0,
            &mut acc[a0 * dv..],
            Strides(dv, 1),
        );
        t0 = t1;
    }

    let vs = src.v_scale();
    for row in 0..m {
        if run_max[row] == f64::NEG_INFINITY {
            continue;
        }
        let dst = first * h + row;
        lse[dst] = run_max[row] + run_sum[row].ln();
        let f = vs / run_sum[row];
        for (x, &a) in o[dst * dv..(dst + 1) * dv]
            .iter_mut()
            .zip(&acc[row * dv..(row + 1) * dv])
        {
            *x = a * f;
        }
    }
    Partial { o, lse }
}
