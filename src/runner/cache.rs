//! The workload and references of the current data id: cases arrive
//! grouped by data id, so each is built once and shared by every variant.

use anyhow::Result;

use crate::case::{Case, CaseParams};
use crate::reference::{self, RefSet};
use crate::workload::{self, Workload};

/// Caches the current workload and references: cases arrive grouped by id.
#[derive(Default)]
pub struct Caches {
    workload: Option<(String, Workload)>,
    refs: Option<RefSet>,
    /// Reference FLOPs and seconds, for the GFLOP/s line.
    pub ref_flops: f64,
    pub ref_secs: f64,
}

impl Caches {
    /// The case's workload and references, built once per id / data id.
    pub fn get(&mut self, case: &Case, check_rows: Option<usize>) -> Result<(&Workload, &RefSet)> {
        let same_data = self.refs.as_ref().map(|r| r.data_id == case.data_id).unwrap_or(false);
        match (&mut self.workload, &case.params) {
            (Some((id, _)), _) if *id == case.id => {}
            // Same data at another page size: re-page, keep Q, KV and references.
            (Some((id, Workload::Mla(w))), CaseParams::Mla(p)) if same_data => {
                w.repage(p.page_size, case.seed);
                *id = case.id.clone();
            }
            // Same V4 data under other knobs (split count, eager, workspace).
            (Some((id, Workload::V4(_))), CaseParams::V4(_)) if same_data => *id = case.id.clone(),
            _ => {
                self.workload = None;
                self.workload = Some((case.id.clone(), workload::build(case)?));
            }
        }
        let wl = &self.workload.as_ref().expect("just built").1;
        if self.refs.as_ref().map(|r| r.data_id != case.data_id).unwrap_or(true) {
            let r = reference::build(case, wl, check_rows)?;
            self.ref_flops += r.flops;
            self.ref_secs += r.secs;
            self.refs = Some(r);
        }
        Ok((wl, self.refs.as_ref().expect("just built")))
    }
}
