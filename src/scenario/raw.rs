//! The scenario file as written: serde types that reject unknown keys. Axis
//! values stay `toml::Value` here so errors can name the key and the reason.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    pub name: Option<String>,
    pub description: Option<String>,
    pub seed: Option<u64>,
    /// Target profile the plans assume: gfx950, gfx1250 or sm90.
    pub target: Option<String>,
    /// Compute units override for the plans.
    pub cus: Option<usize>,
    #[serde(default)]
    pub mla: Vec<RawMla>,
    #[serde(default)]
    pub v4: Vec<RawV4>,
    /// Implementations the blocks may name, declared in place.
    #[serde(default, rename = "impl")]
    pub imps: Vec<crate::variants::external::decl::RawImpl>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMla {
    pub label: Option<String>,
    pub batch: Option<toml::Value>,
    pub context: Option<toml::Value>,
    pub heads_local: Option<toml::Value>,
    pub dcp_world: Option<toml::Value>,
    pub interleave: Option<toml::Value>,
    pub s_q: Option<toml::Value>,
    pub dtype: Option<toml::Value>,
    pub page_size: Option<toml::Value>,
    /// "shuffled" (default) or "contiguous" page placement.
    pub pool: Option<String>,
    pub variants: Option<toml::Value>,
    pub force: Option<toml::Value>,
    pub sm_scale: Option<f64>,
    pub seed: Option<u64>,
    pub tolerance: Option<RawTolerances>,
    /// Also run each DCP case's ranks on GPUs through NCCL: 1, 2, 4, 8 or
    /// "world" (one GPU per rank).
    pub dcp_devices: Option<toml::Value>,
    /// The step's reduce-scatter type(s): "bf16" (vLLM's), "f32", or both.
    pub dcp_reduce: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawV4 {
    pub label: Option<String>,
    pub layer: Option<toml::Value>,
    pub rows: Option<toml::Value>,
    pub pad_rows: Option<toml::Value>,
    pub heads: Option<toml::Value>,
    pub position: Option<toml::Value>,
    pub verify: Option<toml::Value>,
    pub index_topk: Option<usize>,
    pub max_model_len: Option<usize>,
    pub variants: Option<toml::Value>,
    pub splits: Option<toml::Value>,
    pub min_rows: Option<usize>,
    pub partitions: Option<usize>,
    pub workspace: Option<bool>,
    pub eager: Option<bool>,
    pub indptr_offset: Option<toml::Value>,
    pub replay: Option<usize>,
    pub sm_scale: Option<f64>,
    pub seed: Option<u64>,
    pub tolerance: Option<RawTolerances>,
}

/// Per-dtype partial overrides; each may only tighten the default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTolerances {
    pub bf16: Option<RawTol>,
    pub fp8: Option<RawTol>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct RawTol {
    pub cos_diff: Option<f64>,
    pub mismatch: Option<f64>,
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub lse_abs: Option<f64>,
}
