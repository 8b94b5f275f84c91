"""What the PyTorch-based adapters share: the GPU's facts for the hello,
wire tensors to device tensors, and timing by CUDA events (or CUDA-graph
replays) as mlabench's `time` request asks for it."""
import math
import time

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


def median_noise(ms):
    """mlabench's stats::median_noise: the relative half-width of the
    binomial 95% interval of the median, from the order statistics at
    n/2 -+ 1.96 sqrt(n)/2."""
    n = len(ms)
    if n < 2:
        return math.inf
    s = sorted(ms)
    h = 1.959964 * math.sqrt(n) / 2.0
    lo = min(max(math.floor(n / 2.0 - h), 1) - 1, n - 1)
    hi = min(max(math.ceil(n / 2.0 + h), 1), n) - 1
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    if med == 0 or not math.isfinite(med):
        return math.inf
    return (s[hi] - s[lo]) / 2.0 / abs(med)


def cuda_time(fn, req):
    """Samples (ms) of `fn` as mlabench asks: warm-up launches, then samples
    until `min_samples` and `min_time_ms` are in and the median's noise is
    at most `target_noise` (when given), or `max_time_ms` of wall clock is
    spent. Each sample is behind an L2 flush when cold and timed by CUDA
    events around the call (around one graph replay of it with `graph`).
    Samples are queued in batches and read after one wait, as mlabench's
    own timer does (one at a time for calls under 20 us)."""
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
    min_n, min_ms = int(req.get("min_samples", 10)), float(req.get("min_time_ms", 0.0))
    max_n = int(req.get("max_samples", 100000))
    target = req.get("target_noise")
    max_wall = float(req.get("max_time_ms", 1000.0)) / 1e3
    out, total, t0 = [], 0.0, time.monotonic()

    def more():
        n = len(out)
        if n < min_n:
            return True
        if n >= max_n or time.monotonic() - t0 >= max_wall:
            return False
        if total < min_ms:
            return True
        return target is not None and median_noise(out) > float(target)

    events = []
    sampling = req.get("sampling", "auto")
    one_by_one = sampling == "serial"
    while more():
        n = len(out)
        if one_by_one:
            batch = 1
        else:
            batch = min(min_n - n, 256) if n < min_n else max(1, min(n // 4, 256))
        while len(events) < batch:
            events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        for start, end in events[:batch]:
            if flush is not None:
                flush.zero_()
            start.record()
            call()
            end.record()
        for start, end in events[:batch]:
            end.synchronize()
            ms = start.elapsed_time(end)
            out.append(ms)
            total += ms
        # As mlabench's timer: a call under 20 us runs slower back to back,
        # so such calls start over one sample at a time.
        if sampling == "auto" and not one_by_one and not req.get("graph") and sorted(out)[len(out) // 2] < 0.02:
            one_by_one, out, total = True, [], 0.0
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
