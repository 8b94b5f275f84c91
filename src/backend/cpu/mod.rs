//! Executes each variant's plan in f32 on the host, from the same quantized
//! bytes a kernel reads: work items, splits, merges, head padding and
//! stripping. Verifies planners and merges without a GPU.

mod attn;
pub mod fault;

pub use fault::Fault;

use rayon::prelude::*;
use std::time::Instant;

use super::{Backend, BackendError, DeviceCheck, DeviceInfo, OutTensor, RunOutput, RunRequest, Samples};
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
    fault: Option<Fault>,
}

impl CpuBackend {
    /// The emulation with a planted bug (`mlabench selftest --backend cpu`).
    pub fn with_fault(fault: Fault) -> Self {
        let mut b = Self::new();
        b.info.name.push_str(&format!(", planted fault {fault}"));
        b.fault = Some(fault);
        b
    }

    pub fn new() -> Self {
        CpuBackend {
            fault: None,
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

/// Query rows `q` of sequence `seq` over its local tokens `kv`: one work
/// item or split.
struct Span {
    seq: usize,
    q: (usize, usize),
    kv: (usize, usize),
}

/// Attention of a span, with each row's visible prefix given in local tokens.
fn mla_chunk(
    w: &MlaWorkload,
    sh: &MlaShard,
    span: Span,
    hk: usize,
    vis_end: &dyn Fn(usize) -> usize,
    f: Option<Fault>,
) -> Chunk {
    let Span {
        seq,
        q: (q_start, q_end),
        kv: (a, b),
    } = span;
    let q = mla_q(w, q_start, q_end, hk);
    let k = mla_kv(sh, w.p.page_size, seq, a, b);
    let m = (q_end - q_start) * hk;
    let vis: Vec<usize> = (q_start..q_end)
        .flat_map(|i| std::iter::repeat(vis_end(i).clamp(a, b) - a).take(hk))
        .collect();
    let mut o = vec![0f32; m * MLA_D_V];
    let mut lse = vec![0f32; m];
    let mut scale = (w.p.sm_scale as f32) * w.q_scale * w.kv_scale;
    if f == Some(Fault::LogitScale) {
        scale *= 1.01;
    }
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
fn merge_chunks(out: &mut RankOut, hk: usize, parts: &[&Chunk], f: Option<Fault>) {
    let c0 = parts[0];
    let mut buf = vec![0f32; MLA_D_V];
    for (k, i) in (c0.q_start..c0.q_end).enumerate() {
        for h in 0..hk {
            let idx = k * hk + h;
            let ps: Vec<(&[f32], f32)> = parts
                .iter()
                .map(|c| (&c.o[idx * MLA_D_V..(idx + 1) * MLA_D_V], c.lse[idx]))
                .collect();
            let g = attn::merge(&ps, None, &mut buf, f == Some(Fault::MergeKeepsEmpty));
            let d = (i * hk + h) * MLA_D_V;
            for (x, y) in out.o[d..d + MLA_D_V].iter_mut().zip(&buf) {
                *x = round_bf16(*y);
            }
            out.lse[i * hk + h] = g;
        }
    }
}

fn run_ps1(
    w: &MlaWorkload,
    ranks: &[crate::plan::worklist::WorkList],
    hk: usize,
    rows: &[usize],
    f: Option<Fault>,
) -> Vec<RankOut> {
    let p = &w.p;
    ranks
        .iter()
        .enumerate()
        .map(|(r, wl)| {
            let sh = &w.shards[r];
            let vis_end = |i: usize| {
                let b = i / p.s_q;
                if f == Some(Fault::Ps1LocalMask) {
                    return (sh.local_lens[b] + i % p.s_q + 1).saturating_sub(p.s_q);
                }
                crate::variants::mla_visible(p, r, b, i % p.s_q)
            };
            let chunks: Vec<(i32, Chunk)> = wl
                .items
                .par_iter()
                .filter(|it| wanted(rows, it.q_start as usize, it.q_end as usize))
                .map(|it| {
                    let len = sh.local_lens[it.seq as usize];
                    let mut kv_end = it.kv_end as usize;
                    if f == Some(Fault::Ps1ItemOverlap) && kv_end < len {
                        kv_end += 1;
                    }
                    let span = Span {
                        seq: it.seq as usize,
                        q: (it.q_start as usize, it.q_end as usize),
                        kv: (it.kv_start as usize, kv_end),
                    };
                    let c = mla_chunk(w, sh, span, hk, &vis_end, f);
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
                    merge_chunks(&mut out, hk, &parts, f);
                }
            }
            out
        })
        .collect()
}

fn run_page64(w: &MlaWorkload, splits: &[usize], hk: usize, rows: &[usize], f: Option<Fault>) -> Vec<RankOut> {
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
                    let len = sh.local_lens[b];
                    page64_split_ranges(len, n_split).into_iter().map(move |(a, e)| {
                        let e = if f == Some(Fault::Page64SplitOverlap) && a < e && e < len {
                            e + 1
                        } else {
                            e
                        };
                        (b, a, e, 0)
                    })
                })
                .collect();
            let chunks: Vec<(usize, Chunk)> = tasks
                .par_iter()
                .map(|&(b, a, e, _)| {
                    (
                        b,
                        mla_chunk(
                            w,
                            sh,
                            Span {
                                seq: b,
                                q: (b * p.s_q, (b + 1) * p.s_q),
                                kv: (a, e),
                            },
                            hk,
                            &vis_end,
                            f,
                        ),
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
                    _ => merge_chunks(&mut out, hk, &parts, f),
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

fn run_combine(c: &CombineInputs, f: Option<Fault>) -> Vec<OutTensor> {
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
            *l = attn::merge(&parts, None, od, f == Some(Fault::MergeKeepsEmpty));
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
fn v4_finish(w: &V4Workload, pieces: &[(Vec<f32>, Vec<f32>)], o: &mut [f32], lse: &mut [f32], f: Option<Fault>) {
    let mut buf = vec![0f32; V4_D];
    for h in 0..w.heads {
        let parts: Vec<(&[f32], f32)> = pieces
            .iter()
            .map(|(po, pl)| (&po[h * V4_D..(h + 1) * V4_D], pl[h]))
            .collect();
        lse[h] = sink_merge(&parts, w.sink[h], &mut buf, f);
        for (x, y) in o[h * V4_D..(h + 1) * V4_D].iter_mut().zip(&buf) {
            *x = round_bf16(*y);
        }
    }
}

/// The V4 merge of split pieces with the sink (split_merge's job).
fn sink_merge(parts: &[(&[f32], f32)], sink: f32, out: &mut [f32], f: Option<Fault>) -> f32 {
    let g = attn::merge(parts, Some(sink), out, f == Some(Fault::MergeKeepsEmpty));
    if f != Some(Fault::SinkTwice) {
        return g;
    }
    let once = out.to_vec();
    attn::merge(&[(&once, g)], Some(sink), out, false)
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
    f: Option<Fault>,
) -> Vec<OutTensor> {
    let hk = w.heads;
    let mut o = poison(w.t * hk * V4_D);
    let mut lse = poison(w.t * hk);
    let done: Vec<(usize, Vec<f32>, Vec<f32>)> = rows
        .par_iter()
        .map(|&i| {
            let pieces: Vec<_> = pieces_of(i).into_iter().map(|(a, b)| v4_piece(w, i, a, b)).collect();
            let (mut ro, mut rl) = (vec![0f32; hk * V4_D], vec![0f32; hk]);
            v4_finish(w, &pieces, &mut ro, &mut rl, f);
            (i, ro, rl)
        })
        .collect();
    for (i, ro, rl) in done {
        o[i * hk * V4_D..(i + 1) * hk * V4_D].copy_from_slice(&ro);
        lse[i * hk..(i + 1) * hk].copy_from_slice(&rl);
    }
    v4_tensors(w, o, lse)
}

fn run_v4_split(w: &V4Workload, n: usize, rows: &[usize], f: Option<Fault>) -> Vec<OutTensor> {
    let pieces = |i: usize| {
        let len = w.row_len(i);
        let mut r = split_ranges(len, n);
        if f == Some(Fault::V4SplitFloor) {
            for (s, p) in r.iter_mut().enumerate() {
                p.1 = (len * (s + 1) / n).max(p.0);
            }
        }
        r
    };
    run_v4_rows(w, rows, pieces, f)
}

/// hca_persist on the host, with its row counters: a split row's pieces
/// count up, and only the launch whose count started at zero merges the
/// row (the last finisher sees its own count); it then resets the counter.
/// A row that is not merged stays unwritten, as on the device.
fn run_hca(
    w: &V4Workload,
    plan: &crate::plan::v4::HcaPlan,
    rows: &[usize],
    counters: &mut Vec<usize>,
    f: Option<Fault>,
) -> Vec<OutTensor> {
    counters.resize(counters.len().max(w.t), 0);
    let mut merged = vec![true; w.t];
    for (i, &pieces) in plan.row_pieces.iter().enumerate() {
        if pieces > 1 {
            merged[i] = counters[i] == 0;
            counters[i] += pieces;
            if merged[i] && f != Some(Fault::HcaNoReset) {
                counters[i] -= pieces;
            }
        }
    }
    // Rows of length 0 are left unwritten; every other row merges one piece
    // per partition it touches, as the last finisher does.
    let live: Vec<usize> = rows
        .iter()
        .copied()
        .filter(|&i| w.row_len(i) > 0 && merged[i])
        .collect();
    let pieces = |i: usize| {
        plan.pieces
            .iter()
            .filter(|pc| pc.row == i)
            .map(|pc| (pc.start, pc.end))
            .collect()
    };
    run_v4_rows(w, &live, pieces, f)
}

/// Whether the emulated counters are back at zero after a launch; clears them.
fn counters_at_rest(counters: &mut [usize], name: String) -> DeviceCheck {
    let left = counters.iter().filter(|&&c| c != 0).count();
    counters.fill(0);
    DeviceCheck {
        name,
        pass: left == 0,
        why: if left == 0 {
            String::new()
        } else {
            format!("{left} row counters non-zero after the launch; the last finisher must reset them (cleared for the next launch)")
        },
    }
}

/// Appends `suffix` to tensor names (`o` -> `o.step1`).
fn rename(mut ts: Vec<OutTensor>, suffix: &str) -> Vec<OutTensor> {
    for t in &mut ts {
        t.name.push_str(suffix);
    }
    ts
}

/// Runs the workload and its first `steps` replay steps (same plan, new lists).
fn with_steps(
    w: &V4Workload,
    steps: usize,
    mut f: impl FnMut(&V4Workload, &str) -> Result<Vec<OutTensor>, BackendError>,
) -> Result<Vec<OutTensor>, BackendError> {
    let mut out = f(w, "")?;
    for (s, ws) in w.steps.iter().take(steps).enumerate() {
        out.extend(f(ws, &format!(".step{}", s + 1))?);
    }
    Ok(out)
}

fn run_split_merge(s: &SplitMergeInputs, t: usize, f: Option<Fault>) -> Vec<OutTensor> {
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
            lse[i * h + hh] = sink_merge(&parts, s.sink[hh], &mut buf, f);
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
        let mut emu = Emulation {
            fault: self.fault,
            counters: Vec::new(),
            checks: Vec::new(),
        };
        let t0 = Instant::now();
        let tensors = emu.launch(req, 1)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut repeats = Vec::new();
        for k in 2..=req.repeats.max(1) {
            let mut again = emu.launch(req, k)?;
            if self.fault == Some(Fault::Race) {
                flip_last_bit(&mut again);
            }
            repeats.push(again);
        }
        // One wall-clock sample of the emulation: labelled `cpu-wall`, it
        // says nothing about a GPU and is never judged against a baseline.
        let samples = req.timing.enabled.then(|| Samples {
            kernel_ms: vec![ms],
            variant_ms: vec![ms],
            clock: "cpu-wall".into(),
        });
        Ok(RunOutput {
            tensors,
            repeats,
            device_checks: emu.checks,
            samples,
            notes: vec![],
        })
    }
}

/// The planted race: the last bit of the first written element of the
/// first tensor.
fn flip_last_bit(ts: &mut [OutTensor]) {
    if let Some(x) = ts
        .first_mut()
        .and_then(|t| t.data.iter_mut().find(|x| x.to_bits() != POISON_BITS))
    {
        *x = f32::from_bits(x.to_bits() ^ 1);
    }
}

/// One case's emulated device state across its launches.
struct Emulation {
    fault: Option<Fault>,
    /// hca_persist's row counters (the workspace lives for the whole case).
    counters: Vec<usize>,
    checks: Vec<DeviceCheck>,
}

impl Emulation {
    /// Checked launch `k` (1-based) of the plan in f32 on the host, with its
    /// replay steps on the first.
    fn launch(&mut self, req: &RunRequest, k: usize) -> Result<Vec<OutTensor>, BackendError> {
        let f = self.fault;
        Ok(match (req.workload, req.plan) {
            (Workload::Mla(w), VariantPlan::Ps1 { kernel_heads, ranks }) => {
                mla_tensors(w, run_ps1(w, ranks, *kernel_heads, req.rows, f), *kernel_heads)
            }
            (Workload::Mla(w), VariantPlan::Page64 { kernel_heads, splits }) => {
                mla_tensors(w, run_page64(w, splits, *kernel_heads, req.rows, f), *kernel_heads)
            }
            (Workload::Mla(_), VariantPlan::DcpCombine(c)) => run_combine(c, f),
            (Workload::V4(w), VariantPlan::V4Split(s)) => {
                // A graph launch covers all T rows (pad rows get o = 0, lse = sink);
                // an eager one only the N real rows.
                let mut rows = req.rows.to_vec();
                if !req.case.v4.eager {
                    rows.extend(w.p.rows..w.t);
                }
                let steps = if k == 1 { w.steps.len() } else { 0 };
                with_steps(w, steps, |ws, suffix| {
                    Ok(rename(run_v4_split(ws, s.n, &rows, f), suffix))
                })?
            }
            (Workload::V4(w), VariantPlan::HcaPersist { partitions, plan }) => {
                let steps = if k == 1 { w.steps.len() } else { 0 };
                let (counters, checks) = (&mut self.counters, &mut self.checks);
                with_steps(w, steps, |ws, suffix| {
                    // The kernel plans from each call's real lengths: so does the emulation.
                    let replanned;
                    let plan = if suffix.is_empty() {
                        plan
                    } else {
                        let lens: Vec<usize> = (0..ws.p.rows).map(|i| ws.row_len(i)).collect();
                        replanned =
                            crate::plan::v4::hca_call_plan(&lens, *partitions, req.case.cus, ws.p.kernel_heads())
                                .map_err(|e| BackendError::Failed(format!("hca plan of a replay: {e}")))?;
                        &replanned
                    };
                    let out = rename(run_hca(ws, plan, req.rows, counters, f), suffix);
                    let name = match (k, suffix) {
                        (1, "") => "counters".to_string(),
                        (_, "") => format!("counters.launch{k}"),
                        (_, s) => format!("counters{s}"),
                    };
                    checks.push(counters_at_rest(counters, name));
                    Ok(out)
                })?
            }
            (Workload::V4(w), VariantPlan::SplitMerge(s)) => run_split_merge(s, w.t, f),
            _ => {
                return Err(BackendError::Unsupported(
                    "plan does not match the workload family".into(),
                ))
            }
        })
    }
}
