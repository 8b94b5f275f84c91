//! Terminal tables: one for correctness, one for speed. Status words are
//! upper-case so a failure stands out without color; color is added only
//! when the caller says stdout is a terminal.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Attribute, Cell, CellAlignment, Color, ColumnConstraint, ContentArrangement, Table, Width};

use super::format::{clip, duration_ms, duration_range_ms, percent, sci, sig3};
use super::{clock, has_cpu_timings, latency, lse_error, quant_noise, tc_ceilings, worst_output, Counts, CPU_TIMINGS};
use crate::result::{Row, Status};

/// The gate/plan column wraps between these widths; everything else keeps
/// its content width so case ids and numbers never break. Past the lower
/// bound the table grows wider than the terminal rather than turn to mush.
const NOTE_WIDTH: u16 = 48;
const NOTE_MIN_WIDTH: u16 = 24;

/// How to draw: `tty` turns on color and terminal-width fitting; `width`
/// overrides the terminal's width.
#[derive(Clone, Copy, Debug)]
pub(super) struct Look {
    pub tty: bool,
    pub width: Option<u16>,
}

/// Correctness per row: status, gate and plan, worst tensor and its errors.
pub fn errors_table(rows: &[Row], tty: bool) -> String {
    errors(rows, Look { tty, width: None }).to_string()
}

/// Latency and throughput of the timed rows, under a title that names the
/// clock (and says so loudly when it is the host's).
pub fn latency_table(rows: &[Row], tty: bool) -> String {
    let (title, table) = latencies(rows, Look { tty, width: None });
    match table {
        Some(t) => format!("{title}\n{t}"),
        None => title,
    }
}

/// `N passed, N failed, N skipped, N errors`.
pub fn summary_line(rows: &[Row]) -> String {
    Counts::of(rows).to_string()
}

pub(super) fn new_table(look: Look, header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    if look.tty {
        t.enforce_styling();
    } else {
        t.force_no_tty();
    }
    if let Some(w) = look.width {
        t.set_width(w);
    }
    t.set_content_arrangement(ContentArrangement::Dynamic);
    t.set_header(header.iter().map(|h| Cell::new(h).add_attribute(Attribute::Bold)));
    t
}

/// Every column keeps its content width except `wrap`, which is bounded.
fn constrain(t: &mut Table, wrap: Option<usize>) {
    for (i, col) in t.column_iter_mut().enumerate() {
        if Some(i) == wrap {
            col.set_constraint(ColumnConstraint::Boundaries {
                lower: Width::Fixed(NOTE_MIN_WIDTH),
                upper: Width::Fixed(NOTE_WIDTH),
            });
        } else {
            col.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
}

fn status_cell(s: Status, tty: bool) -> Cell {
    let (word, color) = match s {
        Status::Pass => ("PASS", Color::Green),
        Status::Fail => ("FAIL", Color::Red),
        Status::XFail => ("XFAIL", Color::Yellow),
        Status::Skip => ("SKIP", Color::DarkGrey),
        Status::Error => ("ERROR", Color::Red),
    };
    let cell = Cell::new(word);
    if !tty {
        return cell;
    }
    let cell = cell.fg(color);
    if matches!(s, Status::Fail | Status::Error) {
        cell.add_attribute(Attribute::Bold)
    } else {
        cell
    }
}

fn num(text: String) -> Cell {
    Cell::new(text).set_alignment(CellAlignment::Right)
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> Cell {
    num(x.map(f).unwrap_or_else(|| "-".to_string()))
}

/// The gate's verdict word, then why the row did not pass (or, when it
/// did, the plan). Rows that never ran show only why.
fn note(r: &Row) -> String {
    let max = 2 * NOTE_WIDTH as usize;
    if matches!(r.status, Status::Skip | Status::Error) {
        return clip(&r.reason, max);
    }
    let detail = if r.status == Status::Pass || r.reason.is_empty() {
        &r.plan
    } else {
        &r.reason
    };
    let verdict = r.gate.split(':').next().unwrap_or("").trim();
    let forced = if r.forced { " (forced)" } else { "" };
    match (verdict.is_empty(), detail.is_empty()) {
        (true, _) => clip(detail, max),
        (false, true) => format!("{verdict}{forced}"),
        (false, false) => format!("{verdict}{forced}; {}", clip(detail, max)),
    }
}

fn errors(rows: &[Row], look: Look) -> Table {
    let mut t = new_table(
        look,
        &[
            "case",
            "variant",
            "status",
            "gate / plan / why",
            "worst",
            "cos_diff",
            "max_abs",
            "mismatch",
            "lse err",
            "fp8 noise",
            "rows",
        ],
    );
    for r in rows {
        let w = worst_output(r);
        let m = w.map(|c| &c.metrics);
        let checked = if r.checks.is_empty() {
            "-".to_string()
        } else {
            format!("{}/{}", r.rows_checked, r.rows_total)
        };
        t.add_row(vec![
            Cell::new(&r.case_id),
            Cell::new(&r.variant),
            status_cell(r.status, look.tty),
            Cell::new(note(r)),
            Cell::new(w.map_or("-", |c| c.tensor.as_str())),
            opt(m.map(|m| m.cos_diff), sci),
            opt(m.map(|m| m.max_abs), sci),
            opt(m.map(|m| m.mismatch), sci),
            opt(lse_error(r), sci),
            opt(quant_noise(r), sci),
            num(checked),
        ]);
    }
    constrain(&mut t, Some(3));
    t
}

fn latencies(rows: &[Row], look: Look) -> (String, Option<Table>) {
    let timed: Vec<&Row> = rows.iter().filter(|r| !r.latency.is_empty()).collect();
    let mut clocks: Vec<&str> = timed.iter().filter_map(|r| clock(r)).collect();
    clocks.sort_unstable();
    clocks.dedup();
    if timed.is_empty() {
        return ("Latency and throughput: no row was timed".to_string(), None);
    }
    // What %TC is of: named in the title when one ceiling serves every
    // row, else in a column.
    let ceilings = tc_ceilings(rows);
    let tc = match ceilings.as_slice() {
        [(label, _)] => format!("; %TC of {label}"),
        _ => String::new(),
    };
    let title = if has_cpu_timings(rows) {
        format!("{CPU_TIMINGS}; clock: {}{tc}", clocks.join(", "))
    } else {
        format!("Latency and throughput (medians; clock: {}{tc})", clocks.join(", "))
    };
    let mixed = clocks.len() > 1;
    let mixed_tc = ceilings.len() > 1;
    let mut header = vec![
        "case",
        "variant",
        "status",
        "kernel median",
        "variant median",
        "p10-p90",
        "spread",
        "median ±",
        "GB/s",
        "TFLOP/s",
        "%BW",
        "%TC",
    ];
    if mixed_tc {
        header.push("%TC of");
    }
    if mixed {
        header.push("clock");
    }
    let mut t = new_table(look, &header);
    for r in timed {
        let v = latency(r, "variant")
            .or_else(|| latency(r, "kernel"))
            .map(|l| &l.summary);
        // One sample has no spread to show: say so instead of "910-910 us, 0.0%".
        let single = v.is_some_and(|s| s.n < 2);
        let range = v.map(|s| {
            if single {
                "1 sample".to_string()
            } else {
                duration_range_ms(s.p10, s.p90)
            }
        });
        let mut cells = vec![
            Cell::new(&r.case_id),
            Cell::new(&r.variant),
            status_cell(r.status, look.tty),
            opt(latency(r, "kernel").map(|l| l.summary.median), duration_ms),
            opt(latency(r, "variant").map(|l| l.summary.median), duration_ms),
            num(range.unwrap_or_else(|| "-".to_string())),
            opt(v.filter(|_| !single).map(|s| s.rel_spread), percent),
            num(noise_text(r)),
            opt(r.gbps, sig3),
            opt(r.tflops, sig3),
            opt(r.frac_bw, percent),
            opt(r.frac_tc, percent),
        ];
        if mixed_tc {
            cells.push(Cell::new(r.tc_ceiling_label().unwrap_or("-")));
        }
        if mixed {
            cells.push(Cell::new(clock(r).unwrap_or("-")));
        }
        t.add_row(cells);
    }
    constrain(&mut t, None);
    (title, Some(t))
}

/// The variant region's median noise (the kernel's without one), and
/// `capped` when sampling stopped at `--max-time-ms` short of the target.
pub fn noise_text(r: &Row) -> String {
    let Some(l) = latency(r, "variant").or_else(|| latency(r, "kernel")) else {
        return "-".into();
    };
    if l.summary.n < 2 || !l.summary.noise.is_finite() {
        return "-".into();
    }
    let capped = r.latency.iter().any(|l| l.capped);
    format!(
        "{}{}",
        percent(l.summary.noise),
        if capped { " noise-capped" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{row, skipped};

    const LONG_ID: &str = "mla-kimi_k3-b64-ctx32768x64-h12xdcp8-s1-sq3-fp8-page64-target_gfx950";

    fn plain(width: u16) -> Look {
        Look {
            tty: false,
            width: Some(width),
        }
    }

    #[test]
    fn failures_are_visible_without_color_and_ids_do_not_wrap() {
        let mut fail = row(LONG_ID, "page64", Status::Fail, "cuda-events");
        fail.forced = true;
        fail.gate = "rejected: page64 has no global mask for s_q > 1 under DCP".into();
        let rows = vec![
            row(LONG_ID, "ps1", Status::Pass, "cuda-events"),
            fail,
            skipped(LONG_ID, "page64"),
        ];
        let text = errors(&rows, plain(100)).to_string();
        assert!(!text.contains('\u{1b}'), "no escape codes when not a tty");
        let fail_line = text.lines().find(|l| l.contains("FAIL")).expect("a FAIL line");
        assert!(fail_line.contains(LONG_ID), "the id sits whole on the FAIL line");
        assert!(fail_line.contains("rejected (forced); o:"), "{fail_line}");
        assert!(fail_line.contains("3.10e-2"));
        assert!(text
            .lines()
            .any(|l| l.contains("PASS") && l.contains("2.00e-7") && l.contains("8/8")));
        assert!(text
            .lines()
            .any(|l| l.contains("SKIP") && l.contains("rejected: page64")));
        // The narrow width wrapped the note column, never the id.
        assert_eq!(text.matches(LONG_ID).count(), 3);
    }

    #[test]
    fn color_only_on_a_tty() {
        let rows = vec![row("a", "ps1", Status::Fail, "cuda-events")];
        let text = errors(
            &rows,
            Look {
                tty: true,
                width: Some(120),
            },
        )
        .to_string();
        assert!(text.contains('\u{1b}'));
        assert!(text.contains("FAIL"));
    }

    #[test]
    fn cpu_timings_are_labelled() {
        let rows = vec![row("a", "ps1", Status::Pass, "cpu-wall"), skipped("b", "page64")];
        let (title, table) = latencies(&rows, plain(200));
        assert!(title.starts_with(CPU_TIMINGS), "{title}");
        let text = table.unwrap().to_string();
        assert!(!text.contains("b "), "untimed rows stay out");
        let line = text.lines().find(|l| l.contains(" a ")).unwrap();
        for want in [
            "21.0 µs",
            "25.0 µs",
            "22.5-30.0 µs",
            "30.0%",
            "4000",
            "160",
            "90.0%",
            "20.0%",
        ] {
            assert!(line.contains(want), "{want} missing from {line}");
        }
        let (gpu_title, _) = latencies(&[row("a", "ps1", Status::Pass, "cuda-events")], plain(200));
        assert!(!gpu_title.contains("CPU"));
        assert!(gpu_title.contains("cuda-events"));
    }

    #[test]
    fn mixed_clocks_get_a_column_and_nothing_timed_says_so() {
        let rows = vec![
            row("a", "ps1", Status::Pass, "cuda-events"),
            row("b", "ps1", Status::Pass, "cuda-graph"),
        ];
        let text = latencies(&rows, plain(200)).1.unwrap().to_string();
        assert!(text.lines().any(|l| l.contains(" b ") && l.contains("cuda-graph")));
        assert_eq!(
            latency_table(&[skipped("a", "ps1")], false),
            "Latency and throughput: no row was timed"
        );
    }

    #[test]
    fn the_tensor_ceiling_is_named_once_or_per_row() {
        let mut rows = vec![
            row("a", "ps1", Status::Pass, "cuda-events"),
            row("b", "v4_split", Status::Pass, "cuda-events"),
        ];
        let (title, table) = latencies(&rows, plain(250));
        assert!(title.ends_with("clock: cuda-events; %TC of wgmma e4m3)"), "{title}");
        assert!(!table.unwrap().to_string().contains("%TC of"));
        rows[1].tc_ceiling = Some("mma.sync bf16".into());
        let (title, table) = latencies(&rows, plain(250));
        assert!(!title.contains("%TC"), "{title}");
        let text = table.unwrap().to_string();
        assert!(
            text.lines()
                .any(|l| l.contains("%TC of") && l.contains("variant median")),
            "{text}"
        );
        assert!(text.lines().any(|l| l.contains(" b ") && l.contains("mma.sync bf16")));
        assert!(text.lines().any(|l| l.contains(" a ") && l.contains("wgmma e4m3")));
    }

    #[test]
    fn summary_counts() {
        let rows = vec![
            row("a", "ps1", Status::Pass, "cpu-wall"),
            row("b", "ps1", Status::Error, "cpu-wall"),
        ];
        assert_eq!(summary_line(&rows), "1 passed, 0 failed, 0 skipped, 1 errors");
    }
}
