#!/usr/bin/env python3
"""Device check and timing for kernels/ps1.cu, page64.cu and merge.cu.

Runs on the H200 (cupy + NVRTC via ctypes); the host logic (formats, work
list, split heuristic, reference) also runs on numpy alone:

    python3 kernels/dev/check.py --part selftest      # here, no GPU
    python3 kernels/dev/check.py --part merge|ps1|page64|time [--out DIR]

Inputs follow SPEC section 1: random Q/KV (never zeros), NaN in every unused
pool slot, permuted page tables, outputs poisoned with NaN before each run.
The reference is float64 (on the GPU under cupy) from the exact values the
kernel sees. Each part is its own process so a kernel fault in one part
cannot take the others down.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrtc import Nvrtc, mla_defines  # noqa: E402

try:
    import cupy as cp

    xp = cp
    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # no cupy here: host logic only
    cp = None
    xp = np
    HAVE_GPU = False

D_QK, D_V = 576, 512
SM_SCALE = 192 ** -0.5
OUT = os.environ.get("OUT", "/tmp/kmla_out")


def asnp(a):
    return cp.asnumpy(a) if (cp is not None and isinstance(a, cp.ndarray)) else np.asarray(a)


# ----------------------------------------------------------------- formats
def _e4m3_table():
    t = np.zeros(256, np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m / 8 * 2.0 ** -6
        else:
            t[b] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
E4M3_POS = E4M3[:127].astype(np.float32)  # codes 0..126: 0 .. 448 ascending


def enc_e4m3(x):
    """float32 -> e4m3fn bytes, round to nearest even, saturating to 448."""
    pos = xp.asarray(E4M3_POS)
    a = xp.minimum(xp.abs(x), 448.0).astype(xp.float32)
    hi = xp.clip(xp.searchsorted(pos, a), 0, 126)
    lo = xp.clip(hi - 1, 0, 126)
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = xp.where(dlo < dhi, lo, xp.where(dhi < dlo, hi, xp.where(lo % 2 == 0, lo, hi)))
    return (code.astype(xp.uint8) | xp.where(x < 0, 0x80, 0).astype(xp.uint8)).astype(xp.uint8)


def enc_bf16(x):
    b = x.astype(xp.float32).view(xp.uint32)
    r = ((b >> 16) & 1) + 0x7FFF
    return ((b + r) >> 16).astype(xp.uint16)


def dec_bf16(bits):
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def decode_rows(rows_u8, fp8):
    """[n, 576*eb] bytes -> float64 [n, 576] (scale not applied)."""
    if fp8:
        return xp.asarray(E4M3)[rows_u8]
    return dec_bf16(rows_u8.view(xp.uint16)).astype(xp.float64)


def quantize(x, fp8, chunk=1 << 26):
    """float32 [n, d] -> (bytes [n, d*eb], scale), in chunks to bound memory."""
    flat = x.reshape(-1)
    if not fp8:
        out = xp.empty(flat.shape, xp.uint16)
        for i in range(0, flat.size, chunk):
            out[i:i + chunk] = enc_bf16(flat[i:i + chunk])
        return out.reshape(x.shape).view(xp.uint8), 1.0
    amax = float(xp.abs(x).max())
    scale = amax / 448.0 if amax > 0 else 1.0
    out = xp.empty(flat.shape, xp.uint8)
    for i in range(0, flat.size, chunk):
        out[i:i + chunk] = enc_e4m3(flat[i:i + chunk] / np.float32(scale))
    return out.reshape(x.shape), scale


def randn(rs, shape):
    if xp is np:
        return rs.standard_normal(shape).astype(np.float32)
    return rs.standard_normal(shape, dtype=xp.float32)


BF16_NAN_BYTES = (0xC0, 0x7F)  # 0x7FC0 little-endian
E4M3_NAN = 0x7F


# --------------------------------------------------------------- sharding
def local_len(r, L, W, S):
    if L <= 0:
        return 0
    ws = W * S
    return (L // ws) * S + min(max(L % ws - r * S, 0), S)


def global_pos(j, r, W, S):
    return ((j // S) * W + r) * S + j % S


# ---------------------------------------------------------------- inputs
class Case:
    """One MLA case: Q, the global KV and one paged pool per DCP rank."""

    def __init__(self, ctx, s_q, hk, h, W=1, S=1, fp8=False, page=1, seed=0, sm_scale=SM_SCALE):
        self.ctx = np.asarray(ctx, np.int64)
        self.B, self.s_q, self.hk, self.h, self.W, self.S = len(ctx), s_q, hk, h, W, S
        self.fp8, self.page, self.sm_scale = fp8, page, sm_scale
        self.eb = 1 if fp8 else 2
        self.rowb = D_QK * self.eb
        rs = xp.random.RandomState(seed)
        self.total_q = self.B * s_q
        q = randn(rs, (self.total_q, hk, D_QK))
        q[:, h:, :] = 0.0  # pad heads are zero Q
        self.q, self.q_scale = quantize(q, fp8)
        self.q = self.q.reshape(self.total_q, hk * self.rowb)
        del q
        self.g_indptr = np.concatenate([[0], np.cumsum(self.ctx)]).astype(np.int64)
        tot = int(self.g_indptr[-1])
        kv = randn(rs, (max(tot, 1), D_QK))
        self.kv, self.kv_scale = quantize(kv, fp8)
        del kv
        self.qo_indptr = np.arange(self.B + 1, dtype=np.int64) * s_q
        self.seed = seed
        self.shards = [self._shard(r, seed) for r in range(W)]

    def with_page(self, page):
        """Same Q and KV, pools re-laid for another page size."""
        c = object.__new__(Case)
        c.__dict__.update(self.__dict__)
        c.page = page
        c.shards = [c._shard(r, self.seed) for r in range(self.W)]
        return c

    def _shard(self, r, seed):
        W, S, P = self.W, self.S, self.page
        lens = np.array([local_len(r, int(L), W, S) for L in self.ctx], np.int64)
        pages = (lens + P - 1) // P
        used = int(pages.sum())
        num_pages = used + used // 16 + 1
        perm = np.random.RandomState(seed * 131 + r + 7).permutation(num_pages).astype(np.int64)
        kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int64)
        kv_indices = perm[:used]
        last = np.where(lens > 0, lens - (pages - 1) * P, 0)
        pool = xp.empty((num_pages * P, self.rowb), xp.uint8)
        if self.fp8:
            pool[...] = E4M3_NAN
        else:
            pool[:, 0::2] = BF16_NAN_BYTES[0]
            pool[:, 1::2] = BF16_NAN_BYTES[1]
        src, dst = [], []
        for b in range(self.B):
            n = int(lens[b])
            if n == 0:
                continue
            j = np.arange(n)
            src.append(self.g_indptr[b] + global_pos(j, r, W, S))
            dst.append(kv_indices[kv_indptr[b] + j // P] * P + j % P)
        if src:
            pool[xp.asarray(np.concatenate(dst))] = self.kv[xp.asarray(np.concatenate(src))]
        return dict(r=r, lens=lens, pool=pool, kv_indptr=kv_indptr, kv_indices=kv_indices, last=last)

    def q_rows(self, b):
        """float64 [s_q*hk, 576] of sequence b (scale not applied)."""
        a = self.q[b * self.s_q:(b + 1) * self.s_q].reshape(self.s_q * self.hk, self.rowb)
        return decode_rows(a, self.fp8)

    def logit_scale(self):
        return self.sm_scale * self.q_scale * self.kv_scale


def attn_ref(qv, kv_rows, vis, scale, kv_scale):
    """qv [R, 576], kv_rows [n, 576], vis [R, n] bool -> (o [R, 512], lse [R]) f64."""
    R = qv.shape[0]
    if kv_rows.shape[0] == 0:
        return xp.zeros((R, D_V)), xp.full((R,), -np.inf)
    s = (qv @ kv_rows.T) * scale
    s = xp.where(vis, s, -np.inf)
    m = s.max(axis=1)
    empty = ~xp.isfinite(m)
    m = xp.where(empty, 0.0, m)
    p = xp.exp(s - m[:, None])
    l = p.sum(axis=1)
    o = (p @ kv_rows[:, :D_V]) / xp.where(empty, 1.0, l)[:, None] * kv_scale
    lse = xp.where(empty, -np.inf, m + xp.log(xp.where(empty, 1.0, l)))
    return xp.where(empty[:, None], 0.0, o), lse


def ref_rank(case, r, seqs=None, local_mask=False):
    """Reference of one rank over its shard. Global mask (ps1) or local
    bottom-right mask (page64). Returns {b: (o [s_q*hk,512], lse [s_q*hk])}."""
    sh = case.shards[r]
    out = {}
    for b in (range(case.B) if seqs is None else seqs):
        n = int(sh["lens"][b])
        j = np.arange(n)
        g = global_pos(j, r, case.W, case.S)
        rows = case.kv[xp.asarray(case.g_indptr[b] + g, dtype=xp.int64)] if n else case.kv[:0]
        kvv = decode_rows(rows, case.fp8)
        ii = np.arange(case.s_q * case.hk) // case.hk
        if local_mask:
            vis = j[None, :] <= (n - case.s_q + ii)[:, None]
        else:
            L = int(case.ctx[b])
            vis = g[None, :] <= (L - case.s_q + ii)[:, None]
        out[b] = attn_ref(case.q_rows(b), kvv, xp.asarray(vis), case.logit_scale(), case.kv_scale)
    return out


def ref_full(case, seqs=None):
    """Unsharded causal attention over the global KV."""
    out = {}
    for b in (range(case.B) if seqs is None else seqs):
        L = int(case.ctx[b])
        rows = case.kv[int(case.g_indptr[b]):int(case.g_indptr[b]) + L]
        ii = np.arange(case.s_q * case.hk) // case.hk
        vis = np.arange(L)[None, :] <= (L - case.s_q + ii)[:, None]
        out[b] = attn_ref(case.q_rows(b), decode_rows(rows, case.fp8), xp.asarray(vis), case.logit_scale(),
                          case.kv_scale)
    return out


# ------------------------------------------------------------------ plans
def plan_ps1(lens, s_q, num_ctas, gran=16, max_chunks=16):
    """Persistent work list: each sequence's local KV cut into chunks that
    are multiples of `gran` (at most max_chunks), balanced over num_ctas."""
    lens = [int(x) for x in lens]
    total = sum(lens)
    per = max(gran, -(-total // (num_ctas * gran)) * gran)
    per_cta = [[] for _ in range(num_ctas)]
    reduce_items, n_part_rows = [], 0
    cta, room = 0, per
    for b, n in enumerate(lens):
        qs, qe = b * s_q, (b + 1) * s_q
        chunks = []
        if n == 0:
            chunks.append((cta, 0, 0))
        j = 0
        while j < n:
            if len(chunks) == max_chunks - 1:
                take = n - j
            else:
                take = min(n - j, max(gran, -(-room // gran) * gran))
            chunks.append((cta, j, j + take))
            j += take
            room -= take
            if room <= 0 and cta < num_ctas - 1:
                cta, room = cta + 1, per
        if len(chunks) == 1:
            c, a, e = chunks[0]
            per_cta[c].append([b, -1, qs, qe, a, e, 0, 0])
        else:
            base = n_part_rows
            for k, (c, a, e) in enumerate(chunks):
                per_cta[c].append([b, base + k * s_q, qs, qe, a, e, 0, 0])
            n_part_rows += len(chunks) * s_q
            reduce_items.append([qs, qe, base, len(chunks)])
    # invariant: every token of every sequence in exactly one item
    cover = [np.zeros(n, np.int32) for n in lens]
    for items in per_cta:
        for it in items:
            cover[it[0]][it[4]:it[5]] += 1
    assert all((c == 1).all() for c in cover), "work list must cover each token once"
    work_indptr = np.concatenate([[0], np.cumsum([len(x) for x in per_cta])]).astype(np.int32)
    items = np.array([it for x in per_cta for it in x], np.int32).reshape(-1, 8)
    red = np.array(reduce_items, np.int32).reshape(-1, 4)
    return dict(work_indptr=work_indptr, work_items=items, reduce=red, part_rows=n_part_rows)


MIN_BLOCK_N = [(8, 64), (16, 128), (24, 128), (32, 128), (48, 64), (64, 64), (128, 32), (256, 32)]


def page64_splits(B, hk, s_q, lens, fp8, cu=132):
    """SPEC section 1 split heuristic (bs_occ counts our head groups)."""
    total = int(sum(lens))
    avg = total / max(B, 1)
    bs_occ = B * max(hk // 16, 1)
    best, bestv = 1, -1.0
    for n in range(1, 17):
        occ = bs_occ * n
        v = occ / (math.ceil(occ / cu) * cu) * avg / (avg + 84.1 * n) if avg > 0 else 0
        if v > bestv + 1e-12:
            best, bestv = n, v
    n = best
    if fp8:
        key = hk * s_q
        mbn = [v for k, v in MIN_BLOCK_N if k <= key][-1] if key >= 8 else 64
        n = min(n, max(1, -(-total // (B * mbn))))
        if n > 1:
            n = min(n, int(abs(total / B - s_q) // mbn) + 1)
    return max(1, n)


# ---------------------------------------------------------------- metrics
def metrics(o_bits, lse, ref_o, ref_lse, fp8):
    """SPEC section 4 on one output. o_bits: bf16 bits; refs float64."""
    o = dec_bf16(xp.asarray(o_bits)).astype(xp.float64).reshape(ref_o.shape)
    lse = xp.asarray(lse).astype(xp.float64).reshape(ref_lse.shape)
    atol = rtol = 2e-2 if fp8 else 1e-2
    res = dict(n=int(ref_o.size))
    bad_o = int((~xp.isfinite(o)).sum())
    ref_fin = xp.isfinite(ref_lse)
    empty = ~ref_fin
    lse_pos_bad = int((xp.isfinite(lse) != ref_fin).sum() + (empty & (lse != -np.inf)).sum())
    empty_nonzero = int((o[empty] != 0).sum()) if int(empty.sum()) else 0
    res["empty_rows"] = int(empty.sum())
    d = xp.where(xp.isfinite(o), o - ref_o, 0.0)
    num = float((o * ref_o).sum())
    den = float((o * o + ref_o * ref_o).sum())
    res["cos_diff"] = 1 - 2 * num / den if den > 0 else 0.0
    mism = (xp.abs(d) > atol) & (xp.abs(d) > rtol * xp.abs(ref_o))
    res["mismatch"] = float(mism.mean())
    res["max_abs"] = float(xp.abs(d).max())
    k = int(xp.argmax(xp.abs(d)))
    res["worst"] = [int(x) for x in np.unravel_index(k, ref_o.shape)] + [float(o.reshape(-1)[k]), float(ref_o.reshape(-1)[k])]
    both = ref_fin & xp.isfinite(lse)
    res["lse_max_abs"] = float(xp.abs(xp.where(both, lse - ref_lse, 0.0)).max()) if ref_lse.size else 0.0
    cos_tol, mm_tol = (1e-4, 1e-3) if fp8 else (1e-5, 1e-4)
    why = []
    if bad_o:
        why.append(f"{bad_o} non-finite o")
    if lse_pos_bad:
        why.append(f"{lse_pos_bad} lse finite/-inf positions differ")
    if empty_nonzero:
        why.append(f"{empty_nonzero} nonzero o in empty rows")
    if not res["cos_diff"] < cos_tol:
        why.append(f"cos_diff {res['cos_diff']:.2e}")
    if res["mismatch"] > mm_tol:
        why.append(f"mismatch {res['mismatch']:.2e}")
    if res["lse_max_abs"] > 1e-3:
        why.append(f"lse {res['lse_max_abs']:.2e}")
    res["ok"] = not why
    res["why"] = "; ".join(why)
    return res


# -------------------------------------------------------------- kernels
def block_threads(d):
    return 32 * d["WARPS"]


def smem_bytes(d):
    """Mirror of SMEM_BYTES in kernels/common/mla_core.cuh (and of `mla_smem`
    in src/variants/kernels.rs) for a defines dict from `mla_defines`."""
    fp8, rows = d["KV_FP8"], 16 * d["MT"]
    groups, bn = d.get("GROUPS", 1), d.get("BN", 64 if fp8 else 32)
    stages = d.get("STAGES", 2 if groups == 2 else 4)
    if fp8:
        per_group = stages * bn * 640 + 2 * rows * (bn + 4) * 4 + rows * (bn + 8) * 2 + rows * 8
        return (groups * per_group + 1023) // 1024 * 1024 + 5 * rows * 128 + 1024
    per_group = stages * bn * (D_QK * 2 + 16) + 4 * rows * (bn + 8) * 4 + rows * (bn + 8) * 2 + rows * 8
    return groups * per_group + (rows * (D_QK * 2 + 16) if d.get("QSMEM", 0) else 0)


class Kernels:
    """Compiles (in parallel) and caches NVRTC modules."""

    def __init__(self):
        self.nv = Nvrtc()
        self.mods = {}
        self.tmp = tempfile.mkdtemp()

    def prepare(self, configs, patch=None):
        from concurrent.futures import ThreadPoolExecutor

        todo, seen = [], set()
        for c in configs:  # unique keys only: each gets its own cubin file
            k = self.key(*c, patch)
            if k not in self.mods and k not in seen:
                seen.add(k)
                todo.append(c)
        root = self.patched(patch) if patch else None

        def one(c):
            cub, log, _ = self.nv.compile(c[0], c[1], **({"root": root} if root else {}))
            if cub is None:
                raise RuntimeError(f"compile {c}: {log}")
            return c, cub

        with ThreadPoolExecutor(max_workers=16) as ex:
            for (name, d), cub in ex.map(one, todo):
                # RawModule(path=) loads lazily: a file name must never be reused.
                self.n_files = getattr(self, "n_files", 0) + 1
                path = os.path.join(self.tmp, f"m{self.n_files}.cubin")
                open(path, "wb").write(cub)
                self.mods[self.key(name, d, patch)] = cp.RawModule(path=path)

    def patched(self, patch):
        """A kernels/ copy with ABLATIONS[patch] applied (timing experiments only)."""
        import shutil

        from nvrtc import KERNELS
        root = os.path.join(self.tmp, "k_" + patch)
        if not os.path.exists(root):
            shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("dev"))
            for rel, old, new in ABLATIONS[patch]:
                fp = os.path.join(root, rel)
                txt = open(fp).read()
                assert old in txt, (patch, old)
                open(fp, "w").write(txt.replace(old, new))
        return root

    @staticmethod
    def key(name, d, patch=None):
        return name + str(sorted(d.items())) + (patch or "")

    def fn(self, name, d, entry, smem=0, patch=None):
        self.prepare([(name, d)], patch)
        f = self.mods[self.key(name, d, patch)].get_function(entry)
        if smem > 48 * 1024:
            f.max_dynamic_shared_size_bytes = smem
        return f


# Timing-only ablations of the fp8 path: each removes one kind of work (the
# results are wrong on purpose); the time saved says what that work costs.
# (The K-conversion and Q.K mma.sync ablations went with that path: since v8
# Q.K runs on e4m3 wgmma, kernels/dev/NOTES.md.)
_VC = "__device__ __forceinline__ void v_cvt(unsigned w, unsigned& x, unsigned& y) {"
ABLATIONS = {
    "noVcvt": [("common/fp8.cuh", _VC, _VC + " x = w; y = w ^ 0x55555555u; return;")],
    "noPVmma": [("common/mla_core.cuh", f"mma_f16(oacc[mt][u * 4 + {k}], pa[mt], {x}, {y});",
                 f"oacc[mt][u * 4 + {k}][0] += __uint_as_float(({x} ^ {y} ^ pa[mt][{k}]) & 0x3fffffffu);")
                for k, x, y in ((0, "e0", "e1"), (1, "o0", "o1"), (2, "e2", "e3"), (3, "o2", "o3"))],
    "noexp": [("common/mla_core.cuh", "exp2f(", "(")],
}


def i32(a):
    return cp.asarray(np.asarray(a, np.int32))


class Ps1Run:
    """Device buffers + launches of ps1 for one rank of a case."""

    def __init__(self, K, case, r, mt, num_ctas=132, stages=None, cvt=None, warps=None, idx_pf=None, patch=None):
        self.case, self.sh = case, case.shards[r]
        self.d = mla_defines(case.hk, case.fp8, mt, stages, cvt, warps)
        if idx_pf is not None:
            self.d["IDX_PF"] = idx_pf
        self.smem = smem_bytes(self.d)
        self.fwd = K.fn("ps1.cu", self.d, "ps1_fwd", self.smem, patch)
        self.red = K.fn("ps1.cu", self.d, "ps1_reduce")
        self.plan = plan_ps1(self.sh["lens"], case.s_q, num_ctas)
        self.num_ctas = num_ctas
        p = self.plan
        self.bufs = [i32(self.sh["kv_indptr"]), i32(self.sh["kv_indices"]), i32(case.qo_indptr),
                     i32(case.g_indptr), i32(p["work_indptr"]), i32(p["work_items"])]
        self.o = cp.empty((case.total_q, case.hk, D_V), cp.uint16)
        self.lse = cp.empty((case.total_q, case.hk), cp.float32)
        pr = max(p["part_rows"], 1)
        self.part_o = cp.empty((pr, case.hk, D_V), cp.float32)
        self.part_lse = cp.empty((pr, case.hk), cp.float32)
        self.red_items = i32(p["reduce"]) if len(p["reduce"]) else None
        self.r = r

    def poison(self):
        self.o.fill(0x7FC0)  # bf16 NaN
        self.lse.fill(np.nan)
        self.part_o.fill(np.nan)
        self.part_lse.fill(np.nan)

    def launch_fwd(self):
        c = self.case
        self.fwd((self.num_ctas,), (block_threads(self.d),),
                 (c.q, self.sh["pool"], *self.bufs[:4], self.bufs[4], self.bufs[5], np.float32(c.q_scale),
                  np.float32(c.kv_scale), np.float32(c.sm_scale), np.int32(c.W), np.int32(self.r), np.int32(c.S),
                  self.o, self.lse, self.part_o, self.part_lse), shared_mem=self.smem)

    def launch_reduce(self):
        if self.red_items is not None:
            self.red((len(self.plan["reduce"]), self.case.hk), (128,),
                     (self.part_o, self.part_lse, self.red_items, self.o, self.lse))

    def run(self):
        self.launch_fwd()
        self.launch_reduce()


class Page64Run:
    def __init__(self, K, case, mt, n_splits=None, stages=None, cvt=None, r=0, warps=None, patch=None):
        assert case.page == 64
        self.case, self.sh = case, case.shards[r]
        self.d = mla_defines(case.hk, case.fp8, mt, stages, cvt, warps)
        self.smem = smem_bytes(self.d)
        self.fwd = K.fn("page64.cu", self.d, "page64_fwd", self.smem, patch)
        self.mrg = K.fn("page64.cu", self.d, "page64_merge")
        self.n = n_splits or page64_splits(case.B, case.hk, case.s_q, self.sh["lens"], case.fp8)
        self.bufs = [i32(self.sh["kv_indptr"]), i32(self.sh["kv_indices"]), i32(self.sh["last"]), i32(case.qo_indptr)]
        self.o = cp.empty((case.total_q, case.hk, D_V), cp.uint16)
        self.lse = cp.empty((case.total_q, case.hk), cp.float32)
        rows = case.total_q * self.n if self.n > 1 else 1
        self.part_o = cp.empty((rows, case.hk, D_V), cp.float32)
        self.part_lse = cp.empty((rows, case.hk), cp.float32)

    def poison(self):
        self.o.fill(0x7FC0)
        self.lse.fill(np.nan)
        self.part_o.fill(np.nan)
        self.part_lse.fill(np.nan)

    def launch_fwd(self):
        c = self.case
        self.fwd((c.hk // 16, self.n, c.B), (block_threads(self.d),),
                 (c.q, self.sh["pool"], *self.bufs, np.float32(c.q_scale), np.float32(c.kv_scale),
                  np.float32(c.sm_scale), np.int32(self.n), self.o, self.lse, self.part_o, self.part_lse),
                 shared_mem=self.smem)

    def launch_reduce(self):
        if self.n > 1:
            self.mrg((self.case.total_q, self.case.hk), (128,),
                     (self.part_o, self.part_lse, np.int32(self.n), self.o, self.lse))

    def run(self):
        self.launch_fwd()
        self.launch_reduce()


def compare_rank(run, ref, seqs=None):
    c = run.case
    seqs = list(range(c.B)) if seqs is None else seqs
    rows = np.concatenate([np.arange(b * c.s_q, (b + 1) * c.s_q) for b in seqs])
    ro = xp.concatenate([ref[b][0].reshape(c.s_q, c.hk, D_V) for b in seqs])
    rl = xp.concatenate([ref[b][1].reshape(c.s_q, c.hk) for b in seqs])
    ri = xp.asarray(rows)
    return metrics(run.o[ri], run.lse[ri], ro, rl, c.fp8)


# ------------------------------------------------------------------ parts
RESULTS = []
VERBOSE = False
ABLATE = False


def record(part, name, res, extra=None):
    row = dict(part=part, case=name, **res, **(extra or {}))
    RESULTS.append(row)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    flag = "ok  " if res.get("ok", True) else "FAIL"
    if flag == "ok  " and not VERBOSE:
        return
    print(f"{flag} {part:7s} {name:58s} cos={res.get('cos_diff', 0):.1e} mm={res.get('mismatch', 0):.1e} "
          f"lse={res.get('lse_max_abs', 0):.1e} {res.get('why', '')}"
          + ("" if res.get("ok", True) else f" worst={res.get('worst')} empty={res.get('empty_rows')}"), flush=True)


def part_ps1(K, quick=False):
    rng = np.random.RandomState(5)
    cases = []
    # (ctx, s_q, hk, h, W, S, mt, num_ctas[, warps])
    for fp8 in (False, True):
        for hk in (16, 32, 64, 96, 128):
            cases.append((list(rng.randint(1, 700, 5)) + [1], 1, hk, max(hk - 5, 1), 1, 1, 1 if hk == 16 else 2, 132))
        cases.append(([1, 17, 300, 1000, 2500], 1, 16, 16, 1, 1, 1, 7))        # many partials per seq
        cases.append(([3, 64, 129, 700], 1, 16, 16, 1, 1, 2, 5))                # MT=2 with one m-tile
        cases.append(([2, 5, 90, 400], 3, 16, 16, 1, 1, 2, 9))                  # s_q=3, odd m-tile count
        cases.append(([4, 50, 333, 1200], 4, 16, 8, 4, 1, 2, 11))               # DCP4 + MTP
        cases.append(([8, 9, 100, 513, 1500], 8, 96, 64, 8, 1, 2, 17))          # Kimi DSpark-like: 64->96, DCP8
        cases.append(([1, 2, 3, 5, 7, 40], 2, 96, 96, 8, 2, 2, 6))              # empty ranks / rows, S=2
        cases.append(([6, 200, 901], 5, 96, 96, 2, 1, 1, 4))                    # MT=1, s_q=5
        cases.append(([1, 17, 300, 1000, 2500], 1, 16, 16, 1, 1, 1, 7, 8))     # MT=1 with 8 warps
    if quick:
        cases = cases[:3]
    for i, (ctx, s_q, hk, h, W, S, mt, nc, *wp) in enumerate(cases):
        fp8 = i >= len(cases) // 2
        wp = wp[0] if wp else None
        case = Case(ctx, s_q, hk, h, W, S, fp8=fp8, page=1, seed=100 + i)
        rank_out = []
        for r in range(W):
            run = Ps1Run(K, case, r, mt, num_ctas=nc, warps=wp)
            run.poison()
            run.run()
            cp.cuda.runtime.deviceSynchronize()
            res = compare_rank(run, ref_rank(case, r))
            name = (f"{'fp8' if fp8 else 'bf16'} hk{hk} h{h} sq{s_q} W{W} S{S} r{r} mt{mt} w{run.d['WARPS']} "
                    f"ctas{nc} parts{run.plan['part_rows']}")
            record("ps1", name, res)
            rank_out.append((run.o.copy(), run.lse.copy()))
        if W > 1:
            part_dcp_from_ranks(K, case, rank_out)


def part_dcp_from_ranks(K, case, rank_out):
    """dcp_combine over real ps1 rank outputs vs the unsharded reference."""
    f = K.fn("merge.cu", {}, "dcp_combine")
    W, rows, H = case.W, case.total_q, case.hk
    o_r = cp.stack([o for o, _ in rank_out])
    l_r = cp.stack([l for _, l in rank_out])
    o = cp.full((rows, H, D_V), 0x7FC0, cp.uint16)
    lse = cp.full((rows, H), np.nan, cp.float32)
    f((rows * H,), (64,), (o_r, l_r, np.int32(W), np.int32(rows), np.int32(H), o, lse))
    cp.cuda.runtime.deviceSynchronize()
    ref = ref_full(case)
    ro = xp.concatenate([ref[b][0].reshape(case.s_q, H, D_V) for b in range(case.B)])
    rl = xp.concatenate([ref[b][1].reshape(case.s_q, H) for b in range(case.B)])
    record("dcp", f"{'fp8' if case.fp8 else 'bf16'} combine W{W} S{case.S} sq{case.s_q} hk{H} vs full", metrics(o, lse, ro, rl, case.fp8))


def merge_ref(po, pl, sink=None):
    """SPEC combine on float64 numpy: po [n, d], pl [n] -> (o, G)."""
    pl = np.where(np.isnan(pl) | (pl == np.inf), -np.inf, pl)
    vals = list(pl) + ([sink] if sink is not None else [])
    m = max(vals) if vals else -np.inf
    if m == -np.inf:
        return np.zeros(po.shape[1]), -np.inf
    g = math.log(sum(math.exp(v - m) for v in vals if v != -np.inf)) + m
    o = np.zeros(po.shape[1])
    for r in range(po.shape[0]):
        if pl[r] != -np.inf:
            w = math.exp(pl[r] - g)
            if w != 0:
                o += w * po[r]
    return o, g


def part_merge(K):
    rs = np.random.RandomState(11)
    # dcp_combine edge cases: -inf / NaN / +inf lse, NaN o where empty
    f = K.fn("merge.cu", {}, "dcp_combine")
    W, rows, H = 4, 29, 24
    lse = rs.randn(W, rows, H).astype(np.float32) * 3
    o = rs.randn(W, rows, H, D_V).astype(np.float32)
    kill = rs.rand(W, rows, H)
    lse[kill < 0.15] = -np.inf
    lse[(kill >= 0.15) & (kill < 0.2)] = np.nan
    lse[(kill >= 0.2) & (kill < 0.23)] = np.inf
    lse[:, 3, :] = -np.inf  # a fully empty row
    o_bits = asnp(enc_bf16(xp.asarray(o)))
    o_bits[~np.isfinite(lse) | np.isnan(lse)] = 0x7FC0  # NaN o for empty ranks
    ob = dec_bf16(xp.asarray(o_bits)).astype(np.float64)
    ob = asnp(ob)
    ref_o = np.zeros((rows, H, D_V))
    ref_l = np.zeros((rows, H))
    for i in range(rows):
        for h in range(H):
            ref_o[i, h], ref_l[i, h] = merge_ref(ob[:, i, h], lse[:, i, h].astype(np.float64))
    out = cp.full((rows, H, D_V), 0x7FC0, cp.uint16)
    out_l = cp.full((rows, H), np.nan, cp.float32)
    f((rows * H,), (64,), (cp.asarray(o_bits), cp.asarray(lse), np.int32(W), np.int32(rows), np.int32(H), out, out_l))
    cp.cuda.runtime.deviceSynchronize()
    record("merge", "dcp_combine W4 -inf/NaN/+inf lse, NaN o", metrics(out, out_l, xp.asarray(ref_o), xp.asarray(ref_l), False))

    g = K.fn("merge.cu", {}, "split_merge")
    for with_sink in (False, True):
        rows, H = 37, 16
        cnt = rs.randint(0, 6, rows)
        cnt[5] = 0
        indptr = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int32)
        slots = max(int(indptr[-1]), 1)
        pl = (rs.randn(slots, H) * 2).astype(np.float32)
        pl[rs.rand(slots, H) < 0.2] = -np.inf
        po = rs.randn(slots, H, D_V).astype(np.float32)
        po[np.isinf(pl)] = np.nan
        sink = (rs.randn(H) * 2).astype(np.float32) if with_sink else None
        ref_o = np.zeros((rows, H, D_V))
        ref_l = np.zeros((rows, H))
        for i in range(rows):
            for h in range(H):
                a, b = indptr[i], indptr[i + 1]
                ref_o[i, h], ref_l[i, h] = merge_ref(po[a:b, h].astype(np.float64), pl[a:b, h].astype(np.float64),
                                                     None if sink is None else float(sink[h]))
        out = cp.full((rows, H, D_V), 0x7FC0, cp.uint16)
        out_l = cp.full((rows, H), np.nan, cp.float32)
        sk = cp.asarray(sink) if with_sink else np.uint64(0)
        g((rows * H,), (128,), (cp.asarray(po), cp.asarray(pl), cp.asarray(indptr), sk, np.int32(rows), np.int32(H), out, out_l))
        cp.cuda.runtime.deviceSynchronize()
        res = metrics(out, out_l, xp.asarray(ref_o), xp.asarray(ref_l), False)
        if with_sink:  # rows with no split: lse must be the sink exactly-ish, o = 0
            i = 5
            res["sink_row_lse_err"] = float(np.abs(asnp(out_l[i]) - sink).max())
            if res["sink_row_lse_err"] > 1e-6:
                res["ok"] = False
                res["why"] += " sink row lse"
        record("merge", f"split_merge sink={with_sink}", res)


def part_page64(K, quick=False):
    rng = np.random.RandomState(9)
    cases = []
    # (lens, s_q, hk, h, mt, n_splits)
    for fp8 in (False, True):
        cases.append((list(rng.randint(1, 3000, 6)), 1, 16, 16, 1, None))
        cases.append(([0, 1, 63, 64, 65, 1000, 4097], 1, 16, 16, 1, 3))
        cases.append(([1, 2, 200, 700, 2000], 3, 48, 40, 2, 16))     # s_q=3, head groups, splits > pages
        cases.append(([5, 129, 1500], 8, 128, 128, 2, 2))
        cases.append(([7, 64, 900], 2, 32, 32, 1, 1))                # n_splits=1 direct write, MT=1 with s_q=2
        cases.append(([300, 64, 2900], 1, 128, 128, 1, 4, 8))       # 8 warps, 8 head groups
    if quick:
        cases = cases[:2]
    for i, (lens, s_q, hk, h, mt, n, *wp) in enumerate(cases):
        fp8 = i >= len(cases) // 2
        case = Case(lens, s_q, hk, h, 1, 1, fp8=fp8, page=64, seed=300 + i)
        run = Page64Run(K, case, mt, n_splits=n, warps=wp[0] if wp else None)
        run.poison()
        run.run()
        cp.cuda.runtime.deviceSynchronize()
        res = compare_rank(run, ref_rank(case, 0, local_mask=True))
        record("page64", f"{'fp8' if fp8 else 'bf16'} hk{hk} h{h} sq{s_q} mt{mt} w{run.d['WARPS']} splits{run.n}", res)


# ----------------------------------------------------------------- timing
def copy_bw():
    n = 4 << 30
    a = cp.empty(n, cp.uint8)
    b = cp.empty(n, cp.uint8)
    a.fill(1)
    ts = []
    s, e = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(12):
        s.record()
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, n, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    del a, b
    t = float(np.median(ts[2:]))
    return 2 * n / (t * 1e-3) / 1e9


GATHER_SRC = r"""
extern "C" __global__ void gather_probe(const uint4* __restrict__ pool, const long long* __restrict__ rows,
                                        long long ntok, int row16, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  const long long n = ntok * row16;
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < n; c += (long long)gridDim.x * blockDim.x) {
    const long long t = c / row16;
    const uint4 v = __ldg(pool + rows[t] * row16 + (c - t * row16));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
"""


def gather_bw(case, flush):
    """Read bandwidth of the pool rows the kernel reads, in its order (the
    access-pattern ceiling for page size 1 vs 64); bytes read only."""
    k = cp.RawKernel(GATHER_SRC, "gather_probe")
    sh, P = case.shards[0], case.page
    rows = []
    for b in range(case.B):
        j = np.arange(int(sh["lens"][b]))
        rows.append(sh["kv_indices"][sh["kv_indptr"][b] + j // P] * P + j % P)
    rows = cp.asarray(np.concatenate(rows).astype(np.int64))
    sink = cp.zeros(1, cp.uint32)
    ntok, row16 = int(rows.size), case.rowb // 16
    f = lambda: k((132 * 16,), (256,), (sh["pool"], rows, np.int64(ntok), np.int32(row16), sink))
    ms = timed(f, flush)[0]
    return ntok * case.rowb / (ms * 1e-3) / 1e9


def timed(fn, flush, reps=15, warm=3):
    s, e = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(warm):
        fn()
    ts = []
    for i in range(reps):
        flush.fill(i & 0xFF)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(ts)), float(np.percentile(ts, 10)), float(np.percentile(ts, 90))


def part_time(K, quick=False):
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    flush = cp.empty(256 << 20, cp.uint8)
    rows = []
    shapes = [(64, 4096), (64, 32768), (128, 4096), (128, 32768)]
    if quick:
        shapes = shapes[:1]
    variants = [dict()]
    extra = [dict(warps=8), dict(warps=16)]
    for fp8 in (False, True):
        for (B, L) in shapes:
            base = Case([L] * B, 1, 16, 16, 1, 1, fp8=fp8, page=1, seed=7)
            for page in (1, 64):
                case = base if page == 1 else base.with_page(64)
                gbw = gather_bw(case, flush)
                print(f"gather probe {'fp8' if fp8 else 'bf16'} B{B} L{L} page{page}: {gbw:.0f} GB/s read", flush=True)
                rows.append(dict(name=f"gather page{page} {'fp8' if fp8 else 'bf16'} B{B} L{L}", gather_gbs=gbw))
                vs = variants + (extra if (B, L) == (128, 32768) and not quick else [])
                if (B, L) == (128, 32768) and ABLATE and fp8 and page == 64:
                    vs = vs + [dict(patch=k) for k in ABLATIONS]
                for v in vs:
                    run = (Ps1Run(K, case, 0, 1, **v) if page == 1 else Page64Run(K, case, 1, **v))
                    run.poison()
                    run.run()
                    cp.cuda.runtime.deviceSynchronize()
                    seqs = [0, B // 2, B - 1]
                    res = compare_rank(run, ref_rank(case, 0, seqs=seqs, local_mask=(page == 64)), seqs)
                    k_ms = timed(run.launch_fwd, flush)
                    v_ms = timed(run.run, flush)
                    kvb = B * L * D_QK * case.eb
                    qb = case.total_q * 16 * D_QK * case.eb
                    ob = case.total_q * 16 * (D_V * 2 + 4)
                    if page == 1:
                        pr = run.plan["part_rows"]
                    else:
                        pr = case.total_q * run.n if run.n > 1 else 0
                    pb = pr * 16 * (D_V * 4 + 4) * 2
                    tot = kvb + qb + ob + pb
                    gbs = tot / (v_ms[0] * 1e-3) / 1e9
                    kgbs = (kvb + qb + ob + pb / 2) / (k_ms[0] * 1e-3) / 1e9
                    tflops = 2 * 16 * (D_QK + D_V) * B * L / (v_ms[0] * 1e-3) / 1e12
                    name = (f"{'ps1' if page == 1 else 'page64'} {'fp8' if fp8 else 'bf16'} B{B} L{L} "
                            + " ".join(f"{k}{x}" for k, x in v.items()))
                    row = dict(name=name, variant_ms=v_ms, kernel_ms=k_ms, gbs=gbs, frac=gbs / bw, kernel_gbs=kgbs,
                               tflops=tflops, bytes=tot, part_rows=pr, splits=getattr(run, "n", None),
                               ok=res["ok"], cos=res["cos_diff"], lse=res["lse_max_abs"], why=res["why"])
                    rows.append(row)
                    record("time", name, res, dict(gbs=gbs, frac=gbs / bw, variant_ms=v_ms[0], kernel_ms=k_ms[0]))
                    del run
                del case
            del base
            cp.get_default_memory_pool().free_all_blocks()
    print(f"\ncopy bandwidth (read+write) {bw:.0f} GB/s")
    print(f"{'case':40s} {'var ms':>8s} {'ker ms':>8s} {'GB/s':>7s} {'%copy':>6s} {'TF/s':>6s} chk")
    for r in rows:
        if "gather_gbs" in r:
            print(f"{r['name']:40s} {'':8s} {'':8s} {r['gather_gbs']:7.0f} {100 * r['gather_gbs'] / bw:5.1f}%  (read-only probe)")
            continue
        print(f"{r['name']:40s} {r['variant_ms'][0]:8.3f} {r['kernel_ms'][0]:8.3f} {r['gbs']:7.0f} "
              f"{100 * r['frac']:5.1f}% {r['tflops']:6.1f} {'ok' if r['ok'] else 'FAIL ' + r['why']}")
    with open(os.path.join(OUT, "time_summary.json"), "w") as f:
        json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)


# -------------------------------------------------------------- selftest
def part_selftest():
    """Host logic only (numpy): plans, sharding, reference vs brute force."""
    for lens, s_q, nc in [([0, 1, 17, 300, 1000, 2500], 1, 7), ([5] * 40, 2, 132), ([10000], 1, 132), ([], 1, 3)]:
        p = plan_ps1(lens, s_q, nc)
        assert len(p["work_indptr"]) == nc + 1
        per_seq = {}
        for it in p["work_items"]:
            per_seq.setdefault(int(it[0]), []).append(it)
        assert set(per_seq) == set(range(len(lens))), "every sequence has an item"
        for b, its in per_seq.items():
            assert len(its) <= 16
            if len(its) > 1:
                assert all(it[1] >= 0 for it in its)
                assert all((it[5] - it[4]) % 16 == 0 for it in its[:-1]), "chunks are multiples of 16"
        print("plan ok", lens[:4], s_q, nc, "items", len(p["work_items"]), "reduce", len(p["reduce"]))
    assert page64_splits(64, 16, 1, [4096] * 64, False) == 2
    assert page64_splits(128, 16, 1, [32768] * 128, False) == 1
    # e4m3 round trip on representable values and rounding to nearest
    vals = E4M3[np.isfinite(E4M3)].astype(np.float32)
    assert np.array_equal(E4M3[enc_e4m3(vals)].astype(np.float32), vals)
    assert E4M3[enc_e4m3(np.array([1.0625, 1.1875, 500.0, -0.0015], np.float32))].tolist() == [1.0, 1.25, 448.0, -0.001953125]
    # reference vs per-row brute force, DCP with interleave
    c = Case([1, 5, 37, 70], 3, 16, 13, W=4, S=2, fp8=True, page=64, seed=3)
    for r in range(4):
        ref = ref_rank(c, r)
        for b in range(c.B):
            o, lse = ref[b]
            sh = c.shards[r]
            n = int(sh["lens"][b])
            for row in (0, c.hk * c.s_q - 1):
                ii = row // c.hk
                qv = c.q_rows(b)[row]
                s, v = [], []
                for j in range(n):
                    gp = global_pos(j, r, 4, 2)
                    if gp <= c.ctx[b] - c.s_q + ii:
                        page = sh["kv_indices"][sh["kv_indptr"][b] + j // 64]
                        krow = decode_rows(sh["pool"][page * 64 + j % 64][None], True)[0]
                        s.append(qv @ krow * c.logit_scale())
                        v.append(krow[:D_V])
                if not s:
                    assert lse[row] == -np.inf and (o[row] == 0).all()
                    continue
                s = np.array(s)
                m = s.max()
                p = np.exp(s - m)
                want = (p[:, None] * np.array(v)).sum(0) / p.sum() * c.kv_scale
                assert np.allclose(o[row], want, rtol=1e-9, atol=1e-12), (r, b, row)
                assert abs(lse[row] - (m + math.log(p.sum()))) < 1e-9
    # the unsharded reference equals the merge of the rank references
    full = ref_full(c)
    ranks = [ref_rank(c, r) for r in range(4)]
    for b in range(c.B):
        for row in range(c.hk * c.s_q):
            po = np.stack([ranks[r][b][0][row] for r in range(4)])
            pl = np.array([ranks[r][b][1][row] for r in range(4)])
            o, g = merge_ref(po, pl)
            assert np.allclose(o, full[b][0][row], atol=1e-12) and (g == full[b][1][row] or abs(g - full[b][1][row]) < 1e-9)
    # metrics flag a wrong output
    ro = np.random.RandomState(0).randn(4, 16, D_V)
    rl = np.zeros((4, 16))
    good = metrics(asnp(enc_bf16(ro)), rl.astype(np.float32), ro, rl, False)
    bad = metrics(asnp(enc_bf16(ro * 1.05)), rl.astype(np.float32), ro, rl, False)
    assert good["ok"] and not bad["ok"], (good, bad)
    print("selftest ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", required=True, choices=["selftest", "merge", "ps1", "page64", "time"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print passing cases too (always in $OUT/results.jsonl)")
    ap.add_argument("--ablate", action="store_true", help="time: add the fp8 ablations (wrong results on purpose)")
    a = ap.parse_args()
    global VERBOSE, ABLATE
    VERBOSE = a.verbose
    ABLATE = a.ablate
    if a.part == "selftest":
        part_selftest()
        return
    assert HAVE_GPU, "this part needs the GPU"
    t0 = time.time()
    K = Kernels()
    if a.part in ("ps1", "time"):
        cfgs = [("ps1.cu", mla_defines(hk, fp8, mt, warps=w)) for fp8 in (0, 1) for hk, mt, w in
                [(16, 1, None), (16, 1, 8), (16, 2, None), (32, 2, None), (64, 2, None), (96, 1, None), (96, 2, None),
                 (128, 2, None)]] + [("merge.cu", {})]
        if a.part == "time":
            cfgs = [("ps1.cu", mla_defines(16, f, 1)) for f in (0, 1)] + [("page64.cu", mla_defines(16, f, 1)) for f in (0, 1)]
            cfgs += [(n, mla_defines(16, f, 1, st, None, w)) for n in ("ps1.cu", "page64.cu") for f in (0, 1)
                     for st, w in ((None, 8), (None, 16), (5, None), (3, None))]
        K.prepare(cfgs)
    if a.part == "page64":
        K.prepare([("page64.cu", mla_defines(hk, f, mt, warps=w)) for f in (0, 1)
                   for hk, mt, w in [(16, 1, None), (48, 2, None), (128, 2, None), (32, 1, None), (128, 1, 8)]])
    print(f"compiled in {time.time() - t0:.1f}s", flush=True)
    {"merge": part_merge, "ps1": part_ps1, "page64": part_page64, "time": part_time}[a.part](
        *([K] if a.part == "merge" else [K, a.quick]))
    fails = [r for r in RESULTS if not r.get("ok", True)]
    print(f"{a.part}: {len(RESULTS) - len(fails)} passed, {len(fails)} failed ({time.time() - t0:.1f}s)")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
