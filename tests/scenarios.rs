//! The shipped scenarios against what they must exercise: every page, tile
//! and split edge of every variant that splits, each in at least two cases
//! that can fail (eligible, not forced), so one planted off-by-one at a
//! boundary fails at least two rows.

use std::collections::BTreeMap;
use std::path::Path;

use mlabench::variants::edges::Edge::{self, *};
use mlabench::variants::{self, dcp_combine, hca_persist, page64, ps1, split_merge, v4_split, VariantId};

/// Edge -> how many eligible, unforced cases of `variant` land on it.
fn edge_counts(scenario: &str) -> BTreeMap<(VariantId, Edge), usize> {
    let sc = mlabench::scenario::load(Path::new(scenario)).unwrap();
    let mut counts = BTreeMap::new();
    for case in mlabench::scenario::expand(&sc).cases {
        let d = variants::decide(&case);
        if d.skip.is_some() || d.forced {
            continue;
        }
        let unit = case.variant.unit();
        let plan = match unit.plan_note() {
            Some(_) => None,
            None => Some(unit.plan(&case, &d, None).unwrap()),
        };
        for e in unit.edges(&case, plan.as_ref()) {
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
        (ps1::ID, all_mla),
        (page64::ID, page64),
        (dcp_combine::ID, vec![Split, EmptyPiece]),
        (
            v4_split::ID,
            vec![Split, OneTokenPiece, OneShortPiece, EmptyPiece, UnevenPieces],
        ),
        (hca_persist::ID, vec![Split, OneTokenPiece, UnevenPieces]),
        (split_merge::ID, vec![Split, OneTokenPiece, EmptyPiece, UnevenPieces]),
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
    let all: Vec<VariantId> = variants::REGISTRY.iter().map(|u| u.info().id).collect();
    assert_covers("scenarios/smoke.toml", &all);
}

#[test]
fn the_sweeps_land_every_variant_on_every_edge_twice() {
    assert_covers("scenarios/mla-sweep.toml", &[ps1::ID, page64::ID, dcp_combine::ID]);
    assert_covers(
        "scenarios/v4-sweep.toml",
        &[v4_split::ID, hca_persist::ID, split_merge::ID],
    );
}

#[test]
fn page64_under_dcp_has_rows_that_can_fail() {
    // The forced s_q > 1 rows are expected to fail; a regression must show in
    // rows the gate accepts.
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    let n = mlabench::scenario::expand(&sc)
        .cases
        .iter()
        .filter(|c| c.variant == page64::ID)
        .filter(|c| c.mla().is_some_and(|p| p.dcp.sharded()))
        .filter(|c| {
            let d = variants::decide(c);
            d.skip.is_none() && !d.forced
        })
        .count();
    assert!(n >= 2, "smoke has {n} eligible page64 cases under DCP");
}
