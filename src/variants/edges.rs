//! The length edges a case's plan puts its sequences on: where an
//! off-by-one at a page, tile or split boundary would change the answer.
//! A sweep that never lands on an edge cannot catch a bug there, so the
//! shipped scenarios are tested to cover every edge of every variant that
//! splits (and `mlabench plan` prints each case's edges).

use std::collections::BTreeSet;
use std::fmt;

/// Tokens per page (page64) and per KV tile of the MLA kernels.
const TILE: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Edge {
    /// A sequence one token past a whole number of 64-token pages / tiles.
    PagePlus1,
    /// A sequence of whole pages.
    PageFull,
    /// One token short of whole pages.
    PageMinus1,
    /// A sequence cut into two or more non-empty pieces (splits, work items,
    /// partitions): the merge runs.
    Split,
    /// A non-empty piece of exactly one token: a cut one token before the
    /// end or after the start.
    OneTokenPiece,
    /// The last non-empty piece one token short of the longest: the length
    /// sits one token before a cut.
    OneShortPiece,
    /// A piece of a split plan that holds no token (its LSE is -inf).
    EmptyPiece,
    /// Pieces of different lengths: the cut rule's rounding is exercised.
    UnevenPieces,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Edge::PagePlus1 => "page+1",
            Edge::PageFull => "page",
            Edge::PageMinus1 => "page-1",
            Edge::Split => "split",
            Edge::OneTokenPiece => "1-token piece",
            Edge::OneShortPiece => "last piece 1 short",
            Edge::EmptyPiece => "empty piece",
            Edge::UnevenPieces => "uneven pieces",
        })
    }
}

/// The edges of one sequence of `len` tokens cut into `pieces` (half-open
/// ranges that tile `[0, len)`, empty ones included).
pub fn of_sequence(len: usize, pieces: &[(usize, usize)]) -> BTreeSet<Edge> {
    let mut e = BTreeSet::new();
    if len >= TILE - 1 {
        match len % TILE {
            1 => e.insert(Edge::PagePlus1),
            0 => e.insert(Edge::PageFull),
            r if r == TILE - 1 => e.insert(Edge::PageMinus1),
            _ => false,
        };
    }
    let sizes: Vec<usize> = pieces.iter().map(|&(a, b)| b - a).collect();
    let full: Vec<usize> = sizes.iter().copied().filter(|&s| s > 0).collect();
    if full.len() >= 2 {
        e.insert(Edge::Split);
        if full.contains(&1) {
            e.insert(Edge::OneTokenPiece);
        }
        if full.iter().any(|&s| s != full[0]) {
            e.insert(Edge::UnevenPieces);
        }
        let longest = full.iter().copied().max().unwrap_or(0);
        if full.last().is_some_and(|&l| l + 1 == longest) {
            e.insert(Edge::OneShortPiece);
        }
    }
    if sizes.len() >= 2 && sizes.contains(&0) {
        e.insert(Edge::EmptyPiece);
    }
    e
}

/// Every edge of a set of sequences.
pub fn union<'a>(seqs: impl IntoIterator<Item = (usize, &'a [(usize, usize)])>) -> BTreeSet<Edge> {
    seqs.into_iter().flat_map(|(len, p)| of_sequence(len, p)).collect()
}

/// `a, b, c` for a plan line.
pub fn describe(e: &BTreeSet<Edge>) -> String {
    if e.is_empty() {
        return "none".into();
    }
    e.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use Edge::*;

    fn set(v: &[Edge]) -> BTreeSet<Edge> {
        v.iter().copied().collect()
    }

    #[test]
    fn page_edges_need_a_length_near_a_page() {
        assert_eq!(of_sequence(65, &[(0, 65)]), set(&[PagePlus1]));
        assert_eq!(of_sequence(128, &[(0, 128)]), set(&[PageFull]));
        assert_eq!(of_sequence(63, &[(0, 63)]), set(&[PageMinus1]));
        assert_eq!(
            of_sequence(1, &[(0, 1)]),
            set(&[]),
            "a one-token sequence is no page edge"
        );
        assert_eq!(of_sequence(100, &[(0, 100)]), set(&[]));
    }

    #[test]
    fn split_edges_come_from_the_pieces() {
        // page64 with 2 splits of a 65-token sequence: pages [0,64) and [64,65).
        assert_eq!(
            of_sequence(65, &[(0, 64), (64, 65)]),
            set(&[PagePlus1, Split, OneTokenPiece, UnevenPieces])
        );
        // 3 splits of 100 tokens, the last empty.
        assert_eq!(
            of_sequence(100, &[(0, 64), (64, 100), (100, 100)]),
            set(&[Split, UnevenPieces, EmptyPiece])
        );
        // 127 tokens in two page-aligned halves: the length is a cut minus one.
        assert_eq!(
            of_sequence(127, &[(0, 64), (64, 127)]),
            set(&[PageMinus1, Split, UnevenPieces, OneShortPiece])
        );
        // Even halves; an empty piece of a one-piece plan is no split.
        assert_eq!(of_sequence(10, &[(0, 5), (5, 10)]), set(&[Split]));
        assert_eq!(of_sequence(3, &[(0, 3), (3, 3)]), set(&[EmptyPiece]));
        assert_eq!(describe(&set(&[Split, EmptyPiece])), "split, empty piece");
        assert_eq!(describe(&set(&[])), "none");
    }
}
