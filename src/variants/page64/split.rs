//! The page64 fallback's split count and its page-aligned KV chunks (SPEC §1
//! "Variant page64").
//!
//! Read from ROCm/aiter `aiter/mla.py` (`get_meta_param`, called by
//! `mla_decode_fwd` on its non-persistent path); this is our own code:
//! - `tg_factor` is how many workgroups the kernel launches per (sequence,
//!   split) along the head dimension; only the occupancy term scales with it
//!   (`bs_occ = B * max(tg_factor, 1)`), `avg_kv` and the fp8 cap stay keyed
//!   on the real `B`. aiter's V3 caller leaves it at 1; its V4 wrapper passes
//!   `ceil(H / 64)`; on gfx1250 a 128-head decode counts as 2 on its own.
//! - The search keeps the first maximum (Python `max` over `i = 1..=16`), so
//!   exact ties go to the smaller `n`. We evaluate the score in f64 in the
//!   same order as the Python expression so the picks agree bit for bit.
//! - `min_block_n` is an exact dict lookup on `H * s_q` with keys {8, 16, 24,
//!   32, 48, 64, 128, 256, 384, 512}; any other product raises `KeyError` in
//!   aiter. SPEC writes the last three as `>= 256: 32`, which we follow. For
//!   the products aiter has no key for (e.g. 96 = Kimi-K3's 96 heads at
//!   `s_q = 1`) we round up to the next key, i.e. the tile of the next larger
//!   kernel configuration, and the pick says it is not aiter's own.
//! - aiter computes `total_kv` as `kv_indices.shape[0]`, which counts pages
//!   when the page size is above 1; SPEC's `avg_kv` is tokens, so callers pass
//!   tokens here.
//! - With `total_kv = 0` the fp8 cap gives `n = 0` in aiter; we keep `n >= 1`.

use serde::Serialize;
use std::fmt;

use crate::case::Dtype;
use crate::case::TargetProfile;
use crate::variants::check_tiling;

/// Per-split cost in the occupancy search, in KV tokens (aiter's constant).
pub const SPLIT_OVERHEAD_TOKENS: f64 = 84.1;
/// Largest split count the search considers.
pub const MAX_FALLBACK_SPLITS: usize = 16;
/// Tokens per page of the page64 pool; chunks are page-aligned.
pub const PAGE: usize = 64;

/// aiter's fp8 `min_block_n` table, keyed by `H * s_q`.
const FP8_MIN_BLOCK_N: &[(usize, usize)] = &[
    (8, 64),
    (16, 128),
    (24, 128),
    (32, 128),
    (48, 64),
    (64, 64),
    (128, 32),
    (256, 32),
    (384, 32),
    (512, 32),
];

/// The fp8 KV block width for `H * s_q` rows, and whether aiter's table has
/// that exact key (`false`: rounded up to the next key, or `>= 256`).
pub fn fp8_min_block_n(heads_x_sq: usize) -> (usize, bool) {
    if let Some(&(_, v)) = FP8_MIN_BLOCK_N.iter().find(|&&(k, _)| k == heads_x_sq) {
        return (v, true);
    }
    if heads_x_sq >= 256 {
        return (32, false);
    }
    let &(_, v) = FP8_MIN_BLOCK_N
        .iter()
        .find(|&&(k, _)| k >= heads_x_sq)
        .expect("256 bounds every smaller key");
    (v, false)
}

/// aiter's head-group multiplier when the caller gives none: 2 for a
/// 128-head decode on gfx1250 (two workgroups per split), else 1.
pub fn profile_tg_factor(profile: TargetProfile, heads: usize) -> usize {
    if profile == TargetProfile::Gfx1250 && heads == 128 {
        2
    } else {
        1
    }
}

/// The share of its waves a launch fills: `ctas * n` workgroups of one per
/// CU over `ceil(ctas * n / cus)` waves (aiter's occupancy term).
pub fn wave_fill(n: usize, ctas: usize, cus: usize) -> f64 {
    let work = ctas * n;
    let cus = cus.max(1);
    work as f64 / (work.div_ceil(cus) * cus) as f64
}

/// The occupancy-times-bandwidth search over `n = 1..=16`.
pub fn occupancy_splits(bs_occ: usize, avg_kv: f64, cus: usize) -> usize {
    let mut best = (f64::NEG_INFINITY, 1);
    for i in 1..=MAX_FALLBACK_SPLITS {
        let score = wave_fill(i, bs_occ, cus) * avg_kv / (avg_kv + SPLIT_OVERHEAD_TOKENS * i as f64);
        // Strictly greater: the first maximum wins, as Python's max does.
        if score > best.0 {
            best = (score, i);
        }
    }
    best.1
}

/// Inputs of the fallback heuristic for one launch (one DCP rank).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FallbackInput {
    pub batch: usize,
    /// KV tokens of the whole batch on this rank.
    pub total_kv: usize,
    /// Heads the kernel runs (after padding).
    pub heads: usize,
    pub s_q: usize,
    pub dtype: Dtype,
    pub cus: usize,
    pub tg_factor: usize,
}

/// The pick and how it came about, for the report's plan column.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SplitPick {
    pub n: usize,
    /// What the occupancy search alone chose.
    pub occupancy_n: usize,
    /// fp8 only: the block width used for the cap and whether aiter has that key.
    pub min_block_n: Option<(usize, bool)>,
}

impl fmt::Display for SplitPick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n={} (occupancy {}", self.n, self.occupancy_n)?;
        match self.min_block_n {
            Some((b, true)) => write!(f, ", fp8 min_block_n {b})"),
            Some((b, false)) => write!(f, ", fp8 min_block_n {b}, not aiter's key)"),
            None => write!(f, ")"),
        }
    }
}

/// The page64 split count with its derivation.
pub fn fallback_split_pick(inp: &FallbackInput) -> SplitPick {
    if inp.batch == 0 {
        return SplitPick {
            n: 1,
            occupancy_n: 1,
            min_block_n: None,
        };
    }
    let b = inp.batch;
    let avg_kv = inp.total_kv as f64 / b as f64;
    let occupancy_n = occupancy_splits(b * inp.tg_factor.max(1), avg_kv, inp.cus);
    let mut n = occupancy_n;
    let mut min_block_n = None;
    if inp.dtype == Dtype::Fp8 {
        let (mbn, exact) = fp8_min_block_n(inp.heads * inp.s_q);
        min_block_n = Some((mbn, exact));
        n = n.min(inp.total_kv.div_ceil(b * mbn));
        if n > 1 {
            // |total_kv/B - s_q| / mbn, floored, in exact integers.
            let dev = inp.total_kv.abs_diff(b * inp.s_q);
            n = n.min(dev / (b * mbn) + 1);
        }
        n = n.max(1);
    }
    SplitPick {
        n,
        occupancy_n,
        min_block_n,
    }
}

/// The split count page64 uses; `tg_factor` is the caller's count of CTAs
/// per (sequence, split) along the rows (see `page64::split_tg_factor`).
pub fn fallback_splits(
    batch: usize,
    total_kv: usize,
    heads: usize,
    s_q: usize,
    dtype: Dtype,
    cus: usize,
    tg_factor: usize,
) -> usize {
    fallback_split_pick(&FallbackInput {
        batch,
        total_kv,
        heads,
        s_q,
        dtype,
        cus,
        tg_factor,
    })
    .n
}

/// Page-aligned KV chunks of one sequence for `n` splits: each split takes
/// `ceil(ceil(len/64)/n)` pages; trailing splits may be empty. The ranges
/// tile `[0, len)` exactly.
pub fn page64_split_ranges(local_len: usize, n: usize) -> Vec<(usize, usize)> {
    let n = n.max(1);
    let chunk = local_len.div_ceil(PAGE).div_ceil(n) * PAGE;
    let ranges: Vec<_> = (0..n)
        .map(|s| ((s * chunk).min(local_len), ((s + 1) * chunk).min(local_len)))
        .collect();
    debug_assert!(check_tiling(&ranges, local_len).is_ok());
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(batch: usize, total_kv: usize, heads: usize, s_q: usize, dtype: Dtype, tg: usize) -> SplitPick {
        fallback_split_pick(&FallbackInput {
            batch,
            total_kv,
            heads,
            s_q,
            dtype,
            cus: 132,
            tg_factor: tg,
        })
    }

    #[test]
    fn one_long_sequence_takes_all_16_splits() {
        // i/132 * 8192/(8192 + 84.1 i) grows with i while i <= 132.
        assert_eq!(pick(1, 8192, 16, 1, Dtype::Bf16, 1).n, 16);
    }

    #[test]
    fn a_full_wave_of_sequences_takes_one_split() {
        assert_eq!(pick(132, 132 * 4096, 16, 1, Dtype::Bf16, 1).n, 1);
    }

    #[test]
    fn wave_quantization_picks_five_for_100_sequences() {
        // avg 4096 on 132 CUs. By hand: n=1 0.742 (100/132 * 4096/4180.1),
        // n=4 0.702, n=5 0.859 (500/528 * 4096/4516.5), n=6 0.809,
        // n=9 0.822, n=10 0.786: five splits fill 3.8 of 4 waves.
        assert_eq!(pick(100, 100 * 4096, 16, 1, Dtype::Bf16, 1).n, 5);
    }

    #[test]
    fn tg_factor_scales_only_occupancy() {
        // 66 sequences: alone they fill half the CUs, so 2 splits; as 2
        // workgroups each they fill all of them, so 1.
        assert_eq!(pick(66, 66 * 4096, 128, 1, Dtype::Bf16, 1).n, 2);
        assert_eq!(pick(66, 66 * 4096, 128, 1, Dtype::Bf16, 2).n, 1);
        assert_eq!(profile_tg_factor(TargetProfile::Gfx1250, 128), 2);
        assert_eq!(profile_tg_factor(TargetProfile::Gfx950, 128), 1);
        assert_eq!(profile_tg_factor(TargetProfile::Gfx1250, 96), 1);
    }

    #[test]
    fn fp8_caps_by_block_count_and_by_distance_from_s_q() {
        // H*s_q = 64 -> 64. Occupancy wants 16; ceil(520 / (4*64)) = 3;
        // floor(|130 - 4| / 64) + 1 = 2.
        let p = pick(4, 520, 16, 4, Dtype::Fp8, 1);
        assert_eq!(p.occupancy_n, 16);
        assert_eq!(p.min_block_n, Some((64, true)));
        assert_eq!(p.n, 2);
        // H*s_q = 16 -> 128: ceil(4000/512) = 8 and floor(999/128) + 1 = 8.
        assert_eq!(pick(4, 4000, 16, 1, Dtype::Fp8, 1).n, 8);
        // The same input in bf16 has no cap.
        assert_eq!(pick(4, 520, 16, 4, Dtype::Bf16, 1).n, 16);
    }

    #[test]
    fn min_block_n_lookup() {
        assert_eq!(fp8_min_block_n(8), (64, true));
        assert_eq!(fp8_min_block_n(48), (64, true));
        assert_eq!(fp8_min_block_n(128), (32, true));
        assert_eq!(fp8_min_block_n(384), (32, true));
        assert_eq!(fp8_min_block_n(1024), (32, false), "SPEC: >= 256");
        assert_eq!(fp8_min_block_n(96), (32, false), "no key: rounds up to 128");
        assert_eq!(fp8_min_block_n(40), (64, false), "rounds up to 48");
        assert_eq!(fp8_min_block_n(4), (64, false), "rounds up to 8");
    }

    #[test]
    fn degenerate_inputs_keep_one_split() {
        assert_eq!(pick(0, 0, 16, 1, Dtype::Bf16, 1).n, 1);
        assert_eq!(pick(8, 0, 16, 1, Dtype::Bf16, 1).n, 1, "all scores 0: the first wins");
        assert_eq!(pick(8, 0, 16, 1, Dtype::Fp8, 1).n, 1, "aiter would say 0");
    }

    #[test]
    fn fallback_splits_matches_the_pick() {
        assert_eq!(fallback_splits(100, 409_600, 16, 1, Dtype::Bf16, 132, 1), 5);
    }

    #[test]
    fn display_explains_the_cap() {
        assert_eq!(
            pick(4, 520, 16, 4, Dtype::Fp8, 1).to_string(),
            "n=2 (occupancy 16, fp8 min_block_n 64)"
        );
        assert_eq!(
            pick(1, 8192, 96, 1, Dtype::Fp8, 1).to_string(),
            "n=16 (occupancy 16, fp8 min_block_n 32, not aiter's key)"
        );
    }

    #[test]
    fn page64_ranges_are_page_aligned_and_tile() {
        assert_eq!(page64_split_ranges(200, 2), vec![(0, 128), (128, 200)]);
        assert_eq!(page64_split_ranges(200, 3), vec![(0, 128), (128, 200), (200, 200)]);
        assert_eq!(page64_split_ranges(64, 1), vec![(0, 64)]);
        assert_eq!(page64_split_ranges(0, 2), vec![(0, 0), (0, 0)]);
        assert_eq!(page64_split_ranges(65, 16).iter().filter(|(a, b)| b > a).count(), 2);
        for len in 0..400 {
            for n in 1..=16 {
                let r = page64_split_ranges(len, n);
                assert_eq!(r.len(), n);
                assert!(check_tiling(&r, len).is_ok(), "len {len} n {n}");
                assert!(
                    r.iter().all(|&(a, _)| a % PAGE == 0 || a == len),
                    "len {len} n {n}: {r:?}"
                );
            }
        }
    }
}
