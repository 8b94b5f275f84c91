//! A DCP rank's device buffers, as every MLA decode kernel reads them
//! (kernels/ABI.md): Q padded to the kernel's heads, the rank's paged pool
//! and page table, the sequence and global offsets, and `o` / `lse`
//! poisoned before every launch.

use crate::case::{MlaParams, MLA_D_QK, MLA_D_V};
use crate::variants::heads::PaddedHeads;
use crate::variants::program::{Arg, BufId, Elem, Fill, Output, Program, RankIo};
use crate::workload::MlaWorkload;

/// `(W, r, S)`: where rank `r`'s tokens sit in the global sequence, which a
/// kernel masking on global positions (ps1) takes after its scales.
pub fn rank_args(p: &MlaParams, r: usize) -> [Arg; 3] {
    [
        Arg::I32(p.dcp.world as i32),
        Arg::I32(r as i32),
        Arg::I32(p.dcp.interleave as i32),
    ]
}

/// The buffers of rank `r` every MLA decode program starts with.
pub struct Rank {
    pub q: BufId,
    pub kv: BufId,
    pub kv_indptr: BufId,
    pub kv_indices: BufId,
    pub last_page: BufId,
    pub qo_indptr: BufId,
    pub g_kv_indptr: BufId,
    pub o: BufId,
    pub lse: BufId,
}

impl Rank {
    /// Adds rank `r`'s inputs and outputs to `p`, with `hk` kernel heads;
    /// only rank 0's program is timed.
    pub fn add<'a>(p: &mut Program<'a>, w: &'a MlaWorkload, r: usize, hk: usize) -> Rank {
        let heads = PaddedHeads {
            real: w.heads(),
            kernel: hk,
        };
        let sh = &w.shards[r];
        let n = w.p.total_q();
        let eb = w.q.elem_bytes();
        p.timed = r == 0;
        let rank = Rank {
            q: p.upload_owned("q", heads.pad(w.q.as_bytes(), MLA_D_QK * eb, 0u8)),
            kv: p.upload("kv pool", sh.pool.as_bytes()),
            kv_indptr: p.upload("kv_indptr", &sh.kv_indptr),
            kv_indices: p.upload("kv_indices", &sh.kv_indices),
            last_page: p.upload("kv_last_page_len", &sh.kv_last_page_len),
            qo_indptr: p.upload("qo_indptr", &w.qo_indptr),
            g_kv_indptr: p.upload("g_kv_indptr", &w.g_kv_indptr),
            o: p.poisoned("o", n * hk * MLA_D_V * 2, Fill::Bf16),
            lse: p.poisoned("lse", n * hk * 4, Fill::F32),
        };
        p.rank_io = Some(RankIo {
            rank: r,
            q: rank.q,
            o: rank.o,
            lse: rank.lse,
        });
        p.outputs.push(Output {
            name: format!("o.r{r}"),
            buf: rank.o,
            elem: Elem::Bf16,
            heads,
            inner: MLA_D_V,
            scatter: None,
        });
        p.outputs.push(Output {
            name: format!("lse.r{r}"),
            buf: rank.lse,
            elem: Elem::F32,
            heads,
            inner: 1,
            scatter: None,
        });
        rank
    }
}
