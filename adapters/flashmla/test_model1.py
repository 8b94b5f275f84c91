#!/usr/bin/env python3
"""The MODEL1 repack against the contract's own decode, byte for byte and
value for value (numpy only; `python3 adapters/flashmla/test_model1.py`)."""
import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import mlabench_worker as mw  # noqa: E402
import model1  # noqa: E402


def contract_rows(p, rng):
    """Random contract pool rows: e4m3 nope (no NaN codes), 7 UE8M0 scales
    written twice, zero tail; bf16 rope."""
    nope = rng.integers(0, 0x7E, size=(p, 448), dtype=np.uint8) | (rng.integers(0, 2, size=(p, 448), dtype=np.uint8) << 7)
    scales = rng.integers(110, 140, size=(p, 7), dtype=np.uint8)
    packed = np.zeros((p, 512), dtype=np.uint8)
    packed[:, :448] = nope
    packed[:, 448:462:2] = scales
    packed[:, 449:462:2] = scales
    rope = mw.f32_to_bf16(rng.standard_normal((p, 64)).astype(np.float32))
    return packed, rope


def contract_decode(packed, rope):
    nope = mw.E4M3[packed[:, :448]].reshape(-1, 7, 64) * np.exp2(packed[:, 448:462:2].astype(np.float64) - 127.0)[:, :, None]
    return np.concatenate([nope.reshape(-1, 448), mw.bf16_to_f32(rope)], axis=1)


class Model1(unittest.TestCase):
    def test_every_token_decodes_to_the_contract_values(self):
        rng = np.random.default_rng(7)
        for p in (1, 63, 64, 65, 200):
            packed, rope = contract_rows(p, rng)
            buf, nb, stride = model1.repack(packed, rope)
            self.assertEqual(stride, 37440)
            self.assertEqual(nb, -(-p // 64))
            self.assertEqual(buf.size, nb * stride)
            want = contract_decode(packed, rope)
            for t in range(p):
                got = model1.decode_token(buf, stride, 64, t, mw.E4M3)
                np.testing.assert_array_equal(got, want[t])

    def test_bytes_sit_where_flashmla_reads_them(self):
        rng = np.random.default_rng(1)
        packed, rope = contract_rows(130, rng)
        buf, _, stride = model1.repack(packed, rope)
        t = 129  # block 2, token 1
        blk = buf[2 * stride:3 * stride]
        np.testing.assert_array_equal(blk[576:576 + 448], packed[t, :448])
        np.testing.assert_array_equal(blk[576 + 448:1152].view("<u2"), rope[t])
        np.testing.assert_array_equal(blk[64 * 576 + 8:64 * 576 + 15], packed[t, 448:462:2])
        self.assertEqual(blk[64 * 576 + 15], 0)

    def test_q_dequant_is_exact_in_bf16(self):
        rng = np.random.default_rng(3)
        packed, rope = contract_rows(16, rng)
        q = model1.dequant_q(packed, rope, mw.E4M3)
        np.testing.assert_array_equal(q, contract_decode(packed, rope).astype(np.float32))
        np.testing.assert_array_equal(mw.bf16_to_f32(mw.f32_to_bf16(q)), q)

    def test_lists_pad_to_a_multiple_of_64_with_minus_one(self):
        indptr = np.array([0, 3, 3, 70], dtype=np.int32)
        indices = np.arange(70, dtype=np.int32) + 5
        idx, lens = model1.lists(indptr, indices, 3)
        self.assertEqual(idx.shape, (3, 128))
        np.testing.assert_array_equal(lens, [3, 0, 67])
        np.testing.assert_array_equal(idx[0, :3], [5, 6, 7])
        self.assertTrue((idx[0, 3:] == -1).all() and (idx[1] == -1).all())
        np.testing.assert_array_equal(idx[2, :67], indices[3:70])


if __name__ == "__main__":
    unittest.main()
