//! dcp_combine: merges per-rank `(o, lse)` over the DCP world with the LSE
//! combine (SPEC §1). Its inputs are the ranks' outputs, taken from the
//! reference as a kernel hands them over (bf16 `o`, f32 `lse`), with every
//! empty rank's `o` NaN and its LSE -inf, +inf or NaN; its reference is the
//! f64 combine of exactly those inputs.

use rayon::prelude::*;
use std::collections::BTreeSet;

use super::checks::pair;
use super::edges::{union, Edge};
use super::emulate::{attn, Emulation, Fault};
use super::heads::PaddedHeads;
use super::merge::{self, poison_empty_parts};
use super::mla;
use super::output::find;
use super::program::{Arg, Call, Elem, Fill, Output, Program, Smem};
use super::{
    Cost, Decision, Family, Job, KernelSpec, OutTensor, Plan, PlanData, PlanError, Variant, VariantId, VariantInfo,
};
use crate::case::{Case, MLA_D_V};
use crate::reference::{self, RefSet};
use crate::result::Check;
use crate::workload::codec::{self, bf16_from_bits, round_bf16};

pub const ID: VariantId = VariantId("dcp_combine");

static INFO: VariantInfo = VariantInfo {
    id: ID,
    kind: crate::variants::external::Contract::DcpCombine,
    family: Family::Mla,
    kernel_file: "merge.cu",
    contract: "merges per-rank (o, lse) over the DCP world with the LSE combine; NaN/+inf LSE count as empty",
    nondeterministic: None,
    native_page_size: 1,
    takes_split_axis: false,
};

/// Per-rank inputs over the checked rows.
pub struct CombineInputs {
    pub world: usize,
    pub heads: usize,
    pub rows: Vec<usize>,
    /// `[W, rows, H, 512]` bf16 bits.
    pub o: Vec<u16>,
    /// `[W, rows, H]`.
    pub lse: Vec<f32>,
    /// Empty (rank, row, head) parts given NaN o and a -inf/+inf/NaN LSE.
    pub poisoned: usize,
}

impl CombineInputs {
    /// Rank `r`'s `o` and `lse`, in f64.
    fn rank(&self, r: usize) -> (Vec<f64>, Vec<f64>) {
        let n = self.rows.len() * self.heads;
        let o = self.o[r * n * MLA_D_V..(r + 1) * n * MLA_D_V]
            .iter()
            .map(|&b| bf16_from_bits(b) as f64)
            .collect();
        let l = self.lse[r * n..(r + 1) * n].iter().map(|&x| x as f64).collect();
        (o, l)
    }
}

pub struct DcpCombine;

fn inputs<'a>(job: &Job<'a>) -> Result<&'a CombineInputs, String> {
    job.plan.expect::<CombineInputs>("dcp_combine")
}

impl Variant for DcpCombine {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn decide(&self, case: &Case) -> Decision {
        match case.mla() {
            Some(_) => Decision::runs("n/a (merge)"),
            None => Decision::skips("", "dcp_combine does not run V4 workloads"),
        }
    }

    fn plan(&self, case: &Case, _: &Decision, data: Option<PlanData>) -> Result<Plan, PlanError> {
        let err = |what: &str| PlanError::new(&case.key(), what);
        let d = data.ok_or_else(|| err("dcp_combine is planned from the references' per-rank outputs"))?;
        let w = d.workload.mla().ok_or_else(|| err("an MLA workload"))?;
        let mut o: Vec<u16> = d
            .refs
            .ranks
            .iter()
            .flat_map(|r| r.o.iter().map(|&x| codec::bf16_bits(x as f32)))
            .collect();
        let mut lse: Vec<f32> = d
            .refs
            .ranks
            .iter()
            .flat_map(|r| r.lse.iter().map(|&x| x as f32))
            .collect();
        let poisoned = poison_empty_parts(&mut o, &mut lse, MLA_D_V, codec::BF16_NAN);
        Ok(Plan::new(CombineInputs {
            world: d.refs.ranks.len(),
            heads: w.heads(),
            rows: d.refs.rows.clone(),
            o,
            lse,
            poisoned,
        }))
    }

    fn plan_note(&self) -> Option<&'static str> {
        Some("merges the W per-rank (o, lse) with the LSE combine; empty ranks get NaN o and a -inf/+inf/NaN lse")
    }

    fn summary(&self, plan: &Plan) -> String {
        plan.of::<CombineInputs>()
            .map(|c| format!("W={} h{} empty-parts-poisoned={}", c.world, c.heads, c.poisoned))
            .unwrap_or_default()
    }

    fn cost(&self, job: &Job) -> Cost {
        let Ok(c) = inputs(job) else { return Cost::default() };
        let n = (c.rows.len() * c.heads) as f64;
        let d_v = MLA_D_V as f64;
        Cost {
            bytes: c.world as f64 * n * (d_v * 2.0 + 4.0) + n * (d_v * 2.0 + 4.0),
            flops: c.world as f64 * n * d_v * 2.0,
        }
    }

    fn edges(&self, case: &Case, _: Option<&Plan>) -> BTreeSet<Edge> {
        let Some(p) = case.mla() else { return BTreeSet::new() };
        // Each query row's ranks are its pieces: the tokens each one sees.
        // No page edges: a row's ranks are not pages of one pool.
        let mut seqs = Vec::new();
        for b in 0..p.batch {
            for ii in 0..p.s_q {
                let mut at = 0;
                let pieces: Vec<(usize, usize)> = p
                    .dcp
                    .ranks()
                    .map(|r| {
                        let n = mla::visible(p, r, b, ii);
                        at += n;
                        (at - n, at)
                    })
                    .collect();
                seqs.push((0, pieces));
            }
        }
        union(seqs.iter().map(|(l, p)| (*l, p.as_slice())))
    }

    fn all_kernels(&self) -> Vec<KernelSpec> {
        vec![merge::spec()]
    }

    fn kernels(&self, case: &Case, d: &Decision) -> Vec<KernelSpec> {
        if case.mla().is_some() && d.skip.is_none() {
            vec![merge::spec()]
        } else {
            vec![]
        }
    }

    fn check(&self, job: &Job, refs: &RefSet, out: &[OutTensor], _: bool) -> Result<Vec<Check>, String> {
        let c = inputs(job)?;
        let o = find(out, "o")?.pick(&refs.rows, true);
        let l = find(out, "lse")?.pick(&refs.rows, true);
        // Reference: the f64 combine of the very inputs the kernel merged.
        let ranks: Vec<(Vec<f64>, Vec<f64>)> = (0..c.world).map(|r| c.rank(r)).collect();
        let parts: Vec<(&[f64], &[f64])> = ranks.iter().map(|(o, l)| (o.as_slice(), l.as_slice())).collect();
        let (ro, rl) = reference::combine::combine(&parts, MLA_D_V);
        Ok(pair("", &o, &ro, &l, &rl, MLA_D_V, &job.case.tol))
    }

    fn emulate(&self, job: &Job, emu: &mut Emulation) -> Result<Vec<OutTensor>, String> {
        let c = inputs(job)?;
        let (n, h) = (c.rows.len(), c.heads);
        let mut o = vec![0f32; n * h * MLA_D_V];
        let mut lse = vec![0f32; n * h];
        let ranks: Vec<Vec<f32>> = (0..c.world)
            .map(|r| {
                c.o[r * n * h * MLA_D_V..(r + 1) * n * h * MLA_D_V]
                    .iter()
                    .map(|&b| bf16_from_bits(b))
                    .collect()
            })
            .collect();
        let keep_empty = emu.has(Fault::MergeKeepsEmpty);
        o.par_chunks_mut(MLA_D_V)
            .zip(lse.par_iter_mut())
            .enumerate()
            .for_each(|(idx, (od, l))| {
                let parts: Vec<(&[f32], f32)> = (0..c.world)
                    .map(|r| (&ranks[r][idx * MLA_D_V..(idx + 1) * MLA_D_V], c.lse[r * n * h + idx]))
                    .collect();
                *l = attn::merge(&parts, None, od, keep_empty);
                od.iter_mut().for_each(|x| *x = round_bf16(*x));
            });
        Ok(vec![
            OutTensor {
                name: "o".into(),
                row_len: h * MLA_D_V,
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
        let c = inputs(job)?;
        let (rows, h) = (c.rows.len(), c.heads);
        let heads = PaddedHeads { real: h, kernel: h };
        let mut p = Program {
            timed: true,
            ..Default::default()
        };
        let o_r = p.upload("rank o", &c.o);
        let lse_r = p.upload("rank lse", &c.lse);
        let o = p.poisoned("o", rows * h * MLA_D_V * 2, Fill::Bf16);
        let lse = p.poisoned("lse", rows * h * 4, Fill::F32);
        p.calls.push(Call {
            kernel: merge::spec(),
            entry: "dcp_combine",
            grid: ((rows * h) as u32, 1, 1),
            block: 64,
            smem: Smem::Fixed(0),
            args: vec![
                Arg::Buf(o_r),
                Arg::Buf(lse_r),
                Arg::I32(c.world as i32),
                Arg::I32(rows as i32),
                Arg::I32(h as i32),
                Arg::Buf(o),
                Arg::Buf(lse),
            ],
            second: false,
            dependent: false,
        });
        for (name, buf, elem, inner) in [("o", o, Elem::Bf16, MLA_D_V), ("lse", lse, Elem::F32, 1)] {
            p.outputs.push(Output {
                name: name.into(),
                buf,
                elem,
                heads,
                inner,
                scatter: None,
            });
        }
        Ok(vec![p])
    }
}
