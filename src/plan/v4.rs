//! DeepSeek-V4 decode plans (SPEC §2): the uniform split table, the split
//! count per layer type, and the hca_persist gates and partition plan.

use serde::Serialize;
use std::fmt;

use super::{check_tiling, split, PlanError};
use crate::case::{LayerType, V4_WINDOW};

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
/// scale from there (fitted on the H200, see docs/perf-notes.md).
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

/// Our split count for `rows` rows whose KV is at most `kv_len_bound` long.
///
/// `n = round(8 * (256 * cus / (132 * rows * H))^0.31)`, at most one
/// 32-token tile of the bound per split and 16; when a split would hold at
/// most 64 bound tokens, n also stays within one wave (`rows * ceil(H/64) * n
/// <= cus`). At least one.
///
/// Why this shape: n falls with the total work (`rows * H`: a 64-head CTA
/// does four times the work per token of a 16-head one) rather than with
/// the CTA count, and the bound only caps it, since for HCA (8320) it is
/// far above what most rows hold. Fitted on `mlabench splits
/// scenarios/dsv4-pro.toml` on the H200 (results/h200/dsv4-splits).
pub fn heuristic_splits(rows: usize, heads: usize, kv_len_bound: usize, cus: usize) -> usize {
    let rows = rows.max(1);
    let heads = heads.max(1);
    let ctas = rows * heads.div_ceil(HEADS_PER_CTA);
    let scale = REFERENCE_HEAD_ROWS * cus.max(1) as f64 / (REFERENCE_CUS * (rows * heads) as f64);
    let n_work = (SPLITS_AT_REFERENCE * scale.powf(WORK_EXPONENT)).round() as usize;
    let mut n = n_work.min(kv_len_bound / SPLIT_TILE_TOKENS).clamp(1, MAX_SPLITS);
    if kv_len_bound / n <= SHORT_SPLIT_TOKENS {
        n = n.min(cus / ctas);
    }
    n.max(1)
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
    /// `[rows+1]`, `split_indptr[i] = n * i`: the table row for table plans
    /// (len `T+1`), the kernel's own CSR for `KernelPick` (len `max(N, T)+1`).
    pub split_indptr: Vec<i32>,
    pub source: SplitSource,
    /// Why there is no plan (KernelPick only).
    pub why: Option<String>,
}

impl SplitPlan {
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
            split_indptr: uniform_csr(n, rows_n.max(t)),
            source: SplitSource::KernelPick,
            why: Some(why),
        }
    };
    if rows_n > t {
        return kernel(format!("rows {rows_n} > T {t}, past the table"));
    }
    let (n, source) = match fixed {
        Some(n) if (1..=MAX_SPLITS).contains(&n) => (n, SplitSource::Fixed),
        Some(n) => return kernel(format!("fixed n={n} is outside the table's 1..={MAX_SPLITS}")),
        None => (heuristic_splits(rows_n, heads, bound, cus), SplitSource::Heuristic),
    };
    let plan = SplitPlan {
        n,
        split_indptr: table_row(&uniform_table(t), t, n).to_vec(),
        source,
        why: None,
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

/// hca_persist's limits (SPEC §2).
pub const HCA_COMPRESS_RATIO: usize = 128;
pub const HCA_HEADS: usize = 128;
pub const HCA_MAX_ROWS: usize = 32768;
/// Default partition count `P`.
pub const HCA_PARTITIONS: usize = 128;

/// The hca_persist gates, in order; Err names the first that fails, with its
/// values, and says what runs instead.
pub fn hca_gates(
    layer: LayerType,
    heads: usize,
    rows: usize,
    min_rows: usize,
    fp8: bool,
    row_dense: bool,
    workspace: bool,
) -> Result<(), String> {
    let ratio = layer.compress_ratio();
    if ratio != HCA_COMPRESS_RATIO {
        return Err(format!(
            "compress_ratio is {ratio} ({layer}), not {HCA_COMPRESS_RATIO}: hca_persist runs HCA layers only; v4_split runs this one"
        ));
    }
    if heads != HCA_HEADS {
        return Err(format!(
            "H={heads}, not {HCA_HEADS}: the persistent kernel is built for {HCA_HEADS} local heads; v4_split runs this case"
        ));
    }
    if !fp8 {
        return Err(
            "the KV pool is not fp8: the persistent kernel reads native FP8 rows only; v4_split runs this case".into(),
        );
    }
    if rows < min_rows {
        return Err(format!(
            "rows {rows} < min_rows {min_rows}: small batches stay on v4_split"
        ));
    }
    if rows > HCA_MAX_ROWS {
        return Err(format!(
            "rows {rows} > {HCA_MAX_ROWS}: past the persistent kernel's row limit; v4_split runs this case"
        ));
    }
    if !row_dense {
        return Err(
            "the KV pools are not row-dense: the persistent kernel indexes pool rows directly; v4_split runs this case"
                .into(),
        );
    }
    if !workspace {
        return Err(
            "no workspace: it is allocated at setup, before any graph capture, and a capture without one stays on v4_split"
                .into(),
        );
    }
    Ok(())
}

/// One contiguous piece of a row's KV that one partition processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Piece {
    pub partition: usize,
    pub row: usize,
    /// Token range within the row, `[start, end)`.
    pub start: usize,
    pub end: usize,
    /// `None`: the row lies in this partition whole and is written directly.
    /// `Some(s)`: a partial in workspace slot `s` of `o_acc [2P, H, 512]`:
    /// `2p` for the cut row at the partition's start, `2p + 1` for the one at its end.
    pub slot: Option<usize>,
}

/// The in-kernel split of hca_persist, emulated on the host so the CPU
/// backend can run it and the CUDA kernel can be checked against it.
///
/// Rows are laid end to end (row `i` at `sum(lens[..i])`); partition `p`
/// takes the work `[floor(p*total/P), floor((p+1)*total/P))`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HcaPlan {
    pub partitions: usize,
    /// Total work: the sum of the row lengths.
    pub total: usize,
    /// `[P+1]` work offsets of the partitions.
    pub bounds: Vec<usize>,
    /// Ordered by partition, then row.
    pub pieces: Vec<Piece>,
    /// Rows written directly (one piece, no partial).
    pub direct_rows: usize,
    /// Rows cut by a boundary (partials merged by the last piece to finish).
    pub split_rows: usize,
    /// Pieces per row: the count the row's counter reaches before the merge.
    pub row_pieces: Vec<usize>,
}

/// Row lengths from a CSR that may start at an offset (`kv_indptr[0] != 0`).
pub fn lens_from_indptr(kv_indptr: &[i32]) -> Result<Vec<usize>, String> {
    kv_indptr
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            usize::try_from(w[1] - w[0]).map_err(|_| format!("kv_indptr decreases at row {i}: {} -> {}", w[0], w[1]))
        })
        .collect()
}

fn partition_bound(p: usize, total: usize, parts: usize) -> usize {
    (p as u128 * total as u128 / parts as u128) as usize
}

/// Fewest tokens an hca_persist partition holds (kernel define `HCA_MIN_TOKENS`).
pub const HCA_MIN_TOKENS: usize = 64;

/// The partitions one hca_persist call really uses, as the kernel computes
/// them (`effective_parts` in kernels/hca_persist.cu): at most the
/// workspace's `p`, one CTA per SM per head group, and `HCA_MIN_TOKENS`
/// tokens each; at least one. Small calls thus skip most CTAs instead of
/// paying a merge per few tokens.
pub fn hca_effective_partitions(p: usize, total: usize, cus: usize, heads: usize) -> usize {
    let groups = heads.max(1).div_ceil(HEADS_PER_CTA);
    p.min(cus / groups).min(total.div_ceil(HCA_MIN_TOKENS)).max(1)
}

/// The plan of one call: [`hca_partition_plan`] over the effective partitions.
pub fn hca_call_plan(lens: &[usize], p: usize, cus: usize, heads: usize) -> Result<HcaPlan, String> {
    if p == 0 {
        return Err("hca_persist needs at least one partition (P=0)".into());
    }
    hca_partition_plan(lens, hca_effective_partitions(p, lens.iter().sum(), cus, heads))
}

/// Plans the persistent split over `p` partitions for rows of length `lens`.
pub fn hca_partition_plan(lens: &[usize], p: usize) -> Result<HcaPlan, String> {
    if p == 0 {
        return Err("hca_persist needs at least one partition (P=0)".into());
    }
    let total: usize = lens.iter().sum();
    let bounds: Vec<usize> = (0..=p).map(|q| partition_bound(q, total, p)).collect();
    let mut pieces = Vec::new();
    let mut row_pieces = vec![0usize; lens.len()];
    // Rows overlapping partition q start at `row`, which only moves forward.
    let (mut row, mut row_off) = (0usize, 0usize);
    for q in 0..p {
        let (lo, hi) = (bounds[q], bounds[q + 1]);
        if lo == hi {
            continue;
        }
        while row < lens.len() && row_off + lens[row] <= lo {
            row_off += lens[row];
            row += 1;
        }
        let (mut i, mut off) = (row, row_off);
        while i < lens.len() && off < hi {
            let len = lens[i];
            if len > 0 {
                let (a, b) = (lo.max(off), hi.min(off + len));
                let whole = a == off && b == off + len;
                let slot = match (whole, a == lo) {
                    (true, _) => None,
                    (false, true) => Some(2 * q),
                    (false, false) => Some(2 * q + 1),
                };
                pieces.push(Piece {
                    partition: q,
                    row: i,
                    start: a - off,
                    end: b - off,
                    slot,
                });
                row_pieces[i] += 1;
            }
            off += len;
            i += 1;
        }
    }
    let direct_rows = row_pieces.iter().zip(lens).filter(|&(&k, &l)| l > 0 && k == 1).count();
    let split_rows = row_pieces.iter().filter(|&&k| k > 1).count();
    let plan = HcaPlan {
        partitions: p,
        total,
        bounds,
        pieces,
        direct_rows,
        split_rows,
        row_pieces,
    };
    plan.check(lens)?;
    Ok(plan)
}

impl HcaPlan {
    /// Workspace partial slots the plan may use (`2P`).
    pub fn workspace_slots(&self) -> usize {
        2 * self.partitions
    }

    /// Every token of every row in exactly one piece; empty rows get none;
    /// pieces inside their partition; a row is direct (one piece, no slot)
    /// or split (every piece has a slot); slots distinct and below `2P`.
    pub fn check(&self, lens: &[usize]) -> Result<(), String> {
        let p = self.partitions;
        if self.bounds.len() != p + 1 || self.bounds[p] != self.total || self.total != lens.iter().sum::<usize>() {
            return Err(format!(
                "partition bounds {:?} do not cover the total work {}",
                self.bounds, self.total
            ));
        }
        let mut offs = Vec::with_capacity(lens.len());
        let mut acc = 0;
        for &l in lens {
            offs.push(acc);
            acc += l;
        }
        let mut per_row: Vec<Vec<&Piece>> = vec![Vec::new(); lens.len()];
        let mut used = vec![false; 2 * p];
        for pc in &self.pieces {
            if pc.row >= lens.len() || pc.partition >= p {
                return Err(format!("piece {pc:?} names a row or partition that does not exist"));
            }
            if pc.start >= pc.end || pc.end > lens[pc.row] {
                return Err(format!("piece {pc:?} is empty or past row length {}", lens[pc.row]));
            }
            let (a, b) = (offs[pc.row] + pc.start, offs[pc.row] + pc.end);
            if a < self.bounds[pc.partition] || b > self.bounds[pc.partition + 1] {
                return Err(format!(
                    "piece {pc:?} (work [{a}, {b})) leaves its partition [{}, {})",
                    self.bounds[pc.partition],
                    self.bounds[pc.partition + 1]
                ));
            }
            if let Some(s) = pc.slot {
                if s / 2 != pc.partition || used[s] {
                    return Err(format!("piece {pc:?}: slot {s} is reused or not its partition's"));
                }
                used[s] = true;
            }
            per_row[pc.row].push(pc);
        }
        let (mut direct, mut split) = (0, 0);
        for (i, ps) in per_row.iter_mut().enumerate() {
            ps.sort_by_key(|pc| pc.start);
            let ranges: Vec<_> = ps.iter().map(|pc| (pc.start, pc.end)).collect();
            check_tiling(&ranges, lens[i]).map_err(|e| format!("row {i}: {e}"))?;
            if self.row_pieces[i] != ps.len() {
                return Err(format!(
                    "row {i}: row_pieces says {}, there are {}",
                    self.row_pieces[i],
                    ps.len()
                ));
            }
            match ps.len() {
                0 => {}
                1 if ps[0].slot.is_none() => direct += 1,
                1 => return Err(format!("row {i} is whole in one piece but has a partial slot")),
                _ if ps.iter().all(|pc| pc.slot.is_some()) => split += 1,
                _ => return Err(format!("row {i} is split but a piece has no partial slot")),
            }
        }
        if (direct, split) != (self.direct_rows, self.split_rows) {
            return Err(format!(
                "counts say {} direct / {} split rows, pieces say {direct} / {split}",
                self.direct_rows, self.split_rows
            ));
        }
        Ok(())
    }
}

impl fmt::Display for HcaPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "P={} pieces={} direct={} split={}",
            self.partitions,
            self.pieces.len(),
            self.direct_rows,
            self.split_rows
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

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
        assert_eq!(heuristic_splits(16, 128, 1152, 132), 4);
        // 64 rows x 128 heads: 8 * 32^-0.31 = 2.7; 256 rows: 1.8.
        assert_eq!(heuristic_splits(64, 128, 8320, 132), 3);
        assert_eq!(heuristic_splits(256, 128, 8320, 132), 2);
        // SWA (bound 128): at most 4 one-tile splits, and they stay in one
        // wave: 64 rows at 16 heads launch 64 CTAs a split, so 2.
        assert_eq!(heuristic_splits(16, 16, 128, 132), 4);
        assert_eq!(heuristic_splits(64, 16, 128, 132), 2);
        assert_eq!(heuristic_splits(64, 128, 128, 132), 1);
        // More CUs leave room for more splits at the same rows.
        assert_eq!(heuristic_splits(256, 128, 8320, 528), 3);
        // One row of a 100-token bound: the work wants 19, the bound 3 tiles.
        assert_eq!(heuristic_splits(1, 16, 100, 132), 3);
        // Degenerate inputs still give one split.
        assert_eq!(heuristic_splits(0, 0, 0, 0), 1);
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
    fn hca_gates_name_the_first_failure() {
        let ok = hca_gates(LayerType::Hca, 128, 64, 15, true, true, true);
        assert_eq!(ok, Ok(()));
        let e = hca_gates(LayerType::Csa, 16, 4, 15, false, false, false).unwrap_err();
        assert!(e.starts_with("compress_ratio is 4 (csa), not 128"), "{e}");
        let e = hca_gates(LayerType::Hca, 16, 4, 15, false, true, true).unwrap_err();
        assert!(e.starts_with("H=16, not 128"), "{e}");
        let e = hca_gates(LayerType::Hca, 128, 4, 15, false, true, true).unwrap_err();
        assert!(e.contains("not fp8"), "{e}");
        let e = hca_gates(LayerType::Hca, 128, 14, 15, true, true, true).unwrap_err();
        assert_eq!(e, "rows 14 < min_rows 15: small batches stay on v4_split");
        assert!(
            hca_gates(LayerType::Hca, 128, 15, 15, true, true, true).is_ok(),
            "min_rows is inclusive"
        );
        assert!(
            hca_gates(LayerType::Hca, 128, 32768, 15, true, true, true).is_ok(),
            "32768 is inclusive"
        );
        let e = hca_gates(LayerType::Hca, 128, 32769, 15, true, true, true).unwrap_err();
        assert!(e.starts_with("rows 32769 > 32768"), "{e}");
        let e = hca_gates(LayerType::Hca, 128, 64, 15, true, false, false).unwrap_err();
        assert!(e.contains("row-dense"), "{e}");
        let e = hca_gates(LayerType::Hca, 128, 64, 15, true, true, false).unwrap_err();
        assert!(e.starts_with("no workspace"), "{e}");
    }

    #[test]
    fn hca_plan_by_hand() {
        // Rows [5, 0, 3, 8] end to end: [0,5) [5,5) [5,8) [8,16); P=4 -> bounds 0,4,8,12,16.
        let plan = hca_partition_plan(&[5, 0, 3, 8], 4).unwrap();
        assert_eq!(plan.bounds, vec![0, 4, 8, 12, 16]);
        let pc = |partition, row, start, end, slot| Piece {
            partition,
            row,
            start,
            end,
            slot,
        };
        assert_eq!(
            plan.pieces,
            vec![
                pc(0, 0, 0, 4, Some(0)),
                pc(1, 0, 4, 5, Some(2)),
                pc(1, 2, 0, 3, None),
                pc(2, 3, 0, 4, Some(4)),
                pc(3, 3, 4, 8, Some(6)),
            ]
        );
        assert_eq!((plan.direct_rows, plan.split_rows), (1, 2));
        assert_eq!(plan.row_pieces, vec![2, 0, 1, 2]);
        assert_eq!(plan.to_string(), "P=4 pieces=5 direct=1 split=2");

        // A cut row at a partition's end takes slot 2p+1. Rows [3, 6], P=2:
        // bounds 0, 4, 9; row 1 is [3, 9).
        let plan = hca_partition_plan(&[3, 6], 2).unwrap();
        assert_eq!(
            plan.pieces,
            vec![pc(0, 0, 0, 3, None), pc(0, 1, 0, 1, Some(1)), pc(1, 1, 1, 6, Some(2))]
        );
    }

    #[test]
    fn hca_plan_edge_cases() {
        // The kernel's effective count: 128 slots, 132 SMs over 2 head groups,
        // 64 tokens a partition.
        assert_eq!(hca_effective_partitions(128, 1 << 20, 132, 128), 66);
        assert_eq!(hca_effective_partitions(128, 1000, 132, 128), 16);
        assert_eq!(hca_effective_partitions(8, 1 << 20, 132, 128), 8);
        assert_eq!(hca_effective_partitions(128, 0, 132, 128), 1);
        assert_eq!(hca_call_plan(&[500, 300], 128, 132, 128).unwrap().partitions, 13);
        assert!(hca_call_plan(&[4], 0, 132, 128).is_err());
        assert!(hca_partition_plan(&[4], 0).is_err());
        let plan = hca_partition_plan(&[0, 0, 0], 4).unwrap();
        assert!(plan.pieces.is_empty());
        assert_eq!((plan.direct_rows, plan.split_rows), (0, 0));
        // Fewer tokens than partitions: some partitions are empty.
        let plan = hca_partition_plan(&[2, 1], 8).unwrap();
        assert_eq!(plan.pieces.len(), 3);
        assert_eq!(plan.split_rows, 1);
        // One row over every partition: each piece is first and last of its
        // partition and takes the "first" slot.
        let plan = hca_partition_plan(&[100], 4).unwrap();
        assert_eq!(
            plan.pieces.iter().map(|p| p.slot.unwrap()).collect::<Vec<_>>(),
            vec![0, 2, 4, 6]
        );
    }

    #[test]
    fn hca_plan_holds_its_invariants_on_random_inputs() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x4ca);
        for _ in 0..300 {
            let n = rng.gen_range(1..200);
            let lens: Vec<usize> = (0..n)
                .map(|_| if rng.gen_bool(0.1) { 0 } else { rng.gen_range(1..9000) })
                .collect();
            let p = rng.gen_range(1..=256);
            let plan = hca_partition_plan(&lens, p).unwrap();
            let covered: usize = plan.pieces.iter().map(|pc| pc.end - pc.start).sum();
            assert_eq!(covered, lens.iter().sum::<usize>());
            assert_eq!(
                plan.direct_rows + plan.split_rows,
                lens.iter().filter(|&&l| l > 0).count()
            );
            // Each partition has at most one first and one last cut row.
            for q in 0..p {
                assert!(
                    plan.pieces
                        .iter()
                        .filter(|pc| pc.partition == q && pc.slot.is_some())
                        .count()
                        <= 2
                );
            }
        }
    }

    #[test]
    fn hca_check_catches_broken_plans() {
        let lens = [5, 0, 3, 8];
        let good = hca_partition_plan(&lens, 4).unwrap();
        let mut dropped = good.clone();
        dropped.pieces.remove(3);
        dropped.row_pieces[3] = 1;
        assert!(dropped.check(&lens).unwrap_err().contains("row 3"));
        let mut reused = good.clone();
        reused.pieces[4].slot = Some(4);
        assert!(reused.check(&lens).is_err());
        let mut moved = good.clone();
        moved.pieces[2].partition = 0;
        assert!(moved.check(&lens).unwrap_err().contains("leaves its partition"));
    }

    #[test]
    fn lens_from_offset_indptr() {
        assert_eq!(lens_from_indptr(&[100, 105, 105, 108]), Ok(vec![5, 0, 3]));
        assert!(lens_from_indptr(&[4, 2]).is_err());
        assert_eq!(lens_from_indptr(&[7]), Ok(vec![]));
    }
}
