//! Baseline comparison in and out: entries from a committed rows.csv or
//! from this run's rows, and the verdicts as a terminal table or Markdown
//! (for the comment a CI job attaches to a pull request).

use anyhow::{anyhow, Context, Result};
use comfy_table::{Cell, CellAlignment, Color};

use super::format::{clip, duration_ms};
use super::status_word;
use super::table::{new_table, Look};
use crate::judge::baseline::{geomean_ratio, tally, Delta, Entry, Timing, Verdict};
use crate::result::Row;

/// Which timed region to compare: `variant` (kernel + merge/reduce) or `kernel`.
pub fn check_region(region: &str) -> Result<()> {
    match region {
        "variant" | "kernel" => Ok(()),
        r => Err(anyhow!("region '{r}': use 'variant' or 'kernel'")),
    }
}

/// Entries of this run's rows.
pub fn entries_from_rows(rows: &[Row], region: &str) -> Vec<Entry> {
    rows.iter()
        .map(|r| {
            let l = super::latency(r, region);
            Entry {
                case_id: r.case_id.clone(),
                variant: r.variant.clone(),
                status: status_word(r.status).to_string(),
                clock: l.map(|l| l.clock.clone()).unwrap_or_default(),
                timing: l.map(|l| Timing {
                    median: l.summary.median,
                    p10: l.summary.p10,
                    p90: l.summary.p90,
                }),
            }
        })
        .collect()
}

/// Entries of a rows.csv (see `report::csv::HEADER`); `what` names the file
/// in errors.
pub fn entries_from_csv(bytes: &[u8], region: &str, what: &str) -> Result<Vec<Entry>> {
    let mut r = ::csv::Reader::from_reader(bytes);
    let header = r.headers().with_context(|| format!("{what}: no CSV header"))?.clone();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| anyhow!("{what}: no '{name}' column; is this an mlabench rows.csv?"))
    };
    let (ci, vi, si, ki) = (col("case_id")?, col("variant")?, col("status")?, col("clock")?);
    let (mi, p10i, p90i) = (
        col(&format!("{region}_median_ms"))?,
        col(&format!("{region}_p10_ms"))?,
        col(&format!("{region}_p90_ms"))?,
    );
    let mut out = Vec::new();
    for (line, rec) in r.records().enumerate() {
        let rec = rec.with_context(|| format!("{what}: line {}", line + 2))?;
        let num = |i: usize| -> Result<Option<f64>> {
            let s = rec.get(i).unwrap_or("").trim();
            if s.is_empty() {
                return Ok(None);
            }
            s.parse::<f64>()
                .map(Some)
                .map_err(|_| anyhow!("{what}: line {}: '{s}' is not a number", line + 2))
        };
        let timing = match (num(mi)?, num(p10i)?, num(p90i)?) {
            (Some(median), Some(p10), Some(p90)) => Some(Timing { median, p10, p90 }),
            _ => None,
        };
        out.push(Entry {
            case_id: rec.get(ci).unwrap_or("").to_string(),
            variant: rec.get(vi).unwrap_or("").to_string(),
            status: rec.get(si).unwrap_or("").to_string(),
            clock: if timing.is_some() {
                rec.get(ki).unwrap_or("").to_string()
            } else {
                String::new()
            },
            timing,
        });
    }
    Ok(out)
}

fn word(v: Verdict) -> &'static str {
    match v {
        Verdict::Broke => "BROKE",
        Verdict::Slower => "SLOWER",
        Verdict::Fixed => "fixed",
        Verdict::Faster => "faster",
        Verdict::Same => "same",
        Verdict::OtherClock => "other clock",
        Verdict::HostClock => "cpu clock, not judged",
        Verdict::Untimed => "untimed",
        Verdict::New => "new",
        Verdict::Missing => "missing",
    }
}

fn ms(e: &Option<Entry>) -> String {
    match e {
        Some(Entry { timing: Some(t), .. }) => duration_ms(t.median),
        Some(e) => e.status.clone(),
        None => "-".into(),
    }
}

fn change(d: &Delta) -> String {
    d.ratio
        .map(|r| format!("{:+.1}%", (r - 1.0) * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// `2 slower, 1 faster, 40 same (geomean +1.2%)`.
pub fn summary_line(deltas: &[Delta]) -> String {
    let parts: Vec<String> = tally(deltas)
        .iter()
        .map(|(v, n)| format!("{n} {}", word(*v).to_lowercase()))
        .collect();
    let g = geomean_ratio(deltas)
        .map(|g| format!(" (geomean {:+.1}%)", (g - 1.0) * 100.0))
        .unwrap_or_default();
    format!("{}{g}", parts.join(", "))
}

/// Rows that changed (verdicts other than `same`), worst first; at most
/// `limit` rows, plus a line that says how many were left out.
pub fn table(deltas: &[Delta], tty: bool, limit: usize) -> String {
    let shown: Vec<&Delta> = deltas.iter().filter(|d| d.verdict != Verdict::Same).collect();
    if shown.is_empty() {
        return "no row changed beyond the threshold".into();
    }
    let mut t = new_table(
        Look { tty, width: None },
        &["case", "variant", "baseline", "now", "change", "verdict"],
    );
    for d in shown.iter().take(limit) {
        let mut v = Cell::new(word(d.verdict));
        if tty {
            v = v.fg(match d.verdict {
                Verdict::Broke | Verdict::Slower => Color::Red,
                Verdict::Fixed | Verdict::Faster => Color::Green,
                _ => Color::Reset,
            });
        }
        t.add_row(vec![
            Cell::new(clip(&d.case_id, 64)),
            Cell::new(&d.variant),
            Cell::new(ms(&d.base)).set_alignment(CellAlignment::Right),
            Cell::new(ms(&d.cand)).set_alignment(CellAlignment::Right),
            Cell::new(change(d)).set_alignment(CellAlignment::Right),
            v,
        ]);
    }
    let mut s = t.to_string();
    if shown.len() > limit {
        s.push_str(&format!("\n({} more changed rows not shown)", shown.len() - limit));
    }
    s
}

/// The whole comparison as Markdown; `kernels` is the line saying whether
/// the two runs compiled the same kernel sources.
pub fn markdown(deltas: &[Delta], baseline: &str, threshold: f64, region: &str, kernels: &str) -> String {
    let regressed = deltas.iter().any(|d| d.verdict.is_regression());
    let mut s = format!(
        "## mlabench: {} against `{baseline}`\n\n{} rows; {region} time; a change counts past {:.1}% and outside the baseline's p10..p90. {kernels}.\n\n**{}**\n\n",
        if regressed { "regression" } else { "no regression" },
        deltas.len(),
        threshold * 100.0,
        summary_line(deltas)
    );
    let changed: Vec<&Delta> = deltas.iter().filter(|d| d.verdict != Verdict::Same).collect();
    if changed.is_empty() {
        s.push_str("No row changed beyond the threshold.\n");
        return s;
    }
    s.push_str("| case | variant | baseline | now | change | verdict |\n| --- | --- | ---: | ---: | ---: | --- |\n");
    for d in changed {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            d.case_id,
            d.variant,
            ms(&d.base),
            ms(&d.cand),
            change(d),
            word(d.verdict)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::baseline::compare;
    use crate::report::testutil as fixtures;
    use crate::result::Status;

    #[test]
    fn csv_round_trip_and_verdicts() {
        let a = fixtures::row("c1", "ps1", Status::Pass, "cuda-events");
        let b = fixtures::skipped("c2", "page64");
        let rows = vec![a.clone(), b];
        let bytes = crate::report::csv::render(&rows).unwrap();
        let from_csv = entries_from_csv(&bytes, "variant", "rows.csv").unwrap();
        assert_eq!(from_csv, entries_from_rows(&rows, "variant"));
        assert!(from_csv[0].timing.is_some() && from_csv[1].timing.is_none());

        let mut slow = a.clone();
        for l in &mut slow.latency {
            l.summary.median *= 2.0;
            l.summary.p10 *= 2.0;
            l.summary.p90 *= 2.0;
        }
        let d = compare(&from_csv, &entries_from_rows(&[slow], "variant"), 0.05);
        assert_eq!(d[0].verdict, Verdict::Slower);
        assert_eq!(d[1].verdict, Verdict::Missing);
        let md = markdown(&d, "base/rows.csv", 0.05, "variant", "kernels: sources differ");
        assert!(md.contains("## mlabench: regression"), "{md}");
        assert!(
            md.contains("outside the baseline's p10..p90. kernels: sources differ.\n"),
            "{md}"
        );
        assert!(
            md.contains("| `c1` | ps1 |") && md.contains("+100.0%") && md.contains("SLOWER"),
            "{md}"
        );
        let t = table(&d, false, 1);
        assert!(
            t.contains("SLOWER") && t.contains("(1 more changed rows not shown)"),
            "{t}"
        );
        assert!(summary_line(&d).starts_with("1 slower, 1 missing"));
    }

    #[test]
    fn bad_csv_names_the_problem() {
        let e = entries_from_csv(b"a,b\n1,2\n", "variant", "x.csv").unwrap_err();
        assert!(format!("{e}").contains("x.csv: no 'case_id' column"), "{e}");
        assert!(check_region("kernel").is_ok() && check_region("wall").is_err());
    }
}
