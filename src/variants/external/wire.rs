//! What a worker is handed and must hand back, per contract, in exactly the
//! contract's layouts (docs/protocol.md is the reference for worker
//! authors). One pass per DCP rank for MLA decode, one for everything else.

use serde_json::{json, Value};
use std::borrow::Cow;

use super::decl::Contract;
use super::External;
use crate::case::{Dtype, MLA_D_QK, MLA_D_V, V4_D, V4_D_ROPE};
use crate::variants::dcp_combine::CombineInputs;
use crate::variants::split_merge::SplitMergeInputs;
use crate::variants::Job;
use crate::workload::{Elems, Workload};

/// Element types on the wire, as safetensors names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDtype {
    Bf16,
    F8E4m3,
    F32,
    I32,
    U8,
}

impl WireDtype {
    pub fn name(self) -> &'static str {
        match self {
            WireDtype::Bf16 => "BF16",
            WireDtype::F8E4m3 => "F8_E4M3",
            WireDtype::F32 => "F32",
            WireDtype::I32 => "I32",
            WireDtype::U8 => "U8",
        }
    }
    pub fn size(self) -> usize {
        match self {
            WireDtype::Bf16 => 2,
            WireDtype::F32 | WireDtype::I32 => 4,
            WireDtype::F8E4m3 | WireDtype::U8 => 1,
        }
    }
}

/// One input tensor.
pub struct WireTensor<'a> {
    pub name: &'static str,
    pub dtype: WireDtype,
    pub shape: Vec<usize>,
    pub data: Cow<'a, [u8]>,
}

/// One output the worker must return, and where its rows go.
#[derive(Clone, Debug)]
pub struct WireOut {
    /// The name in the worker's output file.
    pub name: &'static str,
    pub dtype: WireDtype,
    pub shape: Vec<usize>,
    /// The name the checks know it by (`o.r1`, `lse`).
    pub check_name: String,
    /// Rows of the returned tensor go to these row ids of a tensor of
    /// `rows` rows, the rest poisoned (split_merge: the checks index row ids).
    pub scatter: Option<(Vec<usize>, usize)>,
}

/// One call of the implementation: what to load, and what comes back.
pub struct WirePass<'a> {
    pub contract: Contract,
    /// Scalars and geometry; the key `rows` lists the query rows that will
    /// be checked (a CPU worker may compute only those).
    pub params: Value,
    pub tensors: Vec<WireTensor<'a>>,
    pub outputs: Vec<WireOut>,
    /// The pass a timed run times (rank 0 under DCP, as for built-ins).
    pub timed: bool,
}

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Cow<'_, [u8]> {
    Cow::Borrowed(bytemuck::cast_slice(v))
}

fn t<'a>(name: &'static str, dtype: WireDtype, shape: Vec<usize>, data: Cow<'a, [u8]>) -> WireTensor<'a> {
    WireTensor {
        name,
        dtype,
        shape,
        data,
    }
}

fn out(name: &'static str, dtype: WireDtype, shape: Vec<usize>, check_name: String) -> WireOut {
    WireOut {
        name,
        dtype,
        shape,
        check_name,
        scatter: None,
    }
}

/// The passes of one run of `ext` on `job`.
pub fn passes<'a>(ext: &External, job: &Job<'a>) -> Result<Vec<WirePass<'a>>, String> {
    let rows: Vec<usize> = job.rows.to_vec();
    match (ext.decl.contract, job.workload) {
        (Contract::MlaDecode, Workload::Mla(w)) => {
            let h = w.heads();
            let tq = w.p.total_q();
            let (qd, q) = match &w.q {
                Elems::Bf16(v) => (WireDtype::Bf16, bytes(v)),
                Elems::Fp8(v) => (WireDtype::F8E4m3, bytes(v)),
            };
            let mut v = Vec::new();
            for sh in &w.shards {
                let (pd, pool) = match &sh.pool {
                    Elems::Bf16(x) => (WireDtype::Bf16, bytes(x)),
                    Elems::Fp8(x) => (WireDtype::F8E4m3, bytes(x)),
                };
                let lens: Vec<i32> = sh.local_lens.iter().map(|&n| n as i32).collect();
                v.push(WirePass {
                    contract: Contract::MlaDecode,
                    params: json!({
                        "batch": w.p.batch,
                        "s_q": w.p.s_q,
                        "heads": h,
                        "page_size": w.p.page_size,
                        "dtype": match w.p.dtype { Dtype::Bf16 => "bf16", Dtype::Fp8 => "fp8" },
                        "sm_scale": w.p.sm_scale,
                        "q_scale": w.q_scale,
                        "kv_scale": w.kv_scale,
                        "dcp": {"world": w.p.dcp.world, "rank": sh.rank, "interleave": w.p.dcp.interleave},
                        "rows": rows,
                    }),
                    tensors: vec![
                        t("q", qd, vec![tq, h, MLA_D_QK], q.clone()),
                        t("kv_pool", pd, vec![sh.num_pages, w.p.page_size, MLA_D_QK], pool),
                        t(
                            "kv_indptr",
                            WireDtype::I32,
                            vec![sh.kv_indptr.len()],
                            bytes(&sh.kv_indptr),
                        ),
                        t(
                            "kv_indices",
                            WireDtype::I32,
                            vec![sh.kv_indices.len()],
                            bytes(&sh.kv_indices),
                        ),
                        t(
                            "kv_last_page_len",
                            WireDtype::I32,
                            vec![sh.kv_last_page_len.len()],
                            bytes(&sh.kv_last_page_len),
                        ),
                        t(
                            "kv_lens",
                            WireDtype::I32,
                            vec![lens.len()],
                            Cow::Owned(bytemuck::cast_slice(&lens).to_vec()),
                        ),
                        t(
                            "qo_indptr",
                            WireDtype::I32,
                            vec![w.qo_indptr.len()],
                            bytes(&w.qo_indptr),
                        ),
                        t(
                            "g_kv_indptr",
                            WireDtype::I32,
                            vec![w.g_kv_indptr.len()],
                            bytes(&w.g_kv_indptr),
                        ),
                    ],
                    outputs: vec![
                        out("o", WireDtype::Bf16, vec![tq, h, MLA_D_V], format!("o.r{}", sh.rank)),
                        out("lse", WireDtype::F32, vec![tq, h], format!("lse.r{}", sh.rank)),
                    ],
                    timed: sh.rank == 0,
                });
            }
            Ok(v)
        }
        (Contract::V4Decode, Workload::V4(w)) => {
            // Real heads only: the kernel-head padding is a built-in's choice.
            let (h, hk, tt) = (w.p.heads, w.heads, w.t);
            let mut q = Vec::with_capacity(tt * h * V4_D);
            let mut q_rope: Vec<u16> = Vec::with_capacity(tt * h * V4_D_ROPE);
            for i in 0..tt {
                for hh in 0..h {
                    let at = i * hk + hh;
                    q.extend_from_slice(&w.q_packed[at * V4_D..(at + 1) * V4_D]);
                    q_rope.extend_from_slice(&w.q_rope[at * V4_D_ROPE..(at + 1) * V4_D_ROPE]);
                }
            }
            let n = w.p.rows;
            Ok(vec![WirePass {
                contract: Contract::V4Decode,
                params: json!({
                    "rows": rows,
                    "num_rows": n,
                    "padded_rows": tt,
                    "heads": h,
                    "sm_scale": w.p.sm_scale,
                    "pool_rows": w.pool_rows,
                    "layer": w.p.layer.to_string(),
                    // The split plan mlabench's v4_split would run (the
                    // uniform table row), for kernels that take one.
                    "splits": crate::variants::v4_split::split_plan(job.case).ok().map(|s| s.n),
                }),
                tensors: vec![
                    t("q", WireDtype::U8, vec![tt, h, V4_D], Cow::Owned(q)),
                    t(
                        "q_rope",
                        WireDtype::Bf16,
                        vec![tt, h, V4_D_ROPE],
                        Cow::Owned(bytemuck::cast_slice(&q_rope).to_vec()),
                    ),
                    t(
                        "unified_kv",
                        WireDtype::U8,
                        vec![w.pool_rows, V4_D],
                        bytes(&w.pool_packed),
                    ),
                    t(
                        "unified_kv_rope",
                        WireDtype::Bf16,
                        vec![w.pool_rows, V4_D_ROPE],
                        bytes(&w.pool_rope),
                    ),
                    t(
                        "kv_indptr",
                        WireDtype::I32,
                        vec![w.kv_indptr.len()],
                        bytes(&w.kv_indptr),
                    ),
                    t(
                        "kv_indices",
                        WireDtype::I32,
                        vec![w.kv_indices.len()],
                        bytes(&w.kv_indices),
                    ),
                    t("attn_sink", WireDtype::F32, vec![h], bytes(&w.sink[..h])),
                ],
                outputs: if ext.decl.caps.lse {
                    vec![
                        out("o", WireDtype::Bf16, vec![n, h, V4_D], "o".into()),
                        out("lse", WireDtype::F32, vec![n, h], "lse".into()),
                    ]
                } else {
                    vec![out("o", WireDtype::Bf16, vec![n, h, V4_D], "o".into())]
                },
                timed: true,
            }])
        }
        (Contract::DcpCombine, _) => {
            let c = job.plan.expect::<CombineInputs>("an external dcp_combine")?;
            let n = c.rows.len();
            Ok(vec![WirePass {
                contract: Contract::DcpCombine,
                params: json!({"world": c.world, "rows": rows, "num_rows": n, "heads": c.heads}),
                tensors: vec![
                    t(
                        "o_parts",
                        WireDtype::Bf16,
                        vec![c.world, n, c.heads, MLA_D_V],
                        bytes(&c.o),
                    ),
                    t("lse_parts", WireDtype::F32, vec![c.world, n, c.heads], bytes(&c.lse)),
                ],
                outputs: vec![
                    out("o", WireDtype::Bf16, vec![n, c.heads, MLA_D_V], "o".into()),
                    out("lse", WireDtype::F32, vec![n, c.heads], "lse".into()),
                ],
                timed: true,
            }])
        }
        (Contract::SplitMerge, Workload::V4(w)) => {
            let s = job.plan.expect::<SplitMergeInputs>("an external split_merge")?;
            let n = s.rows.len();
            let indptr: Vec<i32> = (0..=n).map(|i| (i * s.n) as i32).collect();
            let scatter = Some((s.rows.clone(), w.t));
            let mut outs = vec![
                out("o", WireDtype::Bf16, vec![n, s.heads, V4_D], "o".into()),
                out("lse", WireDtype::F32, vec![n, s.heads], "lse".into()),
            ];
            for o in &mut outs {
                o.scatter = scatter.clone();
            }
            Ok(vec![WirePass {
                contract: Contract::SplitMerge,
                params: json!({"splits": s.n, "rows": rows, "num_rows": n, "heads": s.heads}),
                tensors: vec![
                    t("partial_o", WireDtype::F32, vec![n * s.n, s.heads, V4_D], bytes(&s.o)),
                    t("partial_lse", WireDtype::F32, vec![n * s.n, s.heads], bytes(&s.lse)),
                    t(
                        "split_indptr",
                        WireDtype::I32,
                        vec![n + 1],
                        Cow::Owned(bytemuck::cast_slice(&indptr).to_vec()),
                    ),
                    t("attn_sink", WireDtype::F32, vec![s.heads], bytes(&s.sink)),
                ],
                outputs: outs,
                timed: true,
            }])
        }
        (c, _) => Err(format!(
            "{} was handed a workload its contract {} does not take",
            ext.decl.name,
            c.name()
        )),
    }
}
