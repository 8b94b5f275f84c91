#!/usr/bin/env python3
"""mlabench worker for FlashMLA (deepseek-ai/FlashMLA, SM90).

  mla_decode: flash_mla_with_kvcache + get_mla_metadata, dense decode: bf16
              Q and KV, page size 64, bottom-right causal mask on the rank's
              local positions when s_q > 1.
  v4_decode:  the same call on FlashMLA's DeepSeek-V4 sparse FP8 format
              (MODEL1: d_qk 512, is_fp8_kvcache, indices + topk_length,
              attn_sink), 64 or 128 heads, bf16 Q holding the exact
              dequantized contract Q, the pool repacked byte for byte
              (model1.py). FlashMLA's LSE leaves the sink out and an empty
              row reads +inf: the contract's is logaddexp(lse, sink), and
              an empty row has o = 0, lse = sink.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, HERE)
import mlabench_worker as mw  # noqa: E402
import model1  # noqa: E402


class FlashMLA(mw.Implementation):
    name = "flashmla"
    contracts = ("mla_decode", "v4_decode")

    def __init__(self):
        import torch
        import flash_mla
        self.torch, self.fm = torch, flash_mla
        import torch_worker
        self.tw = torch_worker
        self.version = f"FlashMLA {getattr(flash_mla, '__version__', 'source build')}"

    def device(self):
        return self.tw.device_info()

    def capabilities(self):
        return {"mla_decode": {"page_sizes": [64], "dtypes": ["bf16"], "mask": "local"},
                "v4_decode": {"heads": [64, 128], "sink": True}}

    def load(self, contract, tensors, params, outputs):
        torch = self.torch
        self.contract, self.p, self.outputs = contract, params, outputs
        t = {k: v for k, (_, v) in tensors.items()}
        if contract == "mla_decode":
            if params["dtype"] != "bf16":
                raise mw.Refused("FlashMLA's dense decode takes bf16 Q and KV only")
            if params["page_size"] != 64:
                raise mw.Refused("FlashMLA's dense decode takes page size 64 only")
            b, s_q, h = params["batch"], params["s_q"], params["heads"]
            self.q = self.tw.to_device("BF16", t["q"]).view(b, s_q, h, 576)
            pool = self.tw.to_device("BF16", t["kv_pool"])
            self.kc = pool.view(pool.shape[0], 64, 1, 576)
            indptr, indices = np.asarray(t["kv_indptr"]), np.asarray(t["kv_indices"])
            npages = indptr[1:] - indptr[:-1]
            table = np.zeros((b, max(1, int(npages.max(initial=0)))), dtype=np.int32)
            for i in range(b):
                table[i, :npages[i]] = indices[indptr[i]:indptr[i + 1]]
            self.table = torch.from_numpy(table).cuda()
            self.lens_np = np.asarray(t["kv_lens"]).astype(np.int32)
            self.lens = torch.from_numpy(self.lens_np).cuda()
            self.vis = self.tw.visible_counts(params, self.lens_np, np.asarray(t["qo_indptr"]), "local")
            self.sched, _ = self.fm.get_mla_metadata()
            self.call = lambda: self.fm.flash_mla_with_kvcache(
                self.q, self.kc, self.table, self.lens, 512, self.sched, None,
                softmax_scale=params["sm_scale"], causal=s_q > 1)
        elif contract == "v4_decode":
            h, n = params["heads"], params["num_rows"]
            if h not in (64, 128):
                raise mw.Refused("FlashMLA's sparse decode takes 64 or 128 heads")
            q = model1.dequant_q(np.asarray(t["q"][:n]), np.asarray(t["q_rope"][:n]), mw.E4M3)
            self.q = torch.from_numpy(q).cuda().to(torch.bfloat16).view(n, 1, h, 512)
            buf, nb, stride = model1.repack(np.asarray(t["unified_kv"]), np.asarray(t["unified_kv_rope"]))
            raw = torch.from_numpy(buf).cuda()
            self._raw = raw
            self.kv = raw.view(torch.float8_e4m3fn).as_strided((nb, 64, 1, 584), (stride, 584, 584, 1))
            idx, lens = model1.lists(np.asarray(t["kv_indptr"]), np.asarray(t["kv_indices"]), n)
            self.idx = torch.from_numpy(idx).cuda().view(n, 1, -1)
            self.lens_np = lens
            self.lens = torch.from_numpy(lens).cuda()
            self.sink = torch.from_numpy(np.asarray(t["attn_sink"], dtype=np.float32)).cuda()
            self.sched, _ = self.fm.get_mla_metadata()
            self.call = lambda: self.fm.flash_mla_with_kvcache(
                self.q, self.kv, None, None, 512, self.sched, None,
                softmax_scale=params["sm_scale"], causal=False, is_fp8_kvcache=True,
                indices=self.idx, attn_sink=self.sink, topk_length=self.lens)
        else:
            raise mw.Refused(f"FlashMLA has no {contract}")
        # The first call fills the scheduler metadata; later calls reuse it
        # (the lengths stay the same within a case).
        self.call()
        torch.cuda.synchronize()

    def run(self, poison):
        torch = self.torch
        out, lse = self.call()
        torch.cuda.synchronize()
        if self.contract == "mla_decode":
            b, s_q, h = self.p["batch"], self.p["s_q"], self.p["heads"]
            o = out.reshape(b * s_q, h, 512).clone()
            l = lse.reshape(b, h, s_q).permute(0, 2, 1).reshape(b * s_q, h).float()
            empty = torch.from_numpy(self.vis == 0).cuda()
            o[empty] = 0.0
            l[empty] = float("-inf")
        else:
            n, h = self.p["num_rows"], self.p["heads"]
            o = out.reshape(n, h, 512).clone()
            l = lse.reshape(n, h).float()
            l = torch.logaddexp(l, self.sink[None, :])
            empty = torch.from_numpy(self.lens_np == 0).cuda()
            o[empty] = 0.0
            l[empty] = self.sink[None, :].expand(int(empty.sum()), h)
        # FlashMLA allocates its outputs: they are copied whole into the
        # poisoned buffers, so an element it leaves unwritten is not caught.
        outs = {}
        for spec in self.outputs:
            buf = mw.poisoned(spec, poison)
            src = o if spec["name"] == "o" else l
            buf[...] = self.tw.from_device(src, spec["dtype"])
            outs[spec["name"]] = (spec["dtype"], buf)
        return outs

    def time(self, req):
        return self.tw.cuda_time(self.call, req)

    def unload(self):
        for k in ("q", "kc", "kv", "_raw", "idx", "table", "lens", "sink", "sched", "call"):
            self.__dict__.pop(k, None)
        self.torch.cuda.empty_cache()


if __name__ == "__main__":
    mw.serve(FlashMLA())
