//! What each variant will run for a case: its support check, gate decision
//! and plan. Backends execute these plans; nothing here touches a device.

use crate::case::Ps1Schedule;
use crate::case::{Case, CaseParams, Dtype, LayerType, MlaParams, V4Params};
use crate::plan::balance::{build_balanced, BalanceOptions, BALANCED_OVERHEAD_TOKENS};
use crate::plan::gate::{mla_gate, GateInput};
use crate::plan::v4::{hca_call_plan, hca_gates, kv_len_bound, v4_split_plan, HcaPlan, SplitPlan};
use crate::plan::worklist::{build_worklist, WorkList};
use crate::plan::{heads, split, PlanError};
use crate::workload::{dcp, Workload};

use super::VariantId;

/// Per-rank (o, lse) inputs of the DCP combine, taken from the reference.
#[derive(Clone, Debug)]
pub struct CombineInputs {
    pub world: usize,
    pub heads: usize,
    /// Query rows these inputs cover (the checked rows).
    pub rows: Vec<usize>,
    /// `[W, rows, H, 512]` bf16 bits.
    pub o: Vec<u16>,
    /// `[W, rows, H]`.
    pub lse: Vec<f32>,
    /// Empty (rank, row, head) parts given NaN o and a -inf/+inf/NaN LSE.
    pub poisoned: usize,
}

/// Split partials (no sink) of the V4 split contract, from the reference.
#[derive(Clone, Debug)]
pub struct SplitMergeInputs {
    pub n: usize,
    pub heads: usize,
    pub rows: Vec<usize>,
    /// `[rows * n, H, 512]`, slot = row_index * n + split.
    pub o: Vec<f32>,
    /// `[rows * n, H]`.
    pub lse: Vec<f32>,
    /// `[H]`.
    pub sink: Vec<f32>,
    /// Empty (split, row, head) parts given NaN o and a -inf/+inf/NaN LSE.
    pub poisoned: usize,
}

#[derive(Clone, Debug)]
pub enum VariantPlan {
    Ps1 { kernel_heads: usize, ranks: Vec<WorkList> },
    Page64 { kernel_heads: usize, splits: Vec<usize> },
    DcpCombine(CombineInputs),
    V4Split(SplitPlan),
    HcaPersist { partitions: usize, plan: HcaPlan },
    SplitMerge(SplitMergeInputs),
}

/// A variant's decision for a case before anything runs.
pub struct Decision {
    /// The gate's words (MLA kernels), or the support check's.
    pub gate: String,
    /// `Some(reason)`: the variant does not run this case (skip).
    pub skip: Option<String>,
    /// Runs although the gate rejected it.
    pub forced: bool,
    /// hca_persist fell back to v4_split: which gate failed.
    pub fallback: Option<String>,
}

/// The dispatch gate's view of an MLA case.
pub fn gate_input(case: &Case, p: &MlaParams) -> GateInput {
    GateInput {
        profile: case.target,
        w: p.dcp_world,
        s_q: p.s_q,
        heads: p.heads(),
        dtype: p.dtype,
        page_size: p.page_size,
    }
}

/// Whether (and why) a variant runs a case.
pub fn decide(case: &Case) -> Decision {
    let none = |gate: String| Decision {
        gate,
        skip: None,
        forced: false,
        fallback: None,
    };
    match (&case.params, case.variant) {
        (CaseParams::Mla(p), VariantId::Ps1 | VariantId::Page64) => {
            let d = mla_gate(case.variant, &gate_input(case, p));
            if d.eligible {
                return none(format!("eligible: {}", d.reason));
            }
            // A hard limit (page size, width) cannot be forced; only the gate's policy can.
            let hard = match case.variant {
                VariantId::Ps1 => p.page_size != 1 || heads::kernel_heads(p.heads(), p.s_q).is_err(),
                _ => p.page_size != 64 || heads::page64_heads(p.heads()).is_err(),
            };
            if case.force && !hard {
                Decision {
                    gate: format!("rejected: {}", d.reason),
                    skip: None,
                    forced: true,
                    fallback: None,
                }
            } else {
                Decision {
                    gate: format!("rejected: {}", d.reason),
                    skip: Some(d.reason),
                    forced: false,
                    fallback: None,
                }
            }
        }
        (CaseParams::Mla(_), VariantId::DcpCombine) => none("n/a (merge)".into()),
        (CaseParams::V4(p), VariantId::HcaPersist) => match hca_gates(
            p.layer,
            p.kernel_heads(),
            p.rows,
            case.v4.min_rows,
            true,
            true,
            case.v4.workspace,
        ) {
            Ok(()) => none("eligible: all hca_persist gates pass".into()),
            Err(why) => Decision {
                gate: format!("fallback: {why}"),
                skip: None,
                forced: false,
                fallback: Some(why),
            },
        },
        (CaseParams::V4(_), VariantId::V4Split | VariantId::SplitMerge) => none("n/a".into()),
        (params, v) => {
            let fam = match params {
                CaseParams::Mla(_) => "MLA",
                CaseParams::V4(_) => "V4",
            };
            Decision {
                gate: String::new(),
                skip: Some(format!("{v} does not run {fam} workloads")),
                forced: false,
                fallback: None,
            }
        }
    }
}

fn mla_plan(case: &Case, p: &MlaParams) -> Result<VariantPlan, PlanError> {
    let err = |what: String| PlanError { case: case.key(), what };
    let local = |r: usize| -> Vec<usize> {
        p.ctx
            .iter()
            .map(|&l| dcp::local_len(r, l, p.dcp_world, p.interleave))
            .collect()
    };
    match case.variant {
        VariantId::Ps1 => {
            let kernel_heads = heads::kernel_heads(p.heads(), p.s_q).map_err(|e| err(e.to_string()))?;
            let qo: Vec<i32> = (0..=p.batch).map(|b| (b * p.s_q) as i32).collect();
            let ranks = (0..p.dcp_world)
                .map(|r| {
                    let lens = local(r);
                    let wl = match case.ps1_schedule {
                        Ps1Schedule::Payload => build_worklist(&case.key(), &lens, &qo, case.cus, 16, 16)?,
                        Ps1Schedule::Balanced => {
                            // One unit: the tokens a pass of all consumer groups covers.
                            let shape = super::kernels::mla_shape(
                                p.dtype == Dtype::Fp8,
                                super::kernels::mla_mt(kernel_heads, p.s_q),
                            );
                            let opts = BalanceOptions {
                                num_ctas: case.cus,
                                granularity: 16,
                                max_splits: 16,
                                unit_tokens: shape.bn * shape.groups,
                                overhead_tokens: BALANCED_OVERHEAD_TOKENS,
                            };
                            build_balanced(&case.key(), &lens, &qo, &opts)?
                        }
                    };
                    // Both schedulers end in `assemble`, which checks SPEC's invariants.
                    Ok(wl)
                })
                .collect::<Result<Vec<_>, PlanError>>()?;
            Ok(VariantPlan::Ps1 { kernel_heads, ranks })
        }
        VariantId::Page64 => {
            let kernel_heads = heads::page64_heads(p.heads()).map_err(|e| err(e.to_string()))?;
            let splits = (0..p.dcp_world)
                .map(|r| {
                    let lens = local(r);
                    let total: usize = lens.iter().sum();
                    split::fallback_splits(p.batch, total, kernel_heads, p.s_q, p.dtype, case.cus)
                })
                .collect();
            Ok(VariantPlan::Page64 { kernel_heads, splits })
        }
        v => Err(err(format!(
            "{v} has no plan of its own; it is planned from reference inputs"
        ))),
    }
}

fn v4_plan(case: &Case, p: &V4Params, fallback: bool) -> Result<VariantPlan, PlanError> {
    if case.variant == VariantId::HcaPersist && !fallback {
        let lens: Vec<usize> = p.positions.iter().map(|&pos| v4_row_len(p, pos)).collect();
        let plan = hca_call_plan(&lens, case.v4.partitions, case.cus, p.kernel_heads())
            .map_err(|what| PlanError { case: case.key(), what })?;
        return Ok(VariantPlan::HcaPersist {
            partitions: case.v4.partitions,
            plan,
        });
    }
    let bound = kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    Ok(VariantPlan::V4Split(v4_split_plan(
        p.rows,
        p.padded_rows,
        p.kernel_heads(),
        bound,
        case.cus,
        case.v4.splits,
    )))
}

/// KV list length of a V4 row at `pos` (SPEC §2), for plans made before the workload exists.
pub fn v4_row_len(p: &V4Params, pos: usize) -> usize {
    let win = (pos + 1).min(crate::case::V4_WINDOW);
    win + match p.layer {
        LayerType::Swa => 0,
        LayerType::Csa => ((pos + 1) / 4).min(p.index_topk),
        LayerType::Hca => (pos + 1) / 128,
    }
}

/// Plans a variant that runs on its own (not a merge fed by reference data).
pub fn plan(case: &Case, decision: &Decision) -> Result<VariantPlan, PlanError> {
    match &case.params {
        CaseParams::Mla(p) => mla_plan(case, p),
        CaseParams::V4(p) => v4_plan(case, p, decision.fallback.is_some()),
    }
}

/// One line for tables: padded heads, splits, items, fallbacks.
pub fn summary(plan: &VariantPlan) -> String {
    match plan {
        VariantPlan::Ps1 { kernel_heads, ranks } => {
            let items: usize = ranks.iter().map(|w| w.items.len()).sum();
            let parts: usize = ranks.iter().map(|w| w.reduce.len()).sum();
            let busy = ranks.iter().map(|w| w.busy_ctas()).min().unwrap_or(0);
            // Always named: rows of runs before the default changed say nothing.
            let schedule = ranks
                .first()
                .map(|w| format!(" schedule={}", w.schedule))
                .unwrap_or_default();
            format!(
                "h{kernel_heads} items={items} split-seqs={parts} ctas={} busy={busy}{schedule}",
                ranks.first().map(|w| w.num_ctas).unwrap_or(0)
            )
        }
        VariantPlan::Page64 { kernel_heads, splits } => {
            let (lo, hi) = (
                splits.iter().min().copied().unwrap_or(0),
                splits.iter().max().copied().unwrap_or(0),
            );
            if lo == hi {
                format!("h{kernel_heads} splits={lo}")
            } else {
                format!("h{kernel_heads} splits={lo}..{hi}")
            }
        }
        VariantPlan::DcpCombine(c) => format!("W={} h{} empty-parts-poisoned={}", c.world, c.heads, c.poisoned),
        VariantPlan::V4Split(s) => format!("n={} ({:?})", s.n, s.source),
        VariantPlan::HcaPersist { partitions, plan } => {
            format!(
                "P={partitions} (uses {}) split-rows={}",
                plan.partitions, plan.split_rows
            )
        }
        VariantPlan::SplitMerge(s) => format!("n={} sink empty-parts-poisoned={}", s.n, s.poisoned),
    }
}

/// Tokens each query row of an MLA rank sees under the global mask.
pub fn mla_visible(p: &MlaParams, r: usize, b: usize, ii: usize) -> usize {
    let l = p.ctx[b];
    let q_g = l - p.s_q + ii;
    // Local tokens with global position <= q_g: the local length of a q_g+1 prefix.
    dcp::local_len(r, q_g + 1, p.dcp_world, p.interleave)
}

/// Bytes moved and FLOPs done by one run, from visible lengths (SPEC §5).
/// MLA kernels: rank 0, the rank with the most tokens under round-robin sharding.
pub fn cost(case: &Case, wl: &Workload, plan: &VariantPlan) -> (f64, f64) {
    const D_QK: f64 = 576.0;
    const D_V: f64 = 512.0;
    match (wl, plan) {
        (Workload::Mla(w), VariantPlan::Ps1 { kernel_heads, .. } | VariantPlan::Page64 { kernel_heads, .. }) => {
            let p = &w.p;
            let eb = if p.dtype == Dtype::Fp8 { 1.0 } else { 2.0 };
            let h = p.heads() as f64;
            let kv_tokens: usize = w.shards[0].local_lens.iter().sum();
            let vis: usize = (0..p.batch)
                .flat_map(|b| (0..p.s_q).map(move |ii| (b, ii)))
                .map(|(b, ii)| mla_visible(p, 0, b, ii))
                .sum();
            let hk = *kernel_heads as f64;
            let rows = p.total_q() as f64;
            let partial_rows = match plan {
                VariantPlan::Ps1 { ranks, .. } => ranks[0].num_partial_rows as f64,
                VariantPlan::Page64 { splits, .. } if splits[0] > 1 => rows * splits[0] as f64,
                _ => 0.0,
            };
            let bytes = kv_tokens as f64 * D_QK * eb
                + rows * hk * D_QK * eb
                + rows * hk * (D_V * 2.0 + 4.0)
                + partial_rows * hk * (D_V + 1.0) * 4.0 * 2.0;
            (bytes, 2.0 * h * (D_QK + D_V) * vis as f64)
        }
        (Workload::Mla(w), VariantPlan::DcpCombine(c)) => {
            let n = (c.rows.len() * c.heads) as f64;
            let _ = w;
            (
                c.world as f64 * n * (D_V * 2.0 + 4.0) + n * (D_V * 2.0 + 4.0),
                c.world as f64 * n * D_V * 2.0,
            )
        }
        (Workload::V4(w), VariantPlan::V4Split(_) | VariantPlan::HcaPersist { .. }) => {
            let n = w.p.rows;
            let tokens: usize = (0..n).map(|i| w.row_len(i)).sum();
            let h = w.p.heads as f64;
            let hk = w.heads as f64;
            let partial = match plan {
                VariantPlan::V4Split(s) if s.n > 1 => (w.t * s.n) as f64 * hk * (D_V + 1.0) * 4.0 * 2.0,
                _ => 0.0,
            };
            let bytes = tokens as f64 * (512.0 + 128.0)
                + n as f64 * hk * (512.0 + 128.0)
                + n as f64 * hk * (D_V * 2.0 + 4.0)
                + partial;
            (bytes, 2.0 * h * (D_V + D_V) * tokens as f64)
        }
        (Workload::V4(_), VariantPlan::SplitMerge(s)) => {
            let slots = (s.rows.len() * s.n * s.heads) as f64;
            (
                slots * (D_V + 1.0) * 4.0 + (s.rows.len() * s.heads) as f64 * (D_V * 2.0 + 4.0),
                slots * D_V * 2.0,
            )
        }
        _ => {
            let _ = case;
            (0.0, 0.0)
        }
    }
}

/// The length edges this plan puts the case's sequences on (see
/// [`crate::plan::edges`]): for each sequence or row, the pieces its split,
/// work list or partitions cut it into.
/// The merges need no plan: dcp_combine's pieces are the ranks, split_merge's
/// the v4_split plan's splits.
pub fn edges(case: &Case, plan: Option<&VariantPlan>) -> std::collections::BTreeSet<crate::plan::edges::Edge> {
    use crate::plan::edges::union;
    use crate::plan::split::page64_split_ranges;
    use crate::plan::v4::split_ranges;
    let tile = |sizes: &[usize]| -> Vec<(usize, usize)> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                at += n;
                (at - n, at)
            })
            .collect()
    };
    let mut seqs: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    match (&case.params, case.variant, plan) {
        (CaseParams::Mla(p), _, Some(VariantPlan::Ps1 { ranks, .. })) => {
            for (r, wl) in ranks.iter().enumerate() {
                let mut by: std::collections::BTreeMap<(i32, i32), Vec<(usize, usize)>> = Default::default();
                for it in &wl.items {
                    by.entry((it.seq, it.q_start))
                        .or_default()
                        .push((it.kv_start as usize, it.kv_end as usize));
                }
                for ((seq, _), mut pieces) in by {
                    pieces.sort_unstable();
                    let len = dcp::local_len(r, p.ctx[seq as usize], p.dcp_world, p.interleave);
                    seqs.push((len, pieces));
                }
            }
        }
        (CaseParams::Mla(p), _, Some(VariantPlan::Page64 { splits, .. })) => {
            for (r, &n) in splits.iter().enumerate() {
                for &l in &p.ctx {
                    let len = dcp::local_len(r, l, p.dcp_world, p.interleave);
                    seqs.push((len, page64_split_ranges(len, n)));
                }
            }
        }
        (CaseParams::Mla(p), VariantId::DcpCombine, _) => {
            // Each query row's ranks are its pieces: the tokens each one sees.
            for b in 0..p.batch {
                for ii in 0..p.s_q {
                    let vis: Vec<usize> = (0..p.dcp_world).map(|r| mla_visible(p, r, b, ii)).collect();
                    // No page edges: a row's ranks are not pages of one pool.
                    seqs.push((0, tile(&vis)));
                }
            }
        }
        (CaseParams::V4(p), _, Some(VariantPlan::V4Split(SplitPlan { n, .. })))
        | (CaseParams::V4(p), _, Some(VariantPlan::SplitMerge(SplitMergeInputs { n, .. }))) => {
            for &pos in &p.positions {
                let len = v4_row_len(p, pos);
                seqs.push((len, split_ranges(len, *n)));
            }
        }
        (CaseParams::V4(p), VariantId::SplitMerge, None) => {
            let bound = kv_len_bound(p.layer, p.index_topk, p.max_model_len);
            let n = v4_split_plan(p.rows, p.padded_rows, p.kernel_heads(), bound, case.cus, case.v4.splits).n;
            for &pos in &p.positions {
                let len = v4_row_len(p, pos);
                seqs.push((len, split_ranges(len, n)));
            }
        }
        (CaseParams::V4(p), _, Some(VariantPlan::HcaPersist { plan, .. })) => {
            for (i, &pos) in p.positions.iter().enumerate() {
                let pieces: Vec<(usize, usize)> = plan
                    .pieces
                    .iter()
                    .filter(|pc| pc.row == i)
                    .map(|pc| (pc.start, pc.end))
                    .collect();
                seqs.push((v4_row_len(p, pos), pieces));
            }
        }
        _ => {}
    }
    union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
}
