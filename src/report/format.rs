//! Number formatting shared by the reporters. Pure functions.

/// A float for machine-read files: exact (shortest round-trip), exponent form
/// for very small or large magnitudes, `NaN` / `inf` / `-inf` spelled out.
pub fn exact(x: f64) -> String {
    let a = x.abs();
    if !x.is_finite() || x == 0.0 || (1e-3..1e9).contains(&a) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// An error metric for people: three significant digits in exponent form.
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

/// The unit that keeps a duration in milliseconds readable, and its scale.
fn time_unit(ms: f64) -> (f64, &'static str) {
    if ms < 1.0 {
        (1e3, "µs")
    } else if ms < 1e3 {
        (1.0, "ms")
    } else {
        (1e-3, "s")
    }
}

/// A duration given in milliseconds, in the unit that keeps it readable.
pub fn duration_ms(ms: f64) -> String {
    if !ms.is_finite() {
        return format!("{ms}");
    }
    let (scale, unit) = time_unit(ms);
    format!("{} {unit}", sig3(ms * scale))
}

/// `lo-hi unit`, both in the unit chosen for `hi`.
pub fn duration_range_ms(lo: f64, hi: f64) -> String {
    if !lo.is_finite() || !hi.is_finite() {
        return format!("{lo}-{hi}");
    }
    let (scale, unit) = time_unit(hi);
    format!("{}-{} {unit}", sig3(lo * scale), sig3(hi * scale))
}

/// Three significant digits without an exponent (for values >= 0.001).
pub fn sig3(v: f64) -> String {
    let a = v.abs();
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    format!("{v:.decimals$}")
}

/// A fraction as a percentage with one decimal.
pub fn percent(frac: f64) -> String {
    format!("{:.1}%", frac * 100.0)
}

/// Shortens `s` to at most `max` characters, marking the cut with `…`.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_round_trips_and_spells_non_finite() {
        for x in [0.0, 1.5, 0.0123, 1e-7, 3.25e12, -2.5e-9, 123456.789] {
            assert_eq!(exact(x).parse::<f64>().unwrap(), x, "{}", exact(x));
        }
        assert_eq!(exact(1e-7), "1e-7");
        assert_eq!(exact(0.25), "0.25");
        assert_eq!(exact(f64::NAN), "NaN");
        assert_eq!(exact(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(duration_ms(0.02134), "21.3 µs");
        assert_eq!(duration_ms(0.0009), "0.900 µs");
        assert_eq!(duration_ms(12.345), "12.3 ms");
        assert_eq!(duration_ms(2500.0), "2.50 s");
        assert_eq!(duration_range_ms(0.9, 1.2), "0.900-1.20 ms");
        assert_eq!(duration_range_ms(0.0225, 0.03), "22.5-30.0 µs");
        assert_eq!(sci(3.14159e-6), "3.14e-6");
        assert_eq!(percent(0.9134), "91.3%");
    }

    #[test]
    fn clip_counts_characters_not_bytes() {
        assert_eq!(clip("µµµµ", 4), "µµµµ");
        assert_eq!(clip("abcdef", 4), "abc…");
    }
}
