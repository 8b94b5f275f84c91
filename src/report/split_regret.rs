//! Exporters of a split-plan study: CSV, an SVG plot of latency against n,
//! and the terminal table.

use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use plotters::prelude::*;

use crate::judge::split_regret::{regret_summary, Study};

/// One line per (study, n), plus `heuristic` and `hca_persist` lines.
pub fn csv(studies: &[Study]) -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "data_id",
        "layer",
        "rows",
        "heads",
        "mean_len",
        "plan",
        "n",
        "median_ms",
        "p10_ms",
        "p90_ms",
        "pass",
        "regret_pct",
        "hca_speedup",
    ])?;
    for s in studies {
        let base = [
            s.data_id.clone(),
            s.layer.clone(),
            s.rows.to_string(),
            s.heads.to_string(),
            format!("{:.0}", s.mean_len),
        ];
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
        for p in &s.points {
            let mut r = base.to_vec();
            r.extend([
                "fixed".into(),
                p.n.to_string(),
                format!("{:.6}", p.median_ms),
                format!("{:.6}", p.p10_ms),
                format!("{:.6}", p.p90_ms),
                p.pass.to_string(),
                String::new(),
                String::new(),
            ]);
            w.write_record(&r)?;
        }
        if let Some(p) = s.at(s.heuristic_n) {
            let mut r = base.to_vec();
            r.extend([
                s.heuristic_source.clone(),
                p.n.to_string(),
                format!("{:.6}", p.median_ms),
                format!("{:.6}", p.p10_ms),
                format!("{:.6}", p.p90_ms),
                p.pass.to_string(),
                opt(s.regret_pct()),
                String::new(),
            ]);
            w.write_record(&r)?;
        }
        if let Some(p) = &s.hca {
            let mut r = base.to_vec();
            r.extend([
                "hca_persist".into(),
                String::new(),
                format!("{:.6}", p.median_ms),
                format!("{:.6}", p.p10_ms),
                format!("{:.6}", p.p90_ms),
                p.pass.to_string(),
                String::new(),
                opt(s.hca_speedup()),
            ]);
            w.write_record(&r)?;
        }
        for (name, p) in &s.peers {
            let mut r = base.to_vec();
            r.extend([
                format!("impl:{name}"),
                String::new(),
                format!("{:.6}", p.median_ms),
                format!("{:.6}", p.p10_ms),
                format!("{:.6}", p.p90_ms),
                p.pass.to_string(),
                String::new(),
                opt(s.peer_speedup(p)),
            ]);
            w.write_record(&r)?;
        }
    }
    Ok(w.into_inner()?)
}

pub fn table(studies: &[Study]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t.set_header([
        "case",
        "best n",
        "best ms",
        "heuristic n",
        "heuristic ms",
        "regret",
        "hca_persist ms",
        "hca vs best",
        "peers vs best",
    ]);
    for s in studies {
        let best = s.best();
        let pick = s.at(s.heuristic_n);
        let ms = |p: Option<&crate::judge::split_regret::Point>| {
            p.map(|p| format!("{:.4}", p.median_ms)).unwrap_or_else(|| "-".into())
        };
        let hca = match (&s.hca, &s.hca_gate) {
            (Some(p), _) => format!("{:.4}", p.median_ms),
            (None, Some(g)) => format!("fallback: {}", g.chars().take(40).collect::<String>()),
            _ => "-".into(),
        };
        t.add_row([
            s.data_id.clone(),
            best.map(|p| p.n.to_string()).unwrap_or_default(),
            ms(best),
            format!("{} ({})", s.heuristic_n, s.heuristic_source),
            ms(pick),
            s.regret_pct().map(|r| format!("{r:.1}%")).unwrap_or_else(|| "-".into()),
            hca,
            s.hca_speedup()
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into()),
            s.peers
                .iter()
                .map(|(n, p)| match s.peer_speedup(p) {
                    Some(x) => format!("{n} {x:.2}x"),
                    None => format!("{n} -"),
                })
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    let mut out = t.to_string();
    if let Some((max, mean)) = regret_summary(studies) {
        out.push_str(&format!(
            "\nheuristic regret: max {max:.1}%, mean {mean:.1}% over {} workloads",
            studies.len()
        ));
    }
    out
}

/// Small multiples: one panel per study, latency against n, the heuristic's
/// pick as a dot and hca_persist as a horizontal line.
pub fn svg(studies: &[Study]) -> Result<String> {
    let cols = 4usize;
    let rows = studies.len().div_ceil(cols).max(1);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (cols as u32 * 420, rows as u32 * 300)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let panels = root.split_evenly((rows, cols));
        for (s, area) in studies.iter().zip(panels.iter()) {
            let ys: Vec<f64> = s
                .points
                .iter()
                .map(|p| p.median_ms)
                .chain(s.hca.iter().map(|p| p.median_ms))
                .filter(|x| x.is_finite())
                .collect();
            let (lo, hi) = ys.iter().fold((f64::MAX, 0f64), |(a, b), &y| (a.min(y), b.max(y)));
            if ys.is_empty() {
                continue;
            }
            let mut c = ChartBuilder::on(area)
                .caption(
                    format!("{} r{} h{} (mean len {:.0})", s.layer, s.rows, s.heads, s.mean_len),
                    ("sans-serif", 14),
                )
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(52)
                .build_cartesian_2d(0.5f64..16.5f64, (lo * 0.9)..(hi * 1.05))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            c.configure_mesh()
                .x_desc("n")
                .y_desc("ms")
                .x_labels(8)
                .y_labels(5)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            c.draw_series(LineSeries::new(
                s.points.iter().map(|p| (p.n as f64, p.median_ms)),
                &BLUE,
            ))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            c.draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new((p.n as f64, p.median_ms), 2, BLUE.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            if let Some(p) = s.at(s.heuristic_n) {
                c.draw_series(std::iter::once(Circle::new((p.n as f64, p.median_ms), 5, RED.filled())))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            if let Some(h) = &s.hca {
                c.draw_series(LineSeries::new(
                    [(0.5, h.median_ms), (16.5, h.median_ms)],
                    GREEN.stroke_width(2),
                ))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
        }
        root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::split_regret::Point;

    fn study() -> Study {
        Study {
            data_id: "v4-hca-n64".into(),
            layer: "hca".into(),
            rows: 64,
            heads: 128,
            mean_len: 8000.0,
            heuristic_n: 2,
            heuristic_source: "heuristic".into(),
            points: (1..=16)
                .map(|n| Point {
                    n,
                    median_ms: 1.0 + (n as f64 - 4.0).abs() * 0.1,
                    p10_ms: 1.0,
                    p90_ms: 2.0,
                    pass: true,
                })
                .collect(),
            hca: Some(Point {
                n: 0,
                median_ms: 0.9,
                p10_ms: 0.9,
                p90_ms: 0.9,
                pass: true,
            }),
            hca_gate: None,
            peers: vec![],
        }
    }

    #[test]
    fn csv_has_a_line_per_n_plus_heuristic_and_hca() {
        let text = String::from_utf8(csv(&[study()]).unwrap()).unwrap();
        assert_eq!(text.lines().count(), 1 + 16 + 2);
        let heur = text.lines().find(|l| l.contains(",heuristic,")).unwrap();
        assert!(heur.contains(",20.000,"), "regret of n=2 vs n=4 is 20%: {heur}");
        assert!(text
            .lines()
            .any(|l| l.contains(",hca_persist,") && l.ends_with(",1.111")));
    }

    #[test]
    fn svg_and_table_show_every_study() {
        let s = svg(&[study(), study()]).unwrap();
        assert!(s.starts_with("<svg") && s.matches("hca r64 h128").count() == 2);
        let t = table(&[study()]);
        assert!(t.contains("20.0%") && t.contains("1.11x") && t.contains("max 20.0%"));
    }
}
