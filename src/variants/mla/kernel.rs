//! The launch shape of `ps1_fwd` / `page64_fwd`, given to the kernel as `-D`
//! defines so host and kernel agree by construction, and the dynamic shared
//! memory it implies (kernels/ABI.md). The one place the host knows them:
//! which core a case runs on (the mma.sync core of `common/mla_core.cuh`
//! or the wgmma core of `common/mla_wg.cuh`), and each core's shape.

use crate::case::{MLA_D_QK, MLA_D_V};
use crate::tensor_ceiling::{MmaKind, MmaMix};
use crate::variants::KernelSpec;

/// Query rows the wgmma core computes per CTA (`wg::BM`).
pub const WG_ROWS: usize = 64;
/// Threads of a wgmma-core CTA: two consumer warpgroups and a producer (`wg::THREADS`).
pub const WG_THREADS: u32 = 384;
/// Tokens per wgmma-core work unit: a pair of 64-token tiles (the seesaw).
pub const WG_UNIT_TOKENS: usize = 128;

/// The forward core of an MLA decode case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    /// `common/mla_core.cuh`: 16 x `mt` rows per pass, mma.sync (and e4m3
    /// wgmma for fp8 Q.K).
    Mma { mt: usize },
    /// `common/mla_wg.cuh`: 64 rows per CTA, 16-bit wgmma for both products
    /// (bf16, or f16 for fp8: the producer converts e4m3 as it loads).
    Wg,
}

impl Core {
    pub fn name(self) -> &'static str {
        match self {
            Core::Mma { .. } => "mma",
            Core::Wg => "wg",
        }
    }
}

/// The core a case runs on, and why: where 64 or more query rows share each
/// KV token the decode is bound by the tensor cores and the wgmma core
/// computes them in one pass.
pub fn mla_core(kernel_heads: usize, s_q: usize, fp8: bool) -> (Core, String) {
    let rows = kernel_heads * s_q;
    if rows < WG_ROWS {
        let mma = Core::Mma {
            mt: mla_mt(kernel_heads, s_q),
        };
        (mma, format!("rows {kernel_heads}x{s_q} = {rows} < {WG_ROWS}"))
    } else {
        let how = if fp8 { "e4m3 loaded as f16" } else { "bf16" };
        (
            Core::Wg,
            format!("rows {kernel_heads}x{s_q} = {rows} >= {WG_ROWS}, {how}"),
        )
    }
}

/// The instructions a core's FLOP run on, for %TC: the wgmma core runs both
/// products on 16-bit wgmma (f16 for fp8, which issues at the bf16 rate the
/// probe measures); the mma core runs them on mma.sync, except fp8's Q.K
/// (576 of the 1088 MAC per row and token) on e4m3 wgmma (its P.V is an f16
/// mma.sync, which runs at the bf16 rate).
pub fn tensor_mix(core: Core, fp8: bool) -> MmaMix {
    match (core, fp8) {
        (Core::Wg, _) => MmaMix::one(MmaKind::WgmmaBf16),
        (Core::Mma { .. }, false) => MmaMix::one(MmaKind::MmaSyncBf16),
        (Core::Mma { .. }, true) => MmaMix::of(&[
            (MmaKind::WgmmaE4m3, MLA_D_QK as f64),
            (MmaKind::MmaSyncBf16, MLA_D_V as f64),
        ]),
    }
}

/// Row blocks of `WG_ROWS` one sequence's `kernel_heads * s_q` rows make.
pub fn wg_row_blocks(kernel_heads: usize, s_q: usize) -> usize {
    (kernel_heads * s_q).div_ceil(WG_ROWS)
}

/// Dynamic shared memory of the wgmma core (`wg::SMEM_BYTES`): Q and two
/// 64-token tiles (9 column blocks of 8 KB each), per-row max and rescales
/// (3 x 64 f32), both warpgroups' row sums (2 x 64 f32), 24 mbarriers, and
/// 1 KB to align the base for the 128-byte swizzle.
pub fn wg_smem() -> u32 {
    let tile = 9 * 8192;
    (3 * tile + 3 * WG_ROWS * 4 + 2 * WG_ROWS * 4 + 24 * 8 + 1024) as u32
}

/// The wgmma core's configuration of `file` for `hk` kernel heads.
pub fn wg_spec(file: &'static str, entries: &[&'static str], hk: usize, fp8: bool) -> KernelSpec {
    KernelSpec::new(file, entries)
        .define("HK", hk)
        .define("KV_FP8", fp8 as u8)
}

/// 16-row m-tiles per pass: 1 for the 16-row decode hot path, else 2 (kernels/ABI.md).
pub fn mla_mt(kernel_heads: usize, s_q: usize) -> usize {
    if kernel_heads * s_q == 16 {
        1
    } else {
        2
    }
}

/// The launch shape of `ps1_fwd` / `page64_fwd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    /// Warps per CTA (all groups): the block is `32 * warps` threads.
    pub warps: usize,
    /// Consumer groups, each with its own cp.async ring (1 or 2).
    pub groups: usize,
    /// Tokens per tile.
    pub bn: usize,
    /// cp.async ring depth per group.
    pub stages: usize,
    /// Q staged in shared memory (`QSMEM=1`) instead of registers.
    pub qsmem: bool,
}

/// MT=1 (the 16-row decode hot path) runs two consumer groups of 8 warps on
/// alternate tiles with a 2-deep ring each, so one group's softmax overlaps
/// the other's loads; bf16 keeps Q in shared memory (`QSMEM`), fp8 always
/// does (as the wgmma B operand). MT=2 runs one group of 8 warps with a
/// 4-deep ring: twice the rows per pass leave no room for a second group.
pub fn mla_shape(fp8: bool, mt: usize) -> MlaShape {
    let bn = if fp8 { 64 } else { 32 };
    if mt == 1 {
        MlaShape {
            warps: 16,
            groups: 2,
            bn,
            stages: 2,
            qsmem: !fp8,
        }
    } else {
        MlaShape {
            warps: 8,
            groups: 1,
            bn,
            stages: 4,
            qsmem: false,
        }
    }
}

/// Dynamic shared memory of `ps1_fwd` / `page64_fwd` (kernels/ABI.md formula).
pub fn mla_smem(fp8: bool, mt: usize, shape: MlaShape) -> u32 {
    let MlaShape {
        groups,
        bn,
        stages,
        qsmem,
        ..
    } = shape;
    let rows = 16 * mt;
    if fp8 {
        // 128-byte-swizzled tiles of 5 column blocks; Q block 1024-aligned; 1 KB alignment slack
        let per_group = stages * bn * 640 + 2 * rows * (bn + 4) * 4 + rows * (bn + 8) * 2 + rows * 8;
        let q_off = (groups * per_group).div_ceil(1024) * 1024;
        return (q_off + 5 * rows * 128 + 1024) as u32;
    }
    let per_group = stages * bn * (576 * 2 + 16) + 4 * rows * (bn + 8) * 4 + rows * (bn + 8) * 2 + rows * 8;
    let q = if qsmem { rows * (576 * 2 + 16) } else { 0 };
    (groups * per_group + q) as u32
}

pub fn spec(file: &'static str, entries: &[&'static str], hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    let sh = mla_shape(fp8, mt);
    KernelSpec::new(file, entries)
        .define("HK", hk)
        .define("KV_FP8", fp8 as u8)
        .define("MT", mt)
        .define("WARPS", sh.warps)
        .define("GROUPS", sh.groups)
        .define("BN", sh.bn)
        .define("STAGES", sh.stages)
        .define("QSMEM", sh.qsmem as u8)
}

/// A decode kernel's configuration at every shape it can be launched with
/// (kernel heads 16..=128 in steps of 16; the mma core at bf16 and fp8, one
/// or two query rows per MMA tile; the wgmma core at bf16 and fp8), so CI
/// compiles each one.
pub fn every_shape(
    spec: impl Fn(usize, bool, usize) -> KernelSpec,
    wg: impl Fn(usize, bool) -> KernelSpec,
) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for hk in (16..=128).step_by(16) {
        for fp8 in [false, true] {
            for mt in [1, 2] {
                v.push(spec(hk, fp8, mt));
            }
            v.push(wg(hk, fp8));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wgmma_core_takes_cases_of_64_rows_or_more() {
        assert_eq!(mla_core(16, 1, false).0, Core::Mma { mt: 1 });
        assert_eq!(mla_core(32, 1, false).0, Core::Mma { mt: 2 });
        assert_eq!(mla_core(32, 1, true).0, Core::Mma { mt: 2 });
        assert_eq!(mla_core(16, 4, false).0, Core::Wg);
        assert_eq!(mla_core(96, 8, false).0, Core::Wg);
        assert_eq!(mla_core(128, 1, true).0, Core::Wg);
        assert!(mla_core(128, 1, true).1.contains("e4m3 loaded as f16"));
        assert!(mla_core(64, 1, false).1.contains("bf16"));
        assert_eq!(wg_row_blocks(96, 8), 12);
        assert_eq!(wg_row_blocks(48, 2), 2);
        // kernels/common/mla_wg.cuh SMEM_BYTES
        assert_eq!(wg_smem(), 223_680);
        assert!(wg_smem() <= 232_448);
    }

    #[test]
    fn each_core_names_the_ceiling_its_mmas_run_at() {
        assert_eq!(tensor_mix(Core::Wg, false).label(), "wgmma bf16");
        assert_eq!(tensor_mix(Core::Mma { mt: 1 }, false).label(), "mma.sync bf16");
        assert_eq!(
            tensor_mix(Core::Mma { mt: 1 }, true).label(),
            "wgmma e4m3 53% + mma.sync bf16 47%"
        );
    }

    #[test]
    fn smem_matches_the_abi_tables() {
        let smem = |fp8, mt| mla_smem(fp8, mt, mla_shape(fp8, mt));
        assert_eq!(smem(false, 1), 191_488);
        assert_eq!(smem(true, 1), 197_632);
        assert_eq!(smem(false, 2), 172_800);
        assert_eq!(smem(true, 2), 207_872);
        for fp8 in [false, true] {
            for mt in [1, 2] {
                assert!(smem(fp8, mt) <= 232_448);
                let sh = mla_shape(fp8, mt);
                assert_eq!(sh.warps % (4 * sh.groups), 0);
                assert!(mt == 1 || sh.warps == 8);
                // fp8: two warpgroups per group, 64-token tiles (the wgmma M)
                assert!(!fp8 || (sh.warps / sh.groups == 8 && sh.bn == 64 && !sh.qsmem));
            }
        }
    }
}
