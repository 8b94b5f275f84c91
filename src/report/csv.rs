//! rows.csv: a fixed core schema, one line per (case, variant). Workload
//! knobs go to one `params` column (`k=v;k=v`) instead of a wide, mostly
//! empty table. An empty cell means "not measured", never zero; non-finite
//! values are written `NaN`, `inf`, `-inf`.

use ::csv::WriterBuilder;

use super::format::exact;
use super::{clock, latency, lse_error, quant_noise, status_word, worst_output};
use crate::result::Row;

/// The columns, in order.
pub const HEADER: [&str; 40] = [
    "case_id",
    "variant",
    "contract",
    "implementation",
    "impl_version",
    "backend",
    "status",
    "reason",
    "forced",
    "gate",
    "plan",
    "rows_checked",
    "rows_total",
    "worst_tensor",
    "cos_diff",
    "max_abs",
    "max_rel",
    "rel_l2",
    "mismatch",
    "lse_max_abs",
    "quant_cos_diff",
    "kernel_median_ms",
    "kernel_p10_ms",
    "kernel_p90_ms",
    "variant_median_ms",
    "variant_p10_ms",
    "variant_p90_ms",
    "variant_min_ms",
    "rel_spread",
    "samples",
    "noise",
    "noise_capped",
    "clock",
    "gbps",
    "tflops",
    "frac_bw",
    "frac_tc",
    "tc_ceiling",
    "params",
    "repro",
];

/// The whole file: header plus one line per row.
pub fn render(rows: &[Row]) -> anyhow::Result<Vec<u8>> {
    let mut bytes = lines(&[HEADER.map(String::from).to_vec()])?;
    bytes.extend(render_rows(rows)?);
    Ok(bytes)
}

/// The data lines alone, to append to a file that has the header.
pub fn render_rows(rows: &[Row]) -> anyhow::Result<Vec<u8>> {
    lines(&rows.iter().map(record).collect::<Vec<_>>())
}

fn lines(records: &[Vec<String>]) -> anyhow::Result<Vec<u8>> {
    let mut w = WriterBuilder::new().from_writer(Vec::new());
    for r in records {
        w.write_record(r)?;
    }
    w.into_inner().map_err(|e| anyhow::anyhow!("csv: {}", e.error()))
}

fn num(x: Option<f64>) -> String {
    x.map(exact).unwrap_or_default()
}

fn record(r: &Row) -> Vec<String> {
    let worst = worst_output(r);
    let m = worst.map(|c| &c.metrics);
    let k = latency(r, "kernel").map(|l| &l.summary);
    let v = latency(r, "variant").map(|l| &l.summary);
    // Nothing was checked when there are no checks, whatever the counters say.
    let checked = !r.checks.is_empty();
    let params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let record = vec![
        r.case_id.clone(),
        r.variant.clone(),
        r.contract.clone(),
        r.implementation.clone(),
        r.impl_version.clone(),
        r.backend.clone(),
        status_word(r.status).to_string(),
        r.reason.clone(),
        r.forced.to_string(),
        r.gate.clone(),
        r.plan.clone(),
        if checked {
            r.rows_checked.to_string()
        } else {
            String::new()
        },
        if r.rows_total > 0 {
            r.rows_total.to_string()
        } else {
            String::new()
        },
        worst.map(|c| c.tensor.clone()).unwrap_or_default(),
        num(m.map(|m| m.cos_diff)),
        num(m.map(|m| m.max_abs)),
        num(m.map(|m| m.max_rel)),
        num(m.map(|m| m.rel_l2)),
        num(m.map(|m| m.mismatch)),
        num(lse_error(r)),
        num(quant_noise(r)),
        num(k.map(|s| s.median)),
        num(k.map(|s| s.p10)),
        num(k.map(|s| s.p90)),
        num(v.map(|s| s.median)),
        num(v.map(|s| s.p10)),
        num(v.map(|s| s.p90)),
        num(v.map(|s| s.min)),
        num(v.or(k).map(|s| s.rel_spread)),
        v.or(k).map(|s| s.n.to_string()).unwrap_or_default(),
        num(v.or(k).map(|s| s.noise).filter(|x| x.is_finite())),
        if r.latency.is_empty() {
            String::new()
        } else {
            r.latency.iter().any(|l| l.capped).to_string()
        },
        clock(r).unwrap_or_default().to_string(),
        num(r.gbps),
        num(r.tflops),
        num(r.frac_bw),
        num(r.frac_tc),
        r.tc_ceiling_label().unwrap_or_default().to_string(),
        params.join(";"),
        r.repro.clone(),
    ];
    debug_assert_eq!(record.len(), HEADER.len());
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{row, skipped};
    use crate::result::Status;

    fn parse(bytes: &[u8]) -> (Vec<String>, Vec<Vec<String>>) {
        let mut rd = ::csv::ReaderBuilder::new().from_reader(bytes);
        let header = rd.headers().unwrap().iter().map(String::from).collect();
        let rows = rd
            .records()
            .map(|r| r.unwrap().iter().map(String::from).collect())
            .collect();
        (header, rows)
    }

    fn col(name: &str) -> usize {
        HEADER.iter().position(|h| *h == name).unwrap()
    }

    #[test]
    fn header_and_every_line_have_the_fixed_width() {
        let rows = vec![
            row("mla-b4-sq2-dcp8,odd \"id\"", "ps1", Status::Pass, "cuda-events"),
            skipped("mla-b4", "page64"),
        ];
        let (header, lines) = parse(&render(&rows).unwrap());
        assert_eq!(header, HEADER);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.len() == HEADER.len()));
        assert_eq!(
            lines[0][col("quant_cos_diff")],
            "",
            "no quant check in this row: not measured"
        );
        // Quoting kept the comma and quotes inside the id.
        assert_eq!(lines[0][col("case_id")], "mla-b4-sq2-dcp8,odd \"id\"");
        assert_eq!(lines[0][col("params")], "batch=4;s_q=2");
        assert_eq!(lines[0][col("variant_median_ms")], "0.025");
        assert_eq!(lines[0][col("variant_min_ms")], exact(0.025 * 0.85));
        assert_eq!(lines[0][col("worst_tensor")], "o");
        assert_eq!(lines[0][col("lse_max_abs")], "4e-5");
        assert_eq!(lines[0][col("status")], "pass");
        assert_eq!(lines[0][col("tc_ceiling")], "wgmma e4m3");
    }

    #[test]
    fn not_measured_is_empty_but_a_measured_zero_is_zero() {
        let mut timed = row("a", "ps1", Status::Pass, "cuda-events");
        timed.checks[0].metrics.mismatch = 0.0;
        let rows = vec![timed, skipped("b", "page64")];
        let (_, lines) = parse(&render(&rows).unwrap());
        assert_eq!(lines[0][col("mismatch")], "0");
        for name in [
            "rows_checked",
            "rows_total",
            "worst_tensor",
            "cos_diff",
            "lse_max_abs",
            "kernel_median_ms",
            "variant_min_ms",
            "rel_spread",
            "samples",
            "noise",
            "noise_capped",
            "clock",
            "gbps",
            "frac_tc",
            "tc_ceiling",
        ] {
            assert_eq!(lines[1][col(name)], "", "{name} of a skipped row");
        }
        assert_eq!(lines[1][col("status")], "skip");
        assert_eq!(lines[1][col("forced")], "false");
    }

    #[test]
    fn non_finite_metrics_are_spelled_out() {
        let mut r = row("a", "ps1", Status::Fail, "cuda-events");
        r.checks[0].metrics.cos_diff = f64::NAN;
        r.checks[0].metrics.max_abs = f64::INFINITY;
        let (_, lines) = parse(&render(&[r]).unwrap());
        assert_eq!(lines[0][col("cos_diff")], "NaN");
        assert_eq!(lines[0][col("max_abs")], "inf");
    }
}
