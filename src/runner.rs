//! Runs resolved cases on a backend, checks them against the reference and
//! hands each row to the run directory as soon as it exists.

use anyhow::Result;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use crate::backend::{Backend, BackendError, OutTensor, RunOutput, RunRequest, TimingOptions};
use crate::case::{Case, CaseParams, Dtype, MLA_D_V, V4_D};
use crate::metrics::{self, Tolerances};
use crate::reference::{self, Inputs, RefOut};
use crate::result::{Check, Latency, Row, Status};
use crate::stats::Summary;
use crate::variants::{self, CombineInputs, Decision, SplitMergeInputs, VariantId, VariantPlan};
use crate::workload::{self, codec, Workload};

/// What the run was asked to do, beyond the cases themselves.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub check_rows: Option<usize>,
    pub timing: TimingOptions,
    pub dump: Option<PathBuf>,
    /// Checked launches per case (>= 1), compared bit for bit.
    pub repeat_checks: usize,
    /// Flags to repeat in each row's repro command (backend, check rows).
    pub repro_flags: String,
}

/// References of one data id, shared by every variant that runs on it.
pub struct RefSet {
    pub data_id: String,
    pub rows: Vec<usize>,
    /// MLA: one per rank (global mask).
    pub ranks: Vec<RefOut>,
    /// MLA: unsharded attention; V4: attention with sink.
    pub full: RefOut,
    /// fp8: the same on unquantized inputs (quantization noise level).
    pub unquantized: Option<RefOut>,
    /// V4 replay steps: the attention of each step's workload.
    pub steps: Vec<RefOut>,
    pub flops: f64,
    pub secs: f64,
}

/// Caches the current workload and references: cases arrive grouped by id.
#[derive(Default)]
pub struct Caches {
    workload: Option<(String, Workload)>,
    refs: Option<RefSet>,
    /// Reference FLOPs and seconds, for the GFLOP/s line.
    pub ref_flops: f64,
    pub ref_secs: f64,
}

fn total_rows(case: &Case) -> usize {
    match &case.params {
        CaseParams::Mla(p) => p.total_q(),
        CaseParams::V4(p) => p.rows,
    }
}

fn build_refs(case: &Case, wl: &Workload, check_rows: Option<usize>) -> Result<RefSet> {
    let t0 = Instant::now();
    let rows = reference::sample_rows(total_rows(case), check_rows, case.seed);
    let (ranks, full, unq) = match wl {
        Workload::Mla(w) => {
            let ranks = (0..w.p.dcp_world)
                .map(|r| reference::mla::rank(w, r, &rows, Inputs::Dequantized))
                .collect::<Result<Vec<RefOut>, _>>()?;
            // With one rank, the rank reference is the unsharded attention.
            let full = if w.p.dcp_world == 1 {
                ranks[0].clone()
            } else {
                reference::mla::full(w, &rows, Inputs::Dequantized)?
            };
            let unq = match w.p.dtype {
                Dtype::Fp8 => Some(reference::mla::full(w, &rows, Inputs::Unquantized)?),
                Dtype::Bf16 => None,
            };
            (ranks, full, unq)
        }
        Workload::V4(w) => (
            vec![],
            reference::v4::attend(w, &rows, Inputs::Dequantized),
            Some(reference::v4::attend(w, &rows, Inputs::Unquantized)),
        ),
    };
    let steps: Vec<RefOut> = match wl {
        Workload::V4(w) => w
            .steps
            .iter()
            .map(|ws| reference::v4::attend(ws, &rows, Inputs::Dequantized))
            .collect(),
        Workload::Mla(_) => vec![],
    };
    let flops = ranks.iter().map(|r| r.flops).sum::<f64>()
        + full.flops
        + unq.as_ref().map(|u| u.flops).unwrap_or(0.0)
        + steps.iter().map(|r| r.flops).sum::<f64>();
    Ok(RefSet {
        data_id: case.data_id.clone(),
        rows,
        ranks,
        full,
        unquantized: unq,
        steps,
        flops,
        secs: t0.elapsed().as_secs_f64(),
    })
}

impl Caches {
    /// The case's workload and references, built once per id / data id.
    pub fn get(&mut self, case: &Case, check_rows: Option<usize>) -> Result<(&Workload, &RefSet)> {
        let same_data = self.refs.as_ref().map(|r| r.data_id == case.data_id).unwrap_or(false);
        match (&mut self.workload, &case.params) {
            (Some((id, _)), _) if *id == case.id => {}
            // Same data at another page size: re-page, keep Q, KV and references.
            (Some((id, Workload::Mla(w))), CaseParams::Mla(p)) if same_data => {
                w.repage(p.page_size, case.seed);
                *id = case.id.clone();
            }
            // Same V4 data under other knobs (split count, eager, workspace).
            (Some((id, Workload::V4(_))), CaseParams::V4(_)) if same_data => *id = case.id.clone(),
            _ => {
                self.workload = None;
                self.workload = Some((case.id.clone(), workload::build(case)?));
            }
        }
        let wl = &self.workload.as_ref().expect("just built").1;
        if self.refs.as_ref().map(|r| r.data_id != case.data_id).unwrap_or(true) {
            let r = build_refs(case, wl, check_rows)?;
            self.ref_flops += r.flops;
            self.ref_secs += r.secs;
            self.refs = Some(r);
        }
        Ok((wl, self.refs.as_ref().expect("just built")))
    }
}

fn f32_to_bf16_bits(x: f64) -> u16 {
    codec::bf16_bits(x as f32)
}

/// What a kernel may leave in a part that saw no token, so a merge must not
/// trust it: SPEC §1 maps NaN and +inf LSEs to -inf and gives an empty part
/// weight 0 "even when o_r is NaN". Every empty (part, row, head) of the
/// merge inputs therefore gets a NaN o and an LSE that cycles through -inf,
/// +inf and NaN; a merge without the rule turns them into NaN outputs.
/// Returns how many were poisoned.
pub fn poison_empty_parts<T: Copy>(o: &mut [T], lse: &mut [f32], d: usize, nan: T) -> usize {
    const EMPTY: [f32; 3] = [f32::NEG_INFINITY, f32::INFINITY, f32::NAN];
    let mut n = 0;
    for (i, l) in lse.iter_mut().enumerate() {
        if *l == f32::NEG_INFINITY {
            *l = EMPTY[n % EMPTY.len()];
            o[i * d..(i + 1) * d].fill(nan);
            n += 1;
        }
    }
    n
}

/// The DCP combine's inputs: per-rank reference outputs as a kernel hands
/// them over (bf16 o, f32 lse), empty ranks poisoned.
fn combine_inputs(wl: &Workload, refs: &RefSet) -> CombineInputs {
    let w = wl.mla().expect("MLA workload");
    let mut o: Vec<u16> = refs
        .ranks
        .iter()
        .flat_map(|r| r.o.iter().map(|&x| f32_to_bf16_bits(x)))
        .collect();
    let mut lse: Vec<f32> = refs
        .ranks
        .iter()
        .flat_map(|r| r.lse.iter().map(|&x| x as f32))
        .collect();
    let poisoned = poison_empty_parts(&mut o, &mut lse, MLA_D_V, codec::BF16_NAN);
    CombineInputs {
        world: w.p.dcp_world,
        heads: w.heads(),
        rows: refs.rows.clone(),
        o,
        lse,
        poisoned,
    }
}

fn split_merge_inputs(case: &Case, wl: &Workload, refs: &RefSet) -> SplitMergeInputs {
    let w = wl.v4().expect("V4 workload");
    let p = &w.p;
    let bound = crate::plan::v4::kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    let n = crate::plan::v4::v4_split_plan(p.rows, p.padded_rows, w.heads, bound, case.cus, case.v4.splits).n;
    let parts = reference::v4::split_partials(w, &refs.rows, n);
    let (h, d) = (w.p.heads, V4_D);
    let hk = w.heads;
    let mut o = Vec::with_capacity(refs.rows.len() * n * h * d);
    let mut lse = Vec::with_capacity(refs.rows.len() * n * h);
    for k in 0..refs.rows.len() {
        for part in &parts {
            for hh in 0..h {
                o.extend(
                    part.o[(k * hk + hh) * d..(k * hk + hh + 1) * d]
                        .iter()
                        .map(|&x| x as f32),
                );
                lse.push(part.lse[k * hk + hh] as f32);
            }
        }
    }
    let poisoned = poison_empty_parts(&mut o, &mut lse, V4_D, f32::NAN);
    SplitMergeInputs {
        n,
        heads: h,
        rows: refs.rows.clone(),
        o,
        lse,
        sink: w.sink[..h].to_vec(),
        poisoned,
    }
}

/// Rows of `t` at `rows` (compact layout when `compact`).
fn pick(t: &OutTensor, rows: &[usize], compact: bool) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows.len() * t.row_len);
    for (k, &r) in rows.iter().enumerate() {
        let i = if compact { k } else { r };
        v.extend_from_slice(&t.data[i * t.row_len..(i + 1) * t.row_len]);
    }
    v
}

/// Reference heads may be padded (V4 kernel heads): keep the first `h` of each row.
fn ref_heads(x: &[f64], rows: usize, hr: usize, h: usize, d: usize) -> Vec<f64> {
    if hr == h {
        return x.to_vec();
    }
    (0..rows)
        .flat_map(|i| x[i * hr * d..(i * hr + h) * d].iter().copied())
        .collect()
}

fn check_pair(
    name: &str,
    out: &[f32],
    o_ref: &[f64],
    lse_out: &[f32],
    lse_ref: &[f64],
    d: usize,
    tol: &Tolerances,
) -> Vec<Check> {
    let mo = metrics::compare(out, o_ref, tol, Some(metrics::POISON_BITS));
    let ml = metrics::compare(lse_out, lse_ref, tol, Some(metrics::POISON_BITS));
    let mut o_why = metrics::judge_out(&mo, tol).err();
    if o_why.is_none() {
        o_why = metrics::empty_rows_zero(out, lse_ref, d).err();
    }
    let l_why = metrics::judge_lse(&ml, tol).err();
    let (oname, lname) = if name.is_empty() {
        ("o".to_string(), "lse".to_string())
    } else {
        (format!("o.{name}"), format!("lse.{name}"))
    };
    vec![
        Check {
            tensor: oname,
            level: "kernel".into(),
            pass: o_why.is_none(),
            why: o_why.unwrap_or_default(),
            metrics: mo,
        },
        Check {
            tensor: lname,
            level: "kernel".into(),
            pass: l_why.is_none(),
            why: l_why.unwrap_or_default(),
            metrics: ml,
        },
    ]
}

/// Rows N..T (CUDA-graph padding, length 0): a graph-sized v4_split writes
/// o = 0 and lse = sink there; hca_persist and eager calls leave them unwritten.
fn pad_rows_check(
    case: &Case,
    w: &crate::workload::V4Workload,
    plan: &VariantPlan,
    o: &OutTensor,
    lse: &OutTensor,
) -> Check {
    let (n, t, h) = (w.p.rows, w.t, w.p.heads);
    let written = matches!(plan, VariantPlan::V4Split(_)) && !case.v4.eager;
    let poison = |x: f32| x.to_bits() == metrics::POISON_BITS;
    let mut bad = 0usize;
    for i in n..t {
        for hh in 0..h {
            let os = &o.data[(i * h + hh) * V4_D..(i * h + hh + 1) * V4_D];
            let l = lse.data[i * h + hh];
            let ok = if written {
                os.iter().all(|&x| x == 0.0) && (l - w.sink[hh]).abs() <= 1e-6
            } else {
                os.iter().all(|&x| poison(x)) && poison(l)
            };
            bad += usize::from(!ok);
        }
    }
    let expect = if written { "o = 0, lse = sink" } else { "left unwritten" };
    let m = metrics::ErrorMetrics {
        n: (t - n) * h,
        ..Default::default()
    };
    Check {
        tensor: "pad_rows".into(),
        level: "kernel".into(),
        metrics: m,
        pass: bad == 0,
        why: if bad == 0 {
            String::new()
        } else {
            format!("{bad} of {} pad (row, head) pairs are not {expect}", (t - n) * h)
        },
    }
}

fn find<'a>(out: &'a [OutTensor], name: &str) -> Result<&'a OutTensor, String> {
    out.iter()
        .find(|t| t.name == name)
        .ok_or_else(|| format!("backend returned no `{name}` tensor"))
}

/// Compares a run's outputs with the references; `replays` adds the V4
/// replay steps and pad rows (absent from a repeated launch's outputs).
fn checks(
    case: &Case,
    wl: &Workload,
    refs: &RefSet,
    plan: &VariantPlan,
    out: &[OutTensor],
    replays: bool,
) -> Result<Vec<Check>, String> {
    let tol = &case.tol;
    let rows = &refs.rows;
    let mut cs = Vec::new();
    match (wl, case.variant) {
        (Workload::Mla(w), VariantId::Ps1 | VariantId::Page64) => {
            let d = MLA_D_V;
            let mut rank_o = Vec::new();
            let mut rank_l = Vec::new();
            for r in 0..w.p.dcp_world {
                let o = pick(find(out, &format!("o.r{r}"))?, rows, false);
                let l = pick(find(out, &format!("lse.r{r}"))?, rows, false);
                let name = if w.p.dcp_world == 1 {
                    String::new()
                } else {
                    format!("r{r}")
                };
                cs.extend(check_pair(&name, &o, &refs.ranks[r].o, &l, &refs.ranks[r].lse, d, tol));
                rank_o.push(o.iter().map(|&x| x as f64).collect::<Vec<f64>>());
                rank_l.push(l.iter().map(|&x| x as f64).collect::<Vec<f64>>());
            }
            if w.p.dcp_world > 1 {
                // The kernel's rank outputs merged in f64 must equal the unsharded attention.
                let parts: Vec<(&[f64], &[f64])> = rank_o
                    .iter()
                    .zip(&rank_l)
                    .map(|(o, l)| (o.as_slice(), l.as_slice()))
                    .collect();
                let (mo, ml) = reference::combine::combine(&parts, d);
                let mo32: Vec<f32> = mo.iter().map(|&x| x as f32).collect();
                let ml32: Vec<f32> = ml.iter().map(|&x| x as f32).collect();
                let mut merged = check_pair("", &mo32, &refs.full.o, &ml32, &refs.full.lse, d, tol);
                for c in &mut merged {
                    c.tensor = format!("{}.merged", c.tensor);
                }
                cs.extend(merged);
            }
        }
        (Workload::Mla(_), VariantId::DcpCombine) => {
            let o = pick(find(out, "o")?, rows, true);
            let l = pick(find(out, "lse")?, rows, true);
            // Reference: the f64 combine of the very inputs the kernel merged.
            let VariantPlan::DcpCombine(ci) = plan else {
                return Err("dcp_combine ran without its inputs".into());
            };
            let n = ci.rows.len() * ci.heads;
            let parts_o: Vec<Vec<f64>> = (0..ci.world)
                .map(|r| {
                    ci.o[r * n * MLA_D_V..(r + 1) * n * MLA_D_V]
                        .iter()
                        .map(|&b| codec::bf16_from_bits(b) as f64)
                        .collect()
                })
                .collect();
            let parts_l: Vec<Vec<f64>> = (0..ci.world)
                .map(|r| ci.lse[r * n..(r + 1) * n].iter().map(|&x| x as f64).collect())
                .collect();
            let parts: Vec<(&[f64], &[f64])> = parts_o
                .iter()
                .zip(&parts_l)
                .map(|(o, l)| (o.as_slice(), l.as_slice()))
                .collect();
            let (ro, rl) = reference::combine::combine(&parts, MLA_D_V);
            cs.extend(check_pair("", &o, &ro, &l, &rl, MLA_D_V, tol));
        }
        (Workload::V4(w), VariantId::V4Split | VariantId::HcaPersist | VariantId::SplitMerge) => {
            let w: &crate::workload::V4Workload = w;
            let h = w.p.heads;
            let o = pick(find(out, "o")?, rows, false);
            let l = pick(find(out, "lse")?, rows, false);
            let ro = ref_heads(&refs.full.o, rows.len(), refs.full.heads, h, V4_D);
            let rl = ref_heads(&refs.full.lse, rows.len(), refs.full.heads, h, 1);
            cs.extend(check_pair("", &o, &ro, &l, &rl, V4_D, tol));
            if case.variant != VariantId::SplitMerge && replays {
                for (k, r) in refs.steps.iter().enumerate() {
                    let name = format!("step{}", k + 1);
                    let o = pick(find(out, &format!("o.{name}"))?, rows, false);
                    let l = pick(find(out, &format!("lse.{name}"))?, rows, false);
                    let ro = ref_heads(&r.o, rows.len(), r.heads, h, V4_D);
                    let rl = ref_heads(&r.lse, rows.len(), r.heads, h, 1);
                    cs.extend(check_pair(&name, &o, &ro, &l, &rl, V4_D, tol));
                }
                cs.push(pad_rows_check(case, w, plan, find(out, "o")?, find(out, "lse")?));
            }
        }
        (_, v) => return Err(format!("no checks defined for {v} on this family")),
    }
    // Informative: how far fp8 quantization alone moves the answer.
    if let (Some(unq), true) = (&refs.unquantized, case.variant != VariantId::DcpCombine && replays) {
        let (h, d, hr) = match wl {
            Workload::Mla(w) => (w.heads(), MLA_D_V, refs.full.heads),
            Workload::V4(w) => (w.p.heads, V4_D, refs.full.heads),
        };
        let deq: Vec<f32> = ref_heads(&refs.full.o, rows.len(), hr, h, d)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let unq_o = ref_heads(&unq.o, rows.len(), hr, h, d);
        let m = metrics::compare(&deq, &unq_o, &Tolerances::FP8, None);
        cs.push(Check {
            tensor: "o".into(),
            level: "quant".into(),
            metrics: m,
            pass: true,
            why: String::new(),
        });
    }
    Ok(cs)
}

/// The further checked launches of a run. A deterministic variant must give
/// the first launch's bits again, element for element: a race shows even
/// when both launches are within tolerance. A variant whose registry entry
/// says it is not deterministic has each launch checked against the
/// reference instead.
fn repeat_checks(
    case: &Case,
    wl: &Workload,
    refs: &RefSet,
    plan: &VariantPlan,
    first: &[OutTensor],
    repeats: &[Vec<OutTensor>],
) -> Result<Vec<Check>, String> {
    let mut cs = Vec::new();
    for (k, rep) in repeats.iter().enumerate() {
        let launch = k + 2;
        if case.variant.info().nondeterministic.is_some() {
            for mut c in checks(case, wl, refs, plan, rep, false)? {
                c.tensor = format!("{}.launch{launch}", c.tensor);
                cs.push(c);
            }
            continue;
        }
        let mut compared = 0usize;
        let mut diff: Option<(String, usize, metrics::BitDiff)> = None;
        // A repeat holds the first launch's main outputs (no replay steps).
        for r in rep {
            let t = find(first, &r.name)?;
            if r.data.len() != t.data.len() {
                return Err(format!(
                    "launch {launch} returned {} values of `{}`, launch 1 {}",
                    r.data.len(),
                    t.name,
                    t.data.len()
                ));
            }
            compared += t.data.len();
            if diff.is_none() {
                diff = metrics::bit_difference(&t.data, &r.data).map(|d| (t.name.clone(), t.data.len(), d));
            }
        }
        let m = match &diff {
            Some((_, _, d)) => metrics::ErrorMetrics {
                n: compared,
                worst_index: d.first,
                worst_out: d.b as f64,
                worst_ref: d.a as f64,
                mismatch: d.count as f64 / compared.max(1) as f64,
                ..Default::default()
            },
            None => metrics::ErrorMetrics {
                n: compared,
                ..Default::default()
            },
        };
        cs.push(Check {
            tensor: format!("repeat.launch{launch}"),
            level: "kernel".into(),
            pass: diff.is_none(),
            why: diff
                .map(|(name, len, d)| {
                    format!(
                        "nondeterministic: launch {launch} differs from launch 1 in {} of {len} elements of `{name}`; first at [{}]: {} vs {} (same inputs and plan, so a race or a read of unwritten memory)",
                        d.count,
                        d.first,
                        d.b,
                        d.a
                    )
                })
                .unwrap_or_default(),
            metrics: m,
        });
    }
    Ok(cs)
}

/// Facts the device reported (hca_persist's counters) as checks.
fn device_checks(out: &RunOutput) -> Vec<Check> {
    out.device_checks
        .iter()
        .map(|d| Check {
            tensor: d.name.clone(),
            level: "kernel".into(),
            pass: d.pass,
            why: d.why.clone(),
            metrics: metrics::ErrorMetrics::default(),
        })
        .collect()
}

fn params_map(case: &Case) -> BTreeMap<String, String> {
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
            put("dcp_world", p.dcp_world.to_string());
            put("interleave", p.interleave.to_string());
            put("s_q", p.s_q.to_string());
            put("dtype", p.dtype.to_string());
            put("page_size", p.page_size.to_string());
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

fn repro(case: &Case, opts: &RunOptions) -> String {
    format!(
        "mlabench run {} --case {} --variant {}{}",
        case.scenario.display(),
        case.exact_filter(),
        case.variant,
        opts.repro_flags
    )
}

fn base_row(case: &Case, backend: &str, opts: &RunOptions) -> Row {
    Row {
        case_id: case.id.clone(),
        variant: case.variant.to_string(),
        backend: backend.to_string(),
        status: Status::Pass,
        reason: String::new(),
        gate: String::new(),
        forced: false,
        plan: String::new(),
        rows_checked: 0,
        rows_total: total_rows(case),
        checks: vec![],
        latency: vec![],
        bytes: 0.0,
        flops: 0.0,
        gbps: None,
        tflops: None,
        frac_bw: None,
        frac_tc: None,
        params: params_map(case),
        repro: repro(case, opts),
    }
}

/// Outcome of one case: its row, and whether the device is gone.
pub struct CaseOutcome {
    pub row: Row,
    pub device_lost: bool,
    /// Tensors and plan, kept for `--dump`.
    pub output: Option<RunOutput>,
}

/// Runs one case end to end. Never panics outward: a panic becomes an error row.
pub fn run_case(case: &Case, caches: &mut Caches, backend: &mut dyn Backend, opts: &RunOptions) -> CaseOutcome {
    let bname = backend.info().backend.clone();
    let mut row = base_row(case, &bname, opts);
    let decision: Decision = variants::decide(case);
    row.gate = decision.gate.clone();
    row.forced = decision.forced;
    if let Some(why) = &decision.skip {
        row.status = Status::Skip;
        row.reason = why.clone();
        return CaseOutcome {
            row,
            device_lost: false,
            output: None,
        };
    }
    let got = catch_unwind(AssertUnwindSafe(|| {
        caches
            .get(case, opts.check_rows)
            .map(|(w, r)| (w as *const Workload, r as *const RefSet))
    }));
    let (wl, refs) = match got {
        Ok(Ok((w, r))) => {
            // SAFETY: both point into `caches`, which is not touched again until
            // this function returns; the pointers only shorten the borrow.
            unsafe { (&*w, &*r) }
        }
        Ok(Err(e)) => {
            row.status = Status::Error;
            row.reason = format!("building inputs: {e:#}");
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
        Err(p) => {
            row.status = Status::Error;
            row.reason = format!("panic while building inputs or reference: {}", panic_text(&p));
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
    };
    row.rows_checked = refs.rows.len();
    let plan = match case.variant {
        VariantId::DcpCombine => Ok(VariantPlan::DcpCombine(combine_inputs(wl, refs))),
        VariantId::SplitMerge => Ok(VariantPlan::SplitMerge(split_merge_inputs(case, wl, refs))),
        _ => variants::plan(case, &decision),
    };
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e.to_string();
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
    };
    row.plan = match &decision.fallback {
        Some(why) => format!("fallback v4_split ({why}): {}", variants::summary(&plan)),
        None => variants::summary(&plan),
    };
    let (bytes, flops) = variants::cost(case, wl, &plan);
    row.bytes = bytes;
    row.flops = flops;
    let req = RunRequest {
        case,
        workload: wl,
        plan: &plan,
        timing: &opts.timing,
        rows: &refs.rows,
        repeats: opts.repeat_checks,
    };
    let ran = catch_unwind(AssertUnwindSafe(|| backend.run(&req)));
    let out = match ran {
        Ok(Ok(o)) => o,
        Ok(Err(BackendError::Unsupported(why))) => {
            row.status = Status::Skip;
            row.reason = why;
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
        Ok(Err(e)) => {
            let lost = matches!(e, BackendError::DeviceLost(_));
            row.status = Status::Error;
            row.reason = e.to_string();
            return CaseOutcome {
                row,
                device_lost: lost,
                output: None,
            };
        }
        Err(p) => {
            row.status = Status::Error;
            row.reason = format!("panic in backend: {}", panic_text(&p));
            return CaseOutcome {
                row,
                device_lost: false,
                output: None,
            };
        }
    };
    let judged = checks(case, wl, refs, &plan, &out.tensors, true).and_then(|mut cs| {
        cs.extend(repeat_checks(case, wl, refs, &plan, &out.tensors, &out.repeats)?);
        cs.extend(device_checks(&out));
        Ok(cs)
    });
    match judged {
        Ok(cs) => row.checks = cs,
        Err(e) => {
            row.status = Status::Error;
            row.reason = e;
        }
    }
    if row.status != Status::Error {
        let failed: Vec<&Check> = row.checks.iter().filter(|c| c.level == "kernel" && !c.pass).collect();
        if failed.is_empty() {
            row.status = Status::Pass;
            if decision.forced {
                row.reason = "forced past the gate, and passed on these lengths".into();
            }
        } else {
            let first = format!("{}: {}", failed[0].tensor, failed[0].why);
            if decision.forced {
                row.status = Status::XFail;
                row.reason = format!("fails as the gate predicts ({}) - {first}", decision.gate);
            } else {
                row.status = Status::Fail;
                row.reason = first;
            }
        }
    }
    if let Some(s) = &out.samples {
        let info = backend.info();
        for (region, v) in [("kernel", &s.kernel_ms), ("variant", &s.variant_ms)] {
            if !v.is_empty() {
                row.latency.push(Latency {
                    region: region.into(),
                    clock: s.clock.clone(),
                    summary: Summary::from_samples(v),
                });
            }
        }
        if let Some(ms) = row.median_ms("variant").filter(|&ms| ms > 0.0) {
            let gbps = bytes / (ms * 1e-3) / 1e9;
            let tflops = flops / (ms * 1e-3) / 1e12;
            row.gbps = Some(gbps);
            row.tflops = Some(tflops);
            row.frac_bw = info.copy_gbps.map(|c| gbps / c);
            row.frac_tc = info.tensor_tflops.map(|c| tflops / c);
        }
    }
    CaseOutcome {
        row,
        device_lost: false,
        output: Some(out),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The row of a case skipped before it ran (it does not fit the machine).
pub fn skipped_row(case: &Case, backend: &str, opts: &RunOptions, why: &str) -> Row {
    let mut row = base_row(case, backend, opts);
    row.status = Status::Skip;
    row.reason = why.to_string();
    row
}

/// `--dump`: one .safetensors per (case, variant) with inputs, outputs and
/// reference, loadable with `safetensors.torch.load_file`.
pub fn dump_case(dir: &std::path::Path, case: &Case, caches: &mut Caches, out: &RunOutput, row: &Row) -> Result<()> {
    use crate::report::dump::{write_safetensors, DumpData, DumpTensor};
    std::fs::create_dir_all(dir)?;
    let (wl, refs) = caches.get(case, None)?;
    fn t<'a>(name: &str, shape: Vec<usize>, data: DumpData<'a>) -> DumpTensor<'a> {
        DumpTensor {
            name: name.to_string(),
            shape,
            data,
        }
    }
    let mut ts: Vec<DumpTensor> = Vec::new();
    let scales: Vec<f32>;
    match wl {
        Workload::Mla(w) => {
            let h = w.heads();
            ts.push(match &w.q {
                workload::Elems::Bf16(v) => t("q", vec![w.p.total_q(), h, 576], DumpData::Bf16Bits(v)),
                workload::Elems::Fp8(v) => t("q", vec![w.p.total_q(), h, 576], DumpData::U8(v)),
            });
            scales = vec![w.q_scale, w.kv_scale, w.p.sm_scale as f32];
            ts.push(t("scales_q_kv_sm", vec![3], DumpData::F32(&scales)));
            ts.push(t("qo_indptr", vec![w.qo_indptr.len()], DumpData::I32(&w.qo_indptr)));
            ts.push(t(
                "g_kv_indptr",
                vec![w.g_kv_indptr.len()],
                DumpData::I32(&w.g_kv_indptr),
            ));
            for sh in &w.shards {
                let r = sh.rank;
                let shape = vec![sh.num_pages, w.p.page_size, 576];
                ts.push(match &sh.pool {
                    workload::Elems::Bf16(v) => t(&format!("kv_pool.r{r}"), shape, DumpData::Bf16Bits(v)),
                    workload::Elems::Fp8(v) => t(&format!("kv_pool.r{r}"), shape, DumpData::U8(v)),
                });
                ts.push(t(
                    &format!("kv_indptr.r{r}"),
                    vec![sh.kv_indptr.len()],
                    DumpData::I32(&sh.kv_indptr),
                ));
                ts.push(t(
                    &format!("kv_indices.r{r}"),
                    vec![sh.kv_indices.len()],
                    DumpData::I32(&sh.kv_indices),
                ));
                ts.push(t(
                    &format!("kv_last_page_len.r{r}"),
                    vec![sh.kv_last_page_len.len()],
                    DumpData::I32(&sh.kv_last_page_len),
                ));
            }
            for (r, rr) in refs.ranks.iter().enumerate() {
                ts.push(t(
                    &format!("ref.o.r{r}"),
                    vec![rr.rows.len(), rr.heads, rr.d_v],
                    DumpData::F64(&rr.o),
                ));
                ts.push(t(
                    &format!("ref.lse.r{r}"),
                    vec![rr.rows.len(), rr.heads],
                    DumpData::F64(&rr.lse),
                ));
            }
        }
        Workload::V4(w) => {
            ts.push(t("q_packed", vec![w.t, w.heads, 512], DumpData::U8(&w.q_packed)));
            ts.push(t("q_rope", vec![w.t, w.heads, 64], DumpData::Bf16Bits(&w.q_rope)));
            ts.push(t("unified_kv", vec![w.pool_rows, 512], DumpData::U8(&w.pool_packed)));
            ts.push(t(
                "unified_kv_rope",
                vec![w.pool_rows, 64],
                DumpData::Bf16Bits(&w.pool_rope),
            ));
            ts.push(t("kv_indptr", vec![w.kv_indptr.len()], DumpData::I32(&w.kv_indptr)));
            ts.push(t("kv_indices", vec![w.kv_indices.len()], DumpData::I32(&w.kv_indices)));
            ts.push(t("attn_sink", vec![w.sink.len()], DumpData::F32(&w.sink)));
        }
    }
    let rows_i32: Vec<i32> = refs.rows.iter().map(|&r| r as i32).collect();
    ts.push(t("checked_rows", vec![rows_i32.len()], DumpData::I32(&rows_i32)));
    ts.push(t(
        "ref.o",
        vec![refs.full.rows.len(), refs.full.heads, refs.full.d_v],
        DumpData::F64(&refs.full.o),
    ));
    ts.push(t(
        "ref.lse",
        vec![refs.full.rows.len(), refs.full.heads],
        DumpData::F64(&refs.full.lse),
    ));
    for o in &out.tensors {
        let rows = o.data.len() / o.row_len.max(1);
        ts.push(t(
            &format!("out.{}", o.name),
            vec![rows, o.row_len],
            DumpData::F32(&o.data),
        ));
    }
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("case".to_string(), case.key());
    meta.insert("status".to_string(), format!("{:?}", row.status));
    meta.insert("repro".to_string(), row.repro.clone());
    let path = dir.join(format!("{}__{}.safetensors", case.id, case.variant));
    write_safetensors(&path, &ts, meta)
}
