//! Executes each variant's plan in f32 on the host, from the same quantized
//! bytes a kernel reads: work items, splits, merges, head padding and
//! stripping. Verifies planners and merges without a GPU.

mod attn;

use rayon::prelude::*;
use std::time::Instant;

use super::{Backend, BackendError, DeviceInfo, OutTensor, RunOutput, RunRequest, Samples};
use crate::case::{MLA_D_QK, MLA_D_V, V4_D, V4_D_NOPE, V4_D_ROPE};
use crate::metrics::POISON_BITS;
use crate::plan::heads::PaddedHeads;
use crate::plan::split::page64_split_ranges;
use crate::plan::v4::split_ranges;
use crate::variants::{CombineInputs, SplitMergeInputs, VariantPlan};
use crate::workload::codec::{bf16_from_bits, e4m3_table, round_bf16};
use crate::workload::v4::unpack_nope;
use crate::workload::{Elems, MlaShard, MlaWorkload, V4Workload, Workload};

pub struct CpuBackend {
    info: DeviceInfo,
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            info: DeviceInfo {
                backend: "cpu".into(),
                name: format!("host CPU ({} threads, f32 emulation)", rayon::current_num_threads()),
                compute_units: rayon::current_num_threads(),
                l2_bytes: 0,
                copy_gbps: None,
                tensor_tflops: None,
                details: vec![],
            },
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

fn poison(n: usize) -> Vec<f32> {
    vec![f32::from_bits(POISON_BITS); n]
}

fn decode(e: &Elems, range: std::ops::Range<usize>, out: &mut [f32]) {
    match e {
        Elems::Bf16(v) => v[range].iter().zip(out).for_each(|(b, o)| *o = bf16_from_bits(*b)),
        Elems::Fp8(v) => {
            let t = e4m3_table();
            v[range].iter().zip(out).for_each(|(b, o)| *o = t[*b as usize]);
        }
    }
}

/// Q of rows `q_start..q_end`, padded to `hk` heads with zeros: `[rows*hk, 576]`.
fn mla_q(w: &MlaWorkload, q_start: usize, q_end: usize, hk: usize) -> Vec<f32> {
    let h = w.heads();
    let mut q = vec![0f32; (q_end - q_start) * hk * MLA_D_QK];
    for i in q_start..q_end {
        for hh in 0..h {
            let src = (i * h + hh) * MLA_D_QK;
            let dst = ((i - q_start) * hk + hh) * MLA_D_QK;
            decode(&w.q, src..src + MLA_D_QK, &mut q[dst..dst + MLA_D_QK]);
        }
    }
    q
}

/// Decoded KV of local tokens `a..b` of sequence `seq` read through the page table.
fn mla_kv(sh: &MlaShard, ps: usize, seq: usize, a: usize, b: usize) -> Vec<f32> {
    let mut k = vec![0f32; (b - a) * MLA_D_QK];
    for j in a..b {
        let slot = sh.slot(seq, j, ps);
        decode(
            &sh.pool,
            slot * MLA_D_QK..(slot + 1) * MLA_D_QK,
            &mut k[(j - a) * MLA_D_QK..(j - a + 1) * MLA_D_QK],
        );
    }
    k
}

/// A chunk's result: rows `q_start..q_end` x `hk` heads.
struct Chunk {
    q_start: usize,
    q_end: usize,
    o: Vec<f32>,
    lse: Vec<f32>,
}

/// Attention of one sequence's rows over local tokens `a..b`, with each row's
/// visible prefix given in local tokens.
fn mla_chunk(
    w: &MlaWorkload,
    sh: &MlaShard,
    seq: usize,
    rows: (usize, usize),
    kv: (usize, usize),
    hk: usize,
    vis_end: &dyn Fn(usize) -> usize,
) -> Chunk {
    let (q_start, q_end) = rows;
    let (a, b) = kv;
    let q = mla_q(w, q_start, q_end, hk);
    let k = mla_kv(sh, w.p.page_size, seq, a, b);
    let m = (q_end - q_start) * hk;
    let vis: Vec<usize> = (q_start..q_end)
        .flat_map(|i| std::iter::repeat(vis_end(i).clamp(a, b) - a).take(hk))
        .collect();
    let mut o = vec![0f32; m * MLA_D_V];
    let mut lse = vec![0f32; m];
    let scale = (w.p.sm_scale as f32) * w.q_scale * w.kv_scale;
    attn::attend(
        &q,
        m,
        MLA_D_QK,
        &k,
        b - a,
        MLA_D_V,
        &vis,
        scale,
        w.kv_scale,
        &mut o,
        &mut lse,
    );
    Chunk { q_start, q_end, o, lse }
}

fn wanted(rows: &[usize], a: usize, b: usize) -> bool {
    let i = rows.partition_point(|&r| r < a);
    i < rows.len() && rows[i] < b
}

/// Final per-rank outputs `[total_q, hk, 512]` (bf16-rounded) and `[total_q, hk]`.
struct RankOut {
    o: Vec<f32>,
    lse: Vec<f32>,
}

fn write_final(out: &mut RankOut, hk: usize, c: &Chunk) {
    for (k, i) in (c.q_start..c.q_end).enumerate() {
        for h in 0..hk {
            let s = (k * hk + h) * MLA_D_V;
            let d = (i * hk + h) * MLA_D_V;
            for (x, y) in out.o[d..d + MLA_D_V].iter_mut().zip(&c.o[s..s + MLA_D_V]) {
                *x = round_bf16(*y);
            }
            out.lse[i * hk + h] = c.lse[k * hk + h];
        }
    }
}

/// Merges per-split chunks of the same rows into final outputs.
fn merge_chunks(out: &mut RankOut, hk: usize, parts: &[&Chunk]) {
    let c0 = parts[0];
    let mut buf = vec![0f32; MLA_D_V];
    for (k, i) in (c0.q_start..c0.q_end).enumerate() {
        for h in 0..hk {
            let idx = k * hk + h;
            let ps: Vec<(&[f32], f32)> = parts
                .iter()
                .map(|c| (&c.o[idx * MLA_D_V..(idx + 1) * MLA_D_V], c.lse[idx]))
                .collect();
            let g = attn::merge(&ps, None, &mut buf);
            let d = (i * hk + h) * MLA_D_V;
            for (x, y) in out.o[d..d + MLA_D_V].iter_mut().zip(&buf) {
                *x = round_bf16(*y);
            }
            out.lse[i * hk + h] = g;
        }
    }
}

fn run_ps1(w: &MlaWorkload, ranks: &[crate::plan::worklist::WorkList], hk: usize, rows: &[usize]) -> Vec<RankOut> {
    let p = &w.p;
    ranks
        .iter()
        .enumerate()
        .map(|(r, wl)| {
            let sh = &w.shards[r];
            let vis_end = |i: usize| {
                let b = i / p.s_q;
                crate::variants::mla_visible(p, r, b, i % p.s_q)
            };
            let chunks: Vec<(i32, Chunk)> = wl
                .items
                .par_iter()
                .filter(|it| wanted(rows, it.q_start as usize, it.q_end as usize))
                .map(|it| {
                    let c = mla_chunk(
                        w,
                        sh,
                        it.seq as usize,
                        (it.q_start as usize, it.q_end as usize),
                        (it.kv_start as usize, it.kv_end as usize),
                        hk,
                        &vis_end,
                    );
                    (it.partial, c)
                })
                .collect();
            let n = p.total_q();
            let mut out = RankOut {
                o: poison(n * hk * MLA_D_V),
                lse: poison(n * hk),
            };
            for (_, c) in chunks.iter().filter(|(pt, _)| *pt < 0) {
                write_final(&mut out, hk, c);
            }
            // Reduce: partials of one sequence, found by their partial slot.
            for red in &wl.reduce {
                let rows_per = red.q_end - red.q_start;
                let parts: Vec<&Chunk> = (0..red.n_parts)
                    .filter_map(|k| {
                        chunks
                            .iter()
                            .find(|(pt, _)| *pt == red.part_base + k * rows_per)
                            .map(|(_, c)| c)
                    })
                    .collect();
                if parts.len() == red.n_parts as usize {
                    merge_chunks(&mut out, hk, &parts);
                }
            }
            out
        })
        .collect()
}

fn run_page64(w: &MlaWorkload, splits: &[usize], hk: usize, rows: &[usize]) -> Vec<RankOut> {
    let p = &w.p;
    (0..p.dcp_world)
        .map(|r| {
            let sh = &w.shards[r];
            let n_split = splits[r];
            // The fallback's own mask: bottom-right on local positions.
            let vis_end = |i: usize| {
                let b = i / p.s_q;
                (sh.local_lens[b] + i % p.s_q + 1).saturating_sub(p.s_q)
            };
            let tasks: Vec<(usize, usize, usize, usize)> = (0..p.batch)
                .filter(|&b| wanted(rows, b * p.s_q, (b + 1) * p.s_q))
                .flat_map(|b| {
                    page64_split_ranges(sh.local_lens[b], n_split)
                        .into_iter()
                        .map(move |(a, e)| (b, a, e, 0))
                })
                .collect();
            let chunks: Vec<(usize, Chunk)> = tasks
                .par_iter()
                .map(|&(b, a, e, _)| {
                    (
                        b,
                        mla_chunk(w, sh, b, (b * p.s_q, (b + 1) * p.s_q), (a, e), hk, &vis_end),
                    )
                })
                .collect();
            let mut out = RankOut {
                o: poison(p.total_q() * hk * MLA_D_V),
                lse: poison(p.total_q() * hk),
            };
            for b in 0..p.batch {
                let parts: Vec<&Chunk> = chunks.iter().filter(|(s, _)| *s == b).map(|(_, c)| c).collect();
                match parts.len() {
                    0 => {}
                    1 => write_final(&mut out, hk, parts[0]),
                    _ => merge_chunks(&mut out, hk, &parts),
                }
            }
            out
        })
        .collect()
}

fn mla_tensors(w: &MlaWorkload, outs: Vec<RankOut>, hk: usize) -> Vec<OutTensor> {
    let h = w.heads();
    let mut t = Vec::new();
    for (r, ro) in outs.into_iter().enumerate() {
        t.push(OutTensor {
            name: format!("o.r{r}"),
            row_len: h * MLA_D_V,
            data: PaddedHeads { real: h, kernel: hk }.strip(&ro.o, MLA_D_V),
        });
        t.push(OutTensor {
            name: format!("lse.r{r}"),
            row_len: h,
            data: PaddedHeads { real: h, kernel: hk }.strip(&ro.lse, 1),
        });
    }
    t
}

fn run_combine(c: &CombineInputs) -> Vec<OutTensor> {
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
    o.par_chunks_mut(MLA_D_V)
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(idx, (od, l))| {
            let parts: Vec<(&[f32], f32)> = (0..c.world)
                .map(|r| (&ranks[r][idx * MLA_D_V..(idx + 1) * MLA_D_V], c.lse[r * n * h + idx]))
                .collect();
            *l = attn::merge(&parts, None, od);
            od.iter_mut().for_each(|x| *x = round_bf16(*x));
        });
    vec![
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
    ]
}

/// Decoded V4 Q of one row: `[hk, 512]`.
fn v4_q(w: &V4Workload, i: usize) -> Vec<f32> {
    let mut q = vec![0f32; w.heads * V4_D];
    for h in 0..w.heads {
        let r = i * w.heads + h;
        unpack_nope(
            &w.q_packed[r * V4_D..(r + 1) * V4_D],
            &mut q[h * V4_D..h * V4_D + V4_D_NOPE],
        );
        for d in 0..V4_D_ROPE {
            q[h * V4_D + V4_D_NOPE + d] = bf16_from_bits(w.q_rope[r * V4_D_ROPE + d]);
        }
    }
    q
}

/// Decoded KV rows of entries `a..b` of row `i`'s list: `[b-a, 512]`.
fn v4_kv(w: &V4Workload, i: usize, a: usize, b: usize) -> Vec<f32> {
    let list = w.row_list(i);
    let mut k = vec![0f32; (b - a) * V4_D];
    for (t, &row) in list[a..b].iter().enumerate() {
        let row = row as usize;
        unpack_nope(
            &w.pool_packed[row * V4_D..(row + 1) * V4_D],
            &mut k[t * V4_D..t * V4_D + V4_D_NOPE],
        );
        for d in 0..V4_D_ROPE {
            k[t * V4_D + V4_D_NOPE + d] = bf16_from_bits(w.pool_rope[row * V4_D_ROPE + d]);
        }
    }
    k
}

/// (o `[hk, 512]`, lse `[hk]`) of row `i` over list entries `a..b`, no sink.
fn v4_piece(w: &V4Workload, i: usize, a: usize, b: usize) -> (Vec<f32>, Vec<f32>) {
    let q = v4_q(w, i);
    let k = v4_kv(w, i, a, b);
    let mut o = vec![0f32; w.heads * V4_D];
    let mut lse = vec![0f32; w.heads];
    attn::attend(
        &q,
        w.heads,
        V4_D,
        &k,
        b - a,
        V4_D,
        &vec![b - a; w.heads],
        w.p.sm_scale as f32,
        1.0,
        &mut o,
        &mut lse,
    );
    (o, lse)
}

/// Merges a row's pieces with the sink and writes bf16-rounded outputs.
fn v4_finish(w: &V4Workload, pieces: &[(Vec<f32>, Vec<f32>)], o: &mut [f32], lse: &mut [f32]) {
    let mut buf = vec![0f32; V4_D];
    for h in 0..w.heads {
        let parts: Vec<(&[f32], f32)> = pieces
            .iter()
            .map(|(po, pl)| (&po[h * V4_D..(h + 1) * V4_D], pl[h]))
            .collect();
        lse[h] = attn::merge(&parts, Some(w.sink[h]), &mut buf);
        for (x, y) in o[h * V4_D..(h + 1) * V4_D].iter_mut().zip(&buf) {
            *x = round_bf16(*y);
        }
    }
}

fn v4_tensors(w: &V4Workload, o: Vec<f32>, lse: Vec<f32>) -> Vec<OutTensor> {
    let h = w.p.heads;
    vec![
        OutTensor {
            name: "o".into(),
            row_len: h * V4_D,
            data: PaddedHeads {
                real: h,
                kernel: w.heads,
            }
            .strip(&o, V4_D),
        },
        OutTensor {
            name: "lse".into(),
            row_len: h,
            data: PaddedHeads {
                real: h,
                kernel: w.heads,
            }
            .strip(&lse, 1),
        },
    ]
}

/// Rows of a V4 run: each row's pieces (list ranges) merged with the sink;
/// rows not in `rows` stay poisoned, as a kernel leaves rows it skips.
fn run_v4_rows(
    w: &V4Workload,
    rows: &[usize],
    pieces_of: impl Fn(usize) -> Vec<(usize, usize)> + Sync,
) -> Vec<OutTensor> {
    let hk = w.heads;
    let mut o = poison(w.t * hk * V4_D);
    let mut lse = poison(w.t * hk);
    let done: Vec<(usize, Vec<f32>, Vec<f32>)> = rows
        .par_iter()
        .map(|&i| {
            let pieces: Vec<_> = pieces_of(i).into_iter().map(|(a, b)| v4_piece(w, i, a, b)).collect();
            let (mut ro, mut rl) = (vec![0f32; hk * V4_D], vec![0f32; hk]);
            v4_finish(w, &pieces, &mut ro, &mut rl);
            (i, ro, rl)
        })
        .collect();
    for (i, ro, rl) in done {
        o[i * hk * V4_D..(i + 1) * hk * V4_D].copy_from_slice(&ro);
        lse[i * hk..(i + 1) * hk].copy_from_slice(&rl);
    }
    v4_tensors(w, o, lse)
}

fn run_v4_split(w: &V4Workload, n: usize, rows: &[usize]) -> Vec<OutTensor> {
    run_v4_rows(w, rows, |i| split_ranges(w.row_len(i), n))
}

fn run_hca(w: &V4Workload, plan: &crate::plan::v4::HcaPlan, rows: &[usize]) -> Vec<OutTensor> {
    // Rows of length 0 are left unwritten; every other row merges one piece
    // per partition it touches, as the last finisher does.
    let live: Vec<usize> = rows.iter().copied().filter(|&i| w.row_len(i) > 0).collect();
    run_v4_rows(w, &live, |i| {
        plan.pieces
            .iter()
            .filter(|pc| pc.row == i)
            .map(|pc| (pc.start, pc.end))
            .collect()
    })
}

/// Appends `suffix` to tensor names (`o` -> `o.step1`).
fn rename(mut ts: Vec<OutTensor>, suffix: &str) -> Vec<OutTensor> {
    for t in &mut ts {
        t.name.push_str(suffix);
    }
    ts
}

/// Runs the workload and each of its replay steps (same plan, new lists).
fn with_steps(
    w: &V4Workload,
    mut f: impl FnMut(&V4Workload, &str) -> Result<Vec<OutTensor>, BackendError>,
) -> Result<Vec<OutTensor>, BackendError> {
    let mut out = f(w, "")?;
    for (s, ws) in w.steps.iter().enumerate() {
        out.extend(f(ws, &format!(".step{}", s + 1))?);
    }
    Ok(out)
}

fn run_split_merge(s: &SplitMergeInputs, t: usize) -> Vec<OutTensor> {
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
            lse[i * h + hh] = attn::merge(&parts, Some(s.sink[hh]), &mut buf);
            for (x, y) in o[(i * h + hh) * V4_D..(i * h + hh + 1) * V4_D].iter_mut().zip(&buf) {
                *x = round_bf16(*y);
            }
        }
    }
    vec![
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
    ]
}

impl Backend for CpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn run(&mut self, req: &RunRequest) -> Result<RunOutput, BackendError> {
        let t0 = Instant::now();
        let tensors = match (req.workload, req.plan) {
            (Workload::Mla(w), VariantPlan::Ps1 { kernel_heads, ranks }) => {
                mla_tensors(w, run_ps1(w, ranks, *kernel_heads, req.rows), *kernel_heads)
            }
            (Workload::Mla(w), VariantPlan::Page64 { kernel_heads, splits }) => {
                mla_tensors(w, run_page64(w, splits, *kernel_heads, req.rows), *kernel_heads)
            }
            (Workload::Mla(_), VariantPlan::DcpCombine(c)) => run_combine(c),
            (Workload::V4(w), VariantPlan::V4Split(s)) => {
                // A graph launch covers all T rows (pad rows get o = 0, lse = sink);
                // an eager one only the N real rows.
                let mut rows = req.rows.to_vec();
                if !req.case.v4.eager {
                    rows.extend(w.p.rows..w.t);
                }
                with_steps(w, |ws, suffix| Ok(rename(run_v4_split(ws, s.n, &rows), suffix)))?
            }
            (Workload::V4(w), VariantPlan::HcaPersist { partitions, plan }) => with_steps(w, |ws, suffix| {
                // The kernel plans from each call's real lengths: so does the emulation.
                let replanned;
                let plan = if suffix.is_empty() {
                    plan
                } else {
                    let lens: Vec<usize> = (0..ws.p.rows).map(|i| ws.row_len(i)).collect();
                    replanned =
                        match crate::plan::v4::hca_call_plan(&lens, *partitions, req.case.cus, ws.p.kernel_heads()) {
                            Ok(p) => p,
                            Err(e) => return Err(BackendError::Failed(format!("hca plan of a replay: {e}"))),
                        };
                    &replanned
                };
                Ok(rename(run_hca(ws, plan, req.rows), suffix))
            })?,
            (Workload::V4(w), VariantPlan::SplitMerge(s)) => run_split_merge(s, w.t),
            _ => {
                return Err(BackendError::Unsupported(
                    "plan does not match the workload family".into(),
                ))
            }
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let samples = req.timing.enabled.then(|| Samples {
            kernel_ms: vec![ms],
            variant_ms: vec![ms],
            clock: "cpu-wall".into(),
        });
        Ok(RunOutput {
            tensors,
            samples,
            notes: vec![],
        })
    }
}
