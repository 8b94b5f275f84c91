//! DeepSeek-V4 native FP8 inputs (SPEC §2): packed rows, rope buffers, the
//! per-row KV lists of each layer type, and the attention sink.

use anyhow::{ensure, Result};
use rand::seq::SliceRandom;
use rand::Rng;
use rayon::prelude::*;

use super::codec::{self, BF16_NAN, E4M3_NAN};
use super::rng;
use crate::case::{LayerType, V4Params, V4_D, V4_D_NOPE, V4_D_ROPE, V4_REPLAY_GROWTH, V4_WINDOW};

/// Tiles of 64 nope elements, each with its own UE8M0 scale.
pub const V4_TILES: usize = V4_D_NOPE / 64;
/// Pool rows beyond which sequences share their compressed region (keeps
/// host memory bounded; the report's params say when it happened).
pub const POOL_ROW_CAP: usize = 1 << 20;

#[derive(Debug)]
pub struct V4Workload {
    pub p: V4Params,
    /// Heads the kernels run with (>= 16).
    pub heads: usize,
    pub t: usize,
    /// `[T, Hk, 512]` packed native FP8 rows; pad rows and pad heads are zero.
    pub q_packed: Vec<u8>,
    /// `[T, Hk, 64]` bf16 bits.
    pub q_rope: Vec<u16>,
    /// `[T, Hk, 512]` decoded Q (448 nope then 64 rope).
    pub q_vals: Vec<f32>,
    /// `[T, Hk, 512]` unquantized Q.
    pub q_src: Vec<f32>,
    /// `[P, 512]` packed pool rows; unused rows are NaN.
    pub pool_packed: Vec<u8>,
    /// `[P, 64]` bf16 bits.
    pub pool_rope: Vec<u16>,
    /// `[P, 512]` decoded pool rows.
    pub pool_vals: Vec<f32>,
    /// `[P, 512]` unquantized pool rows.
    pub pool_src: Vec<f32>,
    pub pool_rows: usize,
    /// `[T+1]`; pad rows repeat the last value (length 0).
    pub kv_indptr: Vec<i32>,
    pub kv_indices: Vec<i32>,
    /// `[Hk]` sink logits; pad heads get 0.
    pub sink: Vec<f32>,
    /// Sequences share compressed pool regions (the pool hit `POOL_ROW_CAP`).
    pub shared_pool: bool,
    /// Replay steps: same shapes, grown positions, new lists and pool contents.
    pub steps: Vec<V4Workload>,
}

impl V4Workload {
    pub fn row_len(&self, i: usize) -> usize {
        (self.kv_indptr[i + 1] - self.kv_indptr[i]) as usize
    }
    pub fn row_list(&self, i: usize) -> &[i32] {
        &self.kv_indices[self.kv_indptr[i] as usize..self.kv_indptr[i + 1] as usize]
    }
}

/// Packs one 448-element nope vector: e4m3 bytes, 7 UE8M0 scales written twice, zeros.
pub fn pack_nope(x: &[f32], out: &mut [u8]) {
    debug_assert_eq!(x.len(), V4_D_NOPE);
    debug_assert_eq!(out.len(), V4_D);
    for t in 0..V4_TILES {
        let tile = &x[t * 64..(t + 1) * 64];
        let amax = tile.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = codec::ue8m0_for_amax(amax);
        let s = codec::ue8m0_to_f32(e);
        for (k, &v) in tile.iter().enumerate() {
            out[t * 64 + k] = codec::f32_to_e4m3(v / s);
        }
        out[V4_D_NOPE + 2 * t] = e;
        out[V4_D_NOPE + 2 * t + 1] = e;
    }
    out[V4_D_NOPE + 2 * V4_TILES..].fill(0);
}

/// Decodes a packed row's nope part (the inverse a kernel computes).
pub fn unpack_nope(row: &[u8], out: &mut [f32]) {
    let t8 = codec::e4m3_table();
    for t in 0..V4_TILES {
        let s = codec::ue8m0_to_f32(row[V4_D_NOPE + 2 * t]);
        for k in 0..64 {
            out[t * 64 + k] = t8[row[t * 64 + k] as usize] * s;
        }
    }
}

struct Packed {
    packed: Vec<u8>,
    rope: Vec<u16>,
    vals: Vec<f32>,
}

/// Quantizes `[n, 512]` source rows (448 nope + 64 rope) into the native format.
fn pack_rows(src: &[f32]) -> Packed {
    let n = src.len() / V4_D;
    let mut packed = vec![0u8; n * V4_D];
    let mut rope = vec![0u16; n * V4_D_ROPE];
    let mut vals = vec![0f32; n * V4_D];
    packed
        .par_chunks_mut(V4_D)
        .zip(rope.par_chunks_mut(V4_D_ROPE))
        .zip(vals.par_chunks_mut(V4_D))
        .zip(src.par_chunks(V4_D))
        .for_each(|(((pk, rp), vl), s)| {
            if s[0].is_nan() {
                pk[..V4_D_NOPE].fill(E4M3_NAN);
                rp.fill(BF16_NAN);
                vl.fill(f32::NAN);
                return;
            }
            pack_nope(&s[..V4_D_NOPE], pk);
            unpack_nope(pk, &mut vl[..V4_D_NOPE]);
            for k in 0..V4_D_ROPE {
                rp[k] = codec::bf16_bits(s[V4_D_NOPE + k]);
                vl[V4_D_NOPE + k] = codec::bf16_from_bits(rp[k]);
            }
        });
    Packed { packed, rope, vals }
}

/// One row's KV list in logical terms, before mapping to physical pool rows.
fn row_entries(layer: LayerType, pos: usize, topk: usize, r: &mut impl Rng) -> (Vec<usize>, std::ops::Range<usize>) {
    let win_lo = (pos + 1).saturating_sub(V4_WINDOW);
    let comp = match layer {
        LayerType::Swa => vec![],
        LayerType::Hca => (0..(pos + 1) / 128).collect(),
        LayerType::Csa => {
            let avail = (pos + 1) / 4;
            let k = avail.min(topk);
            let mut all: Vec<usize> = (0..avail).collect();
            let (chosen, _) = all.partial_shuffle(r, k);
            chosen.to_vec()
        }
    };
    (comp, win_lo..pos + 1)
}

pub fn build(p: &V4Params, seed: u64) -> Result<V4Workload> {
    ensure!(
        p.positions.len() == p.rows,
        "{} positions for {} rows",
        p.positions.len(),
        p.rows
    );
    ensure!(
        p.padded_rows >= p.rows,
        "padded rows {} < rows {}",
        p.padded_rows,
        p.rows
    );
    let hk = p.kernel_heads();
    let t = p.padded_rows;
    let verify = p.verify.max(1);

    // Sequences are runs of `verify` consecutive rows; each owns a window
    // region and a compressed region of the pool.
    let seqs: Vec<std::ops::Range<usize>> = (0..p.rows)
        .step_by(verify)
        .map(|s| s..(s + verify).min(p.rows))
        .collect();
    let win_rows = |rs: &std::ops::Range<usize>| {
        let lo = (p.positions[rs.start] + 1).saturating_sub(V4_WINDOW);
        p.positions[rs.end - 1] + 1 - lo
    };
    let comp_rows = |rs: &std::ops::Range<usize>| {
        let pm = p.positions[rs.end - 1];
        match p.layer {
            LayerType::Swa => 0,
            LayerType::Csa => (pm + 1) / 4,
            LayerType::Hca => (pm + 1) / 128,
        }
    };
    for rs in &seqs {
        for i in rs.clone().skip(1) {
            ensure!(
                p.positions[i] == p.positions[i - 1] + 1,
                "verify rows of one sequence must have consecutive positions"
            );
        }
    }
    let win_total: usize = seqs.iter().map(win_rows).sum();
    let comp_total: usize = seqs.iter().map(comp_rows).sum();
    let shared_pool = win_total + comp_total > POOL_ROW_CAP;
    let comp_region = if shared_pool {
        seqs.iter().map(comp_rows).max().unwrap_or(0)
    } else {
        0
    };
    let logical = win_total + if shared_pool { comp_region } else { comp_total };
    let pool_rows = logical + logical / 16 + 1;
    let mut phys: Vec<i32> = (0..pool_rows as i32).collect();
    phys.shuffle(&mut rng::stream(seed, "v4pool", 0));

    // Logical layout: windows of each sequence, then compressed regions.
    let mut kv_indptr = vec![0i32; t + 1];
    let mut kv_indices = Vec::new();
    let mut win_base = 0usize;
    let mut comp_base = win_total;
    for (si, rs) in seqs.iter().enumerate() {
        let lo = (p.positions[rs.start] + 1).saturating_sub(V4_WINDOW);
        let mut r = rng::stream(seed, "topk", si as u64);
        for i in rs.clone() {
            let (comp, win) = row_entries(p.layer, p.positions[i], p.index_topk, &mut r);
            kv_indices.extend(comp.iter().map(|&c| phys[comp_base + c]));
            kv_indices.extend(win.map(|g| phys[win_base + g - lo]));
            kv_indptr[i + 1] = kv_indices.len() as i32;
        }
        win_base += win_rows(rs);
        if !shared_pool {
            comp_base += comp_rows(rs);
        }
    }
    for i in p.rows..t {
        kv_indptr[i + 1] = kv_indptr[i];
    }
    if p.indptr_offset > 0 {
        // Junk entries before the first list, pointing at NaN rows: a kernel
        // that ignores kv_indptr[0] reads them and fails.
        let slack = &phys[logical..];
        let junk: Vec<i32> = (0..p.indptr_offset).map(|k| slack[k % slack.len()]).collect();
        kv_indices.splice(0..0, junk);
        kv_indptr.iter_mut().for_each(|x| *x += p.indptr_offset as i32);
    }

    // Pool contents: used rows random, the rest NaN.
    let mut pool_src = vec![0f32; pool_rows * V4_D];
    rng::par_fill_normal(&mut pool_src, seed, "v4kv", 256 * V4_D, 1.0);
    for &r in &phys[logical..] {
        pool_src[r as usize * V4_D..(r as usize + 1) * V4_D].fill(f32::NAN);
    }
    let pool = pack_rows(&pool_src);

    let mut q_src = vec![0f32; t * hk * V4_D];
    rng::par_fill_normal(&mut q_src, seed, "v4q", 256 * V4_D, 1.0);
    for row in 0..t {
        for h in 0..hk {
            if row >= p.rows || h >= p.heads {
                q_src[(row * hk + h) * V4_D..(row * hk + h + 1) * V4_D].fill(0.0);
            }
        }
    }
    let q = pack_rows(&q_src);

    let mut sink = vec![0f32; hk];
    rng::fill_normal(&mut sink[..p.heads], seed, "sink", 0, 2.0);
    let steps = (1..=p.replay)
        .map(|s| {
            let mut sp = p.clone();
            sp.replay = 0;
            sp.positions = p
                .positions
                .iter()
                .map(|&x| (x + s * V4_REPLAY_GROWTH).min(p.max_model_len - 1))
                .collect();
            // The sink is a model weight: it stays; Q, lists and pool rows change.
            let mut w = build(
                &sp,
                crate::case::stable_hash(&[&seed.to_le_bytes(), b"replay", &s.to_le_bytes()]),
            )?;
            w.sink = sink.clone();
            Ok(w)
        })
        .collect::<Result<Vec<_>>>()?;

    Ok(V4Workload {
        p: p.clone(),
        heads: hk,
        t,
        q_packed: q.packed,
        q_rope: q.rope,
        q_vals: q.vals,
        q_src,
        pool_packed: pool.packed,
        pool_rope: pool.rope,
        pool_vals: pool.vals,
        pool_src,
        pool_rows,
        kv_indptr,
        kv_indices,
        sink,
        shared_pool,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(layer: LayerType, positions: Vec<usize>, verify: usize) -> V4Params {
        V4Params {
            layer,
            rows: positions.len(),
            padded_rows: positions.len() + 3,
            heads: 8,
            positions,
            pos_label: "t".into(),
            verify,
            index_topk: 16,
            max_model_len: 1 << 16,
            sm_scale: (512f64).powf(-0.5),
            indptr_offset: 0,
            replay: 0,
        }
    }

    #[test]
    fn packed_rows_roundtrip_within_fp8_precision() {
        let mut src = vec![0f32; 4 * V4_D];
        rng::fill_normal(&mut src, 1, "x", 0, 3.0);
        src[5] = 1000.0; // a large outlier gets a larger tile scale
        let pk = pack_rows(&src);
        for r in 0..4 {
            let row = &pk.packed[r * V4_D..(r + 1) * V4_D];
            for tt in 0..V4_TILES {
                assert_eq!(
                    row[V4_D_NOPE + 2 * tt],
                    row[V4_D_NOPE + 2 * tt + 1],
                    "scales are written twice"
                );
            }
            assert!(row[V4_D_NOPE + 14..].iter().all(|&b| b == 0));
            for k in 0..V4_D {
                let (a, b) = (src[r * V4_D + k], pk.vals[r * V4_D + k]);
                let tile_amax = if k < V4_D_NOPE {
                    src[r * V4_D + k / 64 * 64..r * V4_D + k / 64 * 64 + 64]
                        .iter()
                        .fold(0f32, |m, v| m.max(v.abs()))
                } else {
                    a.abs()
                };
                assert!(
                    (a - b).abs() <= 0.0625 * a.abs() + tile_amax / 448.0,
                    "row {r} k {k}: {a} vs {b}"
                );
            }
        }
        assert_eq!(pk.vals[5], 1024.0f32.min(1000.0f32.max(pk.vals[5])));
    }

    #[test]
    fn row_lists_follow_the_layer_rules() {
        for layer in [LayerType::Swa, LayerType::Csa, LayerType::Hca] {
            let w = build(&params(layer, vec![0, 5, 127, 128, 300, 301, 302, 1000], 1), 11).unwrap();
            for (i, &pos) in w.p.positions.iter().enumerate() {
                let win = (pos + 1).min(128);
                let comp = match layer {
                    LayerType::Swa => 0,
                    LayerType::Csa => ((pos + 1) / 4).min(16),
                    LayerType::Hca => (pos + 1) / 128,
                };
                assert_eq!(w.row_len(i), win + comp, "{layer} pos {pos}");
                let list = w.row_list(i);
                let mut sorted = list.to_vec();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted.len(), list.len(), "entries are distinct");
                for &r in list {
                    assert!(!w.pool_vals[r as usize * V4_D].is_nan(), "list points at a used row");
                }
            }
            for i in w.p.rows..w.t {
                assert_eq!(w.row_len(i), 0, "pad rows are empty");
            }
            assert_eq!(w.kv_indptr[w.t] as usize, w.kv_indices.len());
        }
    }

    #[test]
    fn offset_lists_start_after_junk_and_replays_grow() {
        let mut p = params(LayerType::Hca, vec![200, 700], 1);
        p.indptr_offset = 5;
        p.replay = 2;
        let w = build(&p, 4).unwrap();
        assert_eq!(w.kv_indptr[0], 5);
        for &j in &w.kv_indices[..5] {
            assert!(
                w.pool_vals[j as usize * V4_D].is_nan(),
                "junk entries point at NaN rows"
            );
        }
        assert_eq!(w.row_len(1), 128 + 701 / 128);
        assert_eq!(w.steps.len(), 2);
        let s2 = &w.steps[1];
        assert_eq!(
            s2.p.positions,
            vec![200 + 2 * V4_REPLAY_GROWTH, 700 + 2 * V4_REPLAY_GROWTH]
        );
        assert!(s2.row_len(1) > w.row_len(1), "lengths grow");
        assert_eq!(
            (s2.t, s2.heads, s2.kv_indptr[0]),
            (w.t, w.heads, 5),
            "same shapes and offset"
        );
        assert_eq!(s2.sink, w.sink, "the sink is a weight: replays keep it");
        assert_ne!(s2.q_packed, w.q_packed, "each step decodes a new token");
    }

    #[test]
    fn verify_rows_share_their_window() {
        let w = build(&params(LayerType::Swa, vec![200, 201, 202, 203], 4), 2).unwrap();
        // Row i+1 sees row i's window shifted by one.
        assert_eq!(&w.row_list(0)[1..], &w.row_list(1)[..127]);
        assert_eq!(w.q_vals[(w.p.rows * w.heads) * V4_D], 0.0, "pad rows have zero Q");
        assert_eq!(w.q_vals[(8) * V4_D + 3], 0.0, "pad heads have zero Q");
    }
}
