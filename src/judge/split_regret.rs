//! `mlabench splits`: how far the V4 split heuristic is from the best fixed
//! split count, and how the persistent HCA kernel compares. The study math is
//! pure; the command runs cases through the same runner as `run`.

use serde::Serialize;

/// One timed point of a study.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub n: usize,
    #[serde(serialize_with = "crate::serde_float::serialize")]
    pub median_ms: f64,
    #[serde(serialize_with = "crate::serde_float::serialize")]
    pub p10_ms: f64,
    #[serde(serialize_with = "crate::serde_float::serialize")]
    pub p90_ms: f64,
    /// The run's checks passed.
    pub pass: bool,
}

/// Every split count of one (layer, rows, heads, positions) workload.
#[derive(Clone, Debug, Serialize)]
pub struct Study {
    pub data_id: String,
    pub layer: String,
    pub rows: usize,
    pub heads: usize,
    #[serde(serialize_with = "crate::serde_float::serialize")]
    pub mean_len: f64,
    /// The heuristic's n and where it came from (heuristic / kernel pick).
    pub heuristic_n: usize,
    pub heuristic_source: String,
    pub points: Vec<Point>,
    /// hca_persist's time, or why its gates sent it to the fallback.
    pub hca: Option<Point>,
    pub hca_gate: Option<String>,
    /// External V4 implementations timed on the same workload (`--impl`).
    #[serde(default)]
    pub peers: Vec<(String, Point)>,
}

impl Study {
    /// The fastest fixed plan (ties to the smaller n).
    pub fn best(&self) -> Option<&Point> {
        self.points
            .iter()
            .filter(|p| p.median_ms.is_finite())
            .min_by(|a, b| a.median_ms.total_cmp(&b.median_ms).then(a.n.cmp(&b.n)))
    }
    pub fn at(&self, n: usize) -> Option<&Point> {
        self.points.iter().find(|p| p.n == n)
    }
    /// How much slower the heuristic's pick is than the best n, in percent.
    pub fn regret_pct(&self) -> Option<f64> {
        let best = self.best()?.median_ms;
        Some((self.at(self.heuristic_n)?.median_ms / best - 1.0) * 100.0)
    }
    /// Best fixed plan time over hca_persist time (> 1: hca_persist is faster).
    pub fn hca_speedup(&self) -> Option<f64> {
        Some(self.best()?.median_ms / self.hca.as_ref()?.median_ms)
    }
    /// Best fixed plan time over a peer's time (> 1: the peer is faster).
    pub fn peer_speedup(&self, p: &Point) -> Option<f64> {
        Some(self.best()?.median_ms / p.median_ms)
    }
}

/// Largest and mean regret over studies that have one.
pub fn regret_summary(studies: &[Study]) -> Option<(f64, f64)> {
    let r: Vec<f64> = studies.iter().filter_map(|s| s.regret_pct()).collect();
    if r.is_empty() {
        return None;
    }
    Some((
        r.iter().cloned().fold(f64::MIN, f64::max),
        r.iter().sum::<f64>() / r.len() as f64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(n: usize, ms: f64) -> Point {
        Point {
            n,
            median_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            pass: true,
        }
    }

    fn study(times: &[f64], pick: usize, hca: Option<f64>) -> Study {
        Study {
            data_id: "x".into(),
            layer: "hca".into(),
            rows: 64,
            heads: 128,
            mean_len: 8000.0,
            heuristic_n: pick,
            heuristic_source: "heuristic".into(),
            points: times.iter().enumerate().map(|(i, &t)| pt(i + 1, t)).collect(),
            hca: hca.map(|t| pt(0, t)),
            hca_gate: None,
            peers: vec![],
        }
    }

    #[test]
    fn regret_is_relative_to_the_best_fixed_plan() {
        let s = study(&[4.0, 2.0, 2.0, 3.0], 4, Some(1.6));
        assert_eq!(s.best().unwrap().n, 2, "ties go to the smaller n");
        assert!((s.regret_pct().unwrap() - 50.0).abs() < 1e-9);
        assert!((s.hca_speedup().unwrap() - 1.25).abs() < 1e-9);
        let s2 = study(&[1.0, 2.0], 1, None);
        assert_eq!(s2.regret_pct(), Some(0.0));
        assert_eq!(s2.hca_speedup(), None);
        let (max, mean) = regret_summary(&[s, s2]).unwrap();
        assert!((max - 50.0).abs() < 1e-9 && (mean - 25.0).abs() < 1e-9);
    }

    #[test]
    fn a_pick_that_was_not_timed_has_no_regret() {
        let s = study(&[1.0, 2.0], 9, None);
        assert_eq!(s.regret_pct(), None);
        assert_eq!(regret_summary(&[s]), None);
    }
}
