//! v4_split's plan (SPEC §2): the uniform split table, and the split count
//! per layer type from the heuristic (or the kernel's own pick).

use serde::Serialize;
use std::fmt;

use crate::case::{LayerType, V4_WINDOW};
use crate::variants::page64::split;
use crate::variants::page64::split::wave_fill;
use crate::variants::{check_tiling, PlanError};

/// Rows of the uniform table: the largest split count a plan may name.
pub const MAX_SPLITS: usize = 16;

/// The uniform split table for `t` padded rows: i32 `[16, T+1]`,
/// `table[k][i] = (k+1) * i`. Built once per `T`; a plan reads one row, so a
/// captured graph and its replays see the same constant memory.
pub fn uniform_table(t: usize) -> Vec<i32> {
    (1..=MAX_SPLITS)
        .flat_map(|n| (0..=t).map(move |i| (n * i) as i32))
        .collect()
}

/// Row `n - 1` of the table: the split CSR for `n` splits in every row.
pub fn table_row(table: &[i32], t: usize, n: usize) -> &[i32] {
    assert!(
        (1..=MAX_SPLITS).contains(&n),
        "split count {n} is outside the table (1..={MAX_SPLITS})"
    );
    assert_eq!(table.len(), MAX_SPLITS * (t + 1), "table is not [16, {}]", t + 1);
    &table[(n - 1) * (t + 1)..n * (t + 1)]
}

/// The static KV length bound of a layer type: the window plus what the
/// layer's compressed region can hold.
pub fn kv_len_bound(layer: LayerType, index_topk: usize, max_model_len: usize) -> usize {
    match layer {
        LayerType::Swa => V4_WINDOW,
        LayerType::Csa => V4_WINDOW + index_topk,
        LayerType::Hca => V4_WINDOW + max_model_len / 128,
    }
}

/// Heads one CTA of the V4 kernel covers; more heads launch more CTAs per split.
pub const HEADS_PER_CTA: usize = 64;
/// Splits our heuristic gives 16 rows x 16 heads on 132 CUs; other shapes
/// scale from there (fitted on the H200, see docs/v4-heuristic.md).
pub const SPLITS_AT_REFERENCE: f64 = 8.0;
const REFERENCE_HEAD_ROWS: f64 = 16.0 * 16.0;
const REFERENCE_CUS: f64 = 132.0;
/// How fast n falls with the work: each doubling of `rows * H` per CU
/// divides n by `2^0.31 = 1.24`.
pub const WORK_EXPONENT: f64 = 0.31;
/// Tokens of one kernel tile: a split keeps at least one tile of the bound.
pub const SPLIT_TILE_TOKENS: usize = 32;
/// Splits of at most this many bound tokens (two tiles) cost more in a
/// second wave of CTAs than they save, so they stay within one wave.
pub const SHORT_SPLIT_TOKENS: usize = 64;

/// Bounds up to which 64+ heads take one wave of splits: the lists of a
/// bound this short (CSA: the window plus `index_topk`) are all near it
/// through most of a long context, so equal splits are balanced, and past
/// one wave more splits only add waves of CTAs, each paying the CTA's fixed
/// cost. Whole rows that fill the GPU run on the wgmma core. HCA's bound
/// grows with `max_model_len` and its rows spread far below it.
pub const WHOLE_ROW_MAX_BOUND: usize = 2048;

/// The smallest bound for that rule: shorter lists (SWA's 128) are cut for
/// more CTAs by the formula, as when the rule was measured (at the wgmma
/// core's split threshold of the time).
pub const WHOLE_ROW_MIN_BOUND: usize = 1024;

/// Largest bound at which 64+ heads take whole rows (n = 1) once the rows
/// alone fill the waves (`MIN_WAVE_FILL`): HCA at a 1M context. No split
/// means no merge and no per-split CTA cost, and a wave of such rows is
/// balanced enough; at 2M (a 16512-token bound, rows of 8k-16k) the
/// longest row made the launch 2-11% slower than 2-3 splits
/// (docs/v4-heuristic.md).
pub const WHOLE_ROW_FILL_MAX_BOUND: usize = 8320;

/// Our split count for `rows` rows whose KV is at most `kv_len_bound` long.
///
/// With 64 or more heads and a bound in `WHOLE_ROW_MIN_BOUND..=2048`: as
/// many splits as one wave holds, `cus / (rows * ceil(H/64))`, at least one
/// (`WHOLE_ROW_MAX_BOUND`). With 64 or more heads, a bound of at most 8320
/// and whole rows filling the waves (`wave_fill(1) >= MIN_WAVE_FILL`): one
/// (`WHOLE_ROW_FILL_MAX_BOUND`). Otherwise
/// `n = round(8 * (256 * cus / (132 * rows * H))^0.31)`, at most one
/// 32-token tile of the bound per split and 16; when a split would hold at
/// most 64 bound tokens, n also stays within one wave (`rows * ceil(H/64) * n
/// <= cus`). At least one.
///
/// Why this shape: n falls with the total work (`rows * H`: a 64-head CTA
/// does four times the work per token of a 16-head one) rather than with
/// the CTA count, and the bound only caps it, since for HCA (8320) it is
/// far above what most rows hold. Fitted on `mlabench splits
/// scenarios/dsv4-pro.toml` on the H200 (results/h200/dsv4-splits), where
/// the 64-head CTAs ran the mma.sync core.
pub fn heuristic_splits(rows: usize, heads: usize, kv_len_bound: usize, cus: usize) -> usize {
    heuristic(rows, heads, kv_len_bound, cus).0
}

/// `heuristic_splits` and which of its rules decided, for `mlabench plan`.
pub fn heuristic(rows: usize, heads: usize, kv_len_bound: usize, cus: usize) -> (usize, String) {
    let rows = rows.max(1);
    let heads = heads.max(1);
    let ctas = rows * heads.div_ceil(HEADS_PER_CTA);
    let wg = crate::variants::mla::kernel::WG_ROWS;
    // 64+ heads: a V4 CTA holds an SM alone on either core.
    let alone = heads >= wg;
    let whole_rows = (WHOLE_ROW_MIN_BOUND..=WHOLE_ROW_MAX_BOUND).contains(&kv_len_bound);
    if alone && whole_rows {
        let n = (cus / ctas).clamp(1, MAX_SPLITS);
        return (
            n,
            format!("one wave of splits: {heads} heads >= {wg} on a {kv_len_bound}-token bound, {ctas} CTAs a split on {cus} CUs"),
        );
    }
    if alone && kv_len_bound <= WHOLE_ROW_FILL_MAX_BOUND && wave_fill(1, ctas, cus) >= MIN_WAVE_FILL {
        return (
            1,
            format!(
                "whole rows fill the waves: {heads} heads >= {wg}, {ctas} CTAs on {cus} CUs, {:.0}% busy at n=1, a {kv_len_bound}-token bound <= {WHOLE_ROW_FILL_MAX_BOUND}",
                100.0 * wave_fill(1, ctas, cus)
            ),
        );
    }
    let scale = REFERENCE_HEAD_ROWS * cus.max(1) as f64 / (REFERENCE_CUS * (rows * heads) as f64);
    let n_work = (SPLITS_AT_REFERENCE * scale.powf(WORK_EXPONENT)).round() as usize;
    let cap = (kv_len_bound / SPLIT_TILE_TOKENS).clamp(1, MAX_SPLITS);
    let mut n = n_work.clamp(1, cap);
    let mut why = format!("the work formula: {rows} rows x {heads} heads on {cus} CUs gives {n_work}");
    if n != n_work {
        why += &format!(", {n} within one split per tile of the {kv_len_bound}-token bound and 1..={MAX_SPLITS}");
    }
    if kv_len_bound / n <= SHORT_SPLIT_TOKENS && n > cus / ctas {
        n = (cus / ctas).max(1);
        why += &format!(", {n} to stay in one wave of short splits");
    } else if alone {
        let waved = wave_splits(n, ctas, cus, cap);
        if waved != n {
            why += &format!(
                ", {waved} to fill the waves: {ctas} CTAs a split on {cus} CUs, {:.0}% of the last wave busy at {n}, {:.0}% at {waved}",
                100.0 * wave_fill(n, ctas, cus),
                100.0 * wave_fill(waved, ctas, cus)
            );
            n = waved;
        }
    }
    (n.max(1), why)
}

/// Below this fill the last wave idles enough SMs to move n by one.
pub const MIN_WAVE_FILL: f64 = 0.9;

/// n moved to fill the waves, where a V4 CTA holds an SM alone (64+ heads,
/// both cores): a launch lasts as many waves as it starts, so 192 CTAs on
/// 132 SMs cost two waves of 132. A launch of more than one wave whose
/// waves are under `MIN_WAVE_FILL` busy moves n to the neighbour that
/// fills more (the smaller on a tie: fewer partials to merge). Measured on
/// `mlabench splits` at 64 heads, 64 rows of 8k-16k entries
/// (results/h200/dsv4-peers-splits): n = 2 / 3 / 4 took 507 / 551 / 486 us,
/// the fill 97% / 73% / 97%. Under one wave n stays: more splits helped
/// long lists there and cost short ones 43% (docs/v4-heuristic.md), and the
/// bound does not tell them apart.
pub fn wave_splits(n: usize, ctas: usize, cus: usize, cap: usize) -> usize {
    let ctas = ctas.max(1);
    if ctas * n <= cus || wave_fill(n, ctas, cus) >= MIN_WAVE_FILL {
        return n;
    }
    [n.saturating_sub(1).max(1), (n + 1).min(cap.max(n))]
        .into_iter()
        .filter(|&m| m != n)
        .fold(n, |best, m| {
            if wave_fill(m, ctas, cus) > wave_fill(best, ctas, cus) {
                m
            } else {
                best
            }
        })
}

/// The kernel's own pick when no plan is passed. Modeled on aiter's
/// `get_meta_param` occupancy search (the V4 wrapper passes `tg_factor =
/// ceil(H/64)`), with the static bound standing in for the average length:
/// a host plan has no per-call lengths, and a captured graph must not either.
pub fn kernel_pick_splits(rows: usize, heads: usize, kv_len_bound: usize, cus: usize) -> usize {
    split::occupancy_splits(
        rows.max(1) * heads.max(1).div_ceil(HEADS_PER_CTA),
        kv_len_bound as f64,
        cus,
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitSource {
    /// Our heuristic, row `n-1` of the uniform table.
    Heuristic,
    /// A split count the scenario fixed.
    Fixed,
    /// No plan: the kernel picks `n` itself (see `kernel_pick_splits`).
    KernelPick,
}

/// A V4 split plan: `n` splits in every row and their CSR.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitPlan {
    pub n: usize,
    /// Kernel heads and the KV tokens of the longest split over the real
    /// rows: the core follows from them (`core`); 0 tokens until `with_lens`.
    pub heads: usize,
    pub split_tokens: usize,
    /// The run's `--v4-core` (auto: `v4::core` decides).
    pub core_choice: crate::case::V4CoreChoice,
    /// `[rows+1]`, `split_indptr[i] = n * i`: the table row for table plans
    /// (len `T+1`), the kernel's own CSR for `KernelPick` (len `max(N, T)+1`).
    pub split_indptr: Vec<i32>,
    pub source: SplitSource,
    /// Why this n: the heuristic's rule, or why there is no plan (KernelPick).
    pub why: Option<String>,
    /// The KV tokens of the shortest split over the real rows (`with_lens`).
    pub shortest_tokens: usize,
    /// The order the wgmma kernel takes its pieces in (`piece_order`).
    pub order: PieceOrder,
}

/// Whether the wgmma kernel takes its pieces longest first (its
/// `longest_first` argument), and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PieceOrder {
    pub longest_first: bool,
    pub why: String,
}

/// The shortest longest piece that makes ranking the rows pay. Ranked in
/// every launch of several waves (H100, dsv4-peers and dsv4-pro,
/// alternated), lists whose longest pieces hold 5k-8k tokens ran 5-16%
/// faster and those reaching 2k tokens the same or faster, but launches
/// of 18-250 us whose pieces stay at or under 1,152 tokens 3-10% slower.
pub const LPT_MIN_PIECE_TOKENS: usize = 1024;

/// The most rows the kernel ranks (`LPT_MAX_ROWS`,
/// kernels/common/v4_split_range.cuh): each thread compares its rows with
/// all of them.
pub const LPT_MAX_ROWS: usize = 512;

impl SplitPlan {
    /// Records the longest split of rows of lengths `lens` (`split_ranges`).
    pub fn with_lens(mut self, lens: &[usize]) -> Self {
        let piece = |l: &usize| l.div_ceil(self.n.max(1));
        self.split_tokens = lens.iter().map(piece).max().unwrap_or(0);
        self.shortest_tokens = lens.iter().map(piece).min().unwrap_or(0);
        self
    }

    /// Longest pieces first where the launch lasts several waves of CTAs
    /// that each hold an SM (the wgmma core) and its pieces are long and
    /// uneven: then the last wave's long pieces no longer run alone. The
    /// kernel ranks the rows from the lengths in device memory; this only
    /// says whether to, from the lengths of the plan's rows.
    pub fn piece_order(&self, launch_rows: usize, cus: usize) -> PieceOrder {
        let grid = |why: String| PieceOrder {
            longest_first: false,
            why,
        };
        let (core, _) = self.core();
        if core != crate::variants::v4::V4Core::Wg {
            return grid("grid (the mma core)".into());
        }
        let ctas = crate::variants::v4::groups(self.heads) as usize * launch_rows * self.n;
        if ctas <= cus {
            return grid(format!("grid ({ctas} CTAs on {cus} CUs start at once)"));
        }
        if launch_rows > LPT_MAX_ROWS {
            return grid(format!(
                "grid ({launch_rows} rows, more than the {LPT_MAX_ROWS} the kernel ranks)"
            ));
        }
        if self.split_tokens < LPT_MIN_PIECE_TOKENS {
            return grid(format!(
                "grid (the longest piece is {} tokens, under {LPT_MIN_PIECE_TOKENS})",
                self.split_tokens
            ));
        }
        if self.shortest_tokens == self.split_tokens {
            return grid(format!("grid (every piece is {} tokens)", self.split_tokens));
        }
        PieceOrder {
            longest_first: true,
            why: format!(
                "longest first ({ctas} CTAs on {cus} CUs, pieces of {}-{} tokens)",
                self.shortest_tokens, self.split_tokens
            ),
        }
    }

    /// The core this plan's kernel runs on, and why (`v4::core`). Whole
    /// rows take the wgmma core at any length: its one-split kernel writes
    /// `o` with the sink and leaves no partials to merge (20-39% faster
    /// than the mma core at 128-361 tokens, H100, docs/kernels.md).
    pub fn core(&self) -> (crate::variants::v4::V4Core, String) {
        use crate::variants::v4;
        let min = if self.n == 1 { 0 } else { v4::WG_MIN_SPLIT_TOKENS };
        let (core, why) = v4::core(self.heads, self.split_tokens, min, self.core_choice);
        match (self.n, core, self.core_choice) {
            (1, v4::V4Core::Wg, crate::case::V4CoreChoice::Auto) => (core, format!("whole rows, no merge: {why}")),
            _ => (core, why),
        }
    }

    /// Checks the CSR against `n`; every plan is checked before it runs.
    pub fn check(&self, case: &str) -> Result<(), PlanError> {
        if !(1..=MAX_SPLITS).contains(&self.n) {
            return Err(PlanError::new(
                case,
                format!("V4 split count {} is outside 1..={MAX_SPLITS}", self.n),
            ));
        }
        if self.split_indptr.is_empty() {
            return Err(PlanError::new(case, "V4 split CSR is empty"));
        }
        if let Some(i) = (0..self.split_indptr.len()).find(|&i| self.split_indptr[i] as i64 != (self.n * i) as i64) {
            return Err(PlanError::new(
                case,
                format!(
                    "V4 split CSR entry {i} is {}, not n*i = {}",
                    self.split_indptr[i],
                    self.n * i
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for SplitPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.source, &self.why) {
            (SplitSource::Heuristic, _) => write!(f, "n={} (heuristic)", self.n),
            (SplitSource::Fixed, _) => write!(f, "n={} (fixed)", self.n),
            (SplitSource::KernelPick, Some(why)) => write!(f, "n={} (kernel pick: {why})", self.n),
            (SplitSource::KernelPick, None) => write!(f, "n={} (kernel pick)", self.n),
        }
    }
}

fn uniform_csr(n: usize, rows: usize) -> Vec<i32> {
    (0..=rows).map(|i| (n * i) as i32).collect()
}

/// The plan for `rows_n` real rows in a `t`-row table. A fixed count in
/// 1..=16 is used as is; otherwise our heuristic picks. No plan (`rows > T`,
/// or a fixed count outside the table) leaves the pick to the kernel.
pub fn v4_split_plan(
    rows_n: usize,
    t: usize,
    heads: usize,
    bound: usize,
    cus: usize,
    fixed: Option<usize>,
) -> SplitPlan {
    let kernel = |why: String| {
        let n = kernel_pick_splits(rows_n, heads, bound, cus);
        SplitPlan {
            n,
            heads,
            split_tokens: 0,
            core_choice: Default::default(),
            split_indptr: uniform_csr(n, rows_n.max(t)),
            source: SplitSource::KernelPick,
            why: Some(why),
            shortest_tokens: 0,
            order: PieceOrder::default(),
        }
    };
    if rows_n > t {
        return kernel(format!("rows {rows_n} > T {t}, past the table"));
    }
    let (n, source, why) = match fixed {
        Some(n) if (1..=MAX_SPLITS).contains(&n) => (n, SplitSource::Fixed, None),
        Some(n) => return kernel(format!("fixed n={n} is outside the table's 1..={MAX_SPLITS}")),
        None => {
            let (n, why) = heuristic(rows_n, heads, bound, cus);
            (n, SplitSource::Heuristic, Some(why))
        }
    };
    let plan = SplitPlan {
        n,
        heads,
        split_tokens: 0,
        core_choice: Default::default(),
        split_indptr: table_row(&uniform_table(t), t, n).to_vec(),
        source,
        why,
        shortest_tokens: 0,
        order: PieceOrder::default(),
    };
    debug_assert!(plan.check("v4_split_plan").is_ok());
    plan
}

/// The tokens split `s` of a `len`-token row covers:
/// `[ceil(len*s/n), ceil(len*(s+1)/n))`, possibly empty. Tiles `[0, len)`.
pub fn split_ranges(len: usize, n: usize) -> Vec<(usize, usize)> {
    let n = n.max(1);
    let at = |s: usize| (len * s).div_ceil(n);
    let ranges: Vec<_> = (0..n).map(|s| (at(s), at(s + 1))).collect();
    debug_assert!(check_tiling(&ranges, len).is_ok());
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_table_rows() {
        let t = 3;
        let table = uniform_table(t);
        assert_eq!(table.len(), 16 * 4);
        assert_eq!(table_row(&table, t, 1), &[0, 1, 2, 3]);
        assert_eq!(table_row(&table, t, 2), &[0, 2, 4, 6]);
        assert_eq!(table_row(&table, t, 16), &[0, 16, 32, 48]);
    }

    #[test]
    fn bounds_per_layer_type() {
        assert_eq!(kv_len_bound(LayerType::Swa, 1024, 1 << 20), 128);
        assert_eq!(kv_len_bound(LayerType::Csa, 1024, 1 << 20), 1152);
        assert_eq!(kv_len_bound(LayerType::Hca, 1024, 1 << 20), 128 + 8192);
        assert_eq!(kv_len_bound(LayerType::Hca, 1024, 1000), 128 + 7);
    }

    #[test]
    fn heuristic_by_hand() {
        // The reference point: 16 rows x 16 heads of CSA.
        assert_eq!(heuristic_splits(16, 16, 1152, 132), 8);
        // 8x the head-rows: 8 * 8^-0.31 = 4.2.
        assert_eq!(heuristic_splits(16, 128, 8320, 132), 4);
        // 64 rows x 128 heads on a 2M context's bound: 8 * 32^-0.31 = 2.7;
        // 256 rows: 1.8. At 1M (8320) their whole rows fill the waves: 1.
        assert_eq!(heuristic_splits(64, 128, 16512, 132), 3);
        assert_eq!(heuristic_splits(256, 128, 16512, 132), 2);
        assert_eq!(heuristic_splits(64, 128, 8320, 132), 1);
        assert_eq!(heuristic_splits(256, 128, 8320, 132), 1);
        assert_eq!(heuristic_splits(128, 64, 8320, 132), 1);
        assert_eq!(heuristic_splits(64, 64, 8320, 132), 2);
        // SWA (bound 128): at most 4 one-tile splits, and they stay in one
        // wave: 64 rows at 16 heads launch 64 CTAs a split, so 2.
        assert_eq!(heuristic_splits(16, 16, 128, 132), 4);
        assert_eq!(heuristic_splits(64, 16, 128, 132), 2);
        assert_eq!(heuristic_splits(64, 128, 128, 132), 1);
        // CSA lists (bound 1152) at 64+ heads: one wave of splits. 64 rows
        // x 2 groups = 128 CTAs: whole rows; 64 rows x 1 group: 2 splits;
        // 16 rows x 2 groups: 4; 256 rows: whole rows over two waves. Past
        // 2048, whole rows still while they fill the waves (to 8320), then
        // the formula.
        assert_eq!(heuristic_splits(64, 128, 1152, 132), 1);
        assert_eq!(heuristic_splits(64, 64, 1152, 132), 2);
        assert_eq!(heuristic_splits(16, 128, 1152, 132), 4);
        assert_eq!(heuristic_splits(256, 64, 1152, 132), 1);
        assert_eq!(heuristic_splits(1, 64, 1152, 132), 16);
        assert_eq!(heuristic_splits(64, 128, 2176, 132), 1);
        assert_eq!(heuristic_splits(64, 32, 1152, 132), 4);
        // More CUs leave room for more splits at the same rows.
        assert_eq!(heuristic_splits(256, 128, 16512, 528), 3);
        // One row of a 100-token bound: the work wants 19, the bound 3 tiles.
        assert_eq!(heuristic_splits(1, 16, 100, 132), 3);
        // Degenerate inputs still give one split.
        assert_eq!(heuristic_splits(0, 0, 0, 0), 1);
    }

    #[test]
    fn wave_splits_by_hand() {
        // 64 rows x 64 heads: 3 splits start 192 CTAs, 73% of two waves;
        // 2 and 4 fill 97%, and the smaller wins the tie.
        assert!((wave_fill(3, 64, 132) - 192.0 / 264.0).abs() < 1e-12);
        assert_eq!(wave_splits(3, 64, 132, 16), 2);
        assert_eq!(heuristic_splits(64, 64, 8320, 132), 2);
        // 128 rows x 64 heads: 384 of 396 busy, kept.
        assert_eq!(wave_splits(3, 128, 132, 16), 3);
        // Under one wave n stays.
        assert_eq!(wave_splits(5, 16, 132, 16), 5);
        assert_eq!(heuristic_splits(16, 64, 8320, 132), 5);
        // The cap keeps n + 1 out: 64 rows on a 96-token bound.
        assert_eq!(wave_splits(3, 64, 132, 3), 2);
        // 16 heads (several CTAs an SM) keep the formula.
        assert_eq!(heuristic_splits(64, 16, 8320, 132), 5);
        assert!(heuristic(64, 64, 8320, 132)
            .1
            .ends_with("73% of the last wave busy at 3, 97% at 2"));
    }

    #[test]
    fn the_heuristic_names_the_rule_that_decided() {
        assert!(heuristic(64, 128, 1152, 132).1.contains("one wave of splits"));
        assert!(heuristic(64, 128, 16512, 132).1.starts_with("the work formula"));
        assert!(heuristic(64, 128, 8320, 132).1.starts_with("whole rows fill the waves"));
        let (n, why) = heuristic(64, 16, 128, 132);
        assert_eq!(n, 2);
        assert!(
            why.contains("5, 4 within one split per tile") && why.ends_with("2 to stay in one wave of short splits"),
            "{why}"
        );
        let p = v4_split_plan(64, 72, 128, 1152, 132, None).with_lens(&[1152; 64]);
        assert!(super::super::Run::details(&p)
            .iter()
            .any(|d| d.starts_with("n=1: one wave")));
    }

    #[test]
    fn kernel_pick_follows_the_occupancy_search() {
        // One row, 2 head groups: occupancy grows with n up to 16.
        assert_eq!(kernel_pick_splits(1, 128, 8320, 132), 16);
        // 66 rows x 2 groups = 132 CTAs: one split.
        assert_eq!(kernel_pick_splits(66, 128, 8320, 132), 1);
    }

    #[test]
    fn split_plan_sources() {
        let p = v4_split_plan(4, 8, 16, 128, 132, None);
        assert_eq!((p.n, p.source), (4, SplitSource::Heuristic));
        assert_eq!(p.split_indptr, vec![0, 4, 8, 12, 16, 20, 24, 28, 32]);
        assert!(p.check("c").is_ok());

        let p = v4_split_plan(4, 8, 16, 128, 132, Some(5));
        assert_eq!((p.n, p.source), (5, SplitSource::Fixed));
        assert_eq!(p.split_indptr.len(), 9);
        assert_eq!(p.split_indptr[8], 40);

        let p = v4_split_plan(4, 8, 16, 1152, 132, Some(20));
        assert_eq!(p.source, SplitSource::KernelPick);
        assert_eq!(p.n, 16);
        assert!(p.why.as_deref().unwrap().contains("n=20"));
        assert_eq!(
            p.to_string(),
            "n=16 (kernel pick: fixed n=20 is outside the table's 1..=16)"
        );

        let p = v4_split_plan(12, 8, 16, 1152, 132, None);
        assert_eq!(p.source, SplitSource::KernelPick);
        assert_eq!(p.split_indptr.len(), 13, "the kernel's CSR covers all 12 real rows");
        assert!(p.check("c").is_ok());
    }

    #[test]
    fn the_core_follows_the_longest_split() {
        use crate::variants::v4::{V4Core, WG_MIN_SPLIT_TOKENS};
        // Mean 465 tokens, longest row 1152: split in two it is 576 long,
        // in five 231, under the wgmma core's split threshold.
        let lens = [2, 1152, 241];
        let p = v4_split_plan(3, 8, 128, 1152, 132, Some(2)).with_lens(&lens);
        assert_eq!(p.split_tokens, 576);
        assert_eq!(p.core().0, V4Core::Wg);
        let p = v4_split_plan(3, 8, 128, 1152, 132, Some(5)).with_lens(&lens);
        assert_eq!(p.split_tokens, 231);
        assert!(p.split_tokens < WG_MIN_SPLIT_TOKENS);
        assert_eq!(p.core().0, V4Core::Mma);
        // Whole rows take the wgmma core at any length: no partials, no merge.
        let p = v4_split_plan(3, 8, 128, 128, 132, Some(1)).with_lens(&[2, 128, 90]);
        let (core, why) = p.core();
        assert_eq!(core, V4Core::Wg);
        assert!(why.starts_with("whole rows, no merge"), "{why}");
        assert!(why.contains("128 tokens in the longest split,"), "{why}");
        // Under 64 heads a CTA stays on the mma core.
        let p = v4_split_plan(3, 8, 32, 128, 132, Some(1)).with_lens(&[128]);
        assert_eq!(p.core().0, V4Core::Mma);
        assert_eq!(
            v4_split_plan(3, 8, 128, 1152, 132, Some(3)).with_lens(&[]).split_tokens,
            0
        );
    }

    #[test]
    fn split_plan_check_catches_a_wrong_csr() {
        let mut p = v4_split_plan(4, 8, 16, 128, 132, None);
        p.split_indptr[3] += 1;
        let e = p.check("case-x").unwrap_err();
        assert_eq!(e.case, "case-x");
        assert!(e.what.contains("entry 3"), "{}", e.what);
    }

    #[test]
    fn split_ranges_by_hand_and_tiling() {
        assert_eq!(split_ranges(10, 3), vec![(0, 4), (4, 7), (7, 10)]);
        assert_eq!(split_ranges(2, 4), vec![(0, 1), (1, 1), (1, 2), (2, 2)]);
        assert_eq!(split_ranges(0, 2), vec![(0, 0), (0, 0)]);
        for len in 0..300 {
            for n in 1..=16 {
                let r = split_ranges(len, n);
                assert_eq!(r.len(), n);
                assert!(check_tiling(&r, len).is_ok(), "len {len} n {n}");
                let sizes: Vec<usize> = r.iter().map(|(a, b)| b - a).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "len {len} n {n}: balanced to one token, got {sizes:?}");
            }
        }
    }

    #[test]
    fn longest_first_needs_waves_long_uneven_pieces_and_the_wgmma_core() {
        use crate::case::V4CoreChoice;
        // 128 rows of 8k-16k tokens in two splits at 128 heads: 512 CTAs.
        let lens: Vec<usize> = (0..128).map(|i| 8192 + 64 * i).collect();
        let p = v4_split_plan(128, 128, 128, 16384, 132, Some(2)).with_lens(&lens);
        assert_eq!((p.shortest_tokens, p.split_tokens), (4096, 8160));
        let o = p.piece_order(128, 132);
        assert!(o.longest_first, "{}", o.why);
        assert!(o.why.contains("512 CTAs") && o.why.contains("4096-8160"), "{}", o.why);
        // One wave: every CTA starts at once.
        let o = p.piece_order(128, 512);
        assert!(!o.longest_first && o.why.contains("start at once"), "{}", o.why);
        assert!(p.piece_order(128, 511).longest_first);
        // More rows than the kernel ranks.
        assert!(!p.piece_order(LPT_MAX_ROWS + 1, 132).longest_first);
        assert!(p.piece_order(LPT_MAX_ROWS, 132).longest_first);
        // The mma core keeps the grid order.
        let mut m = p.clone();
        m.core_choice = V4CoreChoice::Mma;
        assert!(!m.piece_order(128, 132).longest_first);
        // Equal pieces (CSA's full top-k lists): nothing to reorder.
        let p = v4_split_plan(128, 128, 128, 16384, 132, Some(2)).with_lens(&[8192; 128]);
        let o = p.piece_order(128, 132);
        assert!(!o.longest_first && o.why.contains("every piece is 4096"), "{}", o.why);
        // Pieces under the threshold: the ranking would not pay.
        let short = |top: usize| {
            let lens: Vec<usize> = (0..128).map(|i| top - i).collect();
            v4_split_plan(128, 128, 128, 16384, 132, Some(1)).with_lens(&lens)
        };
        assert!(!short(LPT_MIN_PIECE_TOKENS - 1).piece_order(128, 132).longest_first);
        assert!(short(LPT_MIN_PIECE_TOKENS).piece_order(128, 132).longest_first);
        // The kernel ranks as many rows as the host asks it to.
        let src = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/kernels/common/v4_split_range.cuh"
        ))
        .unwrap();
        let bits = LPT_MAX_ROWS.trailing_zeros();
        assert_eq!(1 << bits, LPT_MAX_ROWS);
        assert!(
            src.contains(&format!("constexpr int LPT_ROW_BITS = {bits};")),
            "v4_split_range.cuh's LPT_MAX_ROWS is not the host's"
        );
    }
}
