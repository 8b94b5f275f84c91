//! One resolved case: the workload parameters, the variant to run and how to judge it.

use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::dcp::Dcp;
use crate::metrics::Tolerances;

/// A variant's name, as scenarios, filters and report rows spell it. What
/// it names (its unit in the registry) is `crate::variants`' to say.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VariantId(pub &'static str);

impl VariantId {
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for VariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for VariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for VariantId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

/// The hardware a plan is made for. Plans use its CU count; kernels run on
/// whatever device the backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetProfile {
    Gfx950,
    Gfx1250,
    Sm90,
}

impl TargetProfile {
    pub fn compute_units(self) -> usize {
        match self {
            TargetProfile::Gfx950 => 256,
            TargetProfile::Gfx1250 => 256,
            TargetProfile::Sm90 => 132,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TargetProfile::Gfx950 => "gfx950",
            TargetProfile::Gfx1250 => "gfx1250",
            TargetProfile::Sm90 => "sm90",
        }
    }
}

impl fmt::Display for TargetProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TargetProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gfx950" => Ok(TargetProfile::Gfx950),
            "gfx1250" => Ok(TargetProfile::Gfx1250),
            "sm90" => Ok(TargetProfile::Sm90),
            _ => Err(format!("unknown target profile `{s}`; known: gfx950, gfx1250, sm90")),
        }
    }
}

/// Element type of Q and KV for the MLA family. V4 is always native FP8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp8,
}

/// How the ps1 work list is cut (SPEC §1 fixes the invariants, not the
/// schedule). `Balanced` (variants/ps1/balance.rs) is the default: on the
/// H200 it keeps every CTA's load within one tile pair of the others;
/// `Payload` is aiter's and FlashMLA's, kept for comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
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

impl FromStr for Ps1Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "payload" => Ok(Ps1Schedule::Payload),
            "balanced" => Ok(Ps1Schedule::Balanced),
            _ => Err(format!("unknown ps1 schedule `{s}`; use balanced or payload")),
        }
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

/// Which core the V4 kernels run on (`--v4-core`): the plan's pick, or one
/// forced, to A/B the two on the same plans (a run option, not part of the
/// id, like the ps1 schedule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum V4CoreChoice {
    /// `v4::core`: the wgmma core for 64+ heads and long enough splits.
    #[default]
    Auto,
    /// The mma.sync core everywhere.
    Mma,
    /// The wgmma core wherever it can run (64+ heads a CTA).
    Wg,
}

impl FromStr for V4CoreChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(V4CoreChoice::Auto),
            "mma" => Ok(V4CoreChoice::Mma),
            "wg" => Ok(V4CoreChoice::Wg),
            _ => Err(format!("unknown V4 core `{s}`; use auto, mma or wg")),
        }
    }
}

impl fmt::Display for V4CoreChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            V4CoreChoice::Auto => "auto",
            V4CoreChoice::Mma => "mma",
            V4CoreChoice::Wg => "wg",
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
    /// How the context is sharded over the DCP ranks.
    pub dcp: Dcp,
    pub s_q: usize,
    pub dtype: Dtype,
    pub page_size: usize,
    pub pool: PoolOrder,
    pub sm_scale: f64,
}

impl MlaParams {
    /// Gathered heads every rank computes: `H_local * W`.
    pub fn heads(&self) -> usize {
        self.heads_local * self.dcp.world
    }
    pub fn total_q(&self) -> usize {
        self.batch * self.s_q
    }
    /// `H_local x W = H`, as `mlabench plan` shows the heads.
    pub fn heads_label(&self) -> String {
        format!("{}x{}={}", self.heads_local, self.dcp.world, self.heads())
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
    /// The V4 kernels' core (a run option, not part of the id).
    pub v4_core: V4CoreChoice,
    /// GPUs the DCP ranks run on, through NCCL (`-g<N>` in the id);
    /// `None`: emulated on one GPU, rank after rank.
    pub dcp_devices: Option<usize>,
    /// The element type of that step's reduce-scatter (`-rs32` in the id for f32).
    pub dcp_reduce: crate::dcp::Reduce,
    pub scenario: PathBuf,
}

impl Case {
    /// The settings a report row lists under `params`, by name.
    pub fn params_map(&self) -> BTreeMap<String, String> {
        let case = self;
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("target", case.target.to_string());
        put("cus", case.cus.to_string());
        put("seed", case.seed.to_string());
        match &case.params {
            CaseParams::Mla(p) => {
                put("family", "mla".into());
                put("batch", p.batch.to_string());
                put("ctx", p.ctx_label.clone());
                put("ctx_min", p.ctx.iter().min().unwrap_or(&0).to_string());
                put("ctx_max", p.ctx.iter().max().unwrap_or(&0).to_string());
                put(
                    "ctx_mean",
                    format!("{:.0}", p.ctx.iter().sum::<usize>() as f64 / p.batch.max(1) as f64),
                );
                put("heads_local", p.heads_local.to_string());
                put("heads", p.heads().to_string());
                put("dcp_world", p.dcp.world.to_string());
                put("interleave", p.dcp.interleave.to_string());
                put("s_q", p.s_q.to_string());
                put("dtype", p.dtype.to_string());
                put("page_size", p.page_size.to_string());
                if let Some(n) = case.dcp_devices {
                    put("dcp_devices", n.to_string());
                    put("dcp_reduce", case.dcp_reduce.to_string());
                }
            }
            CaseParams::V4(p) => {
                put("family", "v4".into());
                put("layer", p.layer.to_string());
                put("rows", p.rows.to_string());
                put("padded_rows", p.padded_rows.to_string());
                put("heads", p.heads.to_string());
                put("positions", p.pos_label.clone());
                put("verify", p.verify.to_string());
                put("index_topk", p.index_topk.to_string());
                put("partitions", case.v4.partitions.to_string());
                put("min_rows", case.v4.min_rows.to_string());
                if let Some(n) = case.v4.splits {
                    put("splits", n.to_string());
                }
            }
        }
        m
    }

    /// This case with its DCP ranks on `n` GPUs, as a case of its own: the
    /// same data, measured as a whole decode step.
    pub fn on_devices(&self, n: usize, reduce: crate::dcp::Reduce) -> Case {
        let mut c = self.clone();
        c.id = compose_id(&self.id, &format!("-g{n}{}", reduce.knob()));
        c.dcp_devices = Some(n);
        c.dcp_reduce = reduce;
        c
    }

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
