//! What the DeepSeek-V4 variants share: a row's list length, the cost
//! count, the checks (every replay step, the pad rows), the CPU emulation of
//! a row, and the device inputs every V4 kernel reads.

pub mod checks;
pub mod emulate;
pub mod program;

use crate::case::{Case, CaseParams, LayerType, V4CoreChoice, V4Params, V4_WINDOW};
use crate::workload::{V4Workload, Workload};

use super::{Cost, Job, KernelSpec};
use crate::tensor_ceiling::{MmaKind, MmaMix};

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

/// Rows a v4_split launch covers: an eager call the N real rows, a
/// graph-sized one all T (its pad rows get `o = 0`, `lse = sink`).
pub fn launch_rows(p: &V4Params, eager: bool) -> usize {
    if eager {
        p.rows
    } else {
        p.padded_rows
    }
}

/// Heads each V4 CTA handles, and so the CTAs per row (kernels/ABI.md).
pub fn groups(hk: usize) -> u32 {
    (hk / hk.min(64)) as u32
}

/// Dynamic shared memory of the mma.sync V4 core (`v4::SMEM_BYTES`, kernels/ABI.md formula).
pub fn smem(hk: usize) -> u32 {
    let hg = hk.min(64);
    let nsl = 8 / (hg / hg.min(32));
    (hg * 1040 + 2 * 32 * 1040 + 2 * 32 * 592 + nsl * hg * 40 * 4 + hg * 80 + hg * 12 + 1024) as u32
}

/// The attention core a V4 kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Core {
    /// `kernels/v4_core.cuh`: 256 threads, bf16 mma.sync on dequantized tiles.
    Mma,
    /// `kernels/common/mla_wg.cuh` with `WG_V4=1` (`common/wg_v4.cuh`): 64
    /// heads per CTA on bf16 wgmma, a producer warpgroup dequantizing.
    Wg,
}

/// Fewest KV tokens in the longest split for the wgmma core when rows are
/// cut into splits: below it the CTA's larger fixed cost (Q dequantized,
/// the pipeline filled, 384 threads) and the partials it writes outweigh
/// its faster loop. The longest split, not the mean, because a wave lasts
/// as long as its longest CTA. On an H100, v4_split on both cores at the
/// same n (`--v4-core wg` alternated with the plan's pick; docs/kernels.md
/// "Which V4 core"): the wgmma core 12-24% faster at 288-734 tokens (n = 4
/// and 2; 576 the same), 10-26% slower at 176-180 (n = 2) and 2-26% at
/// 23-64 tokens.
pub const WG_MIN_SPLIT_TOKENS: usize = 256;

/// The same for hca_persist's partitions: its 2-CTA kernel walks a
/// partition's rows one pass each and merges the rows it cuts, which the
/// mma kernel does at less cost below 1024 tokens a partition: forced onto
/// the wgmma kernel there, 6 of 8 timed rows were slower (+2.8..+32.2%)
/// on an H100, and earlier every size but one (docs/kernels.md).
pub const WG_MIN_PARTITION_TOKENS: usize = 1024;

/// The core for `hk` kernel heads whose longest split holds `split_tokens`
/// KV tokens, and why: 64 heads per CTA make every KV token feed 64 query
/// rows, where the decode is bound by the tensor cores (the MLA core's
/// threshold, `mla::kernel::WG_ROWS`), once the splits are long enough to
/// pay for the CTA's fixed cost (`min_tokens`, the caller's: whole rows,
/// a split or a partition). The others stay on the mma.sync core.
pub fn core(hk: usize, split_tokens: usize, min_tokens: usize, choice: V4CoreChoice) -> (V4Core, String) {
    let rows = crate::variants::mla::kernel::WG_ROWS;
    match choice {
        V4CoreChoice::Auto => {}
        V4CoreChoice::Mma => return (V4Core::Mma, "forced (--v4-core mma)".into()),
        V4CoreChoice::Wg if hk >= rows => {
            return (
                V4Core::Wg,
                format!("forced (--v4-core wg), {split_tokens} tokens in the longest split"),
            )
        }
        V4CoreChoice::Wg => {
            return (
                V4Core::Mma,
                format!("heads {hk} < {rows}: --v4-core wg needs {rows}+ heads a CTA, so the mma core runs"),
            )
        }
    }
    if hk < rows {
        (V4Core::Mma, format!("heads {hk} < {rows}"))
    } else if split_tokens < min_tokens {
        (
            V4Core::Mma,
            format!("{split_tokens} tokens in the longest split < {min_tokens}"),
        )
    } else {
        let line = if min_tokens > 0 {
            format!(" >= {min_tokens}")
        } else {
            String::new()
        };
        (
            V4Core::Wg,
            format!("heads {hk} >= {rows}, {split_tokens} tokens in the longest split{line}, e4m3 dequantized to bf16"),
        )
    }
}

impl V4Core {
    pub fn name(self) -> &'static str {
        match self {
            V4Core::Mma => "mma",
            V4Core::Wg => "wg",
        }
    }

    /// Threads per CTA.
    pub fn block(self) -> u32 {
        match self {
            V4Core::Mma => 256,
            V4Core::Wg => crate::variants::mla::kernel::WG_THREADS,
        }
    }

    /// Dynamic shared memory for `hk` kernel heads.
    pub fn smem(self, hk: usize) -> u32 {
        match self {
            V4Core::Mma => smem(hk),
            V4Core::Wg => wg_smem(),
        }
    }

    /// The kernel `entry` of this core, from `mma` or `wg`: the defines
    /// each core's sources take for `hk` kernel heads and V4 rows.
    pub fn spec(self, mma: &'static str, wg: &'static str, entry: &'static str, hk: usize) -> KernelSpec {
        match self {
            V4Core::Mma => KernelSpec::new(mma, &[entry]).define("V4_HEADS", hk),
            V4Core::Wg => KernelSpec::new(wg, &[entry])
                .define("HK", hk)
                .define("KV_FP8", 1)
                .define("WG_V4", 1),
        }
    }

    /// What its FLOP run on, for %TC.
    pub fn tensor_mix(self) -> MmaMix {
        match self {
            V4Core::Mma => MmaMix::one(MmaKind::MmaSyncBf16),
            V4Core::Wg => MmaMix::one(MmaKind::WgmmaBf16),
        }
    }
}

/// Dynamic shared memory of the wgmma core with V4 rows (`wg::SMEM_BYTES`
/// at `WG_V4=1`): Q and two 64-token tiles of 8 column blocks (8 KB each),
/// P0 and P1 (8 KB each), per-row max and rescales (3 x 64 f32), both
/// warpgroups' row sums (2 x 64 f32), 22 mbarriers, and 1 KB to align the
/// base for the 128-byte swizzle.
pub fn wg_smem() -> u32 {
    let tile = 8 * 8192;
    (3 * tile + 2 * 8192 + 3 * 64 * 4 + 2 * 64 * 4 + 22 * 8 + 1024) as u32
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
        // kernels/common/mla_wg.cuh SMEM_BYTES at WG_V4=1
        assert_eq!(wg_smem(), 215_472);
        assert!(wg_smem() <= 232_448);
    }

    #[test]
    fn sixty_four_heads_or_more_on_long_splits_run_on_the_wgmma_core() {
        let auto = V4CoreChoice::Auto;
        let min = WG_MIN_SPLIT_TOKENS;
        assert_eq!(
            [16, 32, 64, 128].map(|h| core(h, 8192, min, auto).0),
            [V4Core::Mma, V4Core::Mma, V4Core::Wg, V4Core::Wg]
        );
        assert_eq!(core(128, min, min, auto).0, V4Core::Wg);
        assert_eq!(core(128, min - 1, min, auto).0, V4Core::Mma);
        assert!(core(128, 1023, WG_MIN_PARTITION_TOKENS, auto)
            .1
            .contains("1023 tokens in the longest split < 1024"));
        assert_eq!(core(64, 128, 0, auto).0, V4Core::Wg);
        assert_eq!(core(32, 8192, 0, auto).0, V4Core::Mma);
        assert!(core(128, 4096, min, auto).1.contains("bf16"));
        // Forced: either core on 64+ heads, and the mma core below them.
        assert_eq!(core(128, 8192, min, V4CoreChoice::Mma).0, V4Core::Mma);
        assert_eq!(core(64, 100, min, V4CoreChoice::Wg).0, V4Core::Wg);
        let (c, why) = core(16, 8192, min, V4CoreChoice::Wg);
        assert_eq!(c, V4Core::Mma);
        assert!(why.contains("needs 64+ heads"), "{why}");
        assert_eq!(V4Core::Wg.block(), 384);
        assert_eq!(V4Core::Wg.tensor_mix().label(), "wgmma bf16");
        assert_eq!(V4Core::Mma.smem(128), smem(128));
    }
}
