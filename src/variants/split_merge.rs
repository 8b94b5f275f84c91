//! split_merge: merges a V4 row's split partials (f32 `o`, LSE without the
//! sink) and adds the attention sink once (SPEC §2). Its inputs are the
//! reference's split partials of the v4_split plan, every empty split given
//! a NaN `o` and a -inf, +inf or NaN LSE; its answer is the attention with
//! sink.

use std::collections::BTreeSet;

use super::emulate::{poison, Emulation};
use super::heads::PaddedHeads;
use super::merge::{self, poison_empty_parts};
use super::program::{Arg, Call, Elem, Fill, Output, Program, Scatter, Smem};
use super::v4::emulate::sink_merge;
use super::v4::{self};
use super::v4_split::{self, Run as Split};
use super::{
    edges::Edge, Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId,
    VariantInfo,
};
use crate::case::{Case, V4_D};
use crate::reference::{self, RefSet};
use crate::result::Check;
use crate::workload::codec::round_bf16;

pub const ID: VariantId = VariantId("split_merge");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::SplitMerge,
    family: Family::V4,
    kernel_file: "merge.cu",
    contract: "merges split partials (f32 o, lse without sink) per row and adds the attention sink once",
    nondeterministic: None,
    native_page_size: 1,
    takes_split_axis: false,
};

/// The split partials of the checked rows, from the reference.
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

pub struct SplitMerge;

fn inputs<'a>(job: &Job<'a>) -> Result<&'a SplitMergeInputs, String> {
    job.plan.expect::<SplitMergeInputs>("split_merge")
}

impl Variant for SplitMerge {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn decide(&self, case: &Case) -> Decision {
        match case.v4() {
            Some(_) => Decision::runs("n/a"),
            None => Decision::skips("", "split_merge does not run MLA workloads"),
        }
    }

    fn plan(&self, case: &Case, _: &Decision, data: Option<PlanData>) -> Result<Plan, PlanError> {
        let err = |what: &str| PlanError::new(&case.key(), what);
        let d = data.ok_or_else(|| err("split_merge is planned from the reference's split partials"))?;
        let w = d.workload.v4().ok_or_else(|| err("a V4 workload"))?;
        let n = v4_split::split_plan(case).map_err(|e| err(&e))?.n;
        let parts = reference::v4::split_partials(w, &d.refs.rows, n);
        let (h, hk, dv) = (w.p.heads, w.heads, V4_D);
        let rows = d.refs.rows.len();
        let mut o = Vec::with_capacity(rows * n * h * dv);
        let mut lse = Vec::with_capacity(rows * n * h);
        for k in 0..rows {
            for part in &parts {
                for hh in 0..h {
                    o.extend(
                        part.o[(k * hk + hh) * dv..(k * hk + hh + 1) * dv]
                            .iter()
                            .map(|&x| x as f32),
                    );
                    lse.push(part.lse[k * hk + hh] as f32);
                }
            }
        }
        let poisoned = poison_empty_parts(&mut o, &mut lse, dv, f32::NAN);
        Ok(Plan::new(SplitMergeInputs {
            n,
            heads: h,
            rows: d.refs.rows.clone(),
            o,
            lse,
            sink: w.sink[..h].to_vec(),
            poisoned,
        }))
    }

    fn plan_note(&self) -> Option<&'static str> {
        Some("merges split partials with the sink (n from the v4_split plan); empty splits get NaN o and a -inf/+inf/NaN lse")
    }

    fn summary(&self, plan: &Plan) -> String {
        plan.of::<SplitMergeInputs>()
            .map(|s| format!("n={} sink empty-parts-poisoned={}", s.n, s.poisoned))
            .unwrap_or_default()
    }

    fn cost(&self, job: &Job) -> Cost {
        let Ok(s) = inputs(job) else { return Cost::default() };
        let d_v = V4_D as f64;
        let slots = (s.rows.len() * s.n * s.heads) as f64;
        Cost {
            bytes: slots * (d_v + 1.0) * 4.0 + (s.rows.len() * s.heads) as f64 * (d_v * 2.0 + 4.0),
            flops: slots * d_v * 2.0,
        }
    }

    fn edges(&self, case: &Case, _: Option<&Plan>) -> BTreeSet<Edge> {
        match v4_split::split_plan(case) {
            Ok(s) => Split::edges(case, s.n),
            Err(_) => BTreeSet::new(),
        }
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        vec![merge::spec()]
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        if case.v4().is_some() && d.skip.is_none() {
            vec![merge::spec()]
        } else {
            vec![]
        }
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], replays: bool) -> Result<Vec<Check>, String> {
        v4::checks::decode(job, refs, out, replays, None)
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        let s = inputs(job)?;
        let t = v4::workload(job)?.t;
        let h = s.heads;
        let mut o = poison(t * h * V4_D);
        let mut lse = poison(t * h);
        let mut buf = vec![0f32; V4_D];
        for (k, &i) in s.rows.iter().enumerate() {
            for hh in 0..h {
                let parts: Vec<(&[f32], f32)> = (0..s.n)
                    .map(|sp| {
                        let slot = (k * s.n + sp) * h + hh;
                        (&s.o[slot * V4_D..(slot + 1) * V4_D], s.lse[slot])
                    })
                    .collect();
                lse[i * h + hh] = sink_merge(&parts, s.sink[hh], &mut buf, emu);
                for (x, y) in o[(i * h + hh) * V4_D..(i * h + hh + 1) * V4_D].iter_mut().zip(&buf) {
                    *x = round_bf16(*y);
                }
            }
        }
        Ok(vec![
            OutTensor {
                name: "o".into(),
                row_len: h * V4_D,
                data: o,
            },
            OutTensor {
                name: "lse".into(),
                row_len: h,
                data: lse,
            },
        ])
    }

    fn programs<'a>(&self, job: &Job<'a>) -> Result<Vec<Program<'a>>, String> {
        let s = inputs(job)?;
        let t = v4::workload(job)?.t;
        let (rows, h) = (s.rows.len(), s.heads);
        let indptr: Vec<i32> = (0..=rows).map(|i| (i * s.n) as i32).collect();
        let mut p = Program {
            timed: true,
            ..Default::default()
        };
        let po = p.upload("partials", &s.o);
        let pl = p.upload("partial lse", &s.lse);
        let ip = p.upload_owned("split_indptr", indptr);
        let sink = p.upload("attn_sink", &s.sink);
        let o = p.poisoned("o", rows * h * V4_D * 2, Fill::Bf16);
        let lse = p.poisoned("lse", rows * h * 4, Fill::F32);
        let (entry, grid) = merge::split_merge_launch(rows, h, s.n);
        p.calls.push(Call {
            kernel: merge::spec(),
            entry,
            grid,
            block: 128,
            smem: Smem::Fixed(0),
            args: vec![
                Arg::Buf(po),
                Arg::Buf(pl),
                Arg::Buf(ip),
                Arg::Buf(sink),
                Arg::I32(rows as i32),
                Arg::I32(h as i32),
                Arg::Buf(o),
                Arg::Buf(lse),
            ],
            second: false,
            dependent: false,
        });
        // The device holds the checked rows compact; they go back to their
        // row ids, like the other V4 outputs.
        let heads = PaddedHeads { real: h, kernel: h };
        for (name, buf, elem, inner) in [("o", o, Elem::Bf16, V4_D), ("lse", lse, Elem::F32, 1)] {
            p.outputs.push(Output {
                name: name.into(),
                buf,
                elem,
                heads,
                inner,
                scatter: Some(Scatter {
                    ids: s.rows.clone(),
                    rows: t,
                }),
            });
        }
        Ok(vec![p])
    }
}
