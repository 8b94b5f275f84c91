//! f32 attention and LSE merges as a kernel computes them, for host emulation.

/// Attention of `m` query vectors over `n` KV rows, where query `i` sees the
/// first `vis[i]` rows (every mask here is a prefix of the chunk). V is the
/// first `dv` elements of each K row. Logits are `q.k * scale`; `o` is
/// multiplied by `v_scale`. Rows that see nothing get o = 0, lse = -inf.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    m: usize,
    dk: usize,
    k: &[f32],
    n: usize,
    dv: usize,
    vis: &[usize],
    scale: f32,
    v_scale: f32,
    o: &mut [f32],
    lse: &mut [f32],
) {
    debug_assert_eq!(q.len(), m * dk);
    debug_assert_eq!(k.len(), n * dk);
    o[..m * dv].fill(0.0);
    if n == 0 {
        lse[..m].fill(f32::NEG_INFINITY);
        return;
    }
    let mut s = vec![0f32; m * n];
    // SAFETY: the pointers cover m*dk (q), n*dk (k) and m*n (s) elements with the
    // strides given; the three buffers do not overlap.
    unsafe {
        matrixmultiply::sgemm(
            m,
            dk,
            n,
            1.0,
            q.as_ptr(),
            dk as isize,
            1,
            k.as_ptr(),
            1,
            dk as isize,
            0.0,
            s.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    for i in 0..m {
        let row = &mut s[i * n..(i + 1) * n];
        let v = vis[i].min(n);
        if v == 0 {
            row.fill(0.0);
            lse[i] = f32::NEG_INFINITY;
            continue;
        }
        let mut mx = f32::NEG_INFINITY;
        for x in row[..v].iter_mut() {
            *x *= scale;
            mx = mx.max(*x);
        }
        let mut sum = 0f32;
        for x in row[..v].iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = v_scale / sum;
        for x in row[..v].iter_mut() {
            *x *= inv;
        }
        row[v..].fill(0.0);
        lse[i] = mx + sum.ln();
    }
    // SAFETY: s is m*n, k's first dv columns with row stride dk cover n rows,
    // o holds m*dv; no overlap.
    unsafe {
        matrixmultiply::sgemm(
            m,
            n,
            dv,
            1.0,
            s.as_ptr(),
            n as isize,
            1,
            k.as_ptr(),
            dk as isize,
            1,
            0.0,
            o.as_mut_ptr(),
            dv as isize,
            1,
        );
    }
}

/// Merges partial (o, lse) pairs of one row/head with the SPEC §1 combine and
/// an optional sink (SPEC §2). NaN and +inf LSEs count as empty; a zero weight
/// contributes nothing even when its o is NaN, unless `keep_empty` (a planted
/// bug, see [`super::Fault::MergeKeepsEmpty`]).
pub fn merge(parts: &[(&[f32], f32)], sink: Option<f32>, out: &mut [f32], keep_empty: bool) -> f32 {
    let clean = |l: f32| {
        if l.is_nan() || l == f32::INFINITY {
            f32::NEG_INFINITY
        } else {
            l
        }
    };
    let mut m = parts.iter().map(|p| clean(p.1)).fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        m = m.max(s);
    }
    out.fill(0.0);
    if m == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let mut sum: f32 = parts.iter().map(|p| (clean(p.1) - m).exp()).sum();
    if let Some(s) = sink {
        sum += (s - m).exp();
    }
    let g = m + sum.ln();
    for (o, l) in parts {
        let w = (clean(*l) - g).exp();
        if w == 0.0 && !keep_empty {
            continue;
        }
        for (d, x) in out.iter_mut().zip(o.iter()) {
            *d += w * x;
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tokens_by_hand() {
        // q = [1, 0], k0 = [1, 0] (v = 1), k1 = [0, 1] (v = 0): s = [1, 0].
        let q = [1.0, 0.0];
        let k = [1.0, 0.0, 0.0, 1.0];
        let (mut o, mut lse) = ([0f32; 1], [0f32; 1]);
        attend(&q, 1, 2, &k, 2, 1, &[2], 1.0, 1.0, &mut o, &mut lse);
        let e = std::f32::consts::E;
        assert!((o[0] - e / (e + 1.0)).abs() < 1e-6);
        assert!((lse[0] - (e + 1.0).ln()).abs() < 1e-6);
        // Only the first token visible: o = v0, lse = s0.
        attend(&q, 1, 2, &k, 2, 1, &[1], 1.0, 1.0, &mut o, &mut lse);
        assert_eq!(o[0], 1.0);
        assert!((lse[0] - 1.0).abs() < 1e-6);
        attend(&q, 1, 2, &k, 2, 1, &[0], 1.0, 1.0, &mut o, &mut lse);
        assert_eq!((o[0], lse[0]), (0.0, f32::NEG_INFINITY));
    }

    #[test]
    fn merge_ignores_empty_and_nan_parts_and_adds_sink_once() {
        let a = [2.0f32];
        let nan = [f32::NAN];
        let mut out = [0f32];
        let g = merge(
            &[
                (&a, 0.5),
                (&nan, f32::NEG_INFINITY),
                (&nan, f32::NAN),
                (&nan, f32::INFINITY),
            ],
            None,
            &mut out,
            false,
        );
        assert_eq!(out[0], 2.0);
        assert!((g - 0.5).abs() < 1e-6);
        let g = merge(&[(&a, 0.0)], Some(0.0), &mut out, false);
        assert!((out[0] - 1.0).abs() < 1e-6, "half the mass goes to the sink");
        assert!((g - 2f32.ln()).abs() < 1e-6);
        let g = merge(&[], Some(1.5), &mut out, false);
        assert_eq!((out[0], g), (0.0, 1.5));
        assert_eq!(
            merge(&[(&nan, f32::NEG_INFINITY)], None, &mut out, false),
            f32::NEG_INFINITY
        );
        assert_eq!(out[0], 0.0);
        // The planted bug: an empty part's NaN reaches the sum.
        merge(&[(&a, 0.5), (&nan, f32::NEG_INFINITY)], None, &mut out, true);
        assert!(out[0].is_nan());
    }
}
