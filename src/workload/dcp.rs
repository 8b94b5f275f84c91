//! Round-robin decode-context-parallel sharding with interleave `S` (SPEC §1).

/// Rank that owns global token `p`.
pub fn owner(p: usize, w: usize, s: usize) -> usize {
    (p / s) % w
}

/// Index of global token `p` within its owner's shard.
pub fn local_index(p: usize, w: usize, s: usize) -> usize {
    (p / (s * w)) * s + p % s
}

/// Global position of local token `j` on rank `r`.
pub fn global_pos(j: usize, r: usize, w: usize, s: usize) -> usize {
    ((j / s) * w + r) * s + j % s
}

/// Tokens of a length-`l` sequence that rank `r` holds.
pub fn local_len(r: usize, l: usize, w: usize, s: usize) -> usize {
    let full = (l / (w * s)) * s;
    let rem = (l % (w * s)) as isize - (r * s) as isize;
    full + rem.clamp(0, s as isize) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharding_matches_brute_force_for_small_worlds() {
        for w in 1..=8 {
            for s in 1..=4 {
                for l in 0..(3 * w * s + 5) {
                    let mut counts = vec![0usize; w];
                    for p in 0..l {
                        let r = owner(p, w, s);
                        let j = local_index(p, w, s);
                        assert_eq!(j, counts[r], "w={w} s={s} p={p}: local indices are dense and ordered");
                        assert_eq!(global_pos(j, r, w, s), p, "inverse w={w} s={s} p={p}");
                        counts[r] += 1;
                    }
                    for (r, &c) in counts.iter().enumerate() {
                        assert_eq!(local_len(r, l, w, s), c, "local_len w={w} s={s} r={r} l={l}");
                    }
                }
            }
        }
    }

    #[test]
    fn world_one_is_identity() {
        for p in 0..100 {
            assert_eq!(owner(p, 1, 1), 0);
            assert_eq!(local_index(p, 1, 1), p);
            assert_eq!(global_pos(p, 0, 1, 1), p);
        }
        assert_eq!(local_len(0, 77, 1, 1), 77);
    }
}
