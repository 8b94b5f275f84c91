//! The DCP-step table: each case run on a group of GPUs (`-g<N>` rows) with
//! its phases, beside the same case's one-GPU emulation and the ideal step.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};

use crate::dcp_step::{CORRECT, LSE_ALLGATHER, Q_ALLGATHER, Q_LAYOUT, REDUCE_SCATTER};
use crate::result::Row;

use super::status_word;

/// One `-g<N>` row and what it is compared with.
pub struct StepLine {
    pub case_id: String,
    pub variant: String,
    pub status: String,
    pub world: String,
    pub gpus: usize,
    /// The reduce-scatter's element type.
    pub reduce: String,
    pub step_ms: f64,
    pub kernel_ms: f64,
    /// Q all-gather + layout, LSE all-gather, local combine, reduce-scatter.
    pub phases_ms: [f64; 4],
    pub slowest_rank: usize,
    pub slowest_share: f64,
    pub ideal_ms: f64,
    /// The same case's emulation: rank 0's variant time plus the
    /// dcp_combine row's on the same data, when both were measured.
    pub emulated_ms: Option<f64>,
    pub busbw_gbps: Option<f64>,
}

/// The steps in row order.
pub fn lines(rows: &[Row]) -> Vec<StepLine> {
    rows.iter()
        .filter_map(|r| {
            let d = r.dcp_step.as_ref()?;
            let step_ms = r.median_ms("variant")?;
            let m = |n: &str| r.median_ms(n).unwrap_or(f64::NAN);
            let knob = format!("-g{}{}", d.gpus, if d.reduce == "f32" { "-rs32" } else { "" });
            let emulated_id = r.case_id.replacen(&knob, "", 1);
            let rank0 = rows
                .iter()
                .find(|e| e.case_id == emulated_id && e.variant == r.variant && e.dcp_step.is_none())
                .and_then(|e| e.median_ms("variant"));
            let combine = rows
                .iter()
                .find(|e| e.data_id == r.data_id && e.variant == "dcp_combine")
                .and_then(|e| e.median_ms("variant"));
            Some(StepLine {
                case_id: r.case_id.clone(),
                variant: r.variant.clone(),
                status: status_word(r.status).to_string(),
                world: r.params.get("dcp_world").cloned().unwrap_or_default(),
                gpus: d.gpus,
                reduce: d.reduce.clone(),
                step_ms,
                kernel_ms: m("kernel"),
                phases_ms: [
                    m(Q_ALLGATHER) + m(Q_LAYOUT),
                    m(LSE_ALLGATHER),
                    m(CORRECT),
                    m(REDUCE_SCATTER),
                ],
                slowest_rank: d.slowest_rank,
                slowest_share: d.slowest_share,
                ideal_ms: d.ideal_ms,
                emulated_ms: rank0.zip(combine).map(|(a, b)| a + b),
                busbw_gbps: d.bandwidth.map(|b| b.allgather_gbps),
            })
        })
        .collect()
}

fn us(ms: f64) -> String {
    if ms.is_nan() {
        "-".into()
    } else {
        format!("{:.1}", ms * 1e3)
    }
}

const HEADER: [&str; 15] = [
    "case",
    "variant",
    "W",
    "GPUs",
    "reduce",
    "step µs",
    "slowest kernel µs",
    "Q gather µs",
    "LSE gather µs",
    "combine µs",
    "reduce-scatter µs",
    "slowest rank (share)",
    "ideal µs",
    "emulated µs",
    "status",
];

fn cells(l: &StepLine) -> Vec<String> {
    vec![
        l.case_id.clone(),
        l.variant.clone(),
        l.world.clone(),
        l.gpus.to_string(),
        l.reduce.clone(),
        us(l.step_ms),
        us(l.kernel_ms),
        us(l.phases_ms[0]),
        us(l.phases_ms[1]),
        us(l.phases_ms[2]),
        us(l.phases_ms[3]),
        format!("r{} ({:.0}%)", l.slowest_rank, l.slowest_share * 100.0),
        us(l.ideal_ms),
        l.emulated_ms.map_or("-".into(), us),
        l.status.clone(),
    ]
}

/// The terminal table; empty when no row ran on a group.
pub fn table(rows: &[Row]) -> String {
    let ls = lines(rows);
    if ls.is_empty() {
        return String::new();
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(HEADER);
    for l in &ls {
        t.add_row(cells(l));
    }
    format!("DCP steps on GPU groups (medians):\n{t}\n{}", footnote(&ls))
}

fn footnote(ls: &[StepLine]) -> String {
    let bw: Vec<String> = ls
        .iter()
        .filter_map(|l| l.busbw_gbps.map(|b| format!("{} GPUs {b:.0} GB/s", l.gpus)))
        .fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
    let mut s = String::from(
        "step: the last GPU's end after a one-word all-reduce lines them up; kernel and phases: the GPU whose \
         ranks' kernels took longest in each sample; ideal: that kernel time plus each collective at NCCL's \
         measured bus bandwidth; emulated: rank 0's time plus dcp_combine's on the same data, one after the other on \
         one GPU (the emulation's step for ranks that each have a GPU, without communication).",
    );
    if !bw.is_empty() {
        s.push_str(&format!(" All-gather bus bandwidth: {}.", bw.join(", ")));
    }
    s
}

/// The summary.md section; empty when no row ran on a group.
pub fn markdown(rows: &[Row]) -> String {
    let ls = lines(rows);
    if ls.is_empty() {
        return String::new();
    }
    let mut s = String::from("## DCP steps on GPU groups\n\n| ");
    s.push_str(&HEADER.join(" | "));
    s.push_str(" |\n|");
    s.push_str(&" --- |".repeat(HEADER.len()));
    s.push('\n');
    for l in &ls {
        let mut c = cells(l);
        c[0] = format!("`{}`", c[0]);
        s.push_str(&format!("| {} |\n", c.join(" | ")));
    }
    s.push('\n');
    s.push_str(&footnote(&ls));
    s.push_str("\n\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dcp_step::{CommBytes, DcpStep};
    use crate::report::testutil::row;
    use crate::result::{Latency, Status};
    use crate::stats::Summary;

    fn lat(region: &str, ms: f64) -> Latency {
        Latency {
            region: region.into(),
            clock: "cuda-events".into(),
            summary: Summary::from_samples(&[ms; 10]),
            capped: false,
        }
    }

    #[test]
    fn a_step_row_meets_its_one_gpu_emulation_and_the_combine_on_the_same_data() {
        let mut emulated = row("mla-b8-q4-p1@abcd", "ps1", Status::Pass, "cuda-events");
        emulated.data_id = "mla-b8-q4@abcd".into();
        emulated.latency = vec![lat("variant", 0.100)];
        let mut combine = row("mla-b8-q4-p1@abcd", "dcp_combine", Status::Pass, "cuda-events");
        combine.data_id = "mla-b8-q4@abcd".into();
        combine.latency = vec![lat("variant", 0.010)];
        let mut step = row("mla-b8-q4-p1-g8@abcd", "ps1", Status::Pass, "cuda-events");
        step.data_id = "mla-b8-q4@abcd".into();
        step.params.insert("dcp_world".into(), "8".into());
        step.latency = vec![
            lat("variant", 0.150),
            lat("kernel", 0.090),
            lat(Q_ALLGATHER, 0.010),
            lat(Q_LAYOUT, 0.002),
            lat(LSE_ALLGATHER, 0.020),
            lat(CORRECT, 0.005),
            lat(REDUCE_SCATTER, 0.015),
        ];
        step.dcp_step = Some(DcpStep {
            gpus: 8,
            ranks_per_gpu: 1,
            reduce: "bf16".into(),
            nccl: "NCCL 2.27.3".into(),
            bus_bytes: CommBytes::default(),
            bandwidth: None,
            slowest_rank: 3,
            slowest_share: 0.6,
            ideal_ms: 0.120,
        });
        let rows = vec![emulated, combine, step];
        let ls = lines(&rows);
        assert_eq!(ls.len(), 1, "only the -g row is a step");
        let l = &ls[0];
        assert_eq!((l.gpus, l.world.as_str(), l.slowest_rank), (8, "8", 3));
        assert!((l.emulated_ms.unwrap() - 0.110).abs() < 1e-12);
        assert!((l.phases_ms[0] - 0.012).abs() < 1e-12, "Q gather includes its layout");
        let t = table(&rows);
        assert!(
            t.contains("150.0") && t.contains("110.0") && t.contains("r3 (60%)"),
            "{t}"
        );
        let md = markdown(&rows);
        assert!(md.starts_with("## DCP steps on GPU groups"));
        assert!(
            md.contains("| `mla-b8-q4-p1-g8@abcd` | ps1 | 8 | 8 | bf16 | 150.0 |"),
            "{md}"
        );
        assert!(table(&rows[..2]).is_empty() && markdown(&rows[..2]).is_empty());
    }
}
