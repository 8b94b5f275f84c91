//! The CPU emulation of an MLA decode kernel's pieces: Q and KV decoded
//! from the bytes a kernel reads, a chunk's attention in f32, a chunk
//! written as final output or merged with its sequence's other chunks.

use crate::case::{MLA_D_QK, MLA_D_V};
use crate::variants::emulate::{attn, Emulation, Fault};
use crate::variants::heads::PaddedHeads;
use crate::variants::OutTensor;
use crate::workload::codec::{bf16_from_bits, e4m3_table, round_bf16};
use crate::workload::{Elems, MlaShard, MlaWorkload};

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
pub fn mla_q(w: &MlaWorkload, q_start: usize, q_end: usize, hk: usize) -> Vec<f32> {
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
pub fn mla_kv(sh: &MlaShard, ps: usize, seq: usize, a: usize, b: usize) -> Vec<f32> {
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
pub struct Chunk {
    pub q_start: usize,
    pub q_end: usize,
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

/// Query rows `q` of sequence `seq` over its local tokens `kv`: one work
/// item or split.
pub struct Span {
    pub seq: usize,
    pub q: (usize, usize),
    pub kv: (usize, usize),
}

/// Attention of a span, with each row's visible prefix given in local tokens.
pub fn mla_chunk(
    w: &MlaWorkload,
    sh: &MlaShard,
    span: Span,
    hk: usize,
    vis_end: &dyn Fn(usize) -> usize,
    emu: &Emulation,
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
    if emu.has(Fault::LogitScale) {
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

/// Final per-rank outputs `[total_q, hk, 512]` (bf16-rounded) and `[total_q, hk]`.
pub struct RankOut {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

pub fn write_final(out: &mut RankOut, hk: usize, c: &Chunk) {
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
pub fn merge_chunks(out: &mut RankOut, hk: usize, parts: &[&Chunk], emu: &Emulation) {
    let c0 = parts[0];
    let mut buf = vec![0f32; MLA_D_V];
    for (k, i) in (c0.q_start..c0.q_end).enumerate() {
        for h in 0..hk {
            let idx = k * hk + h;
            let ps: Vec<(&[f32], f32)> = parts
                .iter()
                .map(|c| (&c.o[idx * MLA_D_V..(idx + 1) * MLA_D_V], c.lse[idx]))
                .collect();
            let g = attn::merge(&ps, None, &mut buf, emu.has(Fault::MergeKeepsEmpty));
            let d = (i * hk + h) * MLA_D_V;
            for (x, y) in out.o[d..d + MLA_D_V].iter_mut().zip(&buf) {
                *x = round_bf16(*y);
            }
            out.lse[i * hk + h] = g;
        }
    }
}

pub fn mla_tensors(w: &MlaWorkload, outs: Vec<RankOut>, hk: usize) -> Vec<OutTensor> {
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
