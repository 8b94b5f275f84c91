//! rows.json: `{"meta": RunMeta, "rows": [Row, ...]}`, every check included.
//! Non-finite floats are written as strings (see `crate::serde_float`).

use serde::Serialize;

use super::RunMeta;
use crate::result::Row;

#[derive(Serialize)]
struct Document<'a> {
    meta: &'a RunMeta,
    /// `complete` or `incomplete: N of M cases` (read back from `meta`).
    completeness: String,
    rows: &'a [Row],
}

#[derive(serde::Deserialize)]
struct OwnedDocument {
    meta: RunMeta,
    rows: Vec<Row>,
}

/// The whole file, pretty-printed.
pub fn render(meta: &RunMeta, rows: &[Row]) -> anyhow::Result<String> {
    let completeness = super::Completeness::of(meta.planned, rows.len()).to_string();
    let mut s = serde_json::to_string_pretty(&Document {
        meta,
        completeness,
        rows,
    })?;
    s.push('\n');
    Ok(s)
}

/// Reads a rows.json back (for `run --resume`).
pub fn parse(text: &str) -> Result<(RunMeta, Vec<Row>), serde_json::Error> {
    let d: OwnedDocument = serde_json::from_str(text)?;
    Ok((d.meta, d.rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{meta, row, skipped};
    use crate::result::Status;
    use serde_json::Value;

    #[test]
    fn round_trips_with_non_finite_metrics() {
        let mut r = row("mla-b4", "ps1", Status::Fail, "cuda-events");
        r.checks[1].metrics.worst_ref = f64::NEG_INFINITY;
        r.checks[1].metrics.max_rel = f64::NAN;
        r.checks[1].metrics.max_abs = f64::INFINITY;
        let mut m = meta();
        m.reference_gflops = Some(12.5);
        let text = render(&m, &[r, skipped("mla-b4", "page64")]).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let lse = &v["rows"][0]["checks"][1];
        assert_eq!(lse["tensor"], "lse");
        assert_eq!(lse["metrics"]["worst_ref"], "-Infinity");
        assert_eq!(lse["metrics"]["max_rel"], "NaN");
        assert_eq!(lse["metrics"]["max_abs"], "Infinity");
        assert_eq!(v["rows"][0]["checks"][0]["metrics"]["max_abs"], 3e-3);
        assert_eq!(v["rows"][0]["status"], "fail");
        assert_eq!(v["rows"][1]["gbps"], Value::Null);
        assert_eq!(v["rows"][1]["status"], "skip");
        assert_eq!(v["meta"]["reference_gflops"], 12.5);
        assert_eq!(v["meta"]["device"]["details"][0][1], "13.0");
        assert_eq!(v["rows"].as_array().unwrap().len(), 2);
        // And back: every float, non-finite ones included, and None stay.
        let (m2, rows2) = parse(&text).unwrap();
        assert_eq!(m2.reference_gflops, Some(12.5));
        let l = &rows2[0].checks[1].metrics;
        assert!(l.max_rel.is_nan() && l.max_abs == f64::INFINITY && l.worst_ref == f64::NEG_INFINITY);
        assert_eq!(rows2[1].gbps, None);
        assert_eq!(rows2[0].status, Status::Fail);
        assert_eq!(render(&m2, &rows2).unwrap(), text);
    }

    /// Every float the report holds, set to NaN: none may turn into `null`
    /// (the silent serde_json default), so no float field lacks its attribute.
    #[test]
    fn no_float_field_becomes_null() {
        let mut r = row("mla-b4", "ps1", Status::Pass, "cuda-graph");
        let nan = f64::NAN;
        for c in &mut r.checks {
            let m = &mut c.metrics;
            (m.max_abs, m.max_rel, m.worst_out, m.worst_ref) = (nan, nan, nan, nan);
            (m.rel_l2, m.cos_diff, m.mismatch) = (nan, nan, nan);
        }
        for l in &mut r.latency {
            let s = &mut l.summary;
            (s.median, s.p10, s.p90, s.min, s.max, s.mean, s.rel_spread) = (nan, nan, nan, nan, nan, nan, nan);
        }
        (r.bytes, r.flops) = (nan, nan);
        (r.gbps, r.tflops, r.frac_bw, r.frac_tc) = (Some(nan), Some(nan), Some(nan), Some(nan));
        let mut m = meta();
        m.reference_gflops = Some(nan);
        m.device.copy_gbps = Some(nan);
        m.device.tensor.wgmma_e4m3_tflops = Some(nan);
        m.check_rows = Some(4);
        m.planned = Some(1);
        let v: Value = serde_json::from_str(&render(&m, &[r]).unwrap()).unwrap();
        fn nulls(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Null => out.push(at),
                Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .for_each(|(i, x)| nulls(x, format!("{at}[{i}]"), out)),
                Value::Object(o) => o.iter().for_each(|(k, x)| nulls(x, format!("{at}.{k}"), out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        nulls(&v, String::new(), &mut found);
        assert!(found.is_empty(), "floats written as null: {found:?}");
        assert_eq!(v["rows"][0]["latency"][1]["summary"]["p90"], "NaN");
    }

    #[test]
    fn study_floats_stay_strings() {
        let p = crate::judge::split_regret::Point {
            n: 3,
            median_ms: f64::INFINITY,
            p10_ms: 1.0,
            p90_ms: f64::NAN,
            pass: true,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["median_ms"], "Infinity");
        assert_eq!(v["p90_ms"], "NaN");
        assert_eq!(v["p10_ms"], 1.0);
    }
}
