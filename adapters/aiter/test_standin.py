#!/usr/bin/env python3
"""The stand-in's checks catch the mistakes an adapter can make (numpy only:
`python3 adapters/aiter/test_standin.py`)."""
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "standin"))
import aiter  # noqa: E402
import aiter.mla  # noqa: E402

dt = aiter.dtypes


def plan(qo, kv, last, heads, ps=1, s_q=1, dtype=dt.bf16):
    info = aiter.get_mla_metadata_info_v1(len(qo) - 1, s_q, heads, dtype, dtype, is_sparse=False)
    bufs = [np.zeros(shape, dtype=d) for shape, d in info]
    meta, wi, winfo, ri, rf, rp = bufs
    aiter.get_mla_metadata_v1(qo, kv, last, heads, 1, True, meta, winfo, wi, ri, rf, rp, page_size=ps,
                              kv_granularity=16, max_seqlen_qo=s_q, uni_seqlen_qo=s_q, dtype_q=dtype, dtype_kv=dtype)
    return dict(work_meta_data=meta, work_indptr=wi, work_info_set=winfo, reduce_indptr=ri,
                reduce_final_map=rf, reduce_partial_map=rp)


class Checks(unittest.TestCase):
    def setUp(self):
        self.qo = np.array([0, 1, 2], dtype=np.int32)
        self.kv = np.array([0, 3, 5], dtype=np.int32)
        self.idx = np.arange(5, dtype=np.int32)
        self.last = np.array([1, 1], dtype=np.int32)
        self.q = np.zeros((2, 16, 576), dtype=np.uint16).view(dt.bf16)
        self.pool = np.zeros((5, 1, 1, 576), dtype=np.uint16).view(dt.bf16)
        self.o = np.zeros((2, 16, 512), dtype=np.uint16).view(dt.bf16)

    def call(self, **kw):
        args = dict(page_size=1, return_lse=True)
        args.update(kw)
        return aiter.mla.mla_decode_fwd(self.q, self.pool, self.o, self.qo, self.kv, self.idx, self.last, 1, **args)

    def test_a_consistent_call_runs(self):
        o, lse = self.call(**plan(self.qo, self.kv, self.last, 16))
        self.assertEqual(lse.shape, (2, 16))

    def test_metadata_of_other_indptrs_is_refused(self):
        meta = plan(self.qo, np.array([0, 2, 5], dtype=np.int32), self.last, 16)
        with self.assertRaisesRegex(AssertionError, "planned for other indptrs"):
            self.call(**meta)

    def test_int64_indptrs_and_mixed_dtypes_are_refused(self):
        with self.assertRaisesRegex(AssertionError, "int32"):
            aiter.mla.mla_decode_fwd(self.q, self.pool, self.o, self.qo.astype(np.int64), self.kv, self.idx,
                                     self.last, 1)
        q8 = np.zeros((2, 16, 576), dtype=np.uint8).view(dt.fp8)
        with self.assertRaisesRegex(AssertionError, "the same"):
            aiter.mla.mla_decode_fwd(q8, self.pool, self.o, self.qo, self.kv, self.idx, self.last, 1)

    def test_fp8_needs_per_tensor_scales(self):
        q8 = np.zeros((2, 16, 576), dtype=np.uint8).view(dt.fp8)
        kv8 = np.zeros((5, 1, 1, 576), dtype=np.uint8).view(dt.fp8)
        with self.assertRaisesRegex(AssertionError, "q_scale"):
            aiter.mla.mla_decode_fwd(q8, kv8, self.o, self.qo, self.kv, self.idx, self.last, 1)

    def test_dcp_needs_global_offsets(self):
        with self.assertRaisesRegex(AssertionError, "g_kv_indptr"):
            self.call(cp_world_size=2, cp_rank=1)

    def test_v4_sink_must_be_one_fp32_per_head(self):
        q = np.zeros((1, 64, 512), dtype=np.uint8).view(dt.fp8)
        qr = np.zeros((1, 64, 64), dtype=np.uint16).view(dt.bf16)
        kv = np.zeros((4, 1, 1, 512), dtype=np.uint8).view(dt.fp8)
        kr = np.zeros((4, 1, 1, 64), dtype=np.uint16).view(dt.bf16)
        out = np.zeros((1, 64, 512), dtype=np.uint16).view(dt.bf16)
        i32 = lambda v: np.array(v, dtype=np.int32)  # noqa: E731
        with self.assertRaisesRegex(AssertionError, "sink"):
            aiter.mla.mla_decode_fwd_v4_nm(q, qr, kv, kr, out, i32([0, 1]), i32([0, 4]), i32([0, 1, 2, 3]), 1,
                                           sink=np.zeros(32, dtype=np.float32))


if __name__ == "__main__":
    unittest.main()
