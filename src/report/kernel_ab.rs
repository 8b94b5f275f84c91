//! `mlabench ab` out: the pooled A/B verdicts as a terminal table and as
//! Markdown for a pull request.

use comfy_table::{Cell, CellAlignment, Color};

use super::format::{clip, duration_ms};
use super::table::{new_table, Look};
use crate::judge::kernel_ab::{geomean, AbRow, AbVerdict};

fn word(v: AbVerdict) -> &'static str {
    match v {
        AbVerdict::Broke => "BROKE",
        AbVerdict::Slower => "SLOWER",
        AbVerdict::Faster => "faster",
        AbVerdict::Same => "same",
        AbVerdict::Incomplete => "incomplete",
    }
}

fn ms(v: Option<f64>) -> String {
    v.map(duration_ms).unwrap_or_else(|| "-".into())
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:+.1}%", x * 100.0)).unwrap_or_else(|| "-".into())
}

fn spread(v: Option<f64>) -> String {
    v.map(|x| format!("{:.1}%", x * 100.0)).unwrap_or_else(|| "-".into())
}

/// `3 faster, 1 slower, 12 same (geomean -4.2%); control drift up to 2.9%`.
pub fn summary_line(rows: &[AbRow]) -> String {
    let parts: Vec<String> = crate::stats::count(rows.iter().map(|r| r.verdict))
        .iter()
        .map(|(v, n)| format!("{n} {}", word(*v).to_lowercase()))
        .collect();
    let g = geomean(rows)
        .map(|g| format!(" (geomean {:+.1}%)", (g - 1.0) * 100.0))
        .unwrap_or_default();
    let drift = rows
        .iter()
        .filter_map(|r| r.control_spread)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let d = drift
        .map(|d| format!("; control drift up to {:.1}%", d * 100.0))
        .unwrap_or_default();
    format!("{}{g}{d}", parts.join(", "))
}

const HEAD: [&str; 7] = [
    "case",
    "variant",
    "control",
    "candidate",
    "change",
    "drift (ctl/cand)",
    "verdict",
];

/// Every row, worst first, at most `limit`.
pub fn table(rows: &[AbRow], tty: bool, limit: usize) -> String {
    let mut t = new_table(Look { tty, width: None }, &HEAD);
    for r in rows.iter().take(limit) {
        let mut v = Cell::new(word(r.verdict));
        if tty {
            v = v.fg(match r.verdict {
                AbVerdict::Broke | AbVerdict::Slower => Color::Red,
                AbVerdict::Faster => Color::Green,
                _ => Color::Reset,
            });
        }
        let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
        t.add_row(vec![
            Cell::new(clip(&r.case_id, 64)),
            Cell::new(&r.variant),
            right(ms(r.control_ms)),
            right(ms(r.candidate_ms)),
            right(pct(r.ratio.map(|x| x - 1.0))),
            right(format!("{} / {}", spread(r.control_spread), spread(r.candidate_spread))),
            v,
        ]);
    }
    let mut s = t.to_string();
    if rows.len() > limit {
        s.push_str(&format!("\n({} more rows not shown)", rows.len() - limit));
    }
    s
}

/// A run's command without where it wrote (`--out`, `--run-id`) or how
/// loudly (`-q`): what is left is what the run measured.
pub fn essential_command(cmd: &str) -> String {
    let mut out = Vec::new();
    let mut words = cmd.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "--out" | "--run-id" => {
                words.next();
            }
            "-q" | "--quiet" => {}
            _ if w.starts_with("--out=") || w.starts_with("--run-id=") => {}
            _ => out.push(w),
        }
    }
    out.join(" ")
}

/// The whole A/B as Markdown. `control` and `candidate` name each side's
/// runs; `provenance` lines (kernels, commands) follow the verdict.
pub fn markdown(
    rows: &[AbRow],
    control: &[String],
    candidate: &[String],
    threshold: f64,
    region: &str,
    provenance: &[String],
) -> String {
    let regressed = rows.iter().any(|r| r.verdict.is_regression());
    let mut s = format!(
        "## mlabench A/B: {}\n\ncontrol: {}; candidate: {}. {region} time, median over rounds; a change counts past {:.1}% and past both sides' round-to-round drift.\n\n**{}**\n\n",
        if regressed { "regression" } else { "no regression" },
        control.join(", "),
        candidate.join(", "),
        threshold * 100.0,
        summary_line(rows)
    );
    for line in provenance {
        s.push_str(&format!("- {line}\n"));
    }
    if !provenance.is_empty() {
        s.push('\n');
    }
    s.push_str("| case | variant | control | candidate | change | drift (ctl/cand) | verdict |\n");
    s.push_str("| --- | --- | ---: | ---: | ---: | ---: | --- |\n");
    for r in rows {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} / {} | {} |\n",
            r.case_id,
            r.variant,
            ms(r.control_ms),
            ms(r.candidate_ms),
            pct(r.ratio.map(|x| x - 1.0)),
            spread(r.control_spread),
            spread(r.candidate_spread),
            word(r.verdict)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, ratio: f64, verdict: AbVerdict) -> AbRow {
        AbRow {
            case_id: case.into(),
            variant: "ps1".into(),
            control_ms: Some(1.0),
            candidate_ms: Some(ratio),
            ratio: Some(ratio),
            control_spread: Some(0.03),
            candidate_spread: Some(0.01),
            verdict,
        }
    }

    #[test]
    fn table_and_markdown_show_the_change_and_the_drift() {
        let rows = vec![row("a", 1.2, AbVerdict::Slower), row("b", 0.8, AbVerdict::Faster)];
        assert_eq!(
            summary_line(&rows),
            "1 slower, 1 faster (geomean -2.0%); control drift up to 3.0%"
        );
        let t = table(&rows, false, 1);
        assert!(
            t.contains("+20.0%") && t.contains("3.0% / 1.0%") && t.contains("SLOWER"),
            "{t}"
        );
        assert!(t.contains("(1 more rows not shown)"), "{t}");
        let prov = vec!["kernels: the same sources in both runs (sha256 abc)".to_string()];
        let md = markdown(&rows, &["c0-r1".into()], &["c1-r1".into()], 0.02, "variant", &prov);
        assert!(md.starts_with("## mlabench A/B: regression"), "{md}");
        assert!(
            md.contains("\n- kernels: the same sources in both runs (sha256 abc)\n\n| case"),
            "{md}"
        );
        assert!(
            md.contains("| `b` | ps1 | 1.00 ms | 800 µs | -20.0% | 3.0% / 1.0% | faster |"),
            "{md}"
        );
    }

    #[test]
    fn essential_command_drops_where_and_how_loudly_not_what() {
        let cmd = "bin run s.toml --backend cuda --kernels-dir k2 --out /tmp/x --run-id c1-r1 -q --check-rows 16 --pdl";
        assert_eq!(
            essential_command(cmd),
            "bin run s.toml --backend cuda --kernels-dir k2 --check-rows 16 --pdl"
        );
        assert_eq!(
            essential_command("bin run --out=/o --run-id=r a.toml"),
            "bin run a.toml"
        );
    }
}
