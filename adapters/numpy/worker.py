#!/usr/bin/env python3
"""A CPU worker that implements every mlabench contract with numpy: the
reference point for worker authors, and what mlabench's protocol tests run.

    python3 adapters/numpy/worker.py [--mask local|global] [--fault FAULT]

--fault makes it misbehave, to test that mlabench survives workers that do:
  crash        exit during `run`
  hang         sleep during `run` (mlabench's deadline must fire)
  garbage      write a file that is not safetensors
  short        write a truncated output file
  wrong-shape  return `o` with one row too few
  nan          return NaN outputs (a failed check, not an error)
  version      answer hello with protocol 99
  protocol     answer `run` with a line that is not JSON
  refuse       answer `load` with ok=false
  unsupported  answer `load` with ok=false, unsupported=true (a skip)
  unwritten    leave outputs poisoned (a failed check)
MLABENCH_NUMPY_FAULT in the environment does the same as --fault.
"""
import argparse
import os
import sys
import time

import numpy as np

# The protocol helper: beside this file in the repository, or under the
# current directory's adapters/ for a copy of this worker made elsewhere.
for _d in (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"),
           os.path.join(os.getcwd(), "adapters", "common")):
    sys.path.insert(0, _d)
import mlabench_worker as mw  # noqa: E402

D_QK, D_V, V4_D, V4_NOPE, V4_ROPE = 576, 512, 512, 448, 64


def softmax_rows(s, sink=None):
    """o-weights and lse of logits s [rows, n]; sink [rows] joins the denominator."""
    m = s.max(axis=1) if s.shape[1] else np.full(s.shape[0], -np.inf)
    if sink is not None:
        m = np.maximum(m, sink)
    safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - safe[:, None]) if s.shape[1] else s
    z = e.sum(axis=1)
    if sink is not None:
        z = z + np.exp(sink - safe)
    with np.errstate(divide="ignore"):
        lse = np.where(z > 0, safe + np.log(np.where(z > 0, z, 1.0)), -np.inf)
    p = e / np.where(z > 0, z, 1.0)[:, None]
    return p, lse


def merge(parts_o, parts_lse, sink=None):
    """The contract's LSE merge: NaN and +inf LSEs are empty parts; a zero
    weight ignores a NaN o. parts_o [P, n, d], parts_lse [P, n]."""
    lse = np.where(np.isnan(parts_lse) | (parts_lse == np.inf), -np.inf, parts_lse)
    m = lse.max(axis=0)
    if sink is not None:
        m = np.maximum(m, sink)
    safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lse - safe)
    z = w.sum(axis=0) + (np.exp(sink - safe) if sink is not None else 0.0)
    with np.errstate(divide="ignore"):
        g = np.where(z > 0, safe + np.log(np.where(z > 0, z, 1.0)), -np.inf)
    wn = np.where(z[None] > 0, w / np.where(z > 0, z, 1.0)[None], 0.0)
    o = np.where(wn[..., None] > 0, np.nan_to_num(parts_o, nan=0.0) * wn[..., None], 0.0).sum(axis=0)
    return o, g


class NumpyImpl(mw.Implementation):
    name = "numpy"
    version = f"numpy {np.__version__}"
    contracts = ("mla_decode", "v4_decode", "dcp_combine", "split_merge")

    def __init__(self, mask, fault):
        self.mask, self.fault = mask, fault

    def capabilities(self):
        return {"page_sizes": [1, 64], "dtypes": ["bf16", "fp8"], "mask": self.mask, "sink": True}

    def load(self, contract, tensors, params, outputs):
        if self.fault == "refuse":
            raise mw.Refused("this worker refuses every case (--fault refuse)")
        if self.fault == "unsupported":
            raise mw.Unsupported("this worker's library cannot run any case (--fault unsupported)")
        self.contract, self.t, self.p = contract, {k: v for k, (_, v) in tensors.items()}, params
        self.dt = {k: d for k, (d, _) in tensors.items()}
        self.outputs = outputs
        self.cache = None

    def run(self, poison):
        f = self.fault
        if f == "crash":
            os._exit(3)
        if f == "hang":
            time.sleep(3600)
        outs = {o["name"]: (o["dtype"], mw.poisoned(o, poison)) for o in self.outputs}
        if f == "unwritten":
            return outs
        if self.cache is None:
            self.cache = getattr(self, "_" + self.contract)()
        o, lse = self.cache
        outs["o"][1][...] = mw.f32_to_bf16(o.astype(np.float32))
        outs["lse"][1][...] = lse.astype(np.float32)
        if f == "nan":
            outs["o"][1][...] = 0x7FC0
        if f == "wrong-shape":
            outs["o"] = ("BF16", outs["o"][1][:-1])
        if f == "protocol":
            self.channel.write("this line is not JSON\n")
            self.channel.flush()
        return outs

    def rows(self):
        """Query rows to compute: the ones mlabench checks (all of a real kernel's)."""
        return self.p.get("rows") or list(range(self.p.get("num_rows", 0)))

    def _mla_decode(self):
        t, p = self.t, self.p
        h, s_q, ps = p["heads"], p["s_q"], p["page_size"]
        fp8 = p["dtype"] == "fp8"
        dec = mw.e4m3_to_f32 if fp8 else mw.bf16_to_f32
        q = dec(np.asarray(t["q"]))
        pool = dec(np.asarray(t["kv_pool"])).reshape(-1, D_QK)
        qs, ks = (p["q_scale"], p["kv_scale"]) if fp8 else (1.0, 1.0)
        w, r, S = p["dcp"]["world"], p["dcp"]["rank"], p["dcp"]["interleave"]
        kv_indptr, kv_indices, lens = t["kv_indptr"], t["kv_indices"], t["kv_lens"]
        qo, g = t["qo_indptr"], t["g_kv_indptr"]
        tq = q.shape[0]
        o = np.zeros((tq, h, D_V))
        lse = np.full((tq, h), -np.inf)
        scale = p["sm_scale"] * qs * ks
        for row in self.rows():
            b = int(np.searchsorted(qo, row, side="right") - 1)
            i = row - int(qo[b])
            n = int(lens[b])
            j = np.arange(n)
            slots = kv_indices[kv_indptr[b] + j // ps].astype(np.int64) * ps + j % ps
            if self.mask == "global":
                glen = int(g[b + 1] - g[b])
                gpos = ((j // S) * w + r) * S + j % S
                keep = gpos <= glen - s_q + i
            else:
                keep = j < n - s_q + i + 1
            kv = pool[slots[keep]].astype(np.float64)
            s = (q[row].astype(np.float64) @ kv.T) * scale
            pr, l = softmax_rows(s)
            o[row] = pr @ kv[:, :D_V] * ks if kv.shape[0] else 0.0
            lse[row] = l
        return o, lse

    def _v4_rows(self, packed, rope):
        """Native FP8 rows [n, 512] bytes + rope [n, 64] bf16 -> [n, 512] f32."""
        nope = mw.e4m3_to_f32(packed[:, :V4_NOPE]).reshape(-1, 7, 64)
        scales = np.exp2(packed[:, V4_NOPE:V4_NOPE + 14:2].astype(np.float64) - 127.0)
        x = (nope * scales[:, :, None]).reshape(-1, V4_NOPE)
        return np.concatenate([x, mw.bf16_to_f32(rope)], axis=1)

    def _v4_decode(self):
        t, p = self.t, self.p
        h, n = p["heads"], p["num_rows"]
        qp, qr = np.asarray(t["q"]), np.asarray(t["q_rope"])
        pool, rope = np.asarray(t["unified_kv"]), np.asarray(t["unified_kv_rope"])
        indptr, idx, sink = t["kv_indptr"], t["kv_indices"], np.asarray(t["attn_sink"], dtype=np.float64)
        o = np.zeros((n, h, V4_D))
        lse = np.zeros((n, h))
        for row in self.rows():
            q = self._v4_rows(qp[row], qr[row])
            lst = idx[indptr[row]:indptr[row + 1]]
            kv = self._v4_rows(pool[lst], rope[lst]) if len(lst) else np.zeros((0, V4_D))
            s = (q @ kv.T) * p["sm_scale"]
            pr, l = softmax_rows(s, sink)
            o[row] = pr @ kv if kv.shape[0] else 0.0
            lse[row] = l
        return o, lse

    def _dcp_combine(self):
        po = mw.bf16_to_f32(np.asarray(self.t["o_parts"])).astype(np.float64)
        pl = np.asarray(self.t["lse_parts"], dtype=np.float64)
        o, lse = merge(po, pl)
        return o, lse

    def _split_merge(self):
        n, s, h = self.p["num_rows"], self.p["splits"], self.p["heads"]
        po = np.asarray(self.t["partial_o"], dtype=np.float64).reshape(n, s, h, V4_D).transpose(1, 0, 2, 3)
        pl = np.asarray(self.t["partial_lse"], dtype=np.float64).reshape(n, s, h).transpose(1, 0, 2)
        sink = np.broadcast_to(np.asarray(self.t["attn_sink"], dtype=np.float64), (n, h))
        return merge(po, pl, sink)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mask", choices=["local", "global"], default="global")
    ap.add_argument("--fault", default=os.environ.get("MLABENCH_NUMPY_FAULT", ""))
    a = ap.parse_args()
    impl = NumpyImpl(a.mask, a.fault)
    if a.fault == "version":
        mw.PROTOCOL = 99
    if a.fault in ("garbage", "short"):
        real = mw.write_safetensors

        def broken(path, tensors):
            real(path, tensors)
            if a.fault == "garbage":
                with open(path, "wb") as fh:
                    fh.write(b"this is not a safetensors file")
            else:
                with open(path, "r+b") as fh:
                    fh.truncate(os.path.getsize(path) // 2)
        mw.write_safetensors = broken
    mw.serve(impl)


if __name__ == "__main__":
    main()
