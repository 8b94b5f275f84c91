//! One resolved case: the workload parameters, the variant to run and how to judge it.

use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

use crate::metrics::Tolerances;
use crate::plan::gate::TargetProfile;
use crate::variants::VariantId;

/// Element type of Q and KV for the MLA family. V4 is always native FP8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp8,
}

/// How the ps1 work list is cut (SPEC §1 fixes the invariants, not the
/// schedule). `Balanced` (plan/balance.rs) is the default since the H200
/// measured it (kernels/dev/NOTES.md session 5); `Payload` is aiter's and
/// FlashMLA's, kept for comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Ps1Schedule {
    /// A fixed payload per CTA in sequence order (may overshoot it by a minimum chunk).
    Payload,
    /// Whole tile pairs, the smallest per-CTA load a fill in sequence order meets.
    #[default]
    Balanced,
}

impl Ps1Schedule {
    /// What a run's metadata without the field means: runs made before
    /// `--ps1-schedule` existed used the payload schedule.
    pub fn before_choice() -> Self {
        Ps1Schedule::Payload
    }
}

impl fmt::Display for Ps1Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ps1Schedule::Payload => "payload",
            Ps1Schedule::Balanced => "balanced",
        })
    }
}

/// How a two-kernel MLA variant's second kernel (ps1's reduce, page64's
/// merge) follows its forward (kernels/common/pdl.cuh).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Handoff {
    /// Programmatic dependent launch: the second kernel's blocks start
    /// during the forward and wait for its results on the device.
    #[default]
    Pdl,
    /// Plain stream order: the second kernel launches after the forward.
    Stream,
}

impl Handoff {
    /// Runs made before `--handoff` existed used stream order.
    pub fn before_choice() -> Self {
        Handoff::Stream
    }
}

impl fmt::Display for Handoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Handoff::Pdl => "pdl",
            Handoff::Stream => "stream",
        })
    }
}

/// Where a sequence's pages sit in the pool. Engines hand out pages from a
/// free list, so `Shuffled` is the realistic case; `Contiguous` (page k of
/// the whole batch is pool page k) isolates what the scattered gather costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolOrder {
    #[default]
    Shuffled,
    Contiguous,
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
        })
    }
}

/// DeepSeek-V4 attention layer type, named by its compress ratio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerType {
    Swa,
    Csa,
    Hca,
}

impl LayerType {
    pub fn compress_ratio(self) -> usize {
        match self {
            LayerType::Swa => 0,
            LayerType::Csa => 4,
            LayerType::Hca => 128,
        }
    }
}

impl fmt::Display for LayerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayerType::Swa => "swa",
            LayerType::Csa => "csa",
            LayerType::Hca => "hca",
        })
    }
}

/// Latent dims of the MLA family (SPEC §1).
pub const MLA_D_QK: usize = 576;
pub const MLA_D_V: usize = 512;
/// V4 row: 448 fp8 nope + 64 bf16 rope; K and V are the same 512 elements.
pub const V4_D_NOPE: usize = 448;
pub const V4_D_ROPE: usize = 64;
pub const V4_D: usize = 512;
pub const V4_WINDOW: usize = 128;

/// MLA decode workload (Kimi-K3 / DeepSeek-V3 style).
#[derive(Clone, Debug, Serialize)]
pub struct MlaParams {
    pub batch: usize,
    /// Global context length `L_b` of each sequence, query tokens included.
    pub ctx: Vec<usize>,
    /// How the lengths were specified, for ids and tables.
    pub ctx_label: String,
    pub heads_local: usize,
    pub dcp_world: usize,
    pub interleave: usize,
    pub s_q: usize,
    pub dtype: Dtype,
    pub page_size: usize,
    pub pool: PoolOrder,
    pub sm_scale: f64,
}

impl MlaParams {
    /// Gathered heads every rank computes: `H_local * W`.
    pub fn heads(&self) -> usize {
        self.heads_local * self.dcp_world
    }
    pub fn total_q(&self) -> usize {
        self.batch * self.s_q
    }
}

/// DeepSeek-V4 decode workload: one row per decode or verify token.
#[derive(Clone, Debug, Serialize)]
pub struct V4Params {
    pub layer: LayerType,
    /// Real rows `N`.
    pub rows: usize,
    /// Padded row count `T >= N` (CUDA-graph size).
    pub padded_rows: usize,
    /// Query heads as the model has them; the kernel pads to at least 16.
    pub heads: usize,
    /// Global position of each real row.
    pub positions: Vec<usize>,
    pub pos_label: String,
    /// Consecutive rows that belong to one sequence (1 = plain decode).
    pub verify: usize,
    pub index_topk: usize,
    pub max_model_len: usize,
    pub sm_scale: f64,
    /// `kv_indptr[0]`: lists start this far into `kv_indices`, after junk
    /// entries that point at NaN rows (as a caller slicing a larger CSR does).
    pub indptr_offset: usize,
    /// Replays after the first run, each with grown positions and new lists
    /// (CUDA: one graph captured at T, replayed with new buffer contents).
    pub replay: usize,
}

/// Positions of replay step `s` grow by this many tokens per step.
pub const V4_REPLAY_GROWTH: usize = 301;

impl V4Params {
    /// Heads the kernels run with (SPEC §2: fewer than 16 pad to 16).
    pub fn kernel_heads(&self) -> usize {
        self.heads.max(16)
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum CaseParams {
    Mla(MlaParams),
    V4(V4Params),
}

/// Knobs of the V4 variants that are not workload shape.
#[derive(Clone, Debug, Serialize)]
pub struct V4Knobs {
    pub min_rows: usize,
    pub partitions: usize,
    /// Fixed split count for `v4_split`; `None` = the heuristic's pick.
    pub splits: Option<usize>,
    /// Whether the hca_persist workspace exists (a capture without one falls back).
    pub workspace: bool,
    /// Launch over the N real rows only (an eager call), not the padded T.
    pub eager: bool,
}

impl Default for V4Knobs {
    fn default() -> Self {
        V4Knobs {
            min_rows: 15,
            partitions: 128,
            splits: None,
            workspace: true,
            eager: false,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Case {
    /// Stable id: the readable shape, then `@` and a digest of every other
    /// setting that changes the bytes, the reference or the verdict (seed,
    /// sm_scale, target, pool, tolerances, ...), so two different cases never
    /// share an id. See [`compose_id`].
    pub id: String,
    /// Id of the data the case computes on (page size and run knobs left
    /// out, digest kept): cases that share it share inputs and references.
    pub data_id: String,
    pub variant: VariantId,
    pub params: CaseParams,
    /// Workload seed, derived from the scenario seed and the id.
    pub seed: u64,
    pub tol: Tolerances,
    /// Run even when the dispatch gate rejects the variant.
    pub force: bool,
    pub target: TargetProfile,
    /// Compute units the plans assume (profile default unless overridden).
    pub cus: usize,
    pub v4: V4Knobs,
    /// The ps1 work-list schedule (a run option, not part of the id).
    pub ps1_schedule: Ps1Schedule,
    pub scenario: PathBuf,
}

impl Case {
    /// The `--case` filter that selects exactly this case's rows.
    pub fn exact_filter(&self) -> String {
        format!("={}", self.id)
    }

    /// `id/variant`, the key of a report row.
    pub fn key(&self) -> String {
        format!("{}/{}", self.id, self.variant)
    }

    pub fn mla(&self) -> Option<&MlaParams> {
        match &self.params {
            CaseParams::Mla(p) => Some(p),
            CaseParams::V4(_) => None,
        }
    }

    pub fn v4(&self) -> Option<&V4Params> {
        match &self.params {
            CaseParams::V4(p) => Some(p),
            CaseParams::Mla(_) => None,
        }
    }
}

/// A case id from its data id (`shape@digest`) and the knobs that make it
/// another case on the same data (`-p64`, `-n4`, `-eager`): the knobs go
/// before the digest, so every id reads `shape-knobs@digest`.
pub fn compose_id(data_id: &str, knobs: &str) -> String {
    match data_id.split_once('@') {
        Some((shape, digest)) => format!("{shape}{knobs}@{digest}"),
        None => format!("{data_id}{knobs}"),
    }
}

/// Whether a `--case` filter selects an id: `=ID` matches exactly (what
/// repro commands use), anything else as a substring.
pub fn filter_matches(filter: &str, id: &str) -> bool {
    match filter.strip_prefix('=') {
        Some(exact) => id == exact,
        None => id.contains(filter),
    }
}

/// FNV-1a, for seeds derived from ids: stable across platforms and releases.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
