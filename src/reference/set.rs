//! The references of one data id (SPEC §3), shared by every variant that
//! runs on it: per DCP rank, unsharded, unquantized (fp8), and per replay step.

use anyhow::Result;
use std::time::Instant;

use super::{mla, sample_rows, v4, Inputs, RefOut};
use crate::case::{Case, CaseParams, Dtype};
use crate::workload::Workload;

/// References of one data id, shared by every variant that runs on it.
pub struct RefSet {
    pub data_id: String,
    pub rows: Vec<usize>,
    /// MLA: one per rank (global mask).
    pub ranks: Vec<RefOut>,
    /// MLA: unsharded attention; V4: attention with sink.
    pub full: RefOut,
    /// fp8: the same on unquantized inputs (quantization noise level).
    pub unquantized: Option<RefOut>,
    /// V4 replay steps: the attention of each step's workload.
    pub steps: Vec<RefOut>,
    pub flops: f64,
    pub secs: f64,
}

/// Query rows of a case (MLA `batch * s_q`, V4 the real rows).
pub fn total_rows(case: &Case) -> usize {
    match &case.params {
        CaseParams::Mla(p) => p.total_q(),
        CaseParams::V4(p) => p.rows,
    }
}

/// Every reference of the case's data, over a seeded sample of `check_rows`
/// rows (all rows when `None`).
pub fn build(case: &Case, wl: &Workload, check_rows: Option<usize>) -> Result<RefSet> {
    let t0 = Instant::now();
    let rows = sample_rows(total_rows(case), check_rows, case.seed);
    let (ranks, full, unq) = match wl {
        Workload::Mla(w) => {
            let ranks =
                w.p.dcp
                    .ranks()
                    .map(|r| mla::rank(w, r, &rows, Inputs::Dequantized))
                    .collect::<Result<Vec<RefOut>, _>>()?;
            // With one rank, the rank reference is the unsharded attention.
            let full = if !w.p.dcp.sharded() {
                ranks[0].clone()
            } else {
                mla::full(w, &rows, Inputs::Dequantized)?
            };
            let unq = match w.p.dtype {
                Dtype::Fp8 => Some(mla::full(w, &rows, Inputs::Unquantized)?),
                Dtype::Bf16 => None,
            };
            (ranks, full, unq)
        }
        Workload::V4(w) => (
            vec![],
            v4::attend(w, &rows, Inputs::Dequantized),
            Some(v4::attend(w, &rows, Inputs::Unquantized)),
        ),
    };
    let steps: Vec<RefOut> = match wl {
        Workload::V4(w) => w
            .steps
            .iter()
            .map(|ws| v4::attend(ws, &rows, Inputs::Dequantized))
            .collect(),
        Workload::Mla(_) => vec![],
    };
    let flops = ranks.iter().map(|r| r.flops).sum::<f64>()
        + full.flops
        + unq.as_ref().map(|u| u.flops).unwrap_or(0.0)
        + steps.iter().map(|r| r.flops).sum::<f64>();
    Ok(RefSet {
        data_id: case.data_id.clone(),
        rows,
        ranks,
        full,
        unquantized: unq,
        steps,
        flops,
        secs: t0.elapsed().as_secs_f64(),
    })
}
