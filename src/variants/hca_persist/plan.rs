//! hca_persist's gates and the in-kernel partition plan it computes on the
//! GPU from the real lengths, emulated on the host (SPEC §2).

use serde::Serialize;
use std::fmt;

use crate::case::LayerType;
use crate::variants::check_tiling;
use crate::variants::v4_split::plan::HEADS_PER_CTA;

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

/// Fewest tokens an hca_persist partition holds; the kernel gets it as
/// `-DHCA_MIN_TOKENS`, so host plan and device plan agree.
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

    /// Mean KV tokens a partition streams: what picks the core (`v4::core`).
    pub fn tokens_per_partition(&self) -> usize {
        self.total / self.partitions.max(1)
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
