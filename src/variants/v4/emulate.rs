//! The CPU emulation of a V4 row: Q and KV rows decoded from the native FP8
//! bytes, a piece of a row's list attended in f32, the pieces merged with
//! the sink, and the replay steps of a captured graph.

use rayon::prelude::*;

use crate::case::{V4_D, V4_D_NOPE, V4_D_ROPE};
use crate::variants::emulate::{attn, poison, Emulation, Fault};
use crate::variants::heads::PaddedHeads;
use crate::variants::OutTensor;
use crate::workload::codec::{bf16_from_bits, round_bf16};
use crate::workload::v4::unpack_nope;
use crate::workload::V4Workload;

/// Decoded V4 Q of one row: `[hk, 512]`.
pub fn v4_q(w: &V4Workload, i: usize) -> Vec<f32> {
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
pub fn v4_kv(w: &V4Workload, i: usize, a: usize, b: usize) -> Vec<f32> {
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
pub fn v4_piece(w: &V4Workload, i: usize, a: usize, b: usize) -> (Vec<f32>, Vec<f32>) {
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
pub fn v4_finish(w: &V4Workload, pieces: &[(Vec<f32>, Vec<f32>)], o: &mut [f32], lse: &mut [f32], emu: &Emulation) {
    let mut buf = vec![0f32; V4_D];
    for h in 0..w.heads {
        let parts: Vec<(&[f32], f32)> = pieces
            .iter()
            .map(|(po, pl)| (&po[h * V4_D..(h + 1) * V4_D], pl[h]))
            .collect();
        lse[h] = sink_merge(&parts, w.sink[h], &mut buf, emu);
        for (x, y) in o[h * V4_D..(h + 1) * V4_D].iter_mut().zip(&buf) {
            *x = round_bf16(*y);
        }
    }
}

/// The V4 merge of split pieces with the sink (split_merge's job).
pub fn sink_merge(parts: &[(&[f32], f32)], sink: f32, out: &mut [f32], emu: &Emulation) -> f32 {
    let g = attn::merge(parts, Some(sink), out, emu.has(Fault::MergeKeepsEmpty));
    if !emu.has(Fault::SinkTwice) {
        return g;
    }
    let once = out.to_vec();
    attn::merge(&[(&once, g)], Some(sink), out, false)
}

pub fn v4_tensors(w: &V4Workload, o: Vec<f32>, lse: Vec<f32>) -> Vec<OutTensor> {
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
pub fn run_v4_rows(
    w: &V4Workload,
    rows: &[usize],
    pieces_of: impl Fn(usize) -> Vec<(usize, usize)> + Sync,
    emu: &Emulation,
) -> Vec<OutTensor> {
    let hk = w.heads;
    let mut o = poison(w.t * hk * V4_D);
    let mut lse = poison(w.t * hk);
    let done: Vec<(usize, Vec<f32>, Vec<f32>)> = rows
        .par_iter()
        .map(|&i| {
            let pieces: Vec<_> = pieces_of(i).into_iter().map(|(a, b)| v4_piece(w, i, a, b)).collect();
            let (mut ro, mut rl) = (vec![0f32; hk * V4_D], vec![0f32; hk]);
            v4_finish(w, &pieces, &mut ro, &mut rl, emu);
            (i, ro, rl)
        })
        .collect();
    for (i, ro, rl) in done {
        o[i * hk * V4_D..(i + 1) * hk * V4_D].copy_from_slice(&ro);
        lse[i * hk..(i + 1) * hk].copy_from_slice(&rl);
    }
    v4_tensors(w, o, lse)
}

/// Appends `suffix` to tensor names (`o` -> `o.step1`).
pub fn rename(mut ts: Vec<OutTensor>, suffix: &str) -> Vec<OutTensor> {
    for t in &mut ts {
        t.name.push_str(suffix);
    }
    ts
}

/// Runs the workload and its first `steps` replay steps (same plan, new lists).
pub fn with_steps(
    w: &V4Workload,
    steps: usize,
    mut f: impl FnMut(&V4Workload, &str) -> Result<Vec<OutTensor>, String>,
) -> Result<Vec<OutTensor>, String> {
    let mut out = f(w, "")?;
    for (s, ws) in w.steps.iter().take(steps).enumerate() {
        out.extend(f(ws, &format!(".step{}", s + 1))?);
    }
    Ok(out)
}
