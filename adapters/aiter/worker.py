#!/usr/bin/env python3
"""mlabench worker for aiter's MLA decode kernels (ROCm/aiter), the kernels
the seeds are about. Written against aiter's public source at commit
000edf30368dc91e66b46544cbf86694ca048b02 (aiter/mla.py, aiter/ops/attention.py),
and tested only against the stand-in in standin/: it has not run on AMD
hardware (README.md).

    python3 adapters/aiter/worker.py --kernel ps1|v4_asm|hca_persist

  ps1          mla_decode: aiter.mla.mla_decode_fwd with the persistent
               metadata (get_mla_metadata_info_v1 / get_mla_metadata_v1),
               fp8 a8w8 (per-tensor scales) and bf16, page sizes 1 and 64,
               and the DCP global-position arguments (g_kv_indptr,
               cp_world_size, cp_rank; interleave 1, the only round-robin
               aiter takes).
  v4_asm       v4_decode: aiter.mla.mla_decode_fwd_v4_nm, the V4 ASM decode,
               with the split plan mlabench builds (the uniform split table
               row, docs/v4-heuristic.md) passed as split_indptr.
  hca_persist  v4_decode: aiter.mla.mla_decode_fwd_v4_nm_ps, the persistent
               kernel that splits and merges on the GPU; 128 heads. It
               returns no LSE, and its declaration says so (caps.lse = false).

Tensors go through `xp`: torch on the GPU with the real aiter, numpy arrays
with the stand-in (its dtypes are numpy dtypes, so the same calls run).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import mlabench_worker as mw  # noqa: E402


class TorchXp:
    def __init__(self, torch):
        self.torch = torch
        self.dev = "cuda"

    def from_wire(self, arr, dtype):
        a = np.ascontiguousarray(arr)
        if a.dtype == np.uint16:  # bf16 bits: torch's uint16 has few kernels
            a = a.view(np.int16)
        return self.torch.from_numpy(a).to(self.dev).view(dtype)

    def i32(self, arr):
        return self.torch.from_numpy(np.ascontiguousarray(arr).astype(np.int32)).to(self.dev)

    def empty(self, shape, dtype):
        return self.torch.empty(shape, dtype=dtype, device=self.dev)

    def scalar_f32(self, x):
        return self.torch.tensor([x], dtype=self.torch.float32, device=self.dev)

    def fill_bits16(self, t, bits):
        t.view(self.torch.int16).fill_(int(bits))

    def host_bf16_bits(self, t):
        return t.detach().contiguous().view(self.torch.int16).cpu().numpy().view(np.uint16)

    def host_f32(self, t):
        return t.detach().contiguous().float().cpu().numpy()

    def sync(self):
        self.torch.cuda.synchronize()


class NumpyXp:
    """The stand-in's arrays: numpy, with aiter.dtypes' numpy dtypes."""

    def __init__(self, dtypes):
        self.dt = dtypes

    def from_wire(self, arr, dtype):
        return np.ascontiguousarray(arr).view(dtype).copy()

    def i32(self, arr):
        return np.ascontiguousarray(arr).astype(np.int32)

    def empty(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def scalar_f32(self, x):
        return np.array([x], dtype=np.float32)

    def fill_bits16(self, t, bits):
        t.view(np.uint16)[...] = bits

    def host_bf16_bits(self, t):
        return np.ascontiguousarray(t).view(np.uint16).copy()

    def host_f32(self, t):
        return np.asarray(t, dtype=np.float32).copy()

    def sync(self):
        pass


class Aiter(mw.Implementation):
    contracts = ("mla_decode", "v4_decode")

    def __init__(self, kernel):
        import aiter
        import aiter.mla
        self.aiter, self.kernel = aiter, kernel
        self.standin = getattr(aiter, "STANDIN", False)
        if self.standin:
            self.xp = NumpyXp(aiter.dtypes)
        else:
            import torch
            self.xp = TorchXp(torch)
            # The contract's fp8 bytes are OCP e4m3 (e4m3fn); gfx942's aiter
            # fp8 is e4m3fnuz, another encoding of the same bytes.
            if aiter.dtypes.fp8 != torch.float8_e4m3fn:
                raise SystemExit(f"aiter's fp8 here is {aiter.dtypes.fp8}; the contract's bytes are e4m3fn")
        self.name = f"aiter_{kernel}"
        self.version = f"aiter {getattr(aiter, '__version__', 'unknown')}"

    def device(self):
        if self.standin:
            return {"name": "host CPU (aiter stand-in)", "kind": "cpu"}
        import torch
        p = torch.cuda.get_device_properties(0)
        return {"name": p.name, "kind": "gpu", "l2_bytes": int(getattr(p, "L2_cache_size", 0))}

    def load(self, contract, tensors, params, outputs):
        self.contract, self.p, self.outputs = contract, params, outputs
        t = {k: v for k, (_, v) in tensors.items()}
        if contract == "mla_decode" and self.kernel == "ps1":
            self._load_ps1(t, params)
        elif contract == "v4_decode" and self.kernel in ("v4_asm", "hca_persist"):
            self._load_v4(t, params)
        else:
            raise mw.Refused(f"--kernel {self.kernel} does not implement {contract}")

    def _load_ps1(self, t, p):
        aiter, xp, dt = self.aiter, self.xp, self.aiter.dtypes
        h, s_q, ps = p["heads"], p["s_q"], p["page_size"]
        w, r, s = p["dcp"]["world"], p["dcp"]["rank"], p["dcp"]["interleave"]
        if w > 1 and s != 1:
            raise mw.Refused(f"aiter's round-robin DCP takes interleave 1, not {s}")
        fp8 = p["dtype"] == "fp8"
        qd = dt.fp8 if fp8 else dt.bf16
        self.q = xp.from_wire(t["q"], qd)
        self.kv = xp.from_wire(t["kv_pool"], qd).reshape(-1, ps, 1, 576)
        self.qo, self.kv_indptr = xp.i32(t["qo_indptr"]), xp.i32(t["kv_indptr"])
        self.kv_indices, self.last = xp.i32(t["kv_indices"]), xp.i32(t["kv_last_page_len"])
        batch = len(t["qo_indptr"]) - 1
        info = aiter.get_mla_metadata_info_v1(batch, s_q, h, qd, qd, is_sparse=False, fast_mode=True)
        meta, w_indptr, w_info, r_indptr, r_final, r_partial = [xp.empty(shape, d) for shape, d in info]
        aiter.get_mla_metadata_v1(
            self.qo, self.kv_indptr, self.last, h, 1, True,
            meta, w_info, w_indptr, r_indptr, r_final, r_partial,
            page_size=ps, kv_granularity=max(ps, 16), max_seqlen_qo=s_q, uni_seqlen_qo=s_q,
            fast_mode=True, is_cp_round_robin=w > 1, dtype_q=qd, dtype_kv=qd)
        kw = dict(work_meta_data=meta, work_indptr=w_indptr, work_info_set=w_info, reduce_indptr=r_indptr,
                  reduce_final_map=r_final, reduce_partial_map=r_partial)
        if fp8:
            kw.update(q_scale=xp.scalar_f32(p["q_scale"]), kv_scale=xp.scalar_f32(p["kv_scale"]))
        if w > 1:
            kw.update(g_kv_indptr=xp.i32(t["g_kv_indptr"]), cp_world_size=w, cp_rank=r)
        self.o = xp.empty((len(t["q"]), h, 512), dt.bf16)
        self.call = lambda: aiter.mla.mla_decode_fwd(
            self.q, self.kv, self.o, self.qo, self.kv_indptr, self.kv_indices, self.last, s_q,
            page_size=ps, nhead_kv=1, sm_scale=p["sm_scale"], return_lse=True, causal=True, **kw)

    def _load_v4(self, t, p):
        aiter, xp, dt = self.aiter, self.xp, self.aiter.dtypes
        h, n = p["heads"], p["num_rows"]
        if abs(p["sm_scale"] - 512 ** -0.5) > 1e-9:
            raise mw.Refused("aiter's V4 kernels fix the softmax scale at 1/sqrt(512)")
        if self.kernel == "hca_persist" and h != 128:
            raise mw.Refused("mla_decode_fwd_v4_nm_ps runs 128 heads")
        self.q = xp.from_wire(t["q"][:n], dt.fp8)
        self.qr = xp.from_wire(t["q_rope"][:n], dt.bf16)
        self.pool = xp.from_wire(t["unified_kv"], dt.fp8)
        self.rope = xp.from_wire(t["unified_kv_rope"], dt.bf16)
        indptr = np.asarray(t["kv_indptr"][:n + 1])
        self.kv_indptr, self.kv_indices = xp.i32(indptr), xp.i32(t["kv_indices"])
        self.sink_np = np.asarray(t["attn_sink"], dtype=np.float32)
        self.sink = xp.from_wire(self.sink_np, dt.fp32)
        self.lens = indptr[1:] - indptr[:-1]
        self.o = xp.empty((n, h, 512), dt.bf16)
        rows = self.pool.shape[0]
        if self.kernel == "v4_asm":
            ns = int(p["splits"])
            qo = xp.i32(np.arange(n + 1))
            split_indptr = xp.i32(np.arange(n + 1) * ns)
            self.call = lambda: aiter.mla.mla_decode_fwd_v4_nm(
                self.q, self.qr, self.pool.reshape(rows, 1, 1, 512), self.rope.reshape(rows, 1, 1, 64),
                self.o, qo, self.kv_indptr, self.kv_indices, 1,
                sink=self.sink, split_indptr=split_indptr, num_kv_splits=ns)
        else:
            ws = aiter.mla.get_mla_v4_nm_ps_workspace(None if self.standin else "cuda", num_partitions=128)

            def call():
                aiter.mla.mla_decode_fwd_v4_nm_ps(self.q, self.qr, self.pool, self.rope, self.kv_indptr,
                                                  self.kv_indices, self.sink, ws, out=self.o)
                return None, None
            self.call = call

    def run(self, poison):
        xp = self.xp
        if poison:
            xp.fill_bits16(self.o, poison["bf16"])
        _, lse = self.call()
        xp.sync()
        o = xp.host_bf16_bits(self.o)
        if self.contract == "mla_decode":
            l = xp.host_f32(lse)
        elif lse is not None:
            # Per-split LSEs with the sink folded into one split (aiter's
            # docstring): the merged LSE is their log-sum-exp over the splits
            # that hold tokens. A row without tokens: o = 0, lse = sink.
            parts = xp.host_f32(lse)[..., 0]
            parts = np.where(np.isnan(parts) | (parts == np.inf), -np.inf, parts)
            m = parts.max(axis=1)
            safe = np.where(np.isfinite(m), m, 0.0)
            with np.errstate(divide="ignore"):
                l = (safe + np.log(np.exp(parts - safe[:, None]).sum(axis=1))).astype(np.float32)
            empty = self.lens == 0
            o[empty] = 0
            l[empty] = self.sink_np[None, :]
        else:
            l = None
        outs = {}
        for spec in self.outputs:
            if spec["name"] == "o":
                outs["o"] = ("BF16", o)
            elif l is None:
                raise mw.Refused("this kernel returns no LSE; its declaration needs caps.lse = false")
            else:
                outs["lse"] = ("F32", l)
        return outs

    def time(self, req):
        if self.standin:
            return super().time(req)
        import torch_worker
        return torch_worker.cuda_time(self.call, req)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=["ps1", "v4_asm", "hca_persist"], required=True)
    mw.serve(Aiter(ap.parse_args().kernel))


if __name__ == "__main__":
    main()
