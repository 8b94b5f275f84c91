//! Round-robin decode-context-parallel sharding with interleave `S` (SPEC
//! §1): the one place that knows how tokens map to ranks.

use serde::Serialize;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

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

/// Where a DCP case's ranks run (`--dcp-devices`, scenario key
/// `dcp_devices`): on `n` GPUs, `W / n` consecutive ranks each, or one GPU
/// per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    Count(usize),
    PerRank,
}

impl Devices {
    /// GPU counts a group may have: NCCL rings and the engine's DCP sizes.
    pub const ALLOWED: [usize; 4] = [1, 2, 4, 8];

    /// The GPUs a case of `world` ranks runs on, or why it cannot.
    pub fn for_world(self, world: usize) -> Result<usize, String> {
        let n = match self {
            Devices::Count(n) => n,
            Devices::PerRank => world,
        };
        if !Self::ALLOWED.contains(&n) {
            return Err(format!("W={world} on {n} GPUs: a DCP group has 1, 2, 4 or 8 GPUs"));
        }
        if world % n != 0 {
            return Err(format!(
                "W={world} is not a multiple of {n} GPUs, so the ranks cannot be split evenly over them"
            ));
        }
        Ok(n)
    }
}

impl FromStr for Devices {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t == "world" {
            return Ok(Devices::PerRank);
        }
        match t.parse::<usize>() {
            Ok(n) if Self::ALLOWED.contains(&n) => Ok(Devices::Count(n)),
            _ => Err(format!(
                "`{s}`: give 1, 2, 4 or 8 GPUs (a count that divides each case's W), or world for one GPU per rank"
            )),
        }
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::Count(n) => write!(f, "{n}"),
            Devices::PerRank => f.write_str("world"),
        }
    }
}

/// The element type of a multi-GPU step's reduce-scatter of the scaled
/// outputs: bf16 as vLLM's `cp_lse_ag_out_rs` (the attention output's type,
/// rounded at every hop of NCCL's ring), or f32 (twice the bytes, one
/// rounding to bf16 at the end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    #[default]
    Bf16,
    F32,
}

impl Reduce {
    pub fn bytes(self) -> usize {
        match self {
            Reduce::Bf16 => 2,
            Reduce::F32 => 4,
        }
    }
    /// The case id's knob after `-g<N>`: none for vLLM's bf16.
    pub fn knob(self) -> &'static str {
        match self {
            Reduce::Bf16 => "",
            Reduce::F32 => "-rs32",
        }
    }
}

impl FromStr for Reduce {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "bf16" => Ok(Reduce::Bf16),
            "f32" => Ok(Reduce::F32),
            _ => Err(format!("`{s}`: give bf16 (vLLM's reduce-scatter) or f32")),
        }
    }
}

impl fmt::Display for Reduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reduce::Bf16 => "bf16",
            Reduce::F32 => "f32",
        })
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

    #[test]
    fn device_counts_divide_the_world_and_come_from_the_allowed_set() {
        let four: Devices = "4".parse().unwrap();
        assert_eq!(four.for_world(8), Ok(4));
        assert_eq!(four.for_world(4), Ok(4));
        assert!(four.for_world(2).unwrap_err().contains("not a multiple of 4"));
        let world: Devices = "world".parse().unwrap();
        assert_eq!(world.for_world(2), Ok(2));
        assert!(world.for_world(16).unwrap_err().contains("1, 2, 4 or 8"));
        assert!(world.for_world(6).unwrap_err().contains("1, 2, 4 or 8"));
        for bad in ["3", "0", "16", "two", ""] {
            assert!(
                bad.parse::<Devices>().unwrap_err().contains("give 1, 2, 4 or 8 GPUs"),
                "{bad}"
            );
        }
        assert_eq!(Devices::PerRank.to_string(), "world");
    }
}
