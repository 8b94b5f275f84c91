//! Round-robin decode-context-parallel sharding with interleave `S` (SPEC
//! §1): the one place that knows how tokens map to ranks.

use serde::Serialize;
use std::ops::Range;

/// `world` ranks, each owning runs of `interleave` consecutive tokens in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Dcp {
    pub world: usize,
    pub interleave: usize,
}

impl Dcp {
    /// No sharding: one rank holds every token.
    pub const NONE: Dcp = Dcp {
        world: 1,
        interleave: 1,
    };

    /// Every rank, in order.
    pub fn ranks(self) -> Range<usize> {
        0..self.world
    }

    /// More than one rank: per-rank results must be merged.
    pub fn sharded(self) -> bool {
        self.world > 1
    }

    /// Rank that owns global token `p`.
    pub fn owner(self, p: usize) -> usize {
        (p / self.interleave) % self.world
    }

    /// Index of global token `p` within its owner's shard.
    pub fn local_index(self, p: usize) -> usize {
        let s = self.interleave;
        (p / (s * self.world)) * s + p % s
    }

    /// Global position of local token `j` on rank `r`.
    pub fn global_pos(self, j: usize, r: usize) -> usize {
        let s = self.interleave;
        ((j / s) * self.world + r) * s + j % s
    }

    /// Tokens of a length-`l` sequence that rank `r` holds.
    pub fn local_len(self, r: usize, l: usize) -> usize {
        let (w, s) = (self.world, self.interleave);
        let full = (l / (w * s)) * s;
        let rem = (l % (w * s)) as isize - (r * s) as isize;
        full + rem.clamp(0, s as isize) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharding_matches_brute_force_for_small_worlds() {
        for w in 1..=8 {
            for s in 1..=4 {
                let d = Dcp {
                    world: w,
                    interleave: s,
                };
                for l in 0..(3 * w * s + 5) {
                    let mut counts = vec![0usize; w];
                    for p in 0..l {
                        let r = d.owner(p);
                        let j = d.local_index(p);
                        assert_eq!(j, counts[r], "w={w} s={s} p={p}: local indices are dense and ordered");
                        assert_eq!(d.global_pos(j, r), p, "inverse w={w} s={s} p={p}");
                        counts[r] += 1;
                    }
                    for (r, &c) in counts.iter().enumerate() {
                        assert_eq!(d.local_len(r, l), c, "local_len w={w} s={s} r={r} l={l}");
                    }
                }
            }
        }
    }

    #[test]
    fn world_one_is_identity() {
        let d = Dcp::NONE;
        for p in 0..100 {
            assert_eq!(d.owner(p), 0);
            assert_eq!(d.local_index(p), p);
            assert_eq!(d.global_pos(p, 0), p);
        }
        assert_eq!(d.local_len(0, 77), 77);
        assert_eq!(d.ranks(), 0..1);
        assert!(!d.sharded());
    }
}
