//! The shipped scenarios against what they must exercise: every page, tile
//! and split edge of every variant that splits, each in at least two cases
//! that can fail (eligible, not forced), so one planted off-by-one at a
//! boundary fails at least two rows.

use std::collections::BTreeMap;
use std::path::Path;

use mlabench::plan::edges::Edge::{self, *};
use mlabench::variants::{self, VariantId};

/// Edge -> how many eligible, unforced cases of `variant` land on it.
fn edge_counts(scenario: &str) -> BTreeMap<(VariantId, Edge), usize> {
    let sc = mlabench::scenario::load(Path::new(scenario)).unwrap();
    let mut counts = BTreeMap::new();
    for case in mlabench::scenario::expand(&sc).cases {
        let d = variants::decide(&case);
        if d.skip.is_some() || d.forced {
            continue;
        }
        let plan = match case.variant {
            VariantId::DcpCombine | VariantId::SplitMerge => None,
            _ => Some(variants::plan(&case, &d).unwrap()),
        };
        for e in variants::edges(&case, plan.as_ref()) {
            *counts.entry((case.variant, e)).or_insert(0) += 1;
        }
    }
    counts
}

fn required() -> Vec<(VariantId, Vec<Edge>)> {
    let all_mla = vec![PagePlus1, PageFull, PageMinus1, Split, OneTokenPiece, UnevenPieces];
    let mut page64 = all_mla.clone();
    page64.extend([OneShortPiece, EmptyPiece]);
    vec![
        (VariantId::Ps1, all_mla),
        (VariantId::Page64, page64),
        (VariantId::DcpCombine, vec![Split, EmptyPiece]),
        (
            VariantId::V4Split,
            vec![Split, OneTokenPiece, OneShortPiece, EmptyPiece, UnevenPieces],
        ),
        (VariantId::HcaPersist, vec![Split, OneTokenPiece, UnevenPieces]),
        (
            VariantId::SplitMerge,
            vec![Split, OneTokenPiece, EmptyPiece, UnevenPieces],
        ),
    ]
}

fn assert_covers(scenario: &str, variants: &[VariantId]) {
    let counts = edge_counts(scenario);
    let mut missing = Vec::new();
    for (v, edges) in required().into_iter().filter(|(v, _)| variants.contains(v)) {
        for e in edges {
            let n = counts.get(&(v, e)).copied().unwrap_or(0);
            if n < 2 {
                missing.push(format!("{v}: {e} in {n} cases"));
            }
        }
    }
    assert!(missing.is_empty(), "{scenario} misses edges: {missing:?}");
}

#[test]
fn smoke_lands_every_variant_on_every_edge_twice() {
    use VariantId::*;
    assert_covers(
        "scenarios/smoke.toml",
        &[Ps1, Page64, DcpCombine, V4Split, HcaPersist, SplitMerge],
    );
}

#[test]
fn the_sweeps_land_every_variant_on_every_edge_twice() {
    use VariantId::*;
    assert_covers("scenarios/mla-sweep.toml", &[Ps1, Page64, DcpCombine]);
    assert_covers("scenarios/v4-sweep.toml", &[V4Split, HcaPersist, SplitMerge]);
}

#[test]
fn page64_under_dcp_has_rows_that_can_fail() {
    // The forced s_q > 1 rows are expected to fail; a regression must show in
    // rows the gate accepts.
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    let n = mlabench::scenario::expand(&sc)
        .cases
        .iter()
        .filter(|c| c.variant == VariantId::Page64)
        .filter(|c| c.mla().is_some_and(|p| p.dcp_world > 1))
        .filter(|c| {
            let d = variants::decide(c);
            d.skip.is_none() && !d.forced
        })
        .count();
    assert!(n >= 2, "smoke has {n} eligible page64 cases under DCP");
}
