//! What the MLA decode variants share: the dispatch gate, the DCP shard
//! geometry, the kernel shape host and kernel agree on, the cost count,
//! the checks, the CPU emulation of a chunk, and a rank's device buffers.

pub mod checks;
pub mod emulate;
pub mod gate;
pub mod kernel;
pub mod program;

use crate::case::{Case, CaseParams, Dtype, MlaParams, MLA_D_QK, MLA_D_V};
use crate::workload::Workload;

use super::{Cost, Decision, Job};
use gate::{GateInput, Verdict};

/// The MLA parameters of a case, or why a variant cannot run it.
pub fn params(case: &Case) -> Result<&MlaParams, String> {
    match &case.params {
        CaseParams::Mla(p) => Ok(p),
        CaseParams::V4(_) => Err(format!("{} does not run V4 workloads", case.variant)),
    }
}

/// Each DCP rank's local length of every sequence: rank `r`'s shard.
pub fn local_lens(p: &MlaParams, r: usize) -> Vec<usize> {
    p.ctx.iter().map(|&l| p.dcp.local_len(r, l)).collect()
}

/// Local tokens query row `ii` of sequence `b` sees on rank `r` under the
/// global mask: the local length of its `q_g + 1` prefix.
pub fn visible(p: &MlaParams, r: usize, b: usize, ii: usize) -> usize {
    let q_g = p.ctx[b] - p.s_q + ii;
    p.dcp.local_len(r, q_g + 1)
}

/// The dispatch gate's view of an MLA case.
pub fn gate_input(case: &Case, p: &MlaParams) -> GateInput {
    GateInput {
        profile: case.target,
        w: p.dcp.world,
        s_q: p.s_q,
        heads: p.heads(),
        dtype: p.dtype,
        page_size: p.page_size,
    }
}

/// A decode kernel's decision: the gate's verdict; a rejected case runs only
/// when forced, and only past the gate's policy, never past a hard limit
/// (`hard`: a page size or width the kernel has no code for).
pub fn decide(case: &Case, gate: fn(&GateInput) -> Verdict, hard: bool) -> Decision {
    let CaseParams::Mla(p) = &case.params else {
        return Decision::skips("", format!("{} does not run V4 workloads", case.variant));
    };
    let d = gate(&gate_input(case, p));
    if d.eligible {
        return Decision::runs(format!("eligible: {}", d.reason));
    }
    let gate = format!("rejected: {}", d.reason);
    if case.force && !hard {
        Decision {
            gate,
            forced: true,
            ..Default::default()
        }
    } else {
        Decision::skips(gate, d.reason)
    }
}

/// Bytes and FLOPs of one decode run on rank 0, the rank with the most
/// tokens under round-robin sharding (SPEC §5): KV of the tokens read, Q,
/// O and LSE, and the f32 partials written and read back.
pub fn cost(job: &Job, kernel_heads: usize, partial_rows: usize) -> Cost {
    let Workload::Mla(w) = job.workload else {
        return Cost::default();
    };
    let p = &w.p;
    let (d_qk, d_v) = (MLA_D_QK as f64, MLA_D_V as f64);
    let eb = if p.dtype == Dtype::Fp8 { 1.0 } else { 2.0 };
    let kv_tokens: usize = w.shards[0].local_lens.iter().sum();
    let vis: usize = (0..p.batch)
        .flat_map(|b| (0..p.s_q).map(move |ii| (b, ii)))
        .map(|(b, ii)| visible(p, 0, b, ii))
        .sum();
    let hk = kernel_heads as f64;
    let rows = p.total_q() as f64;
    let bytes = kv_tokens as f64 * d_qk * eb
        + rows * hk * d_qk * eb
        + rows * hk * (d_v * 2.0 + 4.0)
        + partial_rows as f64 * hk * (d_v + 1.0) * 4.0 * 2.0;
    Cost {
        bytes,
        flops: 2.0 * p.heads() as f64 * (d_qk + d_v) * vis as f64,
    }
}
