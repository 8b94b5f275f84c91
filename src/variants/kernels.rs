//! Which kernel configuration each variant launches, as data: the file, its
//! `-D` defines and entry points, plus the launch facts the ABI fixes
//! (block size, dynamic shared memory). `kernels --check` compiles `all()`.

use crate::backend::cuda::KernelSpec;

/// 16-row m-tiles per pass: 1 for the 16-row decode hot path, else 2 (kernels/ABI.md).
pub fn mla_mt(kernel_heads: usize, s_q: usize) -> usize {
    if kernel_heads * s_q == 16 {
        1
    } else {
        2
    }
}

/// The launch shape of `ps1_fwd` / `page64_fwd`, passed to the kernel as
/// `-D` defines so host and kernel agree by construction (kernels/ABI.md;
/// measured in kernels/dev/NOTES.md).
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
/// alternate tiles with a 2-deep ring each; bf16 keeps Q in shared memory
/// (`QSMEM`), fp8 always does (as the wgmma B operand). MT=2 runs one group
/// of 8 warps, 4-deep ring. Measured in kernels/dev/NOTES.md (v5, v6, v8).
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

fn mla(file: &'static str, entries: &[&'static str], hk: usize, fp8: bool, mt: usize) -> KernelSpec {
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

/// ps1 fp8 loads whole 128-byte lines per cp.async (`LD_LINES`, v8i in
/// kernels/dev/NOTES.md), since scattered rows fill the SM's request queue,
/// and hoists its address arithmetic (`HOIST`), which lost at long contexts
/// alone but wins with the line loader (session 5, kernels/dev/NOTES.md).
/// Q's loads overlap its first KV tiles' (`EARLY_Q`, session 7 in
/// docs/perf-notes.md; page64 lost with it).
pub fn ps1(hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    mla("ps1.cu", &["ps1_fwd", "ps1_reduce"], hk, fp8, mt)
        .define("LD_LINES", fp8 as u8)
        .define("HOIST", fp8 as u8)
        .define("EARLY_Q", 1)
}

/// page64 fp8 hoists its address arithmetic out of the tile loop (`HOIST`,
/// v8e in kernels/dev/NOTES.md).
pub fn page64(hk: usize, fp8: bool, mt: usize) -> KernelSpec {
    mla("page64.cu", &["page64_fwd", "page64_merge"], hk, fp8, mt).define("HOIST", fp8 as u8)
}

pub fn merge() -> KernelSpec {
    KernelSpec::new("merge.cu", &["dcp_combine", "split_merge"])
}

pub fn v4_split(hk: usize) -> KernelSpec {
    KernelSpec::new("v4_split.cu", &["v4_split"]).define("V4_HEADS", hk)
}

pub fn hca_persist(hk: usize) -> KernelSpec {
    KernelSpec::new("hca_persist.cu", &["hca_persist"]).define("V4_HEADS", hk)
}

/// Heads each V4 CTA handles, and the CTAs per row (kernels/ABI.md).
pub fn v4_groups(hk: usize) -> u32 {
    (hk / hk.min(64)) as u32
}

/// Dynamic shared memory of the V4 kernels (kernels/ABI.md formula).
pub fn v4_smem(hk: usize) -> u32 {
    let hg = hk.min(64);
    let nsl = 8 / (hg / hg.min(32));
    (hg * 1040 + 2 * 32 * 1040 + 2 * 32 * 592 + nsl * hg * 40 * 4 + hg * 80 + hg * 12 + 1024) as u32
}

/// The configurations a case launches (none where the gate skips it).
pub fn launched(case: &crate::case::Case, decision: &super::Decision) -> Vec<KernelSpec> {
    use super::VariantId::*;
    use crate::case::CaseParams;
    use crate::plan::heads;
    if decision.skip.is_some() {
        return vec![];
    }
    match (&case.params, case.variant) {
        (CaseParams::Mla(p), Ps1) => heads::kernel_heads(p.heads(), p.s_q)
            .map(|hk| vec![ps1(hk, p.dtype == crate::case::Dtype::Fp8, mla_mt(hk, p.s_q))])
            .unwrap_or_default(),
        (CaseParams::Mla(p), Page64) => heads::page64_heads(p.heads())
            .map(|hk| vec![page64(hk, p.dtype == crate::case::Dtype::Fp8, mla_mt(hk, p.s_q))])
            .unwrap_or_default(),
        (CaseParams::Mla(_), DcpCombine) | (CaseParams::V4(_), SplitMerge) => vec![merge()],
        (CaseParams::V4(p), HcaPersist) if decision.fallback.is_none() => vec![hca_persist(p.kernel_heads())],
        (CaseParams::V4(p), V4Split | HcaPersist) => vec![v4_split(p.kernel_heads()), merge()],
        _ => vec![],
    }
}

/// Every configuration a run can launch; all must compile for sm_90a.
pub fn all() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for hk in (16..=128).step_by(16) {
        for fp8 in [false, true] {
            for mt in [1, 2] {
                v.push(ps1(hk, fp8, mt));
                v.push(page64(hk, fp8, mt));
            }
        }
    }
    v.push(merge());
    for hk in [16, 32, 64, 128] {
        v.push(v4_split(hk));
    }
    v.push(hca_persist(128));
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
        assert_eq!([16, 32, 64, 128].map(v4_smem), [144_064, 182_656, 218_880, 218_880]);
        assert_eq!([16, 32, 64, 128].map(v4_groups), [1, 1, 1, 2]);
    }

    #[test]
    fn every_variant_kernel_is_listed_once() {
        let all = all();
        let mut labels: Vec<String> = all.iter().map(|s| s.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
        assert_eq!(all.len(), 8 * 2 * 2 * 2 + 1 + 4 + 1);
    }
}
