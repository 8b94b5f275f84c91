//! A/B of two kernel builds measured in alternating rounds of one session.
//! A single baseline comparison cannot tell a change from the device's own
//! drift; here each side's runs are pooled and the control's spread across
//! its own rounds is the noise floor a change must clear. Pure: entries in,
//! verdicts out.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::judge::baseline::Entry;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbVerdict {
    /// The control passed (or xfailed) in every round, the candidate failed
    /// or errored in one.
    Broke,
    /// Slower by more than the threshold and both sides' round-to-round spread.
    Slower,
    /// Faster by more than the threshold and both sides' spread.
    Faster,
    /// Within the noise.
    Same,
    /// Not in every run, untimed, or timed with different clocks (unless
    /// mixed clocks are allowed; each side still needs one clock).
    Incomplete,
}

impl AbVerdict {
    pub fn is_regression(self) -> bool {
        matches!(self, AbVerdict::Broke | AbVerdict::Slower)
    }
}

/// One (case, variant) over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct AbRow {
    pub case_id: String,
    pub variant: String,
    /// Median over the rounds of each run's median time, ms.
    pub control_ms: Option<f64>,
    pub candidate_ms: Option<f64>,
    /// candidate / control (> 1: slower).
    pub ratio: Option<f64>,
    /// max / min - 1 of each side's per-round medians (0 with one round).
    pub control_spread: Option<f64>,
    pub candidate_spread: Option<f64>,
    pub verdict: AbVerdict,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::stats::percentile(v, 0.5)
}

fn spread(v: &[f64]) -> f64 {
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    hi / lo - 1.0
}

/// Pools each side's runs (rounds) per (case, variant) and judges the
/// candidate: a change counts when |ratio - 1| exceeds `threshold` (a
/// fraction) and the larger of the two sides' round-to-round spreads.
/// Sorted worst first, then by case. `mixed_clocks`: compare a control
/// timed with one clock against a candidate timed with another (eager
/// events against graph replay); without it such rows are incomplete.
pub fn ab(control: &[Vec<Entry>], candidate: &[Vec<Entry>], threshold: f64, mixed_clocks: bool) -> Vec<AbRow> {
    type Key = (String, String);
    let index = |runs: &[Vec<Entry>]| {
        let mut m: BTreeMap<Key, Vec<Option<Entry>>> = BTreeMap::new();
        for (i, run) in runs.iter().enumerate() {
            for e in run {
                let slot = m
                    .entry((e.case_id.clone(), e.variant.clone()))
                    .or_insert_with(|| vec![None; runs.len()]);
                slot[i] = Some(e.clone());
            }
        }
        m
    };
    let (c, d) = (index(control), index(candidate));
    let mut keys: Vec<&Key> = c.keys().chain(d.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut rows: Vec<AbRow> = keys
        .into_iter()
        .map(|k| judge(k, c.get(k), d.get(k), threshold, mixed_clocks))
        .collect();
    rows.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then(b.ratio.unwrap_or(1.0).total_cmp(&a.ratio.unwrap_or(1.0)))
            .then(a.case_id.cmp(&b.case_id))
    });
    rows
}

fn judge(
    (case_id, variant): &(String, String),
    ctrl: Option<&Vec<Option<Entry>>>,
    cand: Option<&Vec<Option<Entry>>>,
    threshold: f64,
    mixed_clocks: bool,
) -> AbRow {
    let complete = |s: Option<&Vec<Option<Entry>>>| -> Option<Vec<Entry>> { s?.iter().cloned().collect() };
    let (ctrl, cand) = (complete(ctrl), complete(cand));
    let broken = |e: &Entry| matches!(e.status.as_str(), "fail" | "error");
    let mut row = AbRow {
        case_id: case_id.clone(),
        variant: variant.clone(),
        control_ms: None,
        candidate_ms: None,
        ratio: None,
        control_spread: None,
        candidate_spread: None,
        verdict: AbVerdict::Incomplete,
    };
    let (Some(ctrl), Some(cand)) = (ctrl, cand) else {
        return row;
    };
    // A broken candidate's times are still shown: a diagnostic copy that
    // leaves a stage out (docs/profiling.md) fails its checks by design and
    // is read for its time alone. It is never judged faster or slower, and
    // the geomean leaves it out.
    let broke = !ctrl.iter().any(broken) && cand.iter().any(broken);
    if let Some((cm, dm, cs, ds)) = pooled(&ctrl, &cand, mixed_clocks) {
        row.control_ms = Some(cm);
        row.candidate_ms = Some(dm);
        row.ratio = Some(dm / cm);
        row.control_spread = Some(cs);
        row.candidate_spread = Some(ds);
    }
    if broke {
        row.verdict = AbVerdict::Broke;
        return row;
    }
    let (Some(ratio), Some(cs), Some(ds)) = (row.ratio, row.control_spread, row.candidate_spread) else {
        return row;
    };
    let noise = threshold.max(cs).max(ds);
    row.verdict = if ratio > 1.0 + noise {
        AbVerdict::Slower
    } else if ratio < 1.0 - noise {
        AbVerdict::Faster
    } else {
        AbVerdict::Same
    };
    row
}

/// Each side's median over its rounds and round-to-round spread, when every
/// round is timed with one clock per side (and the same clock on both,
/// unless `mixed_clocks`).
fn pooled(ctrl: &[Entry], cand: &[Entry], mixed_clocks: bool) -> Option<(f64, f64, f64, f64)> {
    let (cc, dc) = (one_clock(ctrl)?, one_clock(cand)?);
    if cc != dc && !mixed_clocks {
        return None;
    }
    let times = |side: &[Entry]| -> Option<Vec<f64>> { side.iter().map(|e| e.timing.map(|t| t.median)).collect() };
    let (mut ct, mut dt) = (times(ctrl)?, times(cand)?);
    let (cs, ds) = (spread(&ct), spread(&dt));
    Some((median(&mut ct), median(&mut dt), cs, ds))
}

/// The clock every entry of one side was timed with, if they share one.
fn one_clock(side: &[Entry]) -> Option<&str> {
    let c = side.first()?.clock.as_str();
    (!c.is_empty() && side.iter().all(|e| e.clock == c)).then_some(c)
}

/// The two sides' clocks when every timed entry of each side shares one and
/// they differ: why a plain A/B of eager against `--graph` runs is empty.
pub fn clock_mismatch(control: &[Vec<Entry>], candidate: &[Vec<Entry>]) -> Option<(String, String)> {
    let clocks = |runs: &[Vec<Entry>]| -> Vec<String> {
        let mut v: Vec<String> = runs
            .iter()
            .flatten()
            .map(|e| e.clock.clone())
            .filter(|c| !c.is_empty())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    match (clocks(control).as_slice(), clocks(candidate).as_slice()) {
        ([c], [d]) if c != d => Some((c.clone(), d.clone())),
        _ => None,
    }
}

/// Geometric mean of the ratios of the judged rows (a broken candidate's
/// time is shown, not counted).
pub fn geomean(rows: &[AbRow]) -> Option<f64> {
    crate::stats::geomean(
        rows.iter()
            .filter(|r| r.verdict != AbVerdict::Broke)
            .filter_map(|r| r.ratio),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::baseline::Timing;

    fn e(case: &str, status: &str, ms: Option<f64>) -> Entry {
        Entry {
            case_id: case.into(),
            variant: "ps1".into(),
            status: status.into(),
            clock: if ms.is_some() {
                "cuda-events".into()
            } else {
                String::new()
            },
            timing: ms.map(|m| Timing {
                median: m,
                p10: m,
                p90: m,
            }),
        }
    }

    fn verdict(rows: &[AbRow], case: &str) -> AbVerdict {
        rows.iter().find(|r| r.case_id == case).unwrap().verdict
    }

    #[test]
    fn a_change_must_clear_the_controls_own_drift() {
        // Control drifts 10% between its rounds; a 6% gain is inside it, a
        // 20% gain is not, and a 6% gain with a steady control counts.
        let control = vec![
            vec![
                e("a", "pass", Some(1.0)),
                e("b", "pass", Some(1.0)),
                e("c", "pass", Some(1.0)),
            ],
            vec![
                e("a", "pass", Some(1.1)),
                e("b", "pass", Some(1.1)),
                e("c", "pass", Some(1.0)),
            ],
        ];
        let cand = vec![
            vec![
                e("a", "pass", Some(0.99)),
                e("b", "pass", Some(0.84)),
                e("c", "pass", Some(0.94)),
            ],
            vec![
                e("a", "pass", Some(0.99)),
                e("b", "pass", Some(0.84)),
                e("c", "pass", Some(0.94)),
            ],
        ];
        let rows = ab(&control, &cand, 0.02, false);
        assert_eq!(verdict(&rows, "a"), AbVerdict::Same);
        assert_eq!(verdict(&rows, "b"), AbVerdict::Faster);
        assert_eq!(verdict(&rows, "c"), AbVerdict::Faster);
        let a = rows.iter().find(|r| r.case_id == "a").unwrap();
        assert!((a.control_ms.unwrap() - 1.05).abs() < 1e-12, "median of two rounds");
        assert!((a.control_spread.unwrap() - 0.1).abs() < 1e-12);
        assert!((a.ratio.unwrap() - 0.99 / 1.05).abs() < 1e-12);
        // Swapped, the same rows are slower: a regression.
        let rows = ab(&cand, &control, 0.02, false);
        assert_eq!(verdict(&rows, "b"), AbVerdict::Slower);
        assert!(rows[0].verdict.is_regression(), "worst first");
    }

    #[test]
    fn failures_missing_rows_and_untimed_rows_are_named() {
        let control = vec![vec![
            e("ok", "pass", Some(1.0)),
            e("gone", "pass", Some(1.0)),
            e("quiet", "pass", None),
            e("was-broken", "fail", Some(1.0)),
        ]];
        let cand = vec![vec![
            e("ok", "fail", Some(0.5)),
            e("quiet", "pass", None),
            e("was-broken", "fail", Some(1.0)),
        ]];
        let rows = ab(&control, &cand, 0.05, false);
        assert_eq!(verdict(&rows, "ok"), AbVerdict::Broke);
        // Its time is shown (a diagnostic build is read that way), but the
        // geomean below is of the judged rows alone.
        assert_eq!(rows.iter().find(|r| r.case_id == "ok").unwrap().ratio, Some(0.5));
        assert_eq!(verdict(&rows, "gone"), AbVerdict::Incomplete);
        assert_eq!(verdict(&rows, "quiet"), AbVerdict::Incomplete);
        assert_eq!(verdict(&rows, "was-broken"), AbVerdict::Same);
        assert_eq!(rows[0].case_id, "ok");
        assert_eq!(geomean(&rows), Some(1.0));
    }

    #[test]
    fn a_row_missing_from_one_round_is_incomplete() {
        let control = vec![vec![e("a", "pass", Some(1.0))], vec![e("a", "pass", Some(1.0))]];
        let cand = vec![vec![e("a", "pass", Some(0.5))], vec![]];
        assert_eq!(verdict(&ab(&control, &cand, 0.05, false), "a"), AbVerdict::Incomplete);
    }

    #[test]
    fn clocks_must_match_unless_mixed_clocks_are_asked_for() {
        let graph = |mut x: Entry| {
            x.clock = "cuda-graph".into();
            x
        };
        let control = vec![vec![e("a", "pass", Some(1.0))]];
        let cand = vec![vec![graph(e("a", "pass", Some(0.9)))]];
        assert_eq!(verdict(&ab(&control, &cand, 0.05, false), "a"), AbVerdict::Incomplete);
        assert_eq!(
            clock_mismatch(&control, &cand),
            Some(("cuda-events".to_string(), "cuda-graph".to_string()))
        );
        let rows = ab(&control, &cand, 0.05, true);
        assert_eq!(verdict(&rows, "a"), AbVerdict::Faster);
        assert!((rows[0].ratio.unwrap() - 0.9).abs() < 1e-12);
        // One side on two clocks across its rounds stays incomplete.
        let mixed_side = vec![vec![e("a", "pass", Some(1.0))], vec![graph(e("a", "pass", Some(1.0)))]];
        let two = vec![vec![e("a", "pass", Some(1.0))], vec![e("a", "pass", Some(1.0))]];
        assert_eq!(verdict(&ab(&mixed_side, &two, 0.05, true), "a"), AbVerdict::Incomplete);
        assert_eq!(clock_mismatch(&mixed_side, &two), None);
    }
}
