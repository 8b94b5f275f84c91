//! JUnit XML (`run --junit FILE`), the format CI systems read natively: one
//! test case per (case, variant). A failure names the check and metric that
//! tripped, the worst element and the repro command, so a CI page shows why
//! and how to rerun without opening the run directory.

use std::fmt::Write;

use super::{status_word, Counts, RunMeta};
use crate::result::{Check, Row, Status};

/// The whole document. Test time is the variant's median (seconds) where it
/// was timed; xfail rows (forced past the gate, failed as it predicts) are
/// `skipped` with type `xfail`: shown, not counted as failures, as in the
/// other reports.
pub fn render(meta: &RunMeta, rows: &[Row]) -> String {
    let c = Counts::of(rows);
    let (failures, errors, skipped) = (c.failed, c.errors, c.skipped + c.xfailed);
    let secs: f64 = rows.iter().filter_map(|r| r.median_ms("variant")).sum::<f64>() / 1e3;
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"mlabench\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{secs:.3}\">",
        rows.len()
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{secs:.3}\" timestamp=\"{}\">",
        attr(&meta.run_id),
        rows.len(),
        attr(&meta.started)
    );
    s.push_str("    <properties>\n");
    let mut props = vec![
        ("command", meta.command.clone()),
        ("backend", meta.backend.clone()),
        ("device", meta.device.name.clone()),
        ("scenarios", meta.scenarios.join(" ")),
        (
            "completeness",
            super::Completeness::of(meta.planned, rows.len()).to_string(),
        ),
    ];
    if let Some(k) = &meta.kernels {
        props.push(("kernels_sha256", k.sha256.clone()));
    }
    for (k, v) in props {
        let _ = writeln!(s, "      <property name=\"{k}\" value=\"{}\"/>", attr(&v));
    }
    s.push_str("    </properties>\n");
    for r in rows {
        testcase(&mut s, r);
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

fn testcase(s: &mut String, r: &Row) {
    let time = r
        .median_ms("variant")
        .filter(|t| t.is_finite())
        .map(|t| format!(" time=\"{:.6}\"", t / 1e3))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "    <testcase name=\"{}\" classname=\"mlabench.{}\"{time}>",
        attr(&r.case_id),
        attr(&r.variant)
    );
    match r.status {
        Status::Pass => {}
        Status::Fail => {
            let failing: Vec<&Check> = r.checks.iter().filter(|c| c.level == "kernel" && !c.pass).collect();
            let kind = failing.first().map_or("check", |c| c.tripped());
            let mut body = String::new();
            for c in &failing {
                let m = &c.metrics;
                let _ = writeln!(
                    body,
                    "{}: {} (cos_diff {:e}, max_abs {:e}, mismatch {:e}; worst element [{}]: out {} vs ref {})",
                    c.tensor, c.why, m.cos_diff, m.max_abs, m.mismatch, m.worst_index, m.worst_out, m.worst_ref
                );
            }
            if failing.is_empty() {
                let _ = writeln!(body, "{}", r.reason);
            }
            let _ = writeln!(body, "repro: {}", r.repro);
            let _ = writeln!(
                s,
                "      <failure type=\"{kind}\" message=\"{}\">{}</failure>",
                attr(&r.reason),
                text(&body)
            );
        }
        Status::Error => {
            let _ = writeln!(
                s,
                "      <error type=\"error\" message=\"{}\">{}</error>",
                attr(&r.reason),
                text(&format!("{}\nrepro: {}\n", r.reason, r.repro))
            );
        }
        Status::Skip | Status::XFail => {
            let _ = writeln!(
                s,
                "      <skipped type=\"{}\" message=\"{}\"/>",
                status_word(r.status),
                attr(&r.reason)
            );
        }
    }
    let _ = writeln!(
        s,
        "      <system-out>{}</system-out>",
        text(&format!("plan: {}\ngate: {}\nrepro: {}\n", r.plan, r.gate, r.repro))
    );
    s.push_str("    </testcase>\n");
}

/// XML 1.0 text: the five entities escaped, control characters it cannot
/// hold replaced.
fn text(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => o.push('\u{FFFD}'),
            c => o.push(c),
        }
    }
    o
}

/// An attribute value: as [`text`], with newlines kept as character references.
fn attr(s: &str) -> String {
    text(s)
        .replace('\n', "&#10;")
        .replace('\r', "&#13;")
        .replace('\t', "&#9;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{meta, row, skipped};

    #[test]
    fn one_test_case_per_row_with_failures_naming_metric_element_and_repro() {
        let mut bad = row("mla-b4@1a2b3c4d", "ps1", Status::Fail, "cuda-events");
        bad.checks[0].why = "cos_diff 3.100e-2 >= 1.0e-5; worst element [17]: out 0.5 vs ref 0.497".into();
        let mut err = row("mla-b5", "page64", Status::Error, "cuda-events");
        err.reason = "kernel fault <illegal address> & more".into();
        let mut x = row("mla-b6", "page64", Status::XFail, "cuda-events");
        x.reason = "fails as the gate predicts".into();
        let rows = vec![
            row("mla-b3", "ps1", Status::Pass, "cuda-events"),
            bad,
            err,
            x,
            skipped("mla-b7", "page64"),
        ];
        let xml = render(&meta(), &rows);
        assert_eq!(xml.matches("<testcase ").count(), 5);
        assert!(
            xml.contains("<testsuites name=\"mlabench\" tests=\"5\" failures=\"1\" errors=\"1\""),
            "{xml}"
        );
        assert!(xml.contains("skipped=\"2\""), "xfail and skip are both skipped: {xml}");
        let fail = &xml[xml.find("<failure").unwrap()..xml.find("</failure>").unwrap()];
        assert!(fail.contains("type=\"cos_diff\""), "{fail}");
        assert!(fail.contains("worst element [17]"), "{fail}");
        assert!(fail.contains("repro: mlabench run scenarios/smoke.toml --case mla-b4@1a2b3c4d --variant ps1"));
        assert!(
            xml.contains("message=\"kernel fault &lt;illegal address&gt; &amp; more\""),
            "{xml}"
        );
        assert!(xml.contains("<skipped type=\"xfail\""));
        // The variant median 0.025 ms is the test's time in seconds.
        assert!(xml.contains("time=\"0.000025\""), "{xml}");
    }

    #[test]
    fn text_escapes_entities_and_drops_control_characters() {
        assert_eq!(text("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
        assert_eq!(text("x\u{1}y\nz"), "x\u{FFFD}y\nz");
        assert_eq!(attr("one\ntwo"), "one&#10;two");
        let mut c = crate::report::testutil::check("o", 1.0, 1.0, false);
        for (why, kind) in [
            ("lse max_abs 2e-3 > 1e-3", "lse_max_abs"),
            (
                "12 of 40 elements never written (still hold the poison value)",
                "unwritten",
            ),
            ("nondeterministic: launch 2 differs ... cos_diff", "nondeterministic"),
            ("something else", "check"),
        ] {
            c.why = why.into();
            assert_eq!(c.tripped(), kind, "{why}");
        }
    }
}
