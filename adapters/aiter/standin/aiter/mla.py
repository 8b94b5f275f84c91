"""Stand-in for aiter.mla: the decode entry points mlabench's adapter calls,
with aiter's argument checks and output conventions and numpy math."""
import os
import sys

import numpy as np

from . import _check, _digest, _i32, dtypes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "common"))
import mlabench_worker as mw  # noqa: E402

_V4_NOPE, _V4_DIM = 448, 512


def _f32(a):
    """A stand-in tensor's values (bf16 / fp8 decoded)."""
    if a.dtype == dtypes.bf16:
        return mw.bf16_to_f32(a.view(np.uint16))
    if a.dtype == dtypes.fp8:
        return mw.e4m3_to_f32(a.view(np.uint8))
    return np.asarray(a, dtype=np.float32)


def _store_bf16(dst, x):
    dst.view(np.uint16)[...] = mw.f32_to_bf16(np.asarray(x, dtype=np.float32))


def _attend(q, k, v, scale, sink=None):
    """q [h, d], k [n, d], v [n, dv] -> o [h, dv], lse [h] (sink in the denominator)."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    m = s.max(axis=1) if s.shape[1] else np.full(q.shape[0], -np.inf)
    if sink is not None:
        m = np.maximum(m, sink)
    safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - safe[:, None])
    z = e.sum(axis=1) + (np.exp(sink - safe) if sink is not None else 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(z > 0, safe + np.log(np.where(z > 0, z, 1)), -np.inf)
    o = (e @ v.astype(np.float64)) / np.where(z > 0, z, 1)[:, None] if k.shape[0] else np.zeros((q.shape[0], v.shape[1]))
    return o, lse


def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                   page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                   num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                   reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                   kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False,
                   g_kv_indptr=None, cp_world_size=1, cp_rank=0, causal=True):
    _check(logit_cap <= 0, "logit_cap is not supported")
    _check(q.dtype in (dtypes.bf16, dtypes.fp8) and q.dtype == kv_buffer.dtype, f"q {q.dtype} and kv {kv_buffer.dtype}: bf16 or fp8, the same")
    _check(q.ndim == 3 and q.shape[2] == 576, f"q is [total_s, nhead, 576], got {q.shape}")
    _check(kv_buffer.ndim == 4 and kv_buffer.shape[1] == page_size and kv_buffer.shape[2] == nhead_kv == 1 and kv_buffer.shape[3] == 576,
           f"kv_buffer is [pages, page_size={page_size}, 1, 576], got {kv_buffer.shape}")
    _check(o.dtype == dtypes.bf16 and o.shape == (q.shape[0], q.shape[1], 512), f"o is bf16 [total_s, nhead, 512], got {o.dtype} {o.shape}")
    for n, a in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                 ("kv_last_page_lens", kv_last_page_lens)):
        _i32(n, a)
    if work_meta_data is not None:
        _check(int(work_meta_data[0]) == _digest(qo_indptr, kv_indptr, kv_last_page_lens),
               "work_meta_data was planned for other indptrs (get_mla_metadata_v1 of this call?)")
        _check(int(work_meta_data[1]) >> 24 == page_size, "work_meta_data was planned for another page size")
    fp8 = q.dtype == dtypes.fp8
    if fp8:
        for n, s in (("q_scale", q_scale), ("kv_scale", kv_scale)):
            _check(s is not None and s.dtype == np.float32 and s.shape == (1,), f"fp8 needs a per-tensor f32 {n} [1]")
    if cp_world_size > 1:
        _check(g_kv_indptr is not None, "cp_world_size > 1 needs g_kv_indptr")
        _i32("g_kv_indptr", g_kv_indptr)
        _check(0 <= cp_rank < cp_world_size, "cp_rank")
    total_s, nhead, _ = q.shape
    scale = (sm_scale if sm_scale is not None else 576 ** -0.5)
    qs = float(q_scale[0]) if fp8 else 1.0
    ks = float(kv_scale[0]) if fp8 else 1.0
    qv = _f32(q)
    pool = _f32(kv_buffer).reshape(-1, 576)
    lse = np.full((total_s, nhead), -np.inf, dtype=np.float32)
    out = np.zeros((total_s, nhead, 512), dtype=np.float32)
    for b in range(len(qo_indptr) - 1):
        pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_lens[b])
        j = np.arange(n)
        slots = pages[j // page_size].astype(np.int64) * page_size + j % page_size
        g = j * cp_world_size + cp_rank if cp_world_size > 1 else j
        glen = int(g_kv_indptr[b + 1] - g_kv_indptr[b]) if cp_world_size > 1 else n
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        for i in range(q1 - q0):
            keep = g <= glen - (q1 - q0) + i if causal else np.ones(n, bool)
            kv = pool[slots[keep]]
            ob, lb = _attend(qv[q0 + i], kv, kv[:, :512], scale * qs * ks)
            out[q0 + i] = ob * ks
            lse[q0 + i] = lb
    _store_bf16(o, out)
    return o, (lse if return_lse else None)


def _v4_rows(packed, rope):
    """[..., 512] fp8 (448 nope, scales at 448..462 twice) + [..., 64] bf16 -> [..., 512] f32."""
    p = packed.view(np.uint8)
    lead = p.shape[:-1]
    nope = mw.e4m3_to_f32(p[..., :_V4_NOPE]).reshape(*lead, 7, 64)
    sc = np.exp2(p[..., _V4_NOPE:_V4_NOPE + 14:2].astype(np.float64) - 127.0)
    return np.concatenate([(nope * sc[..., None]).reshape(*lead, _V4_NOPE), _f32(rope)], axis=-1)


def _check_v4(q, qrope, kv, kvrope, sink, heads=None):
    _check(q.dtype == dtypes.fp8 and q.ndim == 3 and q.shape[2] == 512, f"q is fp8 [total_q, H, 512], got {q.dtype} {q.shape}")
    _check(qrope.dtype == dtypes.bf16 and qrope.shape == q.shape[:2] + (64,), "q_rope is bf16 [total_q, H, 64]")
    _check(kv.dtype == dtypes.fp8 and kv.shape[-1] == 512, "the KV pool is fp8 rows of 512 bytes")
    _check(kvrope.dtype == dtypes.bf16 and kvrope.shape[-1] == 64, "the KV rope is bf16 rows of 64")
    _check(sink.dtype == dtypes.fp32 and sink.flags["C_CONTIGUOUS"] and sink.size == q.shape[1],
           f"`sink` must be contiguous FP32 with num_heads={q.shape[1]} values")
    if heads is not None:
        _check(q.shape[1] == heads, f"needs {heads} heads, got {q.shape[1]}")


def mla_decode_fwd_v4_nm(q, qrope, kv_buffer, kvrope, output, qo_indptr, kv_indptr, kv_page_indices,
                         max_seqlen_q, *, sink, split_indptr=None, sm_scale=None, out_16_nosplit=0,
                         num_kv_splits=None, logits=None, attn_lse=None, kv_last_page_lens=None):
    _check_v4(q, qrope, kv_buffer, kvrope, sink)
    _check(kv_buffer.ndim == 4 and kv_buffer.shape[1:3] == (1, 1), "kv_buffer is [P, 1, 1, 512] (page size 1)")
    _check(output.dtype == dtypes.bf16 and output.shape == q.shape[:2] + (512,), "output is bf16 [total_q, H, 512]")
    _check(max_seqlen_q == 1, "the stand-in models decode rows (max_seqlen_q 1)")
    for n, a in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_page_indices", kv_page_indices)):
        _i32(n, a)
    n_seq = len(qo_indptr) - 1
    ns = int(num_kv_splits or 1)
    if split_indptr is not None:
        _i32("split_indptr", split_indptr)
        _check(len(split_indptr) == n_seq + 1 and bool(np.all(np.diff(split_indptr) == ns)),
               f"split_indptr must give every row num_kv_splits={ns} splits")
    h = q.shape[1]
    scale = 512 ** -0.5  # the kernel fixes it; sm_scale is ignored
    qv, pool = _v4_rows(q, qrope), _v4_rows(kv_buffer.reshape(-1, 512), kvrope.reshape(-1, 64))
    sink64 = sink.astype(np.float64)
    part_o = np.zeros((q.shape[0], ns, h, 512), dtype=np.float32)
    part_l = np.full((q.shape[0], ns, h, 1), -np.inf, dtype=np.float32)
    final = np.zeros((q.shape[0], h, 512))
    for i in range(n_seq):
        lst = kv_page_indices[kv_indptr[i]:kv_indptr[i + 1]]
        step = -(-len(lst) // ns) if len(lst) else 0
        parts = []
        for s in range(ns):
            piece = lst[s * step:(s + 1) * step] if step else lst[:0]
            k = pool[piece]
            # The sink joins the last split's denominator, so the standard
            # LSE merge counts it once.
            o_s, l_s = _attend(qv[i], k, k, scale, sink64 if s == ns - 1 else None)
            part_o[i, s], part_l[i, s, :, 0] = o_s, l_s
            parts.append((o_s, l_s))
        ls = np.stack([p[1] for p in parts])
        m = ls.max(axis=0)
        safe = np.where(np.isfinite(m), m, 0.0)
        w = np.exp(ls - safe)
        z = w.sum(axis=0)
        final[i] = sum(w[s][:, None] * parts[s][0] for s in range(ns)) / np.where(z > 0, z, 1)[:, None]
    _store_bf16(output, final)
    if ns == 1:
        return output.reshape(q.shape[0], 1, h, 512), part_l
    return part_o, part_l


def get_mla_v4_nm_ps_workspace(device, num_partitions=128):
    _check(1 <= num_partitions <= 1024, "num_partitions")
    return {"partitions": num_partitions, "counters": np.zeros(2 * 65536, dtype=np.int32)}


def mla_decode_fwd_v4_nm_ps(q_packed, q_rope, unified_kv, unified_kv_rope, kv_indptr, kv_indices, attn_sink,
                            workspace, out=None):
    _check_v4(q_packed, q_rope, unified_kv, unified_kv_rope, attn_sink, heads=128)
    _check(unified_kv.ndim == 2 and unified_kv_rope.ndim == 2, "row-dense pools: unified_kv [P, 512], unified_kv_rope [P, 64]")
    n = q_packed.shape[0]
    _check(n <= 32768, "at most 32768 rows")
    _i32("kv_indptr", kv_indptr)
    _i32("kv_indices", kv_indices)
    _check(len(kv_indptr) >= n + 1, "kv_indptr holds N + 1 entries")
    _check(isinstance(workspace, dict) and bool(np.all(workspace["counters"] == 0)), "a workspace from get_mla_v4_nm_ps_workspace, counters at rest")
    _check(out is not None and out.dtype == dtypes.bf16 and out.shape == (n, 128, 512), "out is bf16 [N, 128, 512]")
    qv, pool = _v4_rows(q_packed, q_rope), _v4_rows(unified_kv, unified_kv_rope)
    sink = attn_sink.astype(np.float64)
    for i in range(n):
        lst = kv_indices[kv_indptr[i]:kv_indptr[i + 1]]
        if len(lst) == 0:
            continue  # rows with K = 0 are left unwritten, as the kernel leaves them
        k = pool[lst]
        o_i, _ = _attend(qv[i], k, k, 512 ** -0.5, sink)
        _store_bf16(out[i], o_i)
    return out
