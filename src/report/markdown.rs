//! summary.md for CI: who ran what where, the counts, then failures first
//! with the command that reruns each one, then every result, then the
//! device ceilings the fractions of peak are taken from.

use std::fmt::Write;

use super::format::{duration_ms, percent, sci, sig3};
use super::{has_cpu_timings, latency, status_word, worst_output, Counts, RunMeta, CPU_TIMINGS};
use crate::result::{Row, Status};
use crate::tensor_ceiling::MmaKind;

/// The whole summary.
pub fn render(meta: &RunMeta, rows: &[Row]) -> String {
    let mut s = String::new();
    header(&mut s, meta);
    let counts = Counts::of(rows);
    let done = super::Completeness::of(meta.planned, rows.len());
    if done.is_incomplete() {
        let _ = writeln!(
            s,
            "> **This run is {done}.** The rest never ran; finish it with `mlabench run ... --resume <this run directory>`.\n"
        );
    }
    let _ = writeln!(s, "**{counts}** ({done})\n");
    failures(&mut s, rows);
    xfails(&mut s, rows);
    let peers = super::peers::groups(rows);
    if !peers.is_empty() {
        s.push_str(&super::peers::markdown(&peers));
        s.push('\n');
    }
    s.push_str(&super::dcp_steps::markdown(rows));
    results(&mut s, rows);
    ceilings(&mut s, meta, rows);
    s
}

fn header(s: &mut String, meta: &RunMeta) {
    let d = &meta.device;
    let _ = writeln!(s, "# mlabench run `{}`\n", meta.run_id);
    let _ = writeln!(
        s,
        "- device: {} ({}, {} compute units, L2 {} MiB)",
        d.name,
        d.backend,
        d.compute_units,
        d.l2_bytes >> 20
    );
    let _ = writeln!(s, "- backend: {}", meta.backend);
    let _ = writeln!(s, "- started: {} (mlabench {})", meta.started, meta.mlabench_version);
    let _ = writeln!(s, "- command: {}", code(&meta.command));
    if let Some(k) = &meta.kernels {
        let _ = writeln!(
            s,
            "- kernels: {} ({} CUDA sources), sha256 {}",
            code(&k.dir),
            k.files,
            code(k.short())
        );
    }
    let _ = writeln!(s, "- ps1 schedule: {}", meta.ps1_schedule);
    if meta.v4_core != crate::case::V4CoreChoice::Auto {
        let _ = writeln!(s, "- V4 core: {} (forced by --v4-core)", meta.v4_core);
    }
    let _ = writeln!(s, "- merge hand-off: {}", handoff_words(meta.handoff));
    for i in &meta.implementations {
        let _ = writeln!(s, "- {i}");
    }
    for c in &meta.resumed {
        let _ = writeln!(s, "- resumed by: {}", code(c));
    }
    let _ = writeln!(s, "- scenarios: {}", meta.scenarios.join(", "));
    let checked = match meta.check_rows {
        Some(n) => format!("a seeded sample of up to {n} query rows per case"),
        None => "every query row".to_string(),
    };
    let _ = writeln!(s, "- checked: {checked}\n");
}

fn failures(s: &mut String, rows: &[Row]) {
    let failed: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.status, Status::Fail | Status::Error))
        .collect();
    if failed.is_empty() {
        let _ = writeln!(s, "## Failures\n\nNone.\n");
        return;
    }
    let _ = writeln!(s, "## Failures\n");
    let _ = writeln!(s, "| case | variant | status | reason | repro |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for r in failed {
        let _ = writeln!(
            s,
            "| {} | {} | **{}** | {} | {} |",
            cell(&r.case_id),
            cell(&r.variant),
            status_word(r.status).to_uppercase(),
            cell(&r.reason),
            code(&r.repro)
        );
    }
    s.push('\n');
}

/// Forced runs the gate rejects: expected to fail, shown because that
/// failure is the bug the gate prevents.
fn xfails(s: &mut String, rows: &[Row]) {
    let x: Vec<&Row> = rows.iter().filter(|r| r.status == Status::XFail).collect();
    if x.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Failed as the gate predicts (forced)\n");
    let _ = writeln!(s, "| case | variant | gate | reason | repro |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for r in x {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            cell(&r.case_id),
            cell(&r.variant),
            cell(&r.gate),
            cell(&r.reason),
            code(&r.repro)
        );
    }
    s.push('\n');
}

fn results(s: &mut String, rows: &[Row]) {
    let _ = writeln!(s, "## Results\n");
    if has_cpu_timings(rows) {
        let _ = writeln!(s, "> {CPU_TIMINGS}\n");
    }
    let _ = writeln!(
        s,
        "| case | variant | status | worst cos_diff | kernel median | variant median | GB/s | %BW |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let dash = || "-".to_string();
        let status = match r.status {
            Status::Fail | Status::Error => format!("**{}**", status_word(r.status).to_uppercase()),
            other => status_word(other).to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&r.case_id),
            cell(&r.variant),
            status,
            worst_output(r).map_or_else(dash, |c| sci(c.metrics.cos_diff)),
            latency(r, "kernel").map_or_else(dash, |l| duration_ms(l.summary.median)),
            latency(r, "variant").map_or_else(dash, |l| duration_ms(l.summary.median)),
            r.gbps.map_or_else(dash, sig3),
            r.frac_bw.map_or_else(dash, percent),
        );
    }
    s.push('\n');
}

fn ceilings(s: &mut String, meta: &RunMeta, rows: &[Row]) {
    let d = &meta.device;
    let measured =
        |x: Option<f64>, unit: &str| x.map_or_else(|| "not measured".to_string(), |v| format!("{} {unit}", sig3(v)));
    let _ = writeln!(s, "## Device ceilings\n");
    let _ = writeln!(
        s,
        "Fractions of peak are taken against these measured rates, not datasheet numbers.\n"
    );
    let _ = writeln!(s, "| ceiling | value |");
    let _ = writeln!(s, "|---|---:|");
    let _ = writeln!(
        s,
        "| copy bandwidth (read + write) | {} |",
        measured(d.copy_gbps, "GB/s")
    );
    for k in MmaKind::ALL {
        let _ = writeln!(
            s,
            "| dense tensor rate, {k} | {} |",
            measured(d.tensor.get(k), "TFLOP/s")
        );
    }
    let _ = writeln!(
        s,
        "| f64 CPU reference | {} |",
        measured(meta.reference_gflops, "GFLOP/s")
    );
    let used = super::tc_ceilings(rows);
    if !used.is_empty() {
        let list: Vec<String> = used
            .iter()
            .map(|(l, n)| format!("{l} ({n} row{})", if *n == 1 { "" } else { "s" }))
            .collect();
        let _ = writeln!(
            s,
            "\n%TC (`frac_tc`) is of the ceiling of each row's tensor instructions (`tc_ceiling`; a mix is bound by each of its rates, `1 / sum(share / rate)`): {}.",
            list.join(", ")
        );
    }
    if !d.details.is_empty() {
        let _ = writeln!(s, "\n## Device details\n");
        for (k, v) in &d.details {
            let _ = writeln!(s, "- {}: {}", k.replace('\n', " "), v.replace('\n', " "));
        }
    }
}

/// Table cell text: pipes escaped, line breaks flattened.
/// The hand-off as a reader of a pull request needs it.
fn handoff_words(h: crate::backend::Handoff) -> &'static str {
    match h {
        crate::backend::Handoff::Pdl => "pdl (programmatic dependent launch of the reduce/merge)",
        crate::backend::Handoff::Stream => "stream (the reduce/merge launches after the forward)",
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// An inline code span that survives backticks and pipes in the text.
fn code(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let fence = if text.contains('`') { "``" } else { "`" };
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{}{pad}{fence}", cell(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{meta, row, skipped};

    #[test]
    fn failures_come_first_with_their_repro() {
        let rows = vec![
            row("mla-ok", "ps1", Status::Pass, "cuda-events"),
            row("mla-bad", "page64", Status::Fail, "cuda-events"),
            skipped("mla-skip", "page64"),
        ];
        let md = render(&meta(), &rows);
        let fail_line = md
            .lines()
            .find(|l| l.starts_with("| mla-bad | page64 | **FAIL**"))
            .expect("failure row");
        assert!(fail_line.contains("o: cos_diff 3.1e-2 > 1e-5"));
        assert!(fail_line.contains("`mlabench run scenarios/smoke.toml --case mla-bad --variant page64`"));
        let fail_at = md.find(fail_line).unwrap();
        let results_at = md.find("## Results").unwrap();
        assert!(fail_at < results_at, "failures precede the results table");
        assert!(md.contains("**1 passed, 1 failed, 1 skipped, 0 errors**"));
        assert!(md.contains("| mla-ok | ps1 | pass | 2.00e-7 | 21.0 µs | 25.0 µs | 4000 | 90.0% |"));
        assert!(md.contains("| mla-skip | page64 | skip | - | - | - | - | - |"));
        assert!(md.contains("| copy bandwidth (read + write) | 4200 GB/s |"));
        assert!(md.contains("| f64 CPU reference | not measured |"));
        assert!(md.contains("| dense tensor rate, mma.sync bf16 | 650 TFLOP/s |"));
        assert!(md.contains("| dense tensor rate, wgmma bf16 | 800 TFLOP/s |"));
        assert!(md.contains("| dense tensor rate, wgmma e4m3 | not measured |"));
        assert!(md.contains("(`tc_ceiling`; a mix is bound by each of its rates"));
        assert!(md.contains("`1 / sum(share / rate)`): wgmma e4m3 (2 rows).\n"), "{md}");
        assert!(md.contains("NVIDIA H200 (cuda, 132 compute units, L2 60 MiB)"));
        assert!(md.contains("## Device details\n\n- driver: 13.0\n"));
        assert!(!md.contains(CPU_TIMINGS));
    }

    #[test]
    fn no_failures_and_cpu_timings_are_said() {
        let md = render(&meta(), &[row("a", "ps1", Status::Pass, "cpu-wall")]);
        assert!(md.contains("## Failures\n\nNone."));
        assert!(md.contains(&format!("> {CPU_TIMINGS}")));
    }

    #[test]
    fn forced_gate_failures_get_their_own_section() {
        let mut x = row("mla-dcp", "page64", Status::XFail, "cuda-events");
        x.gate = "rejected: no global mask".into();
        let md = render(&meta(), &[x]);
        assert!(md.contains("## Failures\n\nNone."));
        assert!(md.contains("| mla-dcp | page64 | rejected: no global mask |"));
    }

    #[test]
    fn cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc"), "a\\|b c");
        assert_eq!(code("run `x` | y"), "``run `x` \\| y``");
        assert_eq!(code("`x`"), "`` `x` ``");
    }
}
