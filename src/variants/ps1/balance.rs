//! The `balanced` ps1 scheduler, the default because the H200 measured it
//! up to 9.8% faster than `payload` (docs/kernels.md, "ps1"). `payload`
//! (worklist.rs, after aiter) fills a fixed payload per CTA and may
//! overshoot it by a minimum chunk (len/16 tokens), so at batch 64 one CTA
//! can carry 17% more than the mean while others idle. This one counts work
//! in the kernel's tile pairs (the tokens one pass of both consumer groups
//! covers), cuts only at whole units, and binary-searches the smallest
//! per-CTA load a greedy fill in sequence order can meet. Same `WorkList`,
//! same invariants (SPEC §1: chunks are multiples of the granularity, at
//! most `max_splits` per sequence, every token in exactly one item).

use super::worklist::{assemble, Piece, WorkList};
use crate::case::Ps1Schedule;
use crate::variants::PlanError;

/// Knobs of the balanced scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalanceOptions {
    pub num_ctas: usize,
    /// Chunk boundaries are multiples of this (SPEC's kv_granularity).
    pub granularity: usize,
    pub max_splits: usize,
    /// Tokens of one load unit: the kernel's tile times its consumer groups
    /// (a multiple of `granularity`).
    pub unit_tokens: usize,
    /// Fixed cost of an item (prologue, partial write), in tokens.
    pub overhead_tokens: usize,
}

/// Per-item fixed cost the balanced scheduler assumes: about one tile pair
/// of fp8 (Q staging, the first tile's latency, the group merge and the
/// partial write). A guess, not tuned on the H200.
pub const BALANCED_OVERHEAD_TOKENS: usize = 128;

/// Pieces `(cta, seq, unit range)` of a greedy fill at per-CTA load `cap`
/// (units), or None if it needs more CTAs than there are.
fn fill(units: &[usize], ov: usize, cap: usize, opts: &BalanceOptions) -> Option<Vec<(usize, usize, usize, usize)>> {
    let mut out = Vec::new();
    let (mut cta, mut left) = (0usize, cap);
    for (b, &n) in units.iter().enumerate() {
        let (mut done, mut chunks) = (0usize, 0usize);
        loop {
            let rem = n - done;
            if rem + ov <= left {
                out.push((cta, b, done, n));
                left -= rem + ov;
                break;
            }
            // Cut here if the CTA has room for at least one unit and the
            // splits left can still carry the rest at full CTAs; else start
            // the next CTA.
            let splits_left = opts.max_splits - chunks - 1;
            if left > ov && splits_left > 0 && rem - (left - ov) <= splits_left * cap.saturating_sub(ov) {
                let take = left - ov;
                out.push((cta, b, done, done + take));
                done += take;
                chunks += 1;
            } else if rem + ov > cap && chunks + 1 >= opts.max_splits {
                return None;
            }
            cta += 1;
            left = cap;
            if cta >= opts.num_ctas {
                return None;
            }
        }
    }
    Some(out)
}

/// Builds and checks a work list with the balanced scheduler.
pub fn build_balanced(
    case_id: &str,
    local_lens: &[usize],
    qo_indptr: &[i32],
    opts: &BalanceOptions,
) -> Result<WorkList, PlanError> {
    let g = opts.granularity;
    if opts.num_ctas == 0 || g == 0 || opts.max_splits == 0 || opts.unit_tokens == 0 || opts.unit_tokens % g != 0 {
        return Err(PlanError::new(
            case_id,
            format!(
                "balanced work list needs num_ctas, granularity, max_splits >= 1 and a unit that is a multiple of the granularity (got {}, {g}, {}, {})",
                opts.num_ctas, opts.max_splits, opts.unit_tokens
            ),
        ));
    }
    let u = opts.unit_tokens;
    let ov = opts.overhead_tokens.div_ceil(u);
    let units: Vec<usize> = local_lens.iter().map(|&l| l.div_ceil(u)).collect();
    let total: usize = units.iter().map(|&n| n + ov).sum();
    // The smallest CTA load a fill meets lies in [lo, hi]: the mean, and
    // everything on one CTA (always met, one piece per sequence).
    let (mut lo, mut hi) = (total.div_ceil(opts.num_ctas).max(1), total.max(1));
    let mut best = fill(&units, ov, hi, opts)
        .ok_or_else(|| PlanError::new(case_id, "balanced work list: no load fits (a bug)".to_string()))?;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match fill(&units, ov, mid, opts) {
            Some(p) => {
                best = p;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    let pieces: Vec<Piece> = best
        .into_iter()
        .map(|(cta, seq, a, e)| Piece {
            cta,
            seq,
            kv_start: a * u,
            kv_end: (e * u).min(local_lens[seq]),
        })
        .collect();
    assemble(
        case_id,
        &pieces,
        local_lens,
        qo_indptr,
        opts.num_ctas,
        g,
        opts.max_splits,
        opts.overhead_tokens,
        Ps1Schedule::Balanced,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variants::ps1::worklist::build_worklist;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn qo(batch: usize) -> Vec<i32> {
        (0..=batch as i32).collect()
    }

    fn opts(num_ctas: usize) -> BalanceOptions {
        BalanceOptions {
            num_ctas,
            granularity: 16,
            max_splits: 16,
            unit_tokens: 128,
            overhead_tokens: 128,
        }
    }

    /// Largest per-CTA load in units (tile pairs of 128 tokens per item,
    /// rounded up, plus one for the item's overhead).
    fn max_load(wl: &WorkList) -> usize {
        wl.work_indptr
            .windows(2)
            .map(|w| {
                wl.items[w[0] as usize..w[1] as usize]
                    .iter()
                    .map(|it| ((it.kv_end - it.kv_start) as usize).div_ceil(128) + 1)
                    .sum::<usize>()
            })
            .max()
            .unwrap()
    }

    #[test]
    fn uniform_batch_carries_less_per_cta_than_the_default() {
        // 64 x 4096 tokens = 2048 units + 64 items on 132 CTAs: mean 16.0.
        let lens = vec![4096; 64];
        let wl = build_balanced("c", &lens, &qo(64), &opts(132)).unwrap();
        assert!(max_load(&wl) <= 17, "max load {}", max_load(&wl));
        assert!(wl.busy_ctas() >= 128, "{wl}");
        // The default's busiest CTA carries 2144 tokens: 17 tile pairs + 1.
        let legacy = build_worklist("c", &lens, &qo(64), 132, 16, 16).unwrap();
        assert_eq!(max_load(&legacy), 18);
    }

    #[test]
    fn cuts_fall_on_whole_units() {
        let lens = [1000, 5000, 77, 0, 9000];
        let wl = build_balanced("c", &lens, &qo(5), &opts(7)).unwrap();
        for it in &wl.items {
            let len = lens[it.seq as usize] as i32;
            assert_eq!(it.kv_start % 128, 0, "{it:?}");
            assert!(it.kv_end == len || it.kv_end % 128 == 0, "{it:?}");
        }
    }

    #[test]
    fn max_splits_holds_when_ctas_are_plenty() {
        let mut o = opts(64);
        o.max_splits = 3;
        let wl = build_balanced("c", &[128 * 100], &qo(1), &o).unwrap();
        assert!(wl.max_chunks() <= 3, "{wl}");
        assert_eq!(wl.items.len(), 3);
    }

    #[test]
    fn random_batches_are_never_worse_balanced_than_the_default() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..60 {
            let batch = rng.gen_range(1..=140);
            let lens: Vec<usize> = (0..batch).map(|_| rng.gen_range(0..=40_000)).collect();
            let ctas = rng.gen_range(1..=140);
            let wl = build_balanced("c", &lens, &qo(batch), &opts(ctas)).unwrap();
            let mean = (lens.iter().map(|l| l.div_ceil(128) + 1).sum::<usize>()).div_ceil(ctas);
            // The greedy may miss the mean by one unit per cut it could not
            // place, never by a whole sequence.
            let longest = lens.iter().map(|l| l.div_ceil(128) + 1).max().unwrap();
            assert!(
                max_load(&wl) <= mean + longest.min(mean) + 1,
                "{lens:?} on {ctas}: {}",
                max_load(&wl)
            );
            let legacy = build_worklist("c", &lens, &qo(batch), ctas, 16, 16).unwrap();
            assert!(
                max_load(&wl) <= max_load(&legacy),
                "{batch} seqs on {ctas} CTAs: balanced {} > default {}",
                max_load(&wl),
                max_load(&legacy)
            );
        }
    }

    #[test]
    fn bad_options_name_the_case() {
        let mut o = opts(4);
        o.unit_tokens = 100;
        let e = build_balanced("case-x", &[10], &qo(1), &o).unwrap_err();
        assert!(e.to_string().contains("case-x"), "{e}");
    }
}
