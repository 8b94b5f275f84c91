//! Sample statistics and noise-aware comparison. Pure functions, no I/O.

use serde::{Deserialize, Serialize};

/// Summary of latency samples, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    #[serde(with = "crate::serde_float")]
    pub median: f64,
    #[serde(with = "crate::serde_float")]
    pub p10: f64,
    #[serde(with = "crate::serde_float")]
    pub p90: f64,
    #[serde(with = "crate::serde_float")]
    pub min: f64,
    #[serde(with = "crate::serde_float")]
    pub max: f64,
    #[serde(with = "crate::serde_float")]
    pub mean: f64,
    /// `(p90 - p10) / median`.
    #[serde(with = "crate::serde_float")]
    pub rel_spread: f64,
    /// [`median_noise`]: how well the median is known (rows made before it
    /// existed: NaN).
    #[serde(default = "nan", with = "crate::serde_float")]
    pub noise: f64,
}

fn nan() -> f64 {
    f64::NAN
}

impl Summary {
    /// Statistics of samples (ms). Percentiles interpolate linearly between
    /// order statistics at `q * (n - 1)` (numpy's default). No samples: `n = 0`
    /// and NaN elsewhere, so an empty run never reads as 0 ms. A zero median
    /// gives `rel_spread` 0 when there is no spread, else infinity.
    pub fn from_samples(ms: &[f64]) -> Summary {
        if ms.is_empty() {
            let nan = f64::NAN;
            return Summary {
                n: 0,
                median: nan,
                p10: nan,
                p90: nan,
                min: nan,
                max: nan,
                mean: nan,
                rel_spread: nan,
                noise: nan,
            };
        }
        let mut s = ms.to_vec();
        s.sort_by(f64::total_cmp);
        let (median, p10, p90) = (percentile(&s, 0.5), percentile(&s, 0.1), percentile(&s, 0.9));
        let spread = p90 - p10;
        Summary {
            n: s.len(),
            median,
            p10,
            p90,
            min: s[0],
            max: s[s.len() - 1],
            mean: s.iter().sum::<f64>() / s.len() as f64,
            rel_spread: if median != 0.0 {
                spread / median
            } else if spread == 0.0 {
                0.0
            } else {
                f64::INFINITY
            },
            noise: sorted_median_noise(&s),
        }
    }
}

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959964;

/// The relative half-width of a 95% confidence interval for the median:
/// `(x[hi] - x[lo]) / 2 / median`, with the order statistics `lo`, `hi` at
/// `n/2 -+ z sqrt(n)/2` (the binomial interval, normal approximation). It
/// assumes nothing about the shape of the distribution, so a long tail or
/// two clock states widen it rather than fool it. It shrinks as `1/sqrt(n)`,
/// which is what lets a timed region stop once its median is known well
/// enough. Infinite below 2 samples or for a median of 0.
pub fn median_noise(ms: &[f64]) -> f64 {
    let mut s = ms.to_vec();
    s.sort_by(f64::total_cmp);
    sorted_median_noise(&s)
}

fn sorted_median_noise(s: &[f64]) -> f64 {
    let n = s.len();
    if n < 2 {
        return f64::INFINITY;
    }
    let h = Z95 * (n as f64).sqrt() / 2.0;
    let mid = n as f64 / 2.0;
    let lo = ((mid - h).floor().max(1.0) as usize - 1).min(n - 1);
    let hi = ((mid + h).ceil() as usize).clamp(1, n) - 1;
    let med = percentile(s, 0.5);
    if med == 0.0 || !med.is_finite() {
        return f64::INFINITY;
    }
    (s[hi] - s[lo]) / 2.0 / med.abs()
}

/// How often each value occurs, in order.
pub fn count<V: Ord>(vs: impl IntoIterator<Item = V>) -> Vec<(V, usize)> {
    let mut t = std::collections::BTreeMap::new();
    for v in vs {
        *t.entry(v).or_insert(0) += 1;
    }
    t.into_iter().collect()
}

/// Geometric mean; `None` for no values.
pub fn geomean(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = xs.into_iter().fold((0.0, 0usize), |(s, n), x| (s + x.ln(), n + 1));
    (n > 0).then(|| (sum / n as f64).exp())
}

/// The `q` quantile (0..=1) of sorted samples, linear between order
/// statistics. NaN for no samples.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// Outcome of comparing a new measurement with a baseline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    /// The new median is `pct` percent lower.
    Faster { pct: f64 },
    /// The new median is `pct` percent higher.
    Slower { pct: f64 },
    /// Within the noise, or the difference is below [`MIN_CHANGE`].
    Same,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Faster { pct } => write!(f, "{pct:.1}% faster"),
            Verdict::Slower { pct } => write!(f, "{pct:.1}% slower"),
            Verdict::Same => f.write_str("same within noise"),
        }
    }
}

/// Relative median change below which no verdict is given even for very
/// tight samples: clocks and boost states drift by about this much.
pub const MIN_CHANGE: f64 = 0.01;

/// Noise-aware comparison. A change counts only when the two `[p10, p90]`
/// bands do not overlap (so the medians differ by more than the two
/// half-bands together) and the medians differ by more than [`MIN_CHANGE`].
/// Either summary empty, or a baseline median that is not positive: `Same`.
pub fn compare(base: &Summary, new: &Summary) -> Verdict {
    if base.n == 0 || new.n == 0 || base.median.is_nan() || base.median <= 0.0 {
        return Verdict::Same;
    }
    let change = (new.median - base.median) / base.median;
    if change.abs() <= MIN_CHANGE {
        return Verdict::Same;
    }
    let pct = change.abs() * 100.0;
    if new.p90 < base.p10 {
        Verdict::Faster { pct }
    } else if new.p10 > base.p90 {
        Verdict::Slower { pct }
    } else {
        Verdict::Same
    }
}

/// Drops samples beyond Tukey's fences (1.5 interquartile ranges outside the
/// quartiles). Returns the kept samples in their original order and how many
/// were removed.
pub fn drop_outliers(ms: &[f64]) -> (Vec<f64>, usize) {
    let mut s = ms.to_vec();
    s.sort_by(f64::total_cmp);
    let (q1, q3) = (percentile(&s, 0.25), percentile(&s, 0.75));
    let (lo, hi) = (q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1));
    let kept: Vec<f64> = ms.iter().copied().filter(|&x| x >= lo && x <= hi).collect();
    let removed = ms.len() - kept.len();
    (kept, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geomean_of_ratios() {
        assert!((geomean([2.0, 8.0]).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(geomean(std::iter::empty()), None);
    }

    fn summary(median: f64, p10: f64, p90: f64) -> Summary {
        Summary {
            n: 10,
            median,
            p10,
            p90,
            min: p10,
            max: p90,
            mean: median,
            rel_spread: (p90 - p10) / median,
            noise: f64::NAN,
        }
    }

    #[test]
    fn summary_of_hand_made_samples() {
        // Sorted: 1..=10 (given shuffled). pos(0.1) = 0.9 -> 1.9; pos(0.5) = 4.5 -> 5.5; pos(0.9) = 8.1 -> 9.1.
        let s = Summary::from_samples(&[7.0, 3.0, 10.0, 1.0, 5.0, 2.0, 9.0, 4.0, 8.0, 6.0]);
        assert_eq!(s.n, 10);
        assert!((s.p10 - 1.9).abs() < 1e-12);
        assert_eq!(s.median, 5.5);
        assert!((s.p90 - 9.1).abs() < 1e-12);
        assert_eq!((s.min, s.max, s.mean), (1.0, 10.0, 5.5));
        assert!((s.rel_spread - 7.2 / 5.5).abs() < 1e-12);
    }

    #[test]
    fn summary_edge_sizes() {
        let one = Summary::from_samples(&[2.5]);
        assert_eq!(
            (one.n, one.median, one.p10, one.p90, one.rel_spread),
            (1, 2.5, 2.5, 2.5, 0.0)
        );
        let two = Summary::from_samples(&[4.0, 2.0]);
        assert_eq!(two.median, 3.0);
        assert!((two.p10 - 2.2).abs() < 1e-12 && (two.p90 - 3.8).abs() < 1e-12);
        let none = Summary::from_samples(&[]);
        assert_eq!(none.n, 0);
        assert!(none.median.is_nan() && none.rel_spread.is_nan());
        let zeros = Summary::from_samples(&[0.0, 0.0]);
        assert_eq!(zeros.rel_spread, 0.0);
    }

    #[test]
    fn median_noise_is_wide_for_few_samples_and_shrinks_with_more() {
        assert!(median_noise(&[1.0]).is_infinite());
        // Ten samples: the interval spans nearly all of them.
        let ten: Vec<f64> = (0..10).map(|i| 1.0 + 0.01 * i as f64).collect();
        let w10 = median_noise(&ten);
        assert!((w10 - 0.08 / 2.0 / 1.045).abs() < 1e-12, "{w10}");
        // The same spread with 100x the samples: about 10x narrower.
        let mut rng = 12345u64;
        let mut draw = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    1.0 + 0.02 * ((rng >> 11) as f64 / (1u64 << 53) as f64)
                })
                .collect()
        };
        let (a, b) = (median_noise(&draw(100)), median_noise(&draw(10_000)));
        assert!(a > 5.0 * b && a < 20.0 * b, "{a} {b}");
        // Uniform on [1, 1.02]: the median's 95% half-width is about 1.96 * 0.02 / 2 / sqrt(n).
        assert!((b / (0.98 * 0.02 / 100.0 / 1.01) - 1.0).abs() < 0.25, "{b}");
        assert_eq!(median_noise(&[2.0; 50]), 0.0);
    }

    #[test]
    fn percentile_interpolates_and_clamps() {
        let s = [10.0, 20.0, 40.0];
        assert_eq!(percentile(&s, 0.0), 10.0);
        assert_eq!(percentile(&s, 0.25), 15.0);
        assert_eq!(percentile(&s, 0.75), 30.0);
        assert_eq!(percentile(&s, 1.5), 40.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn clear_changes_get_verdicts() {
        let base = summary(1.0, 0.98, 1.02);
        match compare(&base, &summary(0.9, 0.89, 0.91)) {
            Verdict::Faster { pct } => assert!((pct - 10.0).abs() < 1e-9),
            v => panic!("expected faster, got {v:?}"),
        }
        match compare(&base, &summary(1.2, 1.19, 1.22)) {
            Verdict::Slower { pct } => assert!((pct - 20.0).abs() < 1e-9),
            v => panic!("expected slower, got {v:?}"),
        }
        assert_eq!(format!("{}", Verdict::Faster { pct: 10.04 }), "10.0% faster");
    }

    #[test]
    fn overlapping_bands_are_the_same() {
        // Medians 5% apart, but the new run is noisy enough to overlap.
        let base = summary(1.0, 0.98, 1.02);
        assert_eq!(compare(&base, &summary(0.95, 0.85, 1.0)), Verdict::Same);
        assert_eq!(compare(&base, &summary(1.05, 0.99, 1.2)), Verdict::Same);
        assert_eq!(compare(&base, &base), Verdict::Same);
    }

    #[test]
    fn tiny_changes_need_more_than_min_change() {
        // Bands do not overlap but the medians are only 0.5% apart.
        let base = summary(1.0, 0.999, 1.001);
        assert_eq!(compare(&base, &summary(0.995, 0.994, 0.996)), Verdict::Same);
        assert!(matches!(
            compare(&base, &summary(0.98, 0.979, 0.981)),
            Verdict::Faster { .. }
        ));
        assert_eq!(compare(&Summary::from_samples(&[]), &base), Verdict::Same);
    }

    #[test]
    fn tukey_fences_drop_far_samples_only() {
        // Quartiles of 1..=8 plus 100: q1 = 3, q3 = 7, fences -3 and 13.
        let (kept, removed) = drop_outliers(&[5.0, 1.0, 100.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0]);
        assert_eq!(removed, 1);
        assert_eq!(kept, vec![5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0]);
        let (kept, removed) = drop_outliers(&[1.0, 1.0, 1.0]);
        assert_eq!((kept.len(), removed), (3, 0));
        assert_eq!(drop_outliers(&[]), (vec![], 0));
    }
}
