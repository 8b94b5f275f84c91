//! The workload and references of the current data id: cases arrive
//! grouped by data id, so each is built once and shared by every variant,
//! and by the pipeline's stages (hence `Arc`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::case::{Case, CaseParams};
use crate::reference::{self, RefSet};
use crate::workload::{self, Workload};

/// One case's inputs: its workload (at its page size) and the references
/// of its data id.
#[derive(Clone)]
pub struct Inputs {
    pub workload: Arc<Workload>,
    pub refs: Arc<RefSet>,
}

/// Caches the current workload and references: cases arrive grouped by id.
#[derive(Default)]
pub struct Caches {
    workload: Option<(String, Arc<Workload>)>,
    refs: Option<Arc<RefSet>>,
    /// Reference FLOPs and seconds, for the GFLOP/s line.
    pub ref_flops: f64,
    pub ref_secs: f64,
}

impl Caches {
    /// The case's inputs, built once per id / data id. A panic while
    /// building becomes an error. Re-paging the same data for another page
    /// size changes the workload in place when no earlier case still holds
    /// it, and re-pages a copy when one does (in the pipeline, the device
    /// or the checks): waiting for them would put the earlier case's run
    /// and checks on the path to the next case's inputs.
    pub fn get(&mut self, case: &Case, check_rows: Option<usize>) -> Result<Inputs, String> {
        match catch_unwind(AssertUnwindSafe(|| self.build(case, check_rows))) {
            Ok(Ok(i)) => Ok(i),
            Ok(Err(e)) => {
                self.workload = None;
                self.refs = None;
                Err(format!("building inputs: {e:#}"))
            }
            Err(p) => {
                self.workload = None;
                self.refs = None;
                Err(format!(
                    "panic while building inputs or reference: {}",
                    super::panic_text(&p)
                ))
            }
        }
    }

    fn build(&mut self, case: &Case, check_rows: Option<usize>) -> anyhow::Result<Inputs> {
        let same_data = self.refs.as_ref().is_some_and(|r| r.data_id == case.data_id);
        match (&mut self.workload, &case.params) {
            (Some((id, _)), _) if *id == case.id => {}
            // Same data at another page size: re-page, keep Q, KV and references.
            (Some((id, arc)), CaseParams::Mla(p)) if same_data && matches!(**arc, Workload::Mla(_)) => {
                if let Some(Workload::Mla(w)) = Arc::get_mut(arc) {
                    w.repage(p.page_size, case.seed);
                } else if let Workload::Mla(w) = &**arc {
                    *arc = Arc::new(Workload::Mla(w.repaged(p.page_size, case.seed)));
                }
                *id = case.id.clone();
            }
            // Same V4 data under other knobs (split count, eager, workspace).
            (Some((id, arc)), CaseParams::V4(_)) if same_data && matches!(**arc, Workload::V4(_)) => {
                *id = case.id.clone()
            }
            _ => {
                self.workload = None;
                self.workload = Some((case.id.clone(), Arc::new(workload::build(case)?)));
            }
        }
        let wl = self.workload.as_ref().expect("just built").1.clone();
        if !same_data {
            self.refs = None;
            let r = reference::build(case, &wl, check_rows)?;
            self.ref_flops += r.flops;
            self.ref_secs += r.secs;
            self.refs = Some(Arc::new(r));
        }
        Ok(Inputs {
            workload: wl,
            refs: self.refs.clone().expect("just built"),
        })
    }
}
