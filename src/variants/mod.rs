//! The one registry of decode variants. Each variant says what it computes,
//! whether it supports a case, and builds its plan; backends execute plans.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

pub mod kernels;
pub mod plans;

pub use plans::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantId {
    Ps1,
    Page64,
    DcpCombine,
    V4Split,
    HcaPersist,
    SplitMerge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Mla,
    V4,
}

/// Static facts about a variant.
pub struct VariantInfo {
    pub id: VariantId,
    pub name: &'static str,
    pub family: Family,
    /// CUDA source under kernels/ (None: host-only or shares another's file).
    pub kernel_file: &'static str,
    /// One-line contract, for `mlabench list`.
    pub contract: &'static str,
    /// Why two launches on the same inputs may differ in their bits, if they
    /// may; `None`: repeated checked launches must match bit for bit.
    pub nondeterministic: Option<&'static str>,
}

pub const REGISTRY: &[VariantInfo] = &[
    VariantInfo {
        id: VariantId::Ps1,
        name: "ps1",
        family: Family::Mla,
        kernel_file: "ps1.cu",
        contract: "persistent MLA decode, page size 1, host work list, causal mask on global DCP positions; widths 16..128 (s_q=1), 16 (s_q<=4) and 96 (s_q<=8); f32 partials + reduce",
        nondeterministic: None,
    },
    VariantInfo {
        id: VariantId::Page64,
        name: "page64",
        family: Family::Mla,
        kernel_file: "page64.cu",
        contract: "non-persistent fallback, page size 64, split heuristic, local bottom-right mask; heads multiple of 16 up to 128; stage 1 partials + stage 2 merge",
        nondeterministic: None,
    },
    VariantInfo {
        id: VariantId::DcpCombine,
        name: "dcp_combine",
        family: Family::Mla,
        kernel_file: "merge.cu",
        contract: "merges per-rank (o, lse) over the DCP world with the LSE combine; NaN/+inf LSE count as empty",
        nondeterministic: None,
    },
    VariantInfo {
        id: VariantId::V4Split,
        name: "v4_split",
        family: Family::V4,
        kernel_file: "v4_split.cu",
        contract: "V4 native-FP8 decode with a caller-built split plan from the uniform [16, T+1] table (or its own pick), attention sink, split_merge",
        nondeterministic: None,
    },
    VariantInfo {
        id: VariantId::HcaPersist,
        name: "hca_persist",
        family: Family::V4,
        kernel_file: "hca_persist.cu",
        contract: "persistent V4 HCA decode: in-kernel split over P partitions from real lengths, last finisher merges and resets counters; gates fall back to v4_split",
        nondeterministic: Some(
            "the last CTA to finish a split row merges it, adding its own piece first: which CTA that is depends on scheduling, and f32 sums in another order differ in their last bits",
        ),
    },
    VariantInfo {
        id: VariantId::SplitMerge,
        name: "split_merge",
        family: Family::V4,
        kernel_file: "merge.cu",
        contract: "merges split partials (f32 o, lse without sink) per row and adds the attention sink once",
        nondeterministic: None,
    },
];

impl VariantId {
    pub fn info(self) -> &'static VariantInfo {
        REGISTRY.iter().find(|v| v.id == self).expect("every id is registered")
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    pub fn family(self) -> Family {
        self.info().family
    }
}

impl fmt::Display for VariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VariantId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        REGISTRY.iter().find(|v| v.name == s).map(|v| v.id).ok_or_else(|| {
            let names: Vec<_> = REGISTRY.iter().map(|v| v.name).collect();
            format!("unknown variant `{s}`; known: {}", names.join(", "))
        })
    }
}
