//! What the DeepSeek-V4 variants share: a row's list length, the cost
//! count, the checks (every replay step, the pad rows), the CPU emulation of
//! a row, and the device inputs every V4 kernel reads.

pub mod checks;
pub mod emulate;
pub mod program;

use crate::case::{Case, CaseParams, LayerType, V4Params, V4_WINDOW};
use crate::workload::{V4Workload, Workload};

use super::{Cost, Job};

/// The V4 parameters of a case, or why a variant cannot run it.
pub fn params(case: &Case) -> Result<&V4Params, String> {
    match &case.params {
        CaseParams::V4(p) => Ok(p),
        CaseParams::Mla(_) => Err(format!("{} does not run MLA workloads", case.variant)),
    }
}

/// The workload of a V4 job.
pub fn workload<'a>(job: &Job<'a>) -> Result<&'a V4Workload, String> {
    match job.workload {
        Workload::V4(w) => Ok(w),
        Workload::Mla(_) => Err(format!("{} was handed an MLA workload", job.case.variant)),
    }
}

/// KV list length of a row at `pos` (SPEC §2), for plans made before the workload exists.
pub fn row_len(p: &V4Params, pos: usize) -> usize {
    let win = (pos + 1).min(V4_WINDOW);
    win + match p.layer {
        LayerType::Swa => 0,
        LayerType::Csa => ((pos + 1) / 4).min(p.index_topk),
        LayerType::Hca => (pos + 1) / 128,
    }
}

/// Heads each V4 CTA handles, and so the CTAs per row (kernels/ABI.md).
pub fn groups(hk: usize) -> u32 {
    (hk / hk.min(64)) as u32
}

/// Dynamic shared memory of the V4 kernels (kernels/ABI.md formula).
pub fn smem(hk: usize) -> u32 {
    let hg = hk.min(64);
    let nsl = 8 / (hg / hg.min(32));
    (hg * 1040 + 2 * 32 * 1040 + 2 * 32 * 592 + nsl * hg * 40 * 4 + hg * 80 + hg * 12 + 1024) as u32
}

/// Bytes and FLOPs of a V4 decode run (SPEC §5): the packed rows and rope of
/// the tokens read, Q, O and LSE, and `partial_slots` f32 partials written
/// and read back.
pub fn cost(job: &Job, partial_slots: usize) -> Cost {
    let Workload::V4(w) = job.workload else {
        return Cost::default();
    };
    let d_v = 512.0;
    let n = w.p.rows;
    let tokens: usize = (0..n).map(|i| w.row_len(i)).sum();
    let hk = w.heads as f64;
    let bytes = tokens as f64 * (512.0 + 128.0)
        + n as f64 * hk * (512.0 + 128.0)
        + n as f64 * hk * (d_v * 2.0 + 4.0)
        + partial_slots as f64 * hk * (d_v + 1.0) * 4.0 * 2.0;
    Cost {
        bytes,
        flops: 2.0 * w.p.heads as f64 * (d_v + d_v) * tokens as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_and_groups_match_the_abi_tables() {
        assert_eq!([16, 32, 64, 128].map(smem), [144_064, 182_656, 218_880, 218_880]);
        assert_eq!([16, 32, 64, 128].map(groups), [1, 1, 1, 2]);
    }
}
