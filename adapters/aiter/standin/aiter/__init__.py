"""A stand-in for ROCm/aiter, for testing mlabench's aiter adapter without an
AMD GPU. It implements the Python signatures the adapter calls, the argument
checks aiter makes (dtypes, shapes, metadata that belongs to the call), and
aiter's output conventions, with numpy reference math. It is not aiter: it
says nothing about aiter's kernels, only that the adapter hands them the
right layouts, dtypes and metadata and reads their outputs back right.

Signatures follow aiter at commit 000edf30368dc91e66b46544cbf86694ca048b02
(aiter/ops/attention.py, aiter/mla.py); mla_decode_fwd_v4_nm_ps and
get_mla_v4_nm_ps_workspace follow their callers in ROCm's ATOM.

Arrays are numpy; bf16 and fp8 are numpy dtypes of their own (below), so a
dtype mix-up fails here as it would in aiter.
"""
import zlib

import numpy as np

STANDIN = True
__version__ = "stand-in (signatures of 000edf3)"


class dtypes:
    bf16 = np.dtype([("bf16", "<u2")])
    fp8 = np.dtype([("e4m3fn", "u1")])
    fp32 = np.dtype(np.float32)
    i32 = np.dtype(np.int32)
    u64 = np.dtype(np.uint64)


CU_NUM = 256  # MI355X


def _check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def _i32(name, a, ndim=1):
    _check(isinstance(a, np.ndarray) and a.dtype == np.int32 and a.ndim == ndim,
           f"{name} must be a {ndim}-D int32 tensor, got {getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}")


def _digest(*arrays):
    h = 0
    for a in arrays:
        h = zlib.crc32(np.ascontiguousarray(a).tobytes(), h)
    return h


def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                             fast_mode=True, num_kv_splits=32, intra_batch_mode=False, max_split_per_batch=-1):
    _check(num_head_qo % 8 == 0, f"num_head_qo={num_head_qo} must be a multiple of 8")
    _check(q_dtype in (dtypes.bf16, dtypes.fp8) and kv_dtype in (dtypes.bf16, dtypes.fp8), "q/kv dtype")
    tiles = batch_size * max(1, -(-max_seqlen_qo * num_head_qo // 128))
    max_work = tiles * CU_NUM
    return (
        ((2,), dtypes.u64),  # work_metadata_ptrs
        ((CU_NUM + 1,), dtypes.i32),  # work_indptr
        ((max_work, 8), dtypes.i32),  # work_info_set
        ((tiles + 1,), dtypes.i32),  # reduce_indptr
        ((tiles, 2), dtypes.i32),  # reduce_final_map
        ((max_work,), dtypes.i32),  # reduce_partial_map
    )


def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                        num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                        reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                        uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                        intra_batch_mode=False, is_cp_round_robin=False, mla_version=0, dtype_q_nope=None,
                        dtype_q_rope=None, dtype_kv_nope=None, dtype_kv_rope=None, dtype_q=None, dtype_kv=None):
    for n, a in (("seqlens_qo_indptr", seqlens_qo_indptr), ("seqlens_kv_indptr", seqlens_kv_indptr),
                 ("kv_last_page_lens", kv_last_page_lens), ("work_indptr", work_indptr),
                 ("reduce_indptr", reduce_indptr), ("reduce_partial_map", reduce_partial_map)):
        _i32(n, a)
    _i32("work_info_set", work_info_set, 2)
    _i32("reduce_final_map", reduce_final_map, 2)
    _check(work_metadata_ptrs.dtype == dtypes.u64 and work_metadata_ptrs.shape == (2,), "work_metadata_ptrs")
    b = len(seqlens_qo_indptr) - 1
    _check(len(seqlens_kv_indptr) == b + 1 and len(kv_last_page_lens) == b, "one kv_indptr entry per batch + 1, one last page length per batch")
    _check(work_info_set.shape[1] == 8, "work_info_set is [max_work, 8]")
    _check(page_size in (1, 64), f"page_size {page_size}")
    _check(num_heads_k == 1, "MLA decode has one KV head")
    _check(kv_granularity % page_size == 0 or page_size == 1, "kv_granularity is a multiple of the page size")
    _check(dtype_q is not None and dtype_kv is not None, "pass dtype_q and dtype_kv")
    if uni_seqlen_qo > 0:
        q = np.diff(seqlens_qo_indptr)
        _check(bool(np.all(q == uni_seqlen_qo)), f"uni_seqlen_qo={uni_seqlen_qo} but qo lengths are {set(q.tolist())}")
    # The kernel follows these tables; the stand-in records what it was
    # planned for, so a call with other indptrs or page size is caught.
    work_metadata_ptrs[0] = np.uint64(_digest(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens))
    work_metadata_ptrs[1] = np.uint64((page_size << 24) | (num_heads_per_head_k << 8) | int(is_cp_round_robin))


from . import mla  # noqa: E402,F401
