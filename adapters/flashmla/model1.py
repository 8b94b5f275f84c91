"""The contract's DeepSeek-V4 pool repacked byte for byte into FlashMLA's
MODEL1 sparse-decode format (numpy only, so it is tested without a GPU).

Contract (docs/contracts.md, "V4"): a pool row is 512 bytes, 448 e4m3 nope
values then the 7 UE8M0 tile scales written twice (bytes 448..462) and
zeros; the 64 bf16 rope values sit in a separate [P, 64] tensor.

MODEL1, per block of `page` tokens: token j's 448 nope bytes at
[j*576, j*576+448), its 64 rope values (bf16, 128 bytes) at
[j*576+448, j*576+576), and its 7 scale bytes plus one pad byte at
[page*576 + j*8, +8). Blocks are padded to a multiple of 576 bytes, as
FlashMLA's own quantizer pads them (37440 bytes at page 64). Pool row p is
token p % page of block p // page, so a contract list entry is already the
index FlashMLA takes.
"""
import numpy as np

NOPE, ROPE_BYTES, TOKEN, TILES = 448, 128, 576, 7


def block_stride(page):
    raw = page * TOKEN + page * 8
    return -(-raw // TOKEN) * TOKEN


def repack(packed, rope, page=64):
    """packed [P, 512] uint8, rope [P, 64] uint16 (bf16 bits) ->
    (buf uint8 [num_blocks * stride], num_blocks, stride)."""
    p = packed.shape[0]
    nb = max(1, -(-p // page))
    stride = block_stride(page)
    pk = np.zeros((nb * page, 512), dtype=np.uint8)
    pk[:p] = packed
    rb = np.zeros((nb * page, 64), dtype=np.uint16)
    rb[:p] = rope
    buf = np.zeros((nb, stride), dtype=np.uint8)
    body = buf[:, :page * TOKEN].reshape(nb, page, TOKEN)
    tail = buf[:, page * TOKEN:page * TOKEN + page * 8].reshape(nb, page, 8)
    body[:, :, :NOPE] = pk[:, :NOPE].reshape(nb, page, NOPE)
    body[:, :, NOPE:] = rb.astype("<u2").view(np.uint8).reshape(nb, page, ROPE_BYTES)
    tail[:, :, :TILES] = pk[:, NOPE:NOPE + 2 * TILES:2].reshape(nb, page, TILES)
    return buf.reshape(-1), nb, stride


def decode_token(buf, stride, page, p, e4m3):
    """MODEL1 token p as its 512 values (448 dequantized nope, 64 rope), as
    FlashMLA reads them; for testing the repack."""
    b, j = divmod(p, page)
    blk = buf[b * stride:(b + 1) * stride]
    nope = e4m3[blk[j * TOKEN:j * TOKEN + NOPE]].reshape(TILES, 64)
    sc = np.exp2(blk[page * TOKEN + j * 8:page * TOKEN + j * 8 + TILES].astype(np.float64) - 127.0)
    rope_bits = blk[j * TOKEN + NOPE:(j + 1) * TOKEN].view("<u2").astype(np.uint32) << 16
    return np.concatenate([(nope * sc[:, None]).reshape(-1), rope_bits.view(np.float32)])


def dequant_q(q, q_rope, e4m3):
    """Contract Q rows [..., 512] uint8 + rope [..., 64] bf16 bits -> f32
    [..., 512]: the values FlashMLA's bf16 Q must hold (exact in bf16)."""
    lead = q.shape[:-1]
    nope = e4m3[q[..., :NOPE]].reshape(*lead, TILES, 64)
    sc = np.exp2(q[..., NOPE:NOPE + 2 * TILES:2].astype(np.float64) - 127.0)
    rope = (q_rope.astype(np.uint32) << 16).view(np.float32)
    return np.concatenate([(nope * sc[..., None]).reshape(*lead, NOPE), rope], axis=-1).astype(np.float32)


def lists(indptr, indices, rows):
    """CSR lists of the first `rows` rows -> (idx [rows, topk] int32 padded
    with -1, topk a multiple of 64, lens [rows] int32)."""
    lens = (indptr[1:rows + 1] - indptr[:rows]).astype(np.int32)
    topk = max(64, -(-int(lens.max(initial=0)) // 64) * 64)
    idx = np.full((rows, topk), -1, dtype=np.int32)
    for i in range(rows):
        n = lens[i]
        idx[i, :n] = indices[indptr[i]:indptr[i] + n]
    return idx, lens
