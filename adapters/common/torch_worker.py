"""What the PyTorch-based adapters share: the GPU's facts for the hello,
wire tensors to device tensors, and timing by CUDA events (or CUDA-graph
replays) as mlabench's `time` request asks for it."""
import numpy as np
import torch


def device_info():
    p = torch.cuda.get_device_properties(0)
    return {
        "name": p.name,
        "kind": "gpu",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


_DT = {"BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32, "I32": torch.int32,
       "U8": torch.uint8}


def to_device(dtype, arr):
    """A wire tensor (numpy storage of `dtype`) as a CUDA tensor of that dtype."""
    a = np.ascontiguousarray(arr)
    if a.dtype == np.uint16:  # bf16 bits: torch's uint16 has few kernels
        a = a.view(np.int16)
    return torch.from_numpy(a).cuda().view(_DT[dtype])


def from_device(t, wire_dtype):
    """A CUDA tensor as the numpy storage of `wire_dtype` (bf16 as uint16 bits)."""
    t = t.detach().contiguous()
    if wire_dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
    if wire_dtype == "F32":
        return t.to(torch.float32).cpu().numpy()
    raise ValueError(f"no wire form for {wire_dtype}")


def cuda_time(fn, req):
    """Samples (ms) of `fn` as mlabench asks: warm-up launches, then samples
    until both minimums are met, each behind an L2 flush when cold, timed
    by CUDA events around the call (around one graph replay of it with
    `graph`)."""
    flush = None
    if req.get("cold_l2", True):
        flush = torch.empty(int(req.get("l2_flush_bytes", 256 << 20)), dtype=torch.uint8, device="cuda")
    call = fn
    clock = "cuda-events"
    if req.get("graph"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        call = g.replay
        clock = "cuda-graph"
    for _ in range(int(req.get("warmup", 3))):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out, total = [], 0.0
    min_n, min_ms = int(req.get("min_samples", 10)), float(req.get("min_time_ms", 50.0))
    max_n = int(req.get("max_samples", 100000))
    while len(out) < min_n or total < min_ms:
        if flush is not None:
            flush.zero_()
        start.record()
        call()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        out.append(ms)
        total += ms
        if len(out) >= max_n:
            break
    return out, clock


def visible_counts(p, kv_lens, qo_indptr, mask):
    """Tokens each query row sees under `mask` (local: bottom-right on the
    rank's positions), for fixing rows a library leaves NaN when they see
    nothing: the contract gives them o = 0, lse = -inf."""
    s_q = p["s_q"]
    tq = int(qo_indptr[-1])
    vis = np.zeros(tq, dtype=np.int64)
    for b in range(len(kv_lens)):
        n = int(kv_lens[b])
        for i in range(s_q):
            vis[int(qo_indptr[b]) + i] = max(0, min(n, n - s_q + i + 1))
    return vis
