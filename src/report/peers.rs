//! The peers table: when more than one implementation (mlabench's own
//! kernels, FlashMLA, FlashInfer, aiter, yours) ran the same inputs, each
//! one's median beside the fastest's, with its checks. Terminal, Markdown
//! and an SVG of latency per case.

use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color as TermColor, ContentArrangement, Table};
use plotters::prelude::*;

use super::status_word;
use crate::result::{Row, Status};

/// One implementation's best row on one data id.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub variant: String,
    pub implementation: String,
    pub version: String,
    pub case_id: String,
    pub median_ms: f64,
    pub clock: String,
    pub status: Status,
}

/// Every implementation's entry on one data id and contract, fastest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub data_id: String,
    pub contract: String,
    pub entries: Vec<Entry>,
}

impl Group {
    /// The entry's time over the fastest passing entry's: a kernel whose
    /// output failed is no yardstick (over the fastest when none passed).
    pub fn ratio(&self, e: &Entry) -> f64 {
        let best = self
            .entries
            .iter()
            .find(|x| x.status == Status::Pass)
            .unwrap_or(&self.entries[0]);
        e.median_ms / best.median_ms
    }
}

/// The contract of a row; rows made before rows named it get their
/// variant's from the registry (empty for a variant it does not hold).
pub fn contract_of(r: &Row) -> String {
    if !r.contract.is_empty() {
        return r.contract.clone();
    }
    crate::variants::registry()
        .iter()
        .find(|v| v.info().id.0 == r.variant)
        .map(|v| v.info().kind.name().to_string())
        .unwrap_or_default()
}

/// (Data id, contract) pairs that more than one implementation timed: a
/// merge shares its decode's data id but not its contract. Within a group each
/// variant shows its fastest timed row (a variant timed at several knobs,
/// such as v4_split at fixed split counts, competes with its best).
pub fn groups(rows: &[Row]) -> Vec<Group> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut by: std::collections::HashMap<(String, String), Vec<Entry>> = std::collections::HashMap::new();
    for r in rows {
        let Some(l) = r.latency.iter().find(|l| l.region == "variant") else {
            continue;
        };
        if !l.summary.median.is_finite() || r.data_id.is_empty() {
            continue;
        }
        let e = Entry {
            variant: r.variant.clone(),
            implementation: r.implementation.clone(),
            version: r.impl_version.clone(),
            case_id: r.case_id.clone(),
            median_ms: l.summary.median,
            clock: l.clock.clone(),
            status: r.status,
        };
        let key = (r.data_id.clone(), contract_of(r));
        let v = by.entry(key.clone()).or_insert_with(|| {
            order.push(key.clone());
            Vec::new()
        });
        match v.iter_mut().find(|x| x.variant == e.variant) {
            Some(x) if x.median_ms <= e.median_ms => {}
            Some(x) => *x = e,
            None => v.push(e),
        }
    }
    order
        .into_iter()
        .filter_map(|id| {
            let mut entries = by.remove(&id)?;
            let mut imps: Vec<&str> = entries.iter().map(|e| e.implementation.as_str()).collect();
            imps.sort_unstable();
            imps.dedup();
            if imps.len() < 2 {
                return None;
            }
            entries.sort_by(|a, b| a.median_ms.total_cmp(&b.median_ms));
            Some(Group {
                data_id: id.0,
                contract: id.1,
                entries,
            })
        })
        .collect()
}

fn who(e: &Entry) -> String {
    if e.implementation == "mlabench" {
        e.variant.clone()
    } else if e.version.is_empty() {
        e.implementation.clone()
    } else {
        format!("{} ({})", e.implementation, e.version)
    }
}

fn us(ms: f64) -> String {
    let us = ms * 1e3;
    if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

pub fn table(groups: &[Group], color: bool) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t.set_header([
        "inputs",
        "implementation",
        "median",
        "vs fastest pass",
        "status",
        "clock",
    ]);
    for g in groups {
        for (i, e) in g.entries.iter().enumerate() {
            let ratio = g.ratio(e);
            let mut r = Cell::new(format!("{ratio:.2}x"));
            if color && ratio > 1.05 {
                r = r.fg(TermColor::Yellow);
            }
            let mut st = Cell::new(status_word(e.status));
            if color && matches!(e.status, Status::Fail | Status::Error) {
                st = st.fg(TermColor::Red);
            }
            t.add_row(vec![
                Cell::new(if i == 0 { g.data_id.as_str() } else { "" }),
                Cell::new(who(e)),
                Cell::new(us(e.median_ms)),
                r,
                st,
                Cell::new(&e.clock),
            ]);
        }
    }
    t.to_string()
}

pub fn markdown(groups: &[Group]) -> String {
    let mut s = String::from(
        "## Peers\n\nImplementations that ran the same inputs: median of the whole call (variant region), \
         and its time over the fastest passing one's.\n\n| inputs | implementation | median | vs fastest pass | status |\n| --- | --- | ---: | ---: | --- |\n",
    );
    for g in groups {
        for (i, e) in g.entries.iter().enumerate() {
            s.push_str(&format!(
                "| {} | {} | {} | {:.2}x | {} |\n",
                if i == 0 {
                    format!("`{}`", g.data_id)
                } else {
                    String::new()
                },
                who(e),
                us(e.median_ms),
                g.ratio(e),
                status_word(e.status)
            ));
        }
    }
    s
}

/// Latency per case (log scale), one colour per implementation.
pub fn svg(groups: &[Group]) -> Result<String> {
    let mut names: Vec<String> = Vec::new();
    for g in groups {
        for e in &g.entries {
            if !names.contains(&who(e)) {
                names.push(who(e));
            }
        }
    }
    let all: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.entries.iter().map(|e| e.median_ms * 1e3))
        .collect();
    let lo = all.iter().cloned().fold(f64::MAX, f64::min).max(1e-3);
    let hi = all.iter().cloned().fold(0.0, f64::max).max(lo * 1.01);
    let w = (160 + 60 * groups.len()).max(640) as u32;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let n = groups.len().max(1) as f64;
        let mut c = ChartBuilder::on(&root)
            .caption("median per case (µs, log scale)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5f64..(n - 0.5), (lo * 0.8..hi * 1.25).log_scale())
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        c.configure_mesh()
            .x_desc("case (in the order of the peers table)")
            .y_desc("µs")
            .x_labels(groups.len().min(40))
            .x_label_formatter(&|x| format!("{}", x.round() as i64))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        for (k, name) in names.iter().enumerate() {
            let col = Palette99::pick(k).to_rgba();
            let pts: Vec<(f64, f64)> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    g.entries
                        .iter()
                        .find(|e| &who(e) == name)
                        .map(|e| (i as f64, e.median_ms * 1e3))
                })
                .collect();
            c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, col.filled())))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(name.clone())
                .legend(move |(x, y)| Circle::new((x, y), 4, col.filled()));
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::row;

    fn timed(case: &str, data: &str, variant: &str, imp: &str, ms: f64) -> Row {
        let mut r = row(case, variant, Status::Pass, "cuda-events");
        r.data_id = data.into();
        r.contract = "mla_decode".into();
        r.implementation = imp.into();
        for l in &mut r.latency {
            l.summary.median = ms;
        }
        r
    }

    #[test]
    fn groups_need_two_implementations_and_sort_fastest_first() {
        let rows = vec![
            timed("a-p1", "a", "ps1", "mlabench", 0.2),
            timed("a-p64", "a", "page64", "mlabench", 0.3),
            timed("a-p64", "a", "flashmla", "flashmla", 0.1),
            // One implementation only: no group.
            timed("b-p1", "b", "ps1", "mlabench", 0.2),
            timed("b-p64", "b", "page64", "mlabench", 0.1),
        ];
        let g = groups(&rows);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].data_id, "a");
        let order: Vec<&str> = g[0].entries.iter().map(|e| e.variant.as_str()).collect();
        assert_eq!(order, ["flashmla", "ps1", "page64"]);
        assert!((g[0].ratio(&g[0].entries[2]) - 3.0).abs() < 1e-12);
        let md = markdown(&g);
        assert!(md.contains("| `a` | flashmla | 100 µs | 1.00x | pass |"), "{md}");
        assert!(md.contains("|  | page64 | 300 µs | 3.00x | pass |"), "{md}");
        assert!(svg(&g).unwrap().starts_with("<svg"));
    }

    #[test]
    fn a_failing_kernel_is_no_yardstick() {
        let mut bad = timed("a-x", "a", "fast", "other", 0.05);
        bad.status = Status::Fail;
        let rows = vec![bad, timed("a-p1", "a", "ps1", "mlabench", 0.1)];
        let g = groups(&rows);
        assert_eq!(g[0].entries[0].variant, "fast");
        assert!((g[0].ratio(&g[0].entries[0]) - 0.5).abs() < 1e-12);
        assert!((g[0].ratio(&g[0].entries[1]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_merge_never_competes_with_its_decode() {
        let mut comb = timed("a-comb", "a", "dcp_combine", "mlabench", 0.01);
        comb.contract = "dcp_combine".into();
        let mut fm = timed("a-fm", "a", "flashmla", "flashmla", 0.1);
        fm.contract = "mla_decode".into();
        // ps1 without a contract (an older row) gets its built-in's.
        let mut old = timed("a-p1", "a", "ps1", "mlabench", 0.2);
        old.contract.clear();
        let rows = vec![old, comb, fm];
        let g = groups(&rows);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].contract, "mla_decode");
        let order: Vec<&str> = g[0].entries.iter().map(|e| e.variant.as_str()).collect();
        assert_eq!(order, ["flashmla", "ps1"]);
    }

    #[test]
    fn a_variant_keeps_its_fastest_knob() {
        let rows = vec![
            timed("v-n1", "v", "v4_split", "mlabench", 0.5),
            timed("v-n4", "v", "v4_split", "mlabench", 0.2),
            timed("v", "v", "fm", "flashmla", 0.3),
        ];
        let g = groups(&rows);
        assert_eq!(g[0].entries[0].case_id, "v-n4");
        assert_eq!(g[0].entries.len(), 2);
    }
}
