//! Baseline comparison: the same (case, variant) rows of two runs, judged
//! for speed and check status. Pure: rows in, verdicts out; reading files
//! and printing live in `app` and `report::compare`.

use serde::Serialize;
use std::collections::HashMap;

/// One timed region's spread, in ms.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Timing {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

/// What a comparison needs of a report row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    pub case_id: String,
    pub variant: String,
    /// `pass`, `fail`, `xfail`, `skip` or `error` (rows.csv's words).
    pub status: String,
    /// `cuda-events`, `cuda-graph`, `cpu-wall`; empty when untimed.
    pub clock: String,
    pub timing: Option<Timing>,
}

impl Entry {
    fn broken(&self) -> bool {
        matches!(self.status.as_str(), "fail" | "error")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Passed (or xfailed) in the baseline, fails or errors now.
    Broke,
    /// Slower by more than the threshold, and outside the baseline's spread.
    Slower,
    /// Failed in the baseline, passes now.
    Fixed,
    /// Faster by more than the threshold, and outside the baseline's spread.
    Faster,
    /// Within the threshold or the spread.
    Same,
    /// Timed with a different clock (backend or graph mode): not comparable.
    OtherClock,
    /// Timed by the CPU backend: one wall-clock sample of the host
    /// emulation, which says nothing about a kernel's speed; not judged.
    HostClock,
    /// One side has no timing (e.g. `--no-timing`, skipped).
    Untimed,
    /// Only in the candidate.
    New,
    /// Only in the baseline.
    Missing,
}

impl Verdict {
    /// Verdicts that fail a comparison (exit 1).
    pub fn is_regression(self) -> bool {
        matches!(self, Verdict::Broke | Verdict::Slower)
    }
}

/// One (case, variant) of either run.
#[derive(Clone, Debug, Serialize)]
pub struct Delta {
    pub case_id: String,
    pub variant: String,
    pub base: Option<Entry>,
    pub cand: Option<Entry>,
    /// Candidate median over baseline median (> 1: slower).
    pub ratio: Option<f64>,
    pub verdict: Verdict,
}

/// The CPU backend's clock.
pub const HOST_CLOCK: &str = "cpu-wall";

/// Judges the candidate against the baseline. `threshold` is a fraction
/// (0.05 = 5%). A speed change counts only when it exceeds the threshold
/// (candidate/baseline above `1 + t` or below `1 - t`) and
/// the candidate's p10..p90 does not overlap the baseline's, so noise alone
/// does not fail a CI job. Sorted worst first, then by case.
pub fn compare(base: &[Entry], cand: &[Entry], threshold: f64) -> Vec<Delta> {
    let key = |e: &Entry| (e.case_id.clone(), e.variant.clone());
    let base_by: HashMap<_, _> = base.iter().map(|e| (key(e), e)).collect();
    let cand_keys: std::collections::HashSet<_> = cand.iter().map(key).collect();
    let mut out: Vec<Delta> = cand
        .iter()
        .map(|c| {
            let b = base_by.get(&key(c)).copied();
            let (verdict, ratio) = match b {
                None => (Verdict::New, None),
                Some(b) => judge(b, c, threshold),
            };
            Delta {
                case_id: c.case_id.clone(),
                variant: c.variant.clone(),
                base: b.cloned(),
                cand: Some(c.clone()),
                ratio,
                verdict,
            }
        })
        .collect();
    out.extend(base.iter().filter(|b| !cand_keys.contains(&key(b))).map(|b| Delta {
        case_id: b.case_id.clone(),
        variant: b.variant.clone(),
        base: Some(b.clone()),
        cand: None,
        ratio: None,
        verdict: Verdict::Missing,
    }));
    // Within a verdict, the largest change first (either direction).
    let size = |d: &Delta| d.ratio.map_or(0.0, |r| r.ln().abs());
    out.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then_with(|| size(b).total_cmp(&size(a)))
            .then_with(|| (&a.case_id, &a.variant).cmp(&(&b.case_id, &b.variant)))
    });
    out
}

fn judge(b: &Entry, c: &Entry, threshold: f64) -> (Verdict, Option<f64>) {
    match (b.broken(), c.broken()) {
        (false, true) => return (Verdict::Broke, None),
        (true, false) => return (Verdict::Fixed, None),
        _ => {}
    }
    let (Some(tb), Some(tc)) = (b.timing, c.timing) else {
        return (Verdict::Untimed, None);
    };
    if b.clock != c.clock {
        return (Verdict::OtherClock, None);
    }
    if c.clock == HOST_CLOCK {
        return (Verdict::HostClock, None);
    }
    if !(tb.median > 0.0 && tc.median.is_finite()) {
        return (Verdict::Untimed, None);
    }
    let ratio = tc.median / tb.median;
    let verdict = if ratio > 1.0 + threshold && tc.p10 > tb.p90 {
        Verdict::Slower
    } else if ratio < 1.0 - threshold && tc.p90 < tb.p10 {
        Verdict::Faster
    } else {
        Verdict::Same
    };
    (verdict, Some(ratio))
}

/// How many deltas got each verdict, in `Verdict` order.
pub fn tally(deltas: &[Delta]) -> Vec<(Verdict, usize)> {
    crate::stats::count(deltas.iter().map(|d| d.verdict))
}

/// Geometric mean of the candidate/baseline ratios that were compared.
pub fn geomean_ratio(deltas: &[Delta]) -> Option<f64> {
    crate::stats::geomean(
        deltas
            .iter()
            .filter(|d| matches!(d.verdict, Verdict::Slower | Verdict::Faster | Verdict::Same))
            .filter_map(|d| d.ratio),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(case: &str, status: &str, t: Option<(f64, f64, f64)>) -> Entry {
        Entry {
            case_id: case.into(),
            variant: "ps1".into(),
            status: status.into(),
            clock: if t.is_some() {
                "cuda-events".into()
            } else {
                String::new()
            },
            timing: t.map(|(median, p10, p90)| Timing { median, p10, p90 }),
        }
    }

    #[test]
    fn speed_needs_the_threshold_and_a_clear_spread() {
        let base = [
            e("a", "pass", Some((1.0, 0.98, 1.02))),
            e("b", "pass", Some((1.0, 0.98, 1.02))),
            e("c", "pass", Some((1.0, 0.90, 1.20))),
            e("d", "pass", Some((1.0, 0.98, 1.02))),
            e("e", "pass", Some((1.0, 0.98, 1.02))),
        ];
        let cand = [
            e("a", "pass", Some((1.10, 1.08, 1.12))), // 10% slower, clear
            e("b", "pass", Some((1.03, 1.01, 1.05))), // under the threshold
            e("c", "pass", Some((1.10, 1.05, 1.15))), // over it, but inside c's wide spread
            e("d", "pass", Some((0.80, 0.79, 0.81))), // faster
            e("e", "pass", Some((1.0, 0.98, 1.02))),
        ];
        let d = compare(&base, &cand, 0.05);
        let v: HashMap<_, _> = d.iter().map(|x| (x.case_id.as_str(), x.verdict)).collect();
        assert_eq!(v["a"], Verdict::Slower);
        assert_eq!(v["b"], Verdict::Same);
        assert_eq!(v["c"], Verdict::Same);
        assert_eq!(v["d"], Verdict::Faster);
        assert_eq!(v["e"], Verdict::Same);
        // Worst first.
        assert_eq!(d[0].case_id, "a");
        assert!((d[0].ratio.unwrap() - 1.1).abs() < 1e-12);
        let g = geomean_ratio(&d).unwrap();
        assert!((g - (1.1f64 * 1.03 * 1.1 * 0.8).powf(0.2)).abs() < 1e-12);
    }

    #[test]
    fn status_changes_rows_on_one_side_and_clocks() {
        let t = Some((1.0, 1.0, 1.0));
        let base = [
            e("a", "pass", t),
            e("b", "fail", t),
            e("c", "xfail", t),
            e("gone", "pass", t),
            e("u", "pass", None),
        ];
        let mut graph = e("g", "pass", t);
        graph.clock = "cuda-graph".into();
        let cand = [
            e("a", "error", t),
            e("b", "pass", t),
            e("c", "xfail", t),
            e("new", "pass", t),
            e("u", "pass", t),
            graph.clone(),
        ];
        let mut base = base.to_vec();
        base.push(e("g", "pass", t));
        let d = compare(&base, &cand, 0.05);
        let v: HashMap<_, _> = d.iter().map(|x| (x.case_id.as_str(), x.verdict)).collect();
        assert_eq!(v["a"], Verdict::Broke);
        assert_eq!(v["b"], Verdict::Fixed);
        assert_eq!(v["c"], Verdict::Same);
        assert_eq!(v["gone"], Verdict::Missing);
        assert_eq!(v["new"], Verdict::New);
        assert_eq!(v["u"], Verdict::Untimed);
        assert_eq!(v["g"], Verdict::OtherClock);
        // Two CPU runs are never judged for speed, however far apart.
        let mut slow = e("h", "pass", Some((9.0, 9.0, 9.0)));
        slow.clock = HOST_CLOCK.into();
        let mut fast = e("h", "pass", Some((1.0, 1.0, 1.0)));
        fast.clock = HOST_CLOCK.into();
        assert_eq!(compare(&[fast], &[slow], 0.05)[0].verdict, Verdict::HostClock);
        assert!(Verdict::Broke.is_regression() && !Verdict::Fixed.is_regression());
        let t = tally(&d);
        assert_eq!(t[0], (Verdict::Broke, 1));
        assert_eq!(t.iter().map(|x| x.1).sum::<usize>(), 7);
    }
}
