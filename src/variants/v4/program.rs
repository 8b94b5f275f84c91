//! The device inputs every V4 kernel reads (kernels/ABI.md), sized for the
//! workload and all of its replay steps so one captured graph serves them
//! all, and the outputs `o` / `lse` over all T rows, poisoned before every
//! launch.

use std::borrow::Cow;

use crate::case::V4_D;
use crate::variants::heads::PaddedHeads;
use crate::variants::program::{Arg, BufId, Elem, Fill, Init, Output, Program, Replay};
use crate::workload::V4Workload;

pub struct Inputs {
    pub q: BufId,
    pub q_rope: BufId,
    pub pool: BufId,
    pub pool_rope: BufId,
    pub kv_indptr: BufId,
    pub kv_indices: BufId,
    pub sink: BufId,
    pub o: BufId,
    pub lse: BufId,
}

/// Bytes of a slice, to upload.
fn bytes<T: bytemuck::Pod>(v: &[T]) -> Cow<'_, [u8]> {
    Cow::Borrowed(bytemuck::cast_slice(v))
}

impl Inputs {
    /// Adds the inputs (step 0's contents, room for every step's), the
    /// outputs, and one replay per step to `p`.
    pub fn add<'a>(p: &mut Program<'a>, w: &'a V4Workload) -> Inputs {
        let all: Vec<&V4Workload> = std::iter::once(w).chain(w.steps.iter()).collect();
        let cap = |f: &dyn Fn(&V4Workload) -> usize| all.iter().map(|x| f(x)).max().unwrap_or(0).max(4);
        let input =
            |p: &mut Program<'a>, name, size: usize, data: Cow<'a, [u8]>| p.buffer(name, size, Init::Upload(data));
        let q = input(p, "q", cap(&|x| x.q_packed.len()), bytes(&w.q_packed));
        let q_rope = input(p, "q_rope", cap(&|x| x.q_rope.len() * 2), bytes(&w.q_rope));
        let pool = input(p, "unified_kv", cap(&|x| x.pool_packed.len()), bytes(&w.pool_packed));
        let pool_rope = input(
            p,
            "unified_kv_rope",
            cap(&|x| x.pool_rope.len() * 2),
            bytes(&w.pool_rope),
        );
        let kv_indptr = input(p, "kv_indptr", cap(&|x| x.kv_indptr.len() * 4), bytes(&w.kv_indptr));
        let kv_indices = input(p, "kv_indices", cap(&|x| x.kv_indices.len() * 4), bytes(&w.kv_indices));
        let sink = p.upload("attn_sink", &w.sink);
        let hk = w.heads;
        let o = p.poisoned("o", w.t * hk * V4_D * 2, Fill::Bf16);
        let lse = p.poisoned("lse", w.t * hk * 4, Fill::F32);
        let heads = PaddedHeads {
            real: w.p.heads,
            kernel: hk,
        };
        p.outputs.push(Output {
            name: "o".into(),
            buf: o,
            elem: Elem::Bf16,
            heads,
            inner: V4_D,
            scatter: None,
        });
        p.outputs.push(Output {
            name: "lse".into(),
            buf: lse,
            elem: Elem::F32,
            heads,
            inner: 1,
            scatter: None,
        });
        for (s, ws) in w.steps.iter().enumerate() {
            p.replays.push(Replay {
                uploads: vec![
                    (q, bytes(&ws.q_packed)),
                    (q_rope, bytes(&ws.q_rope)),
                    (pool, bytes(&ws.pool_packed)),
                    (pool_rope, bytes(&ws.pool_rope)),
                    (kv_indptr, bytes(&ws.kv_indptr)),
                    (kv_indices, bytes(&ws.kv_indices)),
                ],
                suffix: format!(".step{}", s + 1),
            });
        }
        p.timed = true;
        Inputs {
            q,
            q_rope,
            pool,
            pool_rope,
            kv_indptr,
            kv_indices,
            sink,
            o,
            lse,
        }
    }

    /// The arguments every V4 decode entry starts with (kernels/ABI.md):
    /// Q, its rope, the pool, its rope, `kv_indptr`, `kv_indices`.
    pub fn kv_args(&self) -> [Arg; 6] {
        [
            self.q,
            self.q_rope,
            self.pool,
            self.pool_rope,
            self.kv_indptr,
            self.kv_indices,
        ]
        .map(Arg::Buf)
    }
}
