//! The ps1 persistent work list (SPEC §1 "Variant ps1"): each sequence's
//! local KV cut into chunks and balanced over the persistent CTAs, plus the
//! reduce list that merges the chunks of split sequences.
//!
//! This file's scheduler is `--ps1-schedule payload`; the default,
//! `balanced`, is in balance.rs and shares `assemble` with it.
//!
//! The scheduler follows FlashMLA's `get_mla_metadata` and aiter's
//! `get_mla_metadata_v1` (our own code): work is counted in blocks of
//! `granularity` tokens plus a fixed overhead per item; every CTA gets a
//! payload of `ceil(total / num_ctas) + overhead`, filled greedily in sequence
//! order, cutting a sequence where a CTA's payload runs out. On top of that,
//! no chunk but a sequence's last is shorter than `ceil(blocks / max_splits)`
//! blocks, which bounds a sequence to `max_splits` chunks, and a chunk that
//! would leave a tail shorter than both that minimum and one item's overhead
//! takes the tail too (aiter's tail threshold): such a tail costs less here
//! than as an item of its own.
//!
//! Every CTA but the last closes with at least `ceil(total / num_ctas)` of
//! work plus the overhead of the extra item it created, if any, so the last
//! one never gets more than `ceil(total / num_ctas)`; the others overshoot
//! their payload by less than two minimum chunks.

use serde::Serialize;
use std::fmt;

use crate::case::Ps1Schedule;
use crate::variants::{check_tiling, PlanError};

/// Per-item fixed cost in KV tokens: FlashMLA's 5 blocks of 64 (Q tile load,
/// partial write, reduce). To be tuned on the H200.
pub const ITEM_OVERHEAD_TOKENS: usize = 320;
/// Default chunk granularity in tokens.
pub const KV_GRANULARITY: usize = 16;
/// Default largest number of chunks per sequence.
pub const MAX_SPLITS: usize = 16;
/// i32 words per item in the device layout (6 fields + 2 reserved, 32 bytes).
pub const ITEM_WORDS: usize = 8;
/// i32 words per reduce item.
pub const REDUCE_WORDS: usize = 4;

/// One unit of persistent work: a query tile (all `s_q` rows of a sequence)
/// against a local KV range `[kv_start, kv_end)` of that sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkItem {
    pub seq: i32,
    /// -1: the sequence's only chunk, writes final `o`/`lse`. Otherwise the
    /// first partial row it writes; query row `i` goes to `partial + (i - q_start)`.
    pub partial: i32,
    pub q_start: i32,
    pub q_end: i32,
    /// Local token indices on this rank; never trimmed by a causal tail (the
    /// kernel masks on global positions).
    pub kv_start: i32,
    pub kv_end: i32,
}

/// Merge of one split sequence: chunk `c` is at `part_base + c * (q_end - q_start)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReduceItem {
    pub q_start: i32,
    pub q_end: i32,
    pub part_base: i32,
    pub n_parts: i32,
}

/// Knobs of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorklistOptions {
    pub num_ctas: usize,
    pub granularity: usize,
    pub max_splits: usize,
    pub overhead_tokens: usize,
}

impl WorklistOptions {
    pub fn new(num_ctas: usize) -> Self {
        WorklistOptions {
            num_ctas,
            granularity: KV_GRANULARITY,
            max_splits: MAX_SPLITS,
            overhead_tokens: ITEM_OVERHEAD_TOKENS,
        }
    }
    fn overhead_blocks(&self) -> usize {
        self.overhead_tokens.div_ceil(self.granularity)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkList {
    pub num_ctas: usize,
    /// `[num_ctas + 1]`: CTA `c` runs `items[work_indptr[c]..work_indptr[c+1]]`.
    pub work_indptr: Vec<i32>,
    pub items: Vec<WorkItem>,
    pub reduce: Vec<ReduceItem>,
    /// Rows of the f32 partial buffer `[num_partial_rows, H, 512]`.
    pub num_partial_rows: usize,
    pub granularity: usize,
    pub max_splits: usize,
    pub overhead_tokens: usize,
    /// Which scheduler cut it.
    pub schedule: Ps1Schedule,
}

fn to_i32(case: &str, what: &str, v: usize) -> Result<i32, PlanError> {
    i32::try_from(v).map_err(|_| PlanError::new(case, format!("{what} {v} does not fit in i32")))
}

fn check_qo(case: &str, batch: usize, qo_indptr: &[i32]) -> Result<(), PlanError> {
    if qo_indptr.len() != batch + 1 {
        return Err(PlanError::new(
            case,
            format!("qo_indptr has {} entries for {batch} sequences", qo_indptr.len()),
        ));
    }
    if qo_indptr[0] < 0 {
        return Err(PlanError::new(case, format!("qo_indptr starts at {}", qo_indptr[0])));
    }
    if let Some(b) = (0..batch).find(|&b| qo_indptr[b + 1] <= qo_indptr[b]) {
        return Err(PlanError::new(
            case,
            format!(
                "sequence {b} has no query rows (qo_indptr {} -> {})",
                qo_indptr[b],
                qo_indptr[b + 1]
            ),
        ));
    }
    Ok(())
}

/// Builds the work list with the default per-item overhead.
pub fn build_worklist(
    case_id: &str,
    local_lens: &[usize],
    qo_indptr: &[i32],
    num_ctas: usize,
    granularity: usize,
    max_splits: usize,
) -> Result<WorkList, PlanError> {
    let opts = WorklistOptions {
        num_ctas,
        granularity,
        max_splits,
        overhead_tokens: ITEM_OVERHEAD_TOKENS,
    };
    build_worklist_with(case_id, local_lens, qo_indptr, &opts)
}

/// Builds and checks the work list.
pub fn build_worklist_with(
    case_id: &str,
    local_lens: &[usize],
    qo_indptr: &[i32],
    opts: &WorklistOptions,
) -> Result<WorkList, PlanError> {
    let case = case_id;
    if opts.num_ctas == 0 || opts.granularity == 0 || opts.max_splits == 0 {
        return Err(PlanError::new(
            case,
            format!(
                "work list needs num_ctas, granularity and max_splits >= 1 (got {}, {}, {})",
                opts.num_ctas, opts.granularity, opts.max_splits
            ),
        ));
    }
    let batch = local_lens.len();
    check_qo(case, batch, qo_indptr)?;
    let g = opts.granularity;
    let ov = opts.overhead_blocks();
    let blocks: Vec<usize> = local_lens.iter().map(|&l| l.div_ceil(g)).collect();
    let total: usize = blocks.iter().map(|&b| b + ov).sum();
    let payload = total.div_ceil(opts.num_ctas) + ov;

    // Guard the i32 casts of the kernel layout once, up front.
    to_i32(
        case,
        "largest local length",
        local_lens.iter().copied().max().unwrap_or(0) + g,
    )?;

    let mut pieces = Vec::new();
    let (mut seq, mut done) = (0usize, 0usize);
    for cta in 0..opts.num_ctas {
        let last_cta = cta + 1 == opts.num_ctas;
        let mut remain = payload as isize;
        // Places `[done, done + take)` blocks of sequence `seq` on this CTA.
        let mut place = |seq: &mut usize, done: &mut usize, take: usize| {
            let b = *seq;
            let last = *done + take >= blocks[b];
            pieces.push(Piece {
                cta,
                seq: b,
                kv_start: *done * g,
                kv_end: if last { local_lens[b] } else { (*done + take) * g },
            });
            if last {
                (*seq, *done) = (b + 1, 0);
            } else {
                *done += take;
            }
        };
        while seq < batch {
            let rem = blocks[seq] - done;
            if last_cta || remain >= (rem + ov) as isize {
                remain -= (rem + ov) as isize;
                place(&mut seq, &mut done, rem);
                continue;
            }
            if remain <= ov as isize {
                break;
            }
            let min_chunk = blocks[seq].div_ceil(opts.max_splits).max(1);
            let mut take = (remain as usize - ov).max(min_chunk).min(rem);
            if rem - take < min_chunk.min(ov) {
                take = rem;
            }
            place(&mut seq, &mut done, take);
            break;
        }
    }

    assemble(
        case,
        &pieces,
        local_lens,
        qo_indptr,
        opts.num_ctas,
        g,
        opts.max_splits,
        opts.overhead_tokens,
        Ps1Schedule::Payload,
    )
}

/// One chunk of a sequence placed on a CTA (token range), for [`assemble`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub cta: usize,
    pub seq: usize,
    pub kv_start: usize,
    pub kv_end: usize,
}

/// A work list from pieces in CTA order (each sequence's pieces in token
/// order, sequences in order): numbers the partial rows of split sequences
/// and lists their reduce items, then checks every invariant. Both
/// schedulers end here.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    case_id: &str,
    pieces: &[Piece],
    local_lens: &[usize],
    qo_indptr: &[i32],
    num_ctas: usize,
    granularity: usize,
    max_splits: usize,
    overhead_tokens: usize,
    schedule: Ps1Schedule,
) -> Result<WorkList, PlanError> {
    let batch = local_lens.len();
    check_qo(case_id, batch, qo_indptr)?;
    let mut count = vec![0usize; batch];
    for (i, p) in pieces.iter().enumerate() {
        if p.seq >= batch || p.cta >= num_ctas {
            return Err(PlanError::new(
                case_id,
                format!("piece {p:?} is outside {batch} sequences / {num_ctas} CTAs"),
            ));
        }
        // work_indptr is counted per CTA, so each CTA's items must be contiguous
        if i > 0 && p.cta < pieces[i - 1].cta {
            return Err(PlanError::new(
                case_id,
                format!(
                    "piece {p:?} comes after one on CTA {} (pieces go in CTA order)",
                    pieces[i - 1].cta
                ),
            ));
        }
        count[p.seq] += 1;
    }
    let (mut items, mut reduce) = (Vec::with_capacity(pieces.len()), Vec::new());
    let mut work_indptr = vec![0i32; num_ctas + 1];
    let (mut rows_used, mut seen) = (0usize, vec![0usize; batch]);
    let mut base = vec![0usize; batch];
    for p in pieces {
        let (q_start, q_end) = (qo_indptr[p.seq], qo_indptr[p.seq + 1]);
        let rows = (q_end - q_start) as usize;
        let partial = if count[p.seq] == 1 {
            -1
        } else {
            if seen[p.seq] == 0 {
                base[p.seq] = rows_used;
            }
            rows_used += rows;
            to_i32(case_id, "partial rows", rows_used)? - rows as i32
        };
        seen[p.seq] += 1;
        items.push(WorkItem {
            seq: to_i32(case_id, "sequence", p.seq)?,
            partial,
            q_start,
            q_end,
            kv_start: to_i32(case_id, "kv start", p.kv_start)?,
            kv_end: to_i32(case_id, "kv end", p.kv_end)?,
        });
        work_indptr[p.cta + 1] += 1;
        if count[p.seq] > 1 && seen[p.seq] == count[p.seq] {
            reduce.push(ReduceItem {
                q_start,
                q_end,
                part_base: base[p.seq] as i32,
                n_parts: count[p.seq] as i32,
            });
        }
    }
    for c in 0..num_ctas {
        work_indptr[c + 1] += work_indptr[c];
    }
    let wl = WorkList {
        num_ctas,
        work_indptr,
        items,
        reduce,
        num_partial_rows: rows_used,
        granularity,
        max_splits,
        overhead_tokens,
        schedule,
    };
    wl.check(case_id, local_lens, qo_indptr)?;
    Ok(wl)
}

impl WorkList {
    /// Checks every invariant the kernels and the CPU emulation rely on.
    pub fn check(&self, case_id: &str, local_lens: &[usize], qo_indptr: &[i32]) -> Result<(), PlanError> {
        let case = case_id;
        let err = |what: String| Err(PlanError::new(case, what));
        let batch = local_lens.len();
        check_qo(case, batch, qo_indptr)?;
        if self.num_ctas == 0 || self.work_indptr.len() != self.num_ctas + 1 {
            return err(format!(
                "work_indptr has {} entries for {} CTAs",
                self.work_indptr.len(),
                self.num_ctas
            ));
        }
        if self.work_indptr[0] != 0
            || self.work_indptr.windows(2).any(|w| w[1] < w[0])
            || self.work_indptr[self.num_ctas] as usize != self.items.len()
        {
            return err(format!(
                "work_indptr {:?} is not a CSR over {} items",
                self.work_indptr,
                self.items.len()
            ));
        }
        let g = self.granularity.max(1) as i32;

        let mut per_seq: Vec<Vec<&WorkItem>> = vec![Vec::new(); batch];
        for (k, it) in self.items.iter().enumerate() {
            if it.seq < 0 || it.seq as usize >= batch {
                return err(format!("item {k} names sequence {} of {batch}", it.seq));
            }
            let b = it.seq as usize;
            let len = local_lens[b] as i64;
            if (it.q_start, it.q_end) != (qo_indptr[b], qo_indptr[b + 1]) {
                return err(format!(
                    "item {k} covers query rows [{}, {}), sequence {b} has [{}, {})",
                    it.q_start,
                    it.q_end,
                    qo_indptr[b],
                    qo_indptr[b + 1]
                ));
            }
            let (a, e) = (it.kv_start as i64, it.kv_end as i64);
            if a < 0 || e > len || a > e || (a == e && len > 0) {
                return err(format!(
                    "item {k}: KV [{a}, {e}) is not a non-empty part of sequence {b}'s {len} tokens"
                ));
            }
            if it.kv_start % g != 0 || (e != len && it.kv_end % g != 0) {
                return err(format!("item {k}: KV [{a}, {e}) is not cut at multiples of {g} tokens"));
            }
            per_seq[b].push(it);
        }

        let mut used = vec![false; self.num_partial_rows];
        let mut split_seqs = 0;
        for (b, its) in per_seq.iter_mut().enumerate() {
            its.sort_by_key(|it| it.kv_start);
            let rows = (qo_indptr[b + 1] - qo_indptr[b]) as usize;
            if its.is_empty() {
                return err(format!("sequence {b} has no work item"));
            }
            if local_lens[b] == 0 {
                if its.len() != 1 || its[0].partial != -1 {
                    return err(format!(
                        "empty sequence {b} needs exactly one final item, has {}",
                        its.len()
                    ));
                }
                continue;
            }
            let ranges: Vec<_> = its
                .iter()
                .map(|it| (it.kv_start as usize, it.kv_end as usize))
                .collect();
            check_tiling(&ranges, local_lens[b]).map_err(|e| PlanError::new(case, format!("sequence {b}: {e}")))?;
            if its.len() > self.max_splits {
                return err(format!(
                    "sequence {b} has {} chunks, more than {}",
                    its.len(),
                    self.max_splits
                ));
            }
            if its.len() == 1 {
                if its[0].partial != -1 {
                    return err(format!(
                        "sequence {b} has one chunk but writes partial {}",
                        its[0].partial
                    ));
                }
                continue;
            }
            split_seqs += 1;
            let base = its[0].partial;
            for (c, it) in its.iter().enumerate() {
                let want = base as i64 + (c * rows) as i64;
                if it.partial < 0 || it.partial as i64 != want {
                    return err(format!(
                        "sequence {b} chunk {c} writes partial {}, expected {want}",
                        it.partial
                    ));
                }
                let p = it.partial as usize;
                if p + rows > self.num_partial_rows || used[p..p + rows].iter().any(|&u| u) {
                    return err(format!(
                        "sequence {b} chunk {c}: partial rows [{p}, {}) reused or past {}",
                        p + rows,
                        self.num_partial_rows
                    ));
                }
                used[p..p + rows].fill(true);
            }
            let Some(r) = self.reduce.iter().find(|r| r.q_start == qo_indptr[b]) else {
                return err(format!("split sequence {b} has no reduce item"));
            };
            let want = ReduceItem {
                q_start: qo_indptr[b],
                q_end: qo_indptr[b + 1],
                part_base: base,
                n_parts: its.len() as i32,
            };
            if *r != want {
                return err(format!("sequence {b}: reduce item {r:?}, expected {want:?}"));
            }
        }
        if self.reduce.len() != split_seqs {
            return err(format!(
                "{} reduce items for {split_seqs} split sequences",
                self.reduce.len()
            ));
        }
        if let Some(p) = used.iter().position(|&u| !u) {
            return err(format!("partial row {p} of {} is never written", self.num_partial_rows));
        }
        Ok(())
    }

    /// Device layout: items as `[max(n, num_ctas), 8]` (seq, partial,
    /// q_start, q_end, kv_start, kv_end, 0, 0; zero rows pad, since CTA c
    /// reads item c before its work_indptr arrives) and reduce items as `[m, 4]`.
    pub fn to_i32(&self) -> (Vec<i32>, Vec<i32>) {
        let mut items: Vec<i32> = self
            .items
            .iter()
            .flat_map(|it| [it.seq, it.partial, it.q_start, it.q_end, it.kv_start, it.kv_end, 0, 0])
            .collect();
        items.resize(ITEM_WORDS * self.items.len().max(self.num_ctas), 0);
        let reduce = self
            .reduce
            .iter()
            .flat_map(|r| [r.q_start, r.q_end, r.part_base, r.n_parts])
            .collect();
        (items, reduce)
    }

    /// Cost per CTA in blocks (tokens / granularity plus the item overhead),
    /// the quantity the scheduler balances.
    pub fn cta_costs(&self) -> Vec<usize> {
        let g = self.granularity.max(1);
        let ov = self.overhead_tokens.div_ceil(g);
        self.work_indptr
            .windows(2)
            .map(|w| {
                self.items[w[0] as usize..w[1] as usize]
                    .iter()
                    .map(|it| ((it.kv_end - it.kv_start) as usize).div_ceil(g) + ov)
                    .sum()
            })
            .collect()
    }

    /// Most chunks any sequence was cut into.
    pub fn max_chunks(&self) -> usize {
        self.reduce.iter().map(|r| r.n_parts as usize).max().unwrap_or(1)
    }

    /// CTAs with at least one item.
    pub fn busy_ctas(&self) -> usize {
        self.work_indptr.windows(2).filter(|w| w[1] > w[0]).count()
    }
}

/// `items=300 ctas=132 busy=130 splits<=4 partial_rows=96`
impl fmt::Display for WorkList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "items={} ctas={} busy={} splits<={} partial_rows={}",
            self.items.len(),
            self.num_ctas,
            self.busy_ctas(),
            self.max_chunks(),
            self.num_partial_rows
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn uniform_qo(batch: usize, s_q: usize) -> Vec<i32> {
        (0..=batch).map(|b| (b * s_q) as i32).collect()
    }

    fn item(seq: i32, partial: i32, q: (i32, i32), kv: (i32, i32)) -> WorkItem {
        WorkItem {
            seq,
            partial,
            q_start: q.0,
            q_end: q.1,
            kv_start: kv.0,
            kv_end: kv.1,
        }
    }

    #[test]
    fn one_short_sequence_is_one_final_item() {
        let wl = build_worklist("c", &[100], &uniform_qo(1, 1), 1, 16, 16).unwrap();
        assert_eq!(wl.items, vec![item(0, -1, (0, 1), (0, 100))]);
        assert!(wl.reduce.is_empty());
        assert_eq!(wl.num_partial_rows, 0);
        assert_eq!(wl.work_indptr, vec![0, 1]);
    }

    #[test]
    fn a_long_sequence_splits_over_ctas_by_hand() {
        // 1000 tokens = 63 blocks of 16, overhead 20 blocks: total 83,
        // payload ceil(83/4) + 20 = 41. CTA 0 and 1 take 21 blocks each
        // (336 tokens); CTA 2 takes the last 21 blocks whole (41 >= 21 + 20).
        let wl = build_worklist("c", &[1000], &uniform_qo(1, 2), 4, 16, 16).unwrap();
        assert_eq!(
            wl.items,
            vec![
                item(0, 0, (0, 2), (0, 336)),
                item(0, 2, (0, 2), (336, 672)),
                item(0, 4, (0, 2), (672, 1000))
            ]
        );
        assert_eq!(wl.work_indptr, vec![0, 1, 2, 3, 3]);
        assert_eq!(
            wl.reduce,
            vec![ReduceItem {
                q_start: 0,
                q_end: 2,
                part_base: 0,
                n_parts: 3
            }]
        );
        assert_eq!(wl.num_partial_rows, 6);
        assert_eq!(wl.cta_costs(), vec![41, 41, 41, 0]);
        assert_eq!(wl.to_string(), "items=3 ctas=4 busy=3 splits<=3 partial_rows=6");
    }

    #[test]
    fn empty_sequences_still_get_one_item() {
        // Blocks [0, 1], payload ceil(41/2) + 20 = 41: both fit on CTA 0.
        let wl = build_worklist("c", &[0, 5], &uniform_qo(2, 1), 2, 16, 16).unwrap();
        assert_eq!(wl.items, vec![item(0, -1, (0, 1), (0, 0)), item(1, -1, (1, 2), (0, 5))]);
        assert_eq!(wl.work_indptr, vec![0, 2, 2]);
    }

    #[test]
    fn max_splits_bounds_the_chunks() {
        // 100 blocks, no overhead, 64 CTAs: payload 2 blocks, but chunks are
        // at least ceil(100/4) = 25 blocks, so 4 chunks on CTAs 0..4.
        let opts = WorklistOptions {
            num_ctas: 64,
            granularity: 16,
            max_splits: 4,
            overhead_tokens: 0,
        };
        let wl = build_worklist_with("c", &[1600], &uniform_qo(1, 1), &opts).unwrap();
        let kv: Vec<_> = wl.items.iter().map(|it| (it.kv_start, it.kv_end)).collect();
        assert_eq!(kv, vec![(0, 400), (400, 800), (800, 1200), (1200, 1600)]);
        assert_eq!(&wl.work_indptr[..6], &[0, 1, 2, 3, 4, 4]);
        assert_eq!(wl.max_chunks(), 4);
    }

    #[test]
    fn chunks_follow_the_payload() {
        // 40 blocks, no overhead, 3 CTAs: payload 14, chunks 14, 14, 12.
        let opts = WorklistOptions {
            num_ctas: 3,
            granularity: 16,
            max_splits: 16,
            overhead_tokens: 0,
        };
        let wl = build_worklist_with("c", &[640], &uniform_qo(1, 1), &opts).unwrap();
        let kv: Vec<_> = wl.items.iter().map(|it| (it.kv_start, it.kv_end)).collect();
        assert_eq!(kv, vec![(0, 224), (224, 448), (448, 640)]);
        // 33 blocks, max 2 splits (min chunk 17), 2 CTAs: payload 17, 17 + 16.
        let opts = WorklistOptions {
            num_ctas: 2,
            granularity: 16,
            max_splits: 2,
            overhead_tokens: 0,
        };
        let wl = build_worklist_with("c", &[33 * 16], &uniform_qo(1, 1), &opts).unwrap();
        let kv: Vec<_> = wl.items.iter().map(|it| (it.kv_start, it.kv_end)).collect();
        assert_eq!(kv, vec![(0, 272), (272, 528)]);
    }

    #[test]
    fn a_short_tail_joins_the_chunk_before_it() {
        // Overhead 10 blocks. Sequences of 64 and 38 blocks on 2 CTAs:
        // total 122, payload 61 + 10 = 71. CTA 0 has room for 61 of the
        // first sequence's 64; the 3-block tail is under min(ceil(64/16), 10)
        // = 4, so CTA 0 takes all 64.
        let opts = WorklistOptions {
            num_ctas: 2,
            granularity: 16,
            max_splits: 16,
            overhead_tokens: 160,
        };
        let wl = build_worklist_with("c", &[64 * 16, 38 * 16], &uniform_qo(2, 1), &opts).unwrap();
        assert_eq!(
            wl.items,
            vec![item(0, -1, (0, 1), (0, 1024)), item(1, -1, (1, 2), (0, 608))]
        );
        assert_eq!(wl.work_indptr, vec![0, 1, 2]);
        // With 36 blocks in the second: payload 70, room for 60, tail 4: split.
        let wl = build_worklist_with("c", &[64 * 16, 36 * 16], &uniform_qo(2, 1), &opts).unwrap();
        let kv: Vec<_> = wl.items.iter().map(|it| (it.seq, it.kv_start, it.kv_end)).collect();
        assert_eq!(kv, vec![(0, 0, 960), (0, 960, 1024), (1, 0, 576)]);
    }

    #[test]
    fn many_short_sequences_pack_onto_few_ctas() {
        // 8 sequences of 1 block + 20 overhead = 21 each, 168 in total over
        // 2 CTAs: payload 84 + 20 = 104 holds 4 whole sequences (84) and not
        // a fifth (105), and a split needs more than the overhead left (20).
        let wl = build_worklist("c", &[16; 8], &uniform_qo(8, 1), 2, 16, 16).unwrap();
        assert_eq!(wl.work_indptr, vec![0, 4, 8]);
        assert!(wl.items.iter().all(|it| it.partial == -1));
    }

    #[test]
    fn device_layout() {
        let wl = build_worklist("c", &[1000], &uniform_qo(1, 2), 4, 16, 16).unwrap();
        let (items, reduce) = wl.to_i32();
        // 3 items on 4 CTAs: a zero item pads to one per CTA
        assert_eq!(items.len(), 4 * ITEM_WORDS);
        assert_eq!(&items[8..16], &[0, 2, 0, 2, 336, 672, 0, 0]);
        assert!(items[3 * ITEM_WORDS..].iter().all(|&x| x == 0));
        assert_eq!(reduce, vec![0, 2, 0, 3]);
    }

    #[test]
    fn assemble_rejects_pieces_out_of_cta_order() {
        let piece = |cta, kv_start, kv_end| Piece {
            cta,
            seq: 0,
            kv_start,
            kv_end,
        };
        let run = |pieces: &[Piece]| assemble("c", pieces, &[64], &[0, 1], 2, 16, 16, 0, Ps1Schedule::Balanced);
        let ok = run(&[piece(0, 0, 32), piece(1, 32, 64)]);
        assert_eq!(ok.unwrap().work_indptr, vec![0, 1, 2]);
        let e = run(&[piece(1, 0, 32), piece(0, 32, 64)]).unwrap_err();
        assert!(e.what.contains("CTA order"), "{}", e.what);
    }

    #[test]
    fn bad_inputs_name_the_case() {
        let e = build_worklist("k3/ps1", &[10], &uniform_qo(1, 1), 0, 16, 16).unwrap_err();
        assert_eq!(e.case, "k3/ps1");
        assert!(e.what.contains("num_ctas"), "{}", e.what);
        assert!(
            build_worklist("c", &[10, 20], &uniform_qo(1, 1), 4, 16, 16).is_err(),
            "qo_indptr too short"
        );
        assert!(
            build_worklist("c", &[10, 20], &[0, 1, 1], 4, 16, 16).is_err(),
            "a sequence without rows"
        );
    }

    #[test]
    fn check_catches_broken_lists() {
        let lens = [1000, 50, 0];
        let qo = uniform_qo(3, 2);
        let good = build_worklist("c", &lens, &qo, 4, 16, 16).unwrap();
        assert!(good.check("c", &lens, &qo).is_ok());
        assert!(good.items.len() >= 4, "the first sequence is split: {good}");

        let mut gap = good.clone();
        gap.items[0].kv_end -= 16;
        assert!(gap.check("c", &lens, &qo).unwrap_err().what.contains("sequence 0"));

        let mut dup = good.clone();
        dup.items[1].partial = dup.items[0].partial;
        assert!(dup.check("c", &lens, &qo).is_err());

        let mut no_reduce = good.clone();
        no_reduce.reduce.clear();
        assert!(no_reduce
            .check("c", &lens, &qo)
            .unwrap_err()
            .what
            .contains("no reduce item"));

        let mut lost_empty = good.clone();
        let k = lost_empty.items.iter().position(|it| it.seq == 2).unwrap();
        lost_empty.items.remove(k);
        for p in lost_empty.work_indptr.iter_mut().filter(|p| **p as usize > k) {
            *p -= 1;
        }
        assert!(lost_empty
            .check("c", &lens, &qo)
            .unwrap_err()
            .what
            .contains("sequence 2 has no work item"));

        let mut unaligned = good.clone();
        unaligned.items[0].kv_end += 1;
        unaligned.items[1].kv_start += 1;
        assert!(unaligned
            .check("c", &lens, &qo)
            .unwrap_err()
            .what
            .contains("multiples of 16"));

        let mut bad_csr = good.clone();
        bad_csr.work_indptr[1] = bad_csr.items.len() as i32 + 1;
        assert!(bad_csr.check("c", &lens, &qo).is_err());
    }

    /// Blocks a non-last CTA may hold: the payload plus less than two minimum chunks.
    fn load_bound(lens: &[usize], opts: &WorklistOptions) -> usize {
        let g = opts.granularity;
        let ov = opts.overhead_tokens.div_ceil(g);
        let total: usize = lens.iter().map(|l| l.div_ceil(g) + ov).sum();
        let min_chunk = lens
            .iter()
            .map(|l| l.div_ceil(g).div_ceil(opts.max_splits).max(1))
            .max()
            .unwrap_or(1);
        total.div_ceil(opts.num_ctas) + ov + 2 * min_chunk
    }

    #[test]
    fn random_lists_hold_their_invariants_and_balance() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x9511);
        for round in 0..400 {
            let batch = rng.gen_range(1..=128);
            let lens: Vec<usize> = (0..batch)
                .map(|_| if rng.gen_bool(0.05) { 0 } else { rng.gen_range(0..=5000) })
                .collect();
            let qo: Vec<i32> = if rng.gen_bool(0.5) {
                uniform_qo(batch, rng.gen_range(1..=8))
            } else {
                let mut q = vec![0i32];
                for _ in 0..batch {
                    q.push(q.last().unwrap() + rng.gen_range(1..=8));
                }
                q
            };
            let num_ctas = rng.gen_range(1..=264);
            let wl =
                build_worklist("prop", &lens, &qo, num_ctas, 16, 16).unwrap_or_else(|e| panic!("round {round}: {e}"));
            let covered: usize = wl.items.iter().map(|it| (it.kv_end - it.kv_start) as usize).sum();
            assert_eq!(covered, lens.iter().sum::<usize>(), "round {round}");
            let per_seq = |b: usize| wl.items.iter().filter(|it| it.seq as usize == b).count();
            assert!((0..batch).all(|b| (1..=16).contains(&per_seq(b))), "round {round}");
            let bound = load_bound(&lens, &WorklistOptions::new(num_ctas));
            let costs = wl.cta_costs();
            let worst = *costs.iter().max().unwrap();
            assert!(
                worst <= bound,
                "round {round}: CTA load {worst} > bound {bound} ({costs:?})"
            );
            let total: usize = lens.iter().map(|l| l.div_ceil(16) + 20).sum();
            let last = *costs.last().unwrap();
            assert!(last <= total.div_ceil(num_ctas), "round {round}: last CTA holds {last}");
        }
    }

    #[test]
    fn long_uniform_batches_use_every_cta() {
        // 16 sequences of 4096 tokens on 132 CTAs: splitting fills the SMs.
        let wl = build_worklist("c", &[4096; 16], &uniform_qo(16, 4), 132, 16, 16).unwrap();
        assert!(wl.busy_ctas() >= 120, "{wl}");
        let costs = wl.cta_costs();
        let (lo, hi) = (
            costs.iter().filter(|&&c| c > 0).min().unwrap(),
            costs.iter().max().unwrap(),
        );
        assert!(hi - lo <= 2 * 16, "busy CTAs within two minimum chunks: {lo}..{hi}");
    }
}
