//! Scenario files: loading with errors that name the file and key, and sweep
//! expansion into cases.

pub mod axis;
pub mod lengths;
pub mod raw;

use std::path::{Path, PathBuf};

use crate::case::TargetProfile;
use crate::case::{
    compose_id, stable_hash, Case, CaseParams, Dtype, LayerType, MlaParams, PoolOrder, Ps1Schedule, V4Knobs, V4Params,
};
use crate::dcp::{Dcp, Devices, Reduce};
use crate::error::InputError;
use crate::metrics::Tolerances;
use crate::variants::{Family, VariantId};
use axis::{required, str_axis, usize_axis};
use lengths::LengthSpec;
use raw::{RawMla, RawScenario, RawTol, RawTolerances, RawV4};

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub path: PathBuf,
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub target: TargetProfile,
    pub cus: usize,
    pub mla: Vec<MlaBlock>,
    pub v4: Vec<V4Block>,
}

#[derive(Clone, Debug)]
pub struct MlaBlock {
    pub label: String,
    pub batch: Vec<usize>,
    pub context: Vec<LengthSpec>,
    pub heads_local: Vec<usize>,
    pub dcp_world: Vec<usize>,
    pub interleave: Vec<usize>,
    pub s_q: Vec<usize>,
    pub dtype: Vec<Dtype>,
    /// `None`: each variant's native page size.
    pub page_size: Option<Vec<usize>>,
    pub pool: PoolOrder,
    pub variants: Vec<VariantId>,
    pub force: Vec<VariantId>,
    pub sm_scale: f64,
    pub seed: u64,
    pub tol_bf16: Tolerances,
    pub tol_fp8: Tolerances,
    /// Each decode case also runs on these GPUs (a `-g<N>` twin), once
    /// per reduce-scatter type.
    pub dcp_devices: Option<Devices>,
    pub dcp_reduce: Vec<Reduce>,
}

#[derive(Clone, Debug)]
pub struct V4Block {
    pub label: String,
    pub layer: Vec<LayerType>,
    pub rows: Vec<usize>,
    pub pad_rows: Vec<usize>,
    pub heads: Vec<usize>,
    pub position: Vec<LengthSpec>,
    pub verify: Vec<usize>,
    pub index_topk: usize,
    pub max_model_len: usize,
    pub variants: Vec<VariantId>,
    /// `None` = the heuristic's pick.
    pub splits: Vec<Option<usize>>,
    pub min_rows: usize,
    pub partitions: usize,
    pub workspace: bool,
    pub eager: bool,
    pub indptr_offset: Vec<usize>,
    pub replay: usize,
    pub sm_scale: f64,
    pub seed: u64,
    pub tol: Tolerances,
}

/// Most sequences one MLA case may hold.
pub const MAX_BATCH: usize = 1 << 20;
/// Most rows (real or padded) of a V4 case: SPEC section 2's limit.
pub const V4_MAX_ROWS: usize = 32768;

/// Default MLA softmax scale: the model's 128 nope + 64 rope head dim.
pub fn default_mla_sm_scale() -> f64 {
    192f64.powf(-0.5)
}

pub fn load(path: &Path) -> Result<Scenario, InputError> {
    let file = path.display().to_string();
    let err = |msg: String| InputError::Scenario {
        file: file.clone(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read the file: {e}")))?;
    let raw: RawScenario = toml::from_str(&text).map_err(|e| err(e.to_string().trim_end().to_string()))?;
    validate(path, raw).map_err(err)
}

fn validate(path: &Path, mut raw: RawScenario) -> Result<Scenario, String> {
    // Declared first: the blocks' `variants` may name them.
    for (i, imp) in std::mem::take(&mut raw.imps).into_iter().enumerate() {
        let source = format!("{} [[impl]] #{}", path.display(), i + 1);
        let decl =
            crate::variants::external::decl::validate(imp, &source).map_err(|e| format!("[[impl]] #{}: {e}", i + 1))?;
        crate::variants::declare(decl).map_err(|e| format!("[[impl]] #{}: {e}", i + 1))?;
    }
    let target = match &raw.target {
        Some(t) => t.parse::<TargetProfile>().map_err(|e| format!("key `target`: {e}"))?,
        None => TargetProfile::Sm90,
    };
    let cus = raw.cus.unwrap_or(target.compute_units());
    if cus == 0 {
        return Err("key `cus`: must be at least 1".into());
    }
    if raw.mla.is_empty() && raw.v4.is_empty() {
        return Err("no [[mla]] or [[v4]] block: a scenario needs at least one sweep block".into());
    }
    let seed = raw.seed.unwrap_or(0);
    let name = raw.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let mla = raw
        .mla
        .iter()
        .enumerate()
        .map(|(i, b)| {
            mla_block(b, seed).map_err(|e| {
                format!(
                    "[[mla]] #{} ({}): {e}",
                    i + 1,
                    b.label.as_deref().unwrap_or("unlabelled")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let v4 = raw
        .v4
        .iter()
        .enumerate()
        .map(|(i, b)| {
            v4_block(b, seed).map_err(|e| {
                format!(
                    "[[v4]] #{} ({}): {e}",
                    i + 1,
                    b.label.as_deref().unwrap_or("unlabelled")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Scenario {
        path: path.to_path_buf(),
        name,
        description: raw.description.unwrap_or_default(),
        seed,
        target,
        cus,
        mla,
        v4,
    })
}

fn parse_variants(v: &toml::Value, key: &str, family: Family) -> Result<Vec<VariantId>, String> {
    let vs = str_axis(v, key, |s| s.parse::<VariantId>())?;
    for id in &vs {
        if id.family() != family {
            let (want, other) = match family {
                Family::Mla => ("[[mla]]", "[[v4]]"),
                Family::V4 => ("[[v4]]", "[[mla]]"),
            };
            return Err(format!(
                "key `{key}`: variant `{id}` is not a {want} variant; move it to a {other} block"
            ));
        }
    }
    Ok(vs)
}

fn tighten(base: Tolerances, raw: Option<RawTol>, key: &str) -> Result<Tolerances, String> {
    let Some(r) = raw else { return Ok(base) };
    let pick = |v: Option<f64>, d: f64, name: &str| -> Result<f64, String> {
        match v {
            None => Ok(d),
            Some(x) if x.is_nan() || x <= 0.0 => Err(format!("key `{key}.{name}`: must be > 0, got {x}")),
            Some(x) if x > d => Err(format!(
                "key `{key}.{name}`: {x} is looser than the default {d}; a scenario may only tighten tolerances"
            )),
            Some(x) => Ok(x),
        }
    };
    Ok(Tolerances {
        cos_diff: pick(r.cos_diff, base.cos_diff, "cos_diff")?,
        mismatch: pick(r.mismatch, base.mismatch, "mismatch")?,
        atol: pick(r.atol, base.atol, "atol")?,
        rtol: pick(r.rtol, base.rtol, "rtol")?,
        lse_abs: pick(r.lse_abs, base.lse_abs, "lse_abs")?,
    })
}

fn tolerances(raw: &Option<RawTolerances>) -> Result<(Tolerances, Tolerances), String> {
    let (b, f) = match raw {
        Some(t) => (t.bf16, t.fp8),
        None => (None, None),
    };
    Ok((
        tighten(Tolerances::BF16, b, "tolerance.bf16")?,
        tighten(Tolerances::FP8, f, "tolerance.fp8")?,
    ))
}

fn sm_scale(v: Option<f64>, default: f64) -> Result<f64, String> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        Some(x) => Err(format!("key `sm_scale`: must be a positive finite number, got {x}")),
    }
}

fn mla_block(b: &RawMla, seed: u64) -> Result<MlaBlock, String> {
    let batch = usize_axis(required(&b.batch, "batch")?, "batch", 1)?;
    if let Some(n) = batch.iter().find(|&&n| n > MAX_BATCH) {
        return Err(format!(
            "key `batch`: {n} sequences; a case holds at most {MAX_BATCH} (its per-sequence tables and plans live in host memory); split the batch"
        ));
    }
    let context = lengths::parse_axis(required(&b.context, "context")?, "context")?;
    if let Some(c) = context.iter().find(|c| c.min() == 0) {
        return Err(format!(
            "key `context`: {} has a length 0; a decode sequence holds at least its query tokens",
            c.label()
        ));
    }
    let heads_local = usize_axis(required(&b.heads_local, "heads_local")?, "heads_local", 1)?;
    let dcp_world = b
        .dcp_world
        .as_ref()
        .map(|v| usize_axis(v, "dcp_world", 1))
        .transpose()?
        .unwrap_or(vec![1]);
    if let Some(w) = dcp_world.iter().find(|&&w| w > 64) {
        return Err(format!(
            "key `dcp_world`: {w} ranks is more than the 64 this harness shards"
        ));
    }
    let interleave = b
        .interleave
        .as_ref()
        .map(|v| usize_axis(v, "interleave", 1))
        .transpose()?
        .unwrap_or(vec![1]);
    let s_q = b
        .s_q
        .as_ref()
        .map(|v| usize_axis(v, "s_q", 1))
        .transpose()?
        .unwrap_or(vec![1]);
    if let Some(q) = s_q.iter().find(|&&q| q > 16) {
        return Err(format!(
            "key `s_q`: {q} query tokens per sequence; MTP/speculative decode here goes up to 16"
        ));
    }
    let dtype = match &b.dtype {
        Some(v) => str_axis(v, "dtype", |s| match s {
            "bf16" => Ok(Dtype::Bf16),
            "fp8" => Ok(Dtype::Fp8),
            _ => Err(format!("unknown dtype `{s}` (bf16 or fp8)")),
        })?,
        None => vec![Dtype::Bf16],
    };
    let page_size = b
        .page_size
        .as_ref()
        .map(|v| usize_axis(v, "page_size", 1))
        .transpose()?;
    if let Some(p) = page_size.iter().flatten().find(|&&p| p != 1 && p != 64) {
        return Err(format!(
            "key `page_size`: {p} is not supported; the kernels take page size 1 (ps1) or 64 (page64)"
        ));
    }
    let pool = match b.pool.as_deref() {
        None | Some("shuffled") => PoolOrder::Shuffled,
        Some("contiguous") => PoolOrder::Contiguous,
        Some(o) => {
            return Err(format!(
                "key `pool`: unknown placement `{o}`; use \"shuffled\" (pages in random pool order, the default) or \"contiguous\""
            ))
        }
    };
    let heads_bad = heads_local
        .iter()
        .flat_map(|&h| dcp_world.iter().map(move |&w| (h, w)))
        .find(|&(h, w)| h * w > 128);
    if let Some((h, w)) = heads_bad {
        return Err(format!(
            "keys `heads_local` x `dcp_world`: {h} x {w} = {} gathered heads; no kernel takes more than 128",
            h * w
        ));
    }
    let variants = parse_variants(required(&b.variants, "variants")?, "variants", Family::Mla)?;
    let force = b
        .force
        .as_ref()
        .map(|v| parse_variants(v, "force", Family::Mla))
        .transpose()?
        .unwrap_or_default();
    if let Some(f) = force.iter().find(|f| !variants.contains(f)) {
        return Err(format!(
            "key `force`: `{f}` is not in `variants`; add it there to run it"
        ));
    }
    let (tol_bf16, tol_fp8) = tolerances(&b.tolerance)?;
    let dcp_devices = b.dcp_devices.as_ref().map(devices_key).transpose()?;
    let dcp_reduce = match &b.dcp_reduce {
        Some(v) => str_axis(v, "dcp_reduce", |s| s.parse::<Reduce>())?,
        None => vec![Reduce::Bf16],
    };
    if b.dcp_reduce.is_some() && dcp_devices.is_none() {
        return Err("key `dcp_reduce` without `dcp_devices`: it picks the reduce-scatter of a step on several GPUs; add dcp_devices".into());
    }
    if let Some(d) = dcp_devices {
        for &w in &dcp_world {
            d.for_world(w)
                .map_err(|e| format!("key `dcp_devices` = {d}: {e}; list only worlds it divides in `dcp_world`"))?;
        }
    }
    Ok(MlaBlock {
        label: b.label.clone().unwrap_or_default(),
        batch,
        context,
        heads_local,
        dcp_world,
        interleave,
        s_q,
        dtype,
        page_size,
        pool,
        variants,
        force,
        sm_scale: sm_scale(b.sm_scale, default_mla_sm_scale())?,
        seed: b.seed.unwrap_or(seed),
        tol_bf16,
        tol_fp8,
        dcp_devices,
        dcp_reduce,
    })
}

/// `dcp_devices = 8` or `dcp_devices = "world"`.
fn devices_key(v: &toml::Value) -> Result<Devices, String> {
    let s = match v {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::String(s) => s.clone(),
        other => format!("{other}"),
    };
    s.parse::<Devices>().map_err(|e| format!("key `dcp_devices`: {e}"))
}

/// Whether a case's ranks can run as a multi-GPU DCP step: the built-in
/// MLA decode kernels' (an external implementation runs in its worker).
pub fn runs_on_devices(c: &Case) -> bool {
    c.mla().is_some()
        && c.variant.info().kind == crate::variants::external::Contract::MlaDecode
        && c.variant.unit().external().is_none()
}

/// Puts after each case that can run on `d`'s GPUs its `-g<N>` twin
/// (`world`: each sharded case on W GPUs). Returns why the other decode
/// cases got none.
pub fn add_device_twins(cases: &mut Vec<Case>, d: Devices, reduces: &[Reduce]) -> Vec<String> {
    let mut out = Vec::with_capacity(cases.len() * 2);
    let mut refused = Vec::new();
    for c in cases.drain(..) {
        let n = match c.mla() {
            // One GPU per rank of an unsharded case is no group at all.
            Some(p) if d == Devices::PerRank && !p.dcp.sharded() => None,
            Some(p) if runs_on_devices(&c) && c.dcp_devices.is_none() => match d.for_world(p.dcp.world) {
                Ok(n) => Some(n),
                Err(e) => {
                    refused.push(format!("{}: {e}", c.key()));
                    None
                }
            },
            _ => None,
        };
        let twins: Vec<Case> = n.map_or(vec![], |n| reduces.iter().map(|&r| c.on_devices(n, r)).collect());
        out.push(c);
        out.extend(twins);
    }
    *cases = out;
    refused
}

fn v4_block(b: &RawV4, seed: u64) -> Result<V4Block, String> {
    let layer = str_axis(required(&b.layer, "layer")?, "layer", |s| match s {
        "swa" => Ok(LayerType::Swa),
        "csa" => Ok(LayerType::Csa),
        "hca" => Ok(LayerType::Hca),
        _ => Err(format!("unknown layer `{s}` (swa, csa or hca)")),
    })?;
    let rows = usize_axis(required(&b.rows, "rows")?, "rows", 1)?;
    if let Some(r) = rows.iter().find(|&&r| r > V4_MAX_ROWS) {
        return Err(format!(
            "key `rows`: {r} rows is above the {V4_MAX_ROWS} the V4 decode path takes"
        ));
    }
    let pad_rows = b
        .pad_rows
        .as_ref()
        .map(|v| usize_axis(v, "pad_rows", 0))
        .transpose()?
        .unwrap_or(vec![0]);
    let max_rows = rows.iter().max().copied().unwrap_or(0);
    if let Some(p) = pad_rows.iter().find(|&&p| max_rows.saturating_add(p) > V4_MAX_ROWS) {
        return Err(format!(
            "keys `rows` + `pad_rows`: {max_rows} + {p} padded rows; a CUDA-graph size above the {V4_MAX_ROWS} rows the V4 decode path takes cannot be captured"
        ));
    }
    let heads = usize_axis(required(&b.heads, "heads")?, "heads", 1)?;
    if let Some(h) = heads.iter().find(|&&h| h > 16 && ![32, 64, 128].contains(&h)) {
        return Err(format!(
            "key `heads`: {h} heads; V4 kernels take 16, 32, 64 or 128 (fewer than 16 pad to 16)"
        ));
    }
    let position = lengths::parse_axis(required(&b.position, "position")?, "position")?;
    let verify = b
        .verify
        .as_ref()
        .map(|v| usize_axis(v, "verify", 1))
        .transpose()?
        .unwrap_or(vec![1]);
    let variants = parse_variants(required(&b.variants, "variants")?, "variants", Family::V4)?;
    let splits = match &b.splits {
        None => vec![None],
        Some(v) => {
            let one = |x: &toml::Value| -> Result<Option<usize>, String> {
                match x {
                    toml::Value::String(s) if s == "auto" => Ok(None),
                    toml::Value::Integer(n) if (1..=16).contains(n) => Ok(Some(*n as usize)),
                    other => Err(format!(
                        "key `splits`: expected \"auto\" or an integer 1..=16, got {}",
                        axis::describe(other)
                    )),
                }
            };
            match v {
                toml::Value::Array(a) if !a.is_empty() => a.iter().map(one).collect::<Result<_, _>>()?,
                toml::Value::Array(_) => return Err("key `splits`: the list is empty".into()),
                x => vec![one(x)?],
            }
        }
    };
    let partitions = b.partitions.unwrap_or(128);
    if partitions == 0 || partitions > 4096 {
        return Err(format!("key `partitions`: {partitions}; use 1..=4096"));
    }
    let index_topk = b.index_topk.unwrap_or(1024);
    let max_model_len = b.max_model_len.unwrap_or(1 << 20);
    if let Some(p) = position.iter().find(|p| p.max() >= max_model_len) {
        return Err(format!(
            "key `position`: {} reaches max_model_len {max_model_len}",
            p.label()
        ));
    }
    let (_, tol) = tolerances(&b.tolerance)?;
    Ok(V4Block {
        label: b.label.clone().unwrap_or_default(),
        layer,
        rows,
        pad_rows,
        heads,
        position,
        verify,
        index_topk,
        max_model_len,
        variants,
        splits,
        min_rows: b.min_rows.unwrap_or(15),
        partitions,
        workspace: b.workspace.unwrap_or(true),
        eager: b.eager.unwrap_or(false),
        indptr_offset: b
            .indptr_offset
            .as_ref()
            .map(|v| usize_axis(v, "indptr_offset", 0))
            .transpose()?
            .unwrap_or(vec![0]),
        replay: match b.replay.unwrap_or(0) {
            r @ 0..=8 => r,
            r => return Err(format!("key `replay`: {r} replays; use 0..=8")),
        },
        sm_scale: sm_scale(b.sm_scale, 512f64.powf(-0.5))?,
        seed: b.seed.unwrap_or(seed),
        tol,
    })
}

impl Scenario {
    /// Adds implementations to every block of their family, after the
    /// block's own variants (an `--impl` joins the sweeps as written).
    pub fn add_variants(&mut self, ids: &[VariantId]) {
        for &id in ids {
            match id.family() {
                Family::Mla => self.mla.iter_mut().for_each(|b| push_new(&mut b.variants, id)),
                Family::V4 => self.v4.iter_mut().for_each(|b| push_new(&mut b.variants, id)),
            }
        }
    }
}

fn push_new(v: &mut Vec<VariantId>, id: VariantId) {
    if !v.contains(&id) {
        v.push(id);
    }
}

/// Cases of a scenario, plus the combinations it dropped and why.
pub struct Expansion {
    pub cases: Vec<Case>,
    pub dropped: Vec<String>,
}

pub fn expand(sc: &Scenario) -> Expansion {
    let mut cases = Vec::new();
    let mut dropped = Vec::new();
    for b in &sc.mla {
        for &batch in &b.batch {
            for ctx in &b.context {
                for &hl in &b.heads_local {
                    for &w in &b.dcp_world {
                        for &s in &b.interleave {
                            for &s_q in &b.s_q {
                                if ctx.min() < s_q {
                                    dropped.push(format!(
                                        "context {} with s_q {s_q}: a sequence's length includes its s_q query tokens",
                                        ctx.label()
                                    ));
                                    continue;
                                }
                                for &dtype in &b.dtype {
                                    for &variant in &b.variants {
                                        let pages: Vec<usize> = b
                                            .page_size
                                            .clone()
                                            .unwrap_or_else(|| vec![variant.info().native_page_size]);
                                        for ps in pages {
                                            let contig = if b.pool == PoolOrder::Contiguous { "-contig" } else { "" };
                                            let shape = format!(
                                                "mla-b{batch}-c{}-h{hl}x{w}-s{s}-q{s_q}-{dtype}{contig}",
                                                ctx.label()
                                            );
                                            let tol = if dtype == Dtype::Fp8 { b.tol_fp8 } else { b.tol_bf16 };
                                            let data_id = format!("{shape}@{}", short(mla_settings(sc, b, &tol)));
                                            let id = compose_id(&data_id, &format!("-p{ps}"));
                                            // Seeded by the readable shape, so the bytes of a case do not
                                            // depend on how its digest is spelled.
                                            let seed = stable_hash(&[&b.seed.to_le_bytes(), shape.as_bytes()]);
                                            let params = MlaParams {
                                                batch,
                                                ctx: ctx.lengths(batch, seed),
                                                ctx_label: ctx.label(),
                                                heads_local: hl,
                                                dcp: Dcp {
                                                    world: w,
                                                    interleave: s,
                                                },
                                                s_q,
                                                dtype,
                                                page_size: ps,
                                                pool: b.pool,
                                                sm_scale: b.sm_scale,
                                            };
                                            cases.push(Case {
                                                id,
                                                data_id,
                                                variant,
                                                params: CaseParams::Mla(params),
                                                seed,
                                                tol,
                                                force: b.force.contains(&variant),
                                                target: sc.target,
                                                cus: sc.cus,
                                                v4: V4Knobs::default(),
                                                ps1_schedule: Ps1Schedule::default(),
                                                v4_core: Default::default(),
                                                dcp_devices: None,
                                                dcp_reduce: Default::default(),
                                                scenario: sc.path.clone(),
                                            });
                                            let last = cases.last().expect("just pushed");
                                            let group = b.dcp_devices.filter(|&d| d != Devices::PerRank || w > 1);
                                            if let (Some(d), true) = (group, runs_on_devices(last)) {
                                                // Validated against every W of the block.
                                                if let Ok(n) = d.for_world(w) {
                                                    let twins: Vec<Case> =
                                                        b.dcp_reduce.iter().map(|&r| last.on_devices(n, r)).collect();
                                                    cases.extend(twins);
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for b in &sc.v4 {
        for &layer in &b.layer {
            for &rows in &b.rows {
                for &pad in &b.pad_rows {
                    for &heads in &b.heads {
                        for pos in &b.position {
                            for (&verify, &offset) in b
                                .verify
                                .iter()
                                .flat_map(|v| b.indptr_offset.iter().map(move |o| (v, o)))
                            {
                                let mut shape =
                                    format!("v4-{layer}-n{rows}-t{}-h{heads}-p{}-v{verify}", rows + pad, pos.label());
                                if offset > 0 {
                                    shape.push_str(&format!("-o{offset}"));
                                }
                                if b.replay > 0 {
                                    shape.push_str(&format!("-r{}", b.replay));
                                }
                                let data_id = format!("{shape}@{}", short(v4_settings(sc, b)));
                                let seed = stable_hash(&[&b.seed.to_le_bytes(), shape.as_bytes()]);
                                let seqs = rows.div_ceil(verify);
                                let starts = pos.lengths(seqs, seed);
                                let positions: Vec<usize> =
                                    (0..rows).map(|i| starts[i / verify] + i % verify).collect();
                                if let Some(p) = positions.iter().find(|&&p| p >= b.max_model_len) {
                                    dropped.push(format!(
                                        "{data_id}: verify row position {p} reaches max_model_len {}",
                                        b.max_model_len
                                    ));
                                    continue;
                                }
                                let params = V4Params {
                                    layer,
                                    rows,
                                    padded_rows: rows + pad,
                                    heads,
                                    positions,
                                    pos_label: pos.label(),
                                    verify,
                                    index_topk: b.index_topk,
                                    max_model_len: b.max_model_len,
                                    sm_scale: b.sm_scale,
                                    indptr_offset: offset,
                                    replay: b.replay,
                                };
                                for &variant in &b.variants {
                                    let split_axis: Vec<Option<usize>> = if variant.info().takes_split_axis {
                                        b.splits.clone()
                                    } else {
                                        vec![None]
                                    };
                                    for splits in split_axis {
                                        let knobs = V4Knobs {
                                            min_rows: b.min_rows,
                                            partitions: b.partitions,
                                            splits,
                                            workspace: b.workspace,
                                            eager: b.eager,
                                        };
                                        cases.push(Case {
                                            id: v4_case_id(&data_id, &knobs),
                                            data_id: data_id.clone(),
                                            variant,
                                            params: CaseParams::V4(params.clone()),
                                            seed,
                                            tol: b.tol,
                                            force: false,
                                            target: sc.target,
                                            cus: sc.cus,
                                            v4: knobs,
                                            ps1_schedule: Ps1Schedule::default(),
                                            v4_core: Default::default(),
                                            dcp_devices: None,
                                            dcp_reduce: Default::default(),
                                            scenario: sc.path.clone(),
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    dropped.sort();
    dropped.dedup();
    Expansion { cases, dropped }
}

/// The id of a V4 case on `data_id` with these knobs: a fixed split count,
/// an eager call and a missing workspace make other cases on the same data.
pub fn v4_case_id(data_id: &str, k: &V4Knobs) -> String {
    let mut knobs = String::new();
    if let Some(n) = k.splits {
        knobs.push_str(&format!("-n{n}"));
    }
    if k.eager {
        knobs.push_str("-eager");
    }
    if !k.workspace {
        knobs.push_str("-nows");
    }
    compose_id(data_id, &knobs)
}

/// Feeds a tolerance set into a digest.
fn tol_bytes(t: &Tolerances) -> Vec<u8> {
    [t.cos_diff, t.mismatch, t.atol, t.rtol, t.lse_abs]
        .iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .collect()
}

/// The id's digest: 8 hex digits of a settings hash. A collision of two
/// different cases is caught at resolve time by [`fingerprint`].
fn short(h: u64) -> String {
    format!("{:08x}", h >> 32)
}

/// What an MLA case's readable shape leaves out but its bytes, plan or
/// verdict depend on.
fn mla_settings(sc: &Scenario, b: &MlaBlock, tol: &Tolerances) -> u64 {
    let pool: &[u8] = match b.pool {
        PoolOrder::Shuffled => b"shuffled",
        PoolOrder::Contiguous => b"contiguous",
    };
    stable_hash(&[
        b"mla",
        &b.seed.to_le_bytes(),
        &b.sm_scale.to_bits().to_le_bytes(),
        sc.target.to_string().as_bytes(),
        &(sc.cus as u64).to_le_bytes(),
        pool,
        &tol_bytes(tol),
    ])
}

/// The same for a V4 case: the list rules (`index_topk`, `max_model_len`)
/// and the hca_persist knobs that are not in the id.
fn v4_settings(sc: &Scenario, b: &V4Block) -> u64 {
    stable_hash(&[
        b"v4",
        &b.seed.to_le_bytes(),
        &b.sm_scale.to_bits().to_le_bytes(),
        sc.target.to_string().as_bytes(),
        &(sc.cus as u64).to_le_bytes(),
        &(b.index_topk as u64).to_le_bytes(),
        &(b.max_model_len as u64).to_le_bytes(),
        &(b.min_rows as u64).to_le_bytes(),
        &(b.partitions as u64).to_le_bytes(),
        &tol_bytes(&b.tol),
    ])
}

/// Everything a case's id stands for, as one value: two cases with the same
/// id and different fingerprints would be a digest collision.
pub fn fingerprint(case: &Case) -> String {
    serde_json::to_string(&(
        &case.params,
        case.seed,
        &case.tol,
        case.target.to_string(),
        case.cus,
        &case.v4,
    ))
    .unwrap_or_default()
}

/// The cases of a scenario given as text (tests of other modules too).
#[cfg(test)]
pub(crate) fn cases_of(text: &str) -> Vec<Case> {
    let raw: RawScenario = toml::from_str(text).unwrap();
    expand(&validate(Path::new("t.toml"), raw).unwrap()).cases
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cases(text: &str) -> Vec<Case> {
        cases_of(text)
    }

    #[test]
    fn contiguous_pool_cases_carry_it_in_params_and_id() {
        let block = "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\", \"page64\"]\n";
        let shuffled = cases(block);
        let contig = cases(&format!("{block}pool = \"contiguous\"\n"));
        assert_eq!(shuffled.len(), contig.len());
        for (a, b) in shuffled.iter().zip(&contig) {
            let (CaseParams::Mla(pa), CaseParams::Mla(pb)) = (&a.params, &b.params) else {
                panic!("mla cases")
            };
            assert_eq!((pa.pool, pb.pool), (PoolOrder::Shuffled, PoolOrder::Contiguous));
            assert!(!a.id.contains("contig"), "{}", a.id);
            assert!(b.id.contains("-contig-p"), "{}", b.id);
            assert_eq!(b.id, compose_id(&b.data_id, &format!("-p{}", pb.page_size)));
        }
    }

    #[test]
    fn dcp_device_twins_follow_their_case_on_the_same_data_with_a_g_knob() {
        let block = "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = [2, 8]\ns_q = 1\nvariants = [\"ps1\", \"page64\", \"dcp_combine\"]\n";
        let plain = cases(block);
        let mut twinned = plain.clone();
        let refused = add_device_twins(&mut twinned, Devices::Count(8), &[Reduce::Bf16]);
        // ps1 and page64 at W=8 get twins; at W=2 8 GPUs cannot split them;
        // dcp_combine is a merge, not a decode kernel.
        assert_eq!(twinned.len(), plain.len() + 2);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused.iter().all(|r| r.contains("W=2 is not a multiple of 8 GPUs")));
        for (i, c) in twinned.iter().enumerate() {
            let Some(n) = c.dcp_devices else { continue };
            let before = &twinned[i - 1];
            assert_eq!((n, before.dcp_devices), (8, None));
            assert_eq!(c.data_id, before.data_id);
            assert_eq!(c.variant, before.variant);
            assert_eq!(c.id, compose_id(&before.id, "-g8"));
            assert!(c.id.contains("-p") && c.id.contains("-g8@"), "{}", c.id);
            assert_eq!(c.params_map()["dcp_devices"], "8");
        }
        // The scenario key does the same, one GPU per rank.
        let keyed = cases(&format!("{block}dcp_devices = \"world\"\n"));
        let ns: Vec<usize> = keyed.iter().filter_map(|c| c.dcp_devices).collect();
        assert_eq!(ns, vec![2, 2, 8, 8]);
    }
}
