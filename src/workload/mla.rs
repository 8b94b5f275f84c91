//! MLA family inputs (SPEC §1): Q, the global KV and one paged pool per DCP rank.

use anyhow::{ensure, Result};
use rand::seq::SliceRandom;
use rayon::prelude::*;

use super::codec::{self, BF16_NAN, E4M3_MAX, E4M3_NAN};

use super::rng;
use super::Elems;
use crate::case::{Dtype, MlaParams, PoolOrder, MLA_D_QK};

#[derive(Debug)]
pub struct MlaWorkload {
    pub p: MlaParams,
    /// `[total_q, H, 576]`, H = gathered heads (unpadded).
    pub q: Elems,
    /// Decoded Q values (scale not applied).
    pub q_vals: Vec<f32>,
    /// fp8 only: the unquantized Q (true values, scale folded in).
    pub q_src: Option<Vec<f32>>,
    pub q_scale: f32,
    pub kv_scale: f32,
    /// Every sequence's global tokens `[sum L, 576]` as stored (bf16 or fp8).
    pub kv: Elems,
    /// The same, decoded (scale not applied).
    pub kv_vals: Vec<f32>,
    /// fp8 only: unquantized KV (true values).
    pub kv_src: Option<Vec<f32>>,
    /// Offsets of each sequence in `kv_vals`; also the kernels' `g_kv_indptr`.
    pub g_kv_indptr: Vec<i32>,
    pub qo_indptr: Vec<i32>,
    pub shards: Vec<MlaShard>,
}

/// One DCP rank's paged KV pool and page table.
#[derive(Debug)]
pub struct MlaShard {
    pub rank: usize,
    pub local_lens: Vec<usize>,
    /// `[num_pages, page_size, 576]`; slots no token uses hold NaN.
    pub pool: Elems,
    pub num_pages: usize,
    pub kv_indptr: Vec<i32>,
    pub kv_indices: Vec<i32>,
    pub kv_last_page_len: Vec<i32>,
}

impl MlaWorkload {
    pub fn heads(&self) -> usize {
        self.p.heads()
    }

    /// The same data paged at another page size: only the pools and page
    /// tables change, so variants of one data id (ps1 at 1, page64 at 64)
    /// share the expensive part. Equal to a fresh build at that page size.
    pub fn repage(&mut self, page_size: usize, seed: u64) {
        self.p.page_size = page_size;
        // Ranks are independent copies: build them side by side.
        self.shards = self
            .p
            .dcp
            .ranks()
            .into_par_iter()
            .map(|r| build_shard(&self.p, r, &self.kv, &self.g_kv_indptr, seed))
            .collect();
    }

    /// [`MlaWorkload::repage`] into a copy, for when this one is still in
    /// use: copying the tensors costs a fraction of drawing them again.
    pub fn repaged(&self, page_size: usize, seed: u64) -> MlaWorkload {
        use super::par_copy;
        let mut p = self.p.clone();
        p.page_size = page_size;
        let shards = p
            .dcp
            .ranks()
            .into_par_iter()
            .map(|r| build_shard(&p, r, &self.kv, &self.g_kv_indptr, seed))
            .collect();
        MlaWorkload {
            p,
            q: self.q.par_clone(),
            q_vals: par_copy(&self.q_vals),
            q_src: self.q_src.as_deref().map(par_copy),
            q_scale: self.q_scale,
            kv_scale: self.kv_scale,
            kv: self.kv.par_clone(),
            kv_vals: par_copy(&self.kv_vals),
            kv_src: self.kv_src.as_deref().map(par_copy),
            g_kv_indptr: self.g_kv_indptr.clone(),
            qo_indptr: self.qo_indptr.clone(),
            shards,
        }
    }
    /// Decoded row of global token `t` of sequence `b`.
    pub fn kv_row(&self, b: usize, t: usize) -> &[f32] {
        let o = (self.g_kv_indptr[b] as usize + t) * MLA_D_QK;
        &self.kv_vals[o..o + MLA_D_QK]
    }
}

impl MlaShard {
    /// Pool slot of local token `j` of sequence `b`.
    pub fn slot(&self, b: usize, j: usize, page_size: usize) -> usize {
        let page = self.kv_indices[self.kv_indptr[b] as usize + j / page_size] as usize;
        page * page_size + j % page_size
    }
}

const CHUNK: usize = 256 * MLA_D_QK;

struct Quantized {
    elems: Elems,
    vals: Vec<f32>,
    src: Option<Vec<f32>>,
    scale: f32,
}

fn quantize(src: Vec<f32>, dtype: Dtype) -> Quantized {
    match dtype {
        Dtype::Bf16 => {
            let bits: Vec<u16> = src.par_iter().map(|&x| codec::bf16_bits(x)).collect();
            let vals = bits.par_iter().map(|&b| codec::bf16_from_bits(b)).collect();
            Quantized {
                elems: Elems::Bf16(bits),
                vals,
                src: None,
                scale: 1.0,
            }
        }
        Dtype::Fp8 => {
            let amax = src
                .par_iter()
                .fold(|| 0f32, |m, x| m.max(x.abs()))
                .reduce(|| 0f32, f32::max);
            let scale = if amax > 0.0 { amax / E4M3_MAX } else { 1.0 };
            let bytes: Vec<u8> = src.par_iter().map(|&x| codec::f32_to_e4m3(x / scale)).collect();
            let t = codec::e4m3_table();
            let vals = bytes.par_iter().map(|&b| t[b as usize]).collect();
            Quantized {
                elems: Elems::Fp8(bytes),
                vals,
                src: Some(src),
                scale,
            }
        }
    }
}

pub fn build(p: &MlaParams, seed: u64) -> Result<MlaWorkload> {
    ensure!(
        p.ctx.len() == p.batch,
        "context list has {} entries for batch {}",
        p.ctx.len(),
        p.batch
    );
    ensure!(
        p.page_size == 1 || p.page_size == 64,
        "page size {} (1 or 64)",
        p.page_size
    );
    let h = p.heads();
    let total_q = p.total_q();

    let mut q_src = super::par_filled(total_q * h * MLA_D_QK, 0f32);
    rng::par_fill_normal(&mut q_src, seed, "q", CHUNK, 1.0);
    let q = quantize(q_src, p.dtype);

    let mut g_kv_indptr = vec![0i32; p.batch + 1];
    for b in 0..p.batch {
        g_kv_indptr[b + 1] = g_kv_indptr[b] + p.ctx[b] as i32;
    }
    let total_kv = g_kv_indptr[p.batch] as usize;
    let mut kv_src = super::par_filled(total_kv * MLA_D_QK, 0f32);
    rng::par_fill_normal(&mut kv_src, seed, "kv", CHUNK, 1.0);
    let kv = quantize(kv_src, p.dtype);

    let qo_indptr = (0..=p.batch).map(|b| (b * p.s_q) as i32).collect();

    let shards = p
        .dcp
        .ranks()
        .into_par_iter()
        .map(|r| build_shard(p, r, &kv.elems, &g_kv_indptr, seed))
        .collect();

    Ok(MlaWorkload {
        p: p.clone(),
        q: q.elems,
        q_vals: q.vals,
        q_src: q.src,
        q_scale: q.scale,
        kv_scale: kv.scale,
        kv: kv.elems,
        kv_vals: kv.vals,
        kv_src: kv.src,
        g_kv_indptr,
        qo_indptr,
        shards,
    })
}

fn build_shard(p: &MlaParams, r: usize, kv: &Elems, g_kv_indptr: &[i32], seed: u64) -> MlaShard {
    let (dcp, ps) = (p.dcp, p.page_size);
    let local_lens: Vec<usize> = p.ctx.iter().map(|&l| dcp.local_len(r, l)).collect();
    let pages_per_seq: Vec<usize> = local_lens.iter().map(|&n| n.div_ceil(ps)).collect();
    let used: usize = pages_per_seq.iter().sum();
    // Slack pages stay NaN, so any read outside the page table shows up.
    let num_pages = used + used / 16 + 1;
    let mut perm: Vec<i32> = (0..num_pages as i32).collect();
    if p.pool == PoolOrder::Shuffled {
        perm.shuffle(&mut rng::stream(seed, &format!("pages{r}"), 0));
    }

    let mut kv_indptr = vec![0i32; p.batch + 1];
    let mut kv_last_page_len = vec![0i32; p.batch];
    for b in 0..p.batch {
        kv_indptr[b + 1] = kv_indptr[b] + pages_per_seq[b] as i32;
        let n = local_lens[b];
        kv_last_page_len[b] = if n == 0 {
            0
        } else {
            (n - (pages_per_seq[b] - 1) * ps) as i32
        };
    }
    let kv_indices: Vec<i32> = perm[..used].to_vec();

    // Each pool page's sequence and page index in it (None: slack).
    let mut owner: Vec<Option<(usize, usize)>> = vec![None; num_pages];
    for b in 0..p.batch {
        for (k, &page) in kv_indices[kv_indptr[b] as usize..kv_indptr[b + 1] as usize]
            .iter()
            .enumerate()
        {
            owner[page as usize] = Some((b, k));
        }
    }
    let slots = num_pages * ps * MLA_D_QK;
    let pool = match kv {
        Elems::Bf16(sv) => Elems::Bf16(fill_pool(sv, BF16_NAN, slots, &owner, p, r, g_kv_indptr, &local_lens)),
        Elems::Fp8(sv) => Elems::Fp8(fill_pool(sv, E4M3_NAN, slots, &owner, p, r, g_kv_indptr, &local_lens)),
    };
    MlaShard {
        rank: r,
        local_lens,
        pool,
        num_pages,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
    }
}

/// Rank `r`'s pool, page by page in parallel: each page takes its
/// sequence's tokens from the global KV `kv`, NaN where no token is.
#[allow(clippy::too_many_arguments)]
fn fill_pool<T: Copy + Send + Sync>(
    kv: &[T],
    nan: T,
    slots: usize,
    owner: &[Option<(usize, usize)>],
    p: &MlaParams,
    r: usize,
    g_kv_indptr: &[i32],
    local_lens: &[usize],
) -> Vec<T> {
    let (dcp, ps) = (p.dcp, p.page_size);
    let mut pool = super::par_filled(slots, nan);
    pool.par_chunks_mut(ps * MLA_D_QK)
        .zip(owner.par_iter())
        .for_each(|(page, own)| {
            let Some((b, k)) = *own else { return };
            let g0 = g_kv_indptr[b] as usize;
            for t in 0..ps {
                let j = k * ps + t;
                if j >= local_lens[b] {
                    break;
                }
                let src = (g0 + dcp.global_pos(j, r)) * MLA_D_QK;
                page[t * MLA_D_QK..(t + 1) * MLA_D_QK].copy_from_slice(&kv[src..src + MLA_D_QK]);
            }
        });
    pool
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dcp::Dcp;

    fn params(dtype: Dtype, ps: usize, w: usize, s: usize) -> MlaParams {
        MlaParams {
            batch: 3,
            ctx: vec![1, 70, 129],
            ctx_label: "t".into(),
            heads_local: 2,
            dcp: Dcp {
                world: w,
                interleave: s,
            },
            s_q: 2,
            dtype,
            page_size: ps,
            pool: PoolOrder::Shuffled,
            sm_scale: 0.1,
        }
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let p = params(Dtype::Fp8, 64, 2, 1);
        let a = build(&p, 7).unwrap();
        let b = build(&p, 7).unwrap();
        let c = build(&p, 8).unwrap();
        assert_eq!(a.q.as_bytes(), b.q.as_bytes());
        assert_eq!(a.shards[1].pool.as_bytes(), b.shards[1].pool.as_bytes());
        assert_eq!(a.shards[1].kv_indices, b.shards[1].kv_indices);
        assert_ne!(a.q.as_bytes(), c.q.as_bytes());
    }

    #[test]
    fn shards_hold_exactly_their_tokens_and_nan_elsewhere() {
        for (dtype, ps, w, s) in [(Dtype::Bf16, 1, 1, 1), (Dtype::Fp8, 64, 4, 2), (Dtype::Bf16, 64, 8, 1)] {
            let p = params(dtype, ps, w, s);
            let wl = build(&p, 3).unwrap();
            let t = codec::e4m3_table();
            let decode = |e: &Elems, i: usize| match e {
                Elems::Bf16(v) => codec::bf16_from_bits(v[i]),
                Elems::Fp8(v) => t[v[i] as usize],
            };
            let mut written = vec![false; wl.shards.iter().map(|s| s.num_pages * ps).max().unwrap()];
            for sh in &wl.shards {
                written.iter_mut().for_each(|x| *x = false);
                for b in 0..p.batch {
                    assert_eq!(sh.local_lens[b], p.dcp.local_len(sh.rank, p.ctx[b]));
                    for j in 0..sh.local_lens[b] {
                        let slot = sh.slot(b, j, ps);
                        written[slot] = true;
                        let g = p.dcp.global_pos(j, sh.rank);
                        for d in [0, 100, 575] {
                            assert_eq!(decode(&sh.pool, slot * MLA_D_QK + d), wl.kv_row(b, g)[d]);
                        }
                    }
                }
                for (slot, &wr) in written.iter().enumerate().take(sh.num_pages * ps) {
                    if !wr {
                        assert!(
                            decode(&sh.pool, slot * MLA_D_QK).is_nan(),
                            "unused slot {slot} must be NaN"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn contiguous_pool_holds_the_same_tokens_in_page_order() {
        for ps in [1, 64] {
            let shuffled = params(Dtype::Bf16, ps, 2, 1);
            let contig = MlaParams {
                pool: PoolOrder::Contiguous,
                ..shuffled.clone()
            };
            let (a, b) = (build(&shuffled, 4).unwrap(), build(&contig, 4).unwrap());
            assert_eq!(a.kv_vals, b.kv_vals);
            for (sa, sb) in a.shards.iter().zip(&b.shards) {
                let used = sb.kv_indices.len() as i32;
                assert_eq!(sb.kv_indices, (0..used).collect::<Vec<i32>>(), "page size {ps}");
                assert_ne!(sa.kv_indices, sb.kv_indices, "page size {ps}: the default shuffles");
                assert_eq!(sa.kv_indptr, sb.kv_indptr);
                for bq in 0..contig.batch {
                    for j in 0..sb.local_lens[bq] {
                        let (x, y) = (sa.slot(bq, j, ps) * MLA_D_QK, sb.slot(bq, j, ps) * MLA_D_QK);
                        assert_eq!(
                            sa.pool.as_bytes()[x * 2..(x + MLA_D_QK) * 2],
                            sb.pool.as_bytes()[y * 2..(y + MLA_D_QK) * 2]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn repaging_equals_a_fresh_build_at_that_page_size() {
        let p1 = params(Dtype::Fp8, 1, 4, 2);
        let mut p64 = p1.clone();
        p64.page_size = 64;
        let w1 = build(&p1, 9).unwrap();
        // A copy re-paged while the original is in use, then in place.
        let copy = w1.repaged(64, 9);
        let mut w = w1;
        w.repage(64, 9);
        let fresh = build(&p64, 9).unwrap();
        for got in [&w, &copy] {
            assert_eq!(got.shards.len(), fresh.shards.len());
            for (a, b) in got.shards.iter().zip(&fresh.shards) {
                assert_eq!(a.pool.as_bytes(), b.pool.as_bytes());
                assert_eq!(
                    (&a.kv_indptr, &a.kv_indices, &a.kv_last_page_len),
                    (&b.kv_indptr, &b.kv_indices, &b.kv_last_page_len)
                );
            }
            assert_eq!(format!("{:?}", got.p), format!("{:?}", fresh.p));
            assert_eq!(got.q.as_bytes(), fresh.q.as_bytes());
            assert_eq!(got.kv.as_bytes(), fresh.kv.as_bytes());
            assert_eq!((&got.kv_vals, &got.kv_src), (&fresh.kv_vals, &fresh.kv_src));
            assert_eq!((&got.q_vals, &got.q_src), (&fresh.q_vals, &fresh.q_src));
        }
    }

    #[test]
    fn fp8_values_are_decodes_of_scaled_source() {
        let wl = build(&params(Dtype::Fp8, 1, 1, 1), 5).unwrap();
        let src = wl.kv_src.as_ref().unwrap();
        for i in (0..src.len()).step_by(97) {
            let back = wl.kv_vals[i] * wl.kv_scale;
            assert!(
                (back - src[i]).abs() <= src[i].abs() * 0.07 + wl.kv_scale * 2f32.powi(-9),
                "{back} vs {}",
                src[i]
            );
        }
    }
}
