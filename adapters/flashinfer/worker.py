#!/usr/bin/env python3
"""mlabench worker for FlashInfer's MLA decode (flashinfer-python,
BatchMLAPagedAttentionWrapper, backend fa3).

  mla_decode: bf16 Q with bf16 KV, or bf16 Q with e4m3 KV and per-tensor
              scales; page sizes 1 and 64; bottom-right causal mask on the
              rank's local positions when s_q > 1.

The contract's fp8 case is e4m3 Q and KV with per-tensor scales. FlashInfer
takes bf16 Q: e4m3 values are exact in bf16, so Q is passed as its e4m3
values and q_scale joins the softmax scale; kv_scale is FlashInfer's
ckv_scale and kpe_scale (true value = e4m3 x scale). Outputs are written
into mlabench's poisoned buffers (`out=`, `lse=`), so an element the kernel
leaves unwritten fails the check.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import mlabench_worker as mw  # noqa: E402


class FlashInfer(mw.Implementation):
    name = "flashinfer"
    contracts = ("mla_decode",)

    def __init__(self):
        import torch
        import flashinfer
        from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata
        import torch_worker
        self.torch, self.tw = torch, torch_worker
        self.W, self.M = BatchMLAPagedAttentionWrapper, MLAPlanMetadata
        self.version = f"FlashInfer {flashinfer.__version__} fa3"
        self.ws = torch.empty(1 << 30, dtype=torch.int8, device="cuda")

    def device(self):
        return self.tw.device_info()

    def capabilities(self):
        return {"page_sizes": [1, 64], "dtypes": ["bf16", "fp8"], "mask": "local"}

    def load(self, contract, tensors, params, outputs):
        if contract != "mla_decode":
            raise mw.Refused(f"FlashInfer's MLA wrapper has no {contract}")
        torch, tw = self.torch, self.tw
        self.p, self.outputs = params, outputs
        t = {k: v for k, (_, v) in tensors.items()}
        h, ps = params["heads"], params["page_size"]
        fp8 = params["dtype"] == "fp8"
        tq = int(np.asarray(t["qo_indptr"])[-1])
        if fp8:
            # e4m3 -> bf16 is exact; the q scale moves into the softmax scale.
            q = torch.from_numpy(np.ascontiguousarray(t["q"])).cuda().view(torch.float8_e4m3fn).to(torch.bfloat16)
            sm_scale = params["sm_scale"] * params["q_scale"]
            pool = tw.to_device("F8_E4M3", t["kv_pool"])
            self.kw = {"ckv_scale": float(params["kv_scale"]), "kpe_scale": float(params["kv_scale"])}
        else:
            q = tw.to_device("BF16", t["q"])
            sm_scale = params["sm_scale"]
            pool = tw.to_device("BF16", t["kv_pool"])
            self.kw = {}
        self.q = q.view(tq, h, 576)
        self.pool = pool.view(-1, ps, 576)
        dev = lambda k: torch.from_numpy(np.ascontiguousarray(t[k]).astype(np.int32)).cuda()  # noqa: E731
        self.meta = (dev("qo_indptr"), dev("kv_indptr"), dev("kv_indices"), dev("kv_lens"))
        self.w = self.W(self.ws, backend="fa3")
        try:
            self.w.plan(metadata=self.M.csr(*self.meta), num_heads=h, head_dim_ckv=512, head_dim_kpe=64,
                        page_size=ps, causal=params["s_q"] > 1, sm_scale=sm_scale, q_data_type=torch.bfloat16,
                        kv_data_type=self.pool.dtype, lse_mode="basee")
        except Exception as e:
            # The planner's own verdict on shapes its kernels cannot run.
            if type(e).__name__ == "_BackendPlanUnsupportedError":
                raise mw.Unsupported(f"FlashInfer fa3: {e}") from e
            raise
        self.o = torch.empty(tq, h, 512, dtype=torch.bfloat16, device="cuda")
        self.lse = torch.empty(tq, h, dtype=torch.float32, device="cuda")
        self.vis = tw.visible_counts(params, np.asarray(t["kv_lens"]), np.asarray(t["qo_indptr"]), "local")
        self.call = lambda: self.w.run(query=self.q, kv_cache=self.pool, out=self.o, lse=self.lse,
                                       return_lse=True, return_lse_base_on_e=True, **self.kw)
        self.call()
        torch.cuda.synchronize()

    def run(self, poison):
        torch = self.torch
        if poison:
            # Both patterns are positive as signed integers (quiet NaNs).
            self.o.view(torch.int16).fill_(int(poison["bf16"]))
            self.lse.view(torch.int32).fill_(int(poison["f32"]))
        self.call()
        torch.cuda.synchronize()
        # bf16 stays bf16: a float round trip would turn the poison NaN into
        # a canonical one.
        o, lse = self.o.clone(), self.lse.clone()
        # Rows that see no token: the contract's o = 0, lse = -inf, whatever
        # the library leaves there.
        empty = torch.from_numpy(self.vis == 0).cuda()
        o[empty] = 0.0
        lse[empty] = float("-inf")
        return {s["name"]: (s["dtype"], self.tw.from_device(o if s["name"] == "o" else lse, s["dtype"]))
                for s in self.outputs}

    def time(self, req):
        return self.tw.cuda_time(self.call, req)

    def unload(self):
        for k in ("q", "pool", "meta", "w", "o", "lse", "call"):
            self.__dict__.pop(k, None)
        self.torch.cuda.empty_cache()


if __name__ == "__main__":
    mw.serve(FlashInfer())
