//! The CPU backend: each variant's own emulation of its plan in f32 on the
//! host, from the same quantized bytes a kernel reads. It verifies planners
//! and merges without a GPU; its timings are one wall-clock sample of the
//! emulation, which says nothing about a GPU. A DCP step on a group of GPUs
//! (`-g<N>` cases) is the emulated ranks plus the host model of the step's
//! merge (`dcp_step::device_merge`).

use std::time::Instant;

use super::{Backend, BackendError, DeviceInfo, Exec, RunOutput, Samples};
use crate::variants::{Emulation, Fault, Job, Variant};

pub struct CpuBackend {
    info: DeviceInfo,
    fault: Option<Fault>,
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            fault: None,
            info: DeviceInfo {
                backend: "cpu".into(),
                name: format!("host CPU ({} threads, f32 emulation)", rayon::current_num_threads()),
                compute_units: rayon::current_num_threads(),
                l2_bytes: 0,
                copy_gbps: None,
                tensor: Default::default(),
                details: vec![],
            },
        }
    }

    /// The emulation with a planted bug (`mlabench selftest --backend cpu`).
    pub fn with_fault(fault: Fault) -> Self {
        let mut b = Self::new();
        b.info.name.push_str(&format!(", planted fault {fault}"));
        b.fault = Some(fault);
        b
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn run(&mut self, unit: &dyn Variant, job: &Job, exec: &Exec) -> Result<RunOutput, BackendError> {
        // One emulated device per case: hca_persist's counters live across
        // its launches, as its workspace does on a GPU.
        let mut emu = Emulation::new(self.fault);
        let t0 = Instant::now();
        let mut tensors = unit.emulate(job, &mut emu).map_err(BackendError::Failed)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut repeats = Vec::new();
        for _ in 1..exec.repeats.max(1) {
            let mut again = unit.emulate(job, &mut emu).map_err(BackendError::Failed)?;
            if self.fault == Some(Fault::Race) {
                flip_last_bit(&mut again);
            }
            repeats.push(again);
        }
        if let (Some(n), Some(p)) = (job.case.dcp_devices, job.case.mla()) {
            // A DCP step on n GPUs: its merge modelled on the emulated ranks.
            let shape = crate::dcp_step::StepShape {
                gpus: n,
                world: p.dcp.world,
                rows: p.total_q(),
                heads: p.heads(),
                kernel_heads: p.heads(),
                q_elem: 1,
                reduce_elem: job.case.dcp_reduce.bytes(),
            };
            shape.validate().map_err(BackendError::Failed)?;
            for t in std::iter::once(&mut tensors).chain(repeats.iter_mut()) {
                crate::dcp_step::append_device_merge(&shape, job.case.dcp_reduce, t).map_err(BackendError::Failed)?;
            }
        }
        let samples = exec.timing.enabled.then(|| Samples {
            kernel_ms: vec![ms],
            variant_ms: vec![ms],
            clock: "cpu-wall".into(),
            regions: Vec::new(),
        });
        Ok(RunOutput {
            tensors,
            repeats,
            device_checks: emu.checks,
            samples,
            notes: vec![],
            phases: vec![("emulate", t0.elapsed().as_secs_f64())],
            step: None,
        })
    }
}

/// The planted race: the last bit of the first written element of the
/// first tensor, on every launch after the first.
fn flip_last_bit(ts: &mut [crate::variants::OutTensor]) {
    let poison = crate::metrics::POISON_BITS;
    if let Some(x) = ts
        .first_mut()
        .and_then(|t| t.data.iter_mut().find(|x| x.to_bits() != poison))
    {
        *x = f32::from_bits(x.to_bits() ^ 1);
    }
}
