//! The launch shape of `ps1_fwd` / `page64_fwd`, given to the kernel as `-D`
//! defines so host and kernel agree by construction, and the dynamic shared
//! memory it implies (kernels/ABI.md). The one place the host knows them.

use crate::variants::KernelSpec;

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
/// (kernel heads 16..=128 in steps of 16, bf16 and fp8, one or two query
/// rows per MMA tile), so CI compiles each one.
pub fn every_shape(spec: impl Fn(usize, bool, usize) -> KernelSpec) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for hk in (16..=128).step_by(16) {
        for fp8 in [false, true] {
            for mt in [1, 2] {
                v.push(spec(hk, fp8, mt));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

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
