"""Device check + timing of the V4 kernels (v4_split + split_merge, hca_persist).

Runs on the H200 machine (torch + cupy there). Loads cubins built here by
kernels/dev/v4_nvrtc.py from $V4_CUBINS (default ./cubins), else compiles the
sources with cupy's NVRTC. Correctness: random inputs, NaN in unused pool rows
(and junk indices pointing at them around each row's list), offset kv_indptr,
NaN-poisoned outputs, f64 reference on the dequantized inputs (torch on GPU).
Timing: CUDA events, cold L2 (a 256 MB write between samples), median of N.

usage: python3 v4_check.py [--no-bench] [--ablate] [--profile] [--out DIR]
"""
import argparse, json, math, os, sys, time

import numpy as np
import torch
import cupy as cp

HERE = os.path.dirname(os.path.abspath(__file__))
KDIR = os.path.dirname(HERE)
DEV = torch.device("cuda")
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


# ---------------------------------------------------------------- kernels
def smem_bytes(hk):
    """v4::SMEM_BYTES of kernels/v4_core.cuh."""
    hg = min(hk, 64)
    nsl = 8 // (hg // min(hg, 32))
    return hg * 1040 + 2 * 32 * 1040 + 2 * 32 * 592 + nsl * hg * 40 * 4 + hg * 80 + hg * 12 + 1024


_MODS = {}


def module(name, src, defines):
    if name in _MODS:
        return _MODS[name]
    cub = os.path.join(os.environ.get("V4_CUBINS", os.path.join(HERE, "cubins")), name + ".cubin")
    if os.path.exists(cub):
        mod = cp.RawModule(path=cub)
    else:
        code = open(os.path.join(KDIR, src)).read()
        inc = os.environ.get("CUDA_INC", "/usr/local/cuda/include")
        mod = cp.RawModule(code=code, backend="nvrtc",
                           options=("--gpu-architecture=sm_90a", "-std=c++17", f"-I{KDIR}", f"-I{inc}", *defines))
    _MODS[name] = mod
    return mod


def kernel(name, src, defines, fn, smem):
    k = module(name, src, defines).get_function(fn)
    if smem:
        k.max_dynamic_shared_size_bytes = smem
    return k


def P(t):
    return np.uint64(0 if t is None else t.data_ptr())


class Kernels:
    def __init__(self, hca_name=None):
        self.split = {h: kernel(f"v4_split_h{h}", "v4_split.cu", [f"-DV4_HEADS={h}"], "v4_split", smem_bytes(h))
                      for h in (16, 32, 64, 128)}
        self.hca = kernel(hca_name or "hca_persist_h128", "hca_persist.cu", ["-DV4_HEADS=128"], "hca_persist",
                          smem_bytes(128))
        self.merge = kernel("v4_merge_dev", "dev/v4_merge_dev.cu", [], "split_merge", 0)

    def run_split(self, w, n, part_o, part_lse, split_indptr, rows):
        hk = w["hk"]
        self.split[hk]((max(hk // 64, 1), rows, n), (256, 1, 1),
                       (P(w["q_packed"]), P(w["q_rope"]), P(w["pool_packed"]), P(w["pool_rope"]),
                        P(w["kv_indptr"]), P(w["kv_indices"]), P(split_indptr), np.float32(w["sm_scale"]),
                        np.int32(rows), P(part_o), P(part_lse)), shared_mem=smem_bytes(hk))

    def run_merge(self, w, part_o, part_lse, split_indptr, rows, o, lse):
        self.merge((rows, 1, 1), (256, 1, 1),
                   (P(part_o), P(part_lse), P(split_indptr), P(w["sink"]), np.int32(rows), np.int32(w["hk"]),
                    P(o), P(lse)))

    def run_hca(self, w, n_rows, parts, ws, o, lse):
        self.hca((2, parts, 1), (256, 1, 1), hca_args(w, n_rows, parts, ws, o, lse), shared_mem=smem_bytes(128))


# ---------------------------------------------------------------- inputs
def quantize(src):
    """[n, 512] f32 -> packed u8 [n,512], rope bf16 [n,64], dequantized f32 [n,512] (SPEC section 2)."""
    n = src.shape[0]
    nope = src[:, :448].reshape(n, 7, 64)
    amax = nope.abs().amax(-1)
    e = torch.clamp(torch.ceil(torch.log2(torch.clamp(amax / 448.0, min=1e-4))) + 127, 0, 254)
    scale = torch.exp2(e - 127)
    q8 = (nope / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    packed = torch.zeros(n, 512, dtype=torch.uint8, device=src.device)
    packed[:, :448] = q8.view(torch.uint8).reshape(n, 448)
    eb = e.to(torch.uint8)
    packed[:, 448:462:2] = eb
    packed[:, 449:462:2] = eb
    rope = src[:, 448:].to(torch.bfloat16)
    vals = torch.empty(n, 512, dtype=torch.float32, device=src.device)
    vals[:, :448] = (q8.float() * scale[..., None]).reshape(n, 448)
    vals[:, 448:] = rope.float()
    return packed, rope, vals


def make_workload(hk, lens, t_pad, seed, heads=None, offset=13, q_std=1.0):
    """lens: lengths of rows 0..len(lens); rows len(lens)..t_pad are pad rows (length 0)."""
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    heads = heads or hk
    n = len(lens)
    total = int(sum(lens))
    n_nan = max(64, total // 16)
    prow = total + n_nan
    perm = torch.randperm(prow, generator=g, device=DEV).to(torch.int32)
    used, nanrows = perm[:total], perm[total:]
    src = torch.randn(prow, 512, generator=g, device=DEV)
    packed, rope, vals = quantize(src)
    packed[nanrows, :448] = 0x7F
    packed[nanrows, 448:] = 0
    rope[nanrows] = float("nan")
    vals[nanrows] = float("nan")
    # kv_indices: `offset` junk entries (NaN rows) before row 0 and 64 after the last row.
    pieces = [nanrows[torch.randint(0, n_nan, (offset,), generator=g, device=DEV)]]
    flat = [pieces[0]]
    ip = [offset]
    pos = 0
    for L in list(lens) + [0] * (t_pad - n):
        flat.append(used[pos:pos + L])
        pos += L
        ip.append(ip[-1] + L)
    flat.append(nanrows[torch.randint(0, n_nan, (64,), generator=g, device=DEV)])
    kv_indices = torch.cat(flat).contiguous()
    kv_indptr = torch.tensor(ip, dtype=torch.int32, device=DEV)
    qsrc = torch.randn(t_pad, hk, 512, generator=g, device=DEV) * q_std
    qsrc[n:] = 0
    qsrc[:, heads:] = 0
    qp, qr, qv = quantize(qsrc.reshape(-1, 512))
    sink = torch.randn(hk, generator=g, device=DEV) * 2.0
    sink[heads:] = 0
    return dict(hk=hk, n=n, t=t_pad, lens=list(lens) + [0] * (t_pad - n), q_packed=qp.reshape(t_pad, hk, 512).contiguous(),
                q_rope=qr.reshape(t_pad, hk, 64).contiguous(), q_vals=qv.reshape(t_pad, hk, 512),
                pool_packed=packed, pool_rope=rope.contiguous(), pool_vals=vals, kv_indptr=kv_indptr,
                kv_indices=kv_indices, sink=sink, sm_scale=512 ** -0.5)


def reference(w, rows):
    """f64 o [len(rows), hk, 512], lse [len(rows), hk] with the sink (empty row: o=0, lse=sink)."""
    ip = w["kv_indptr"].tolist()
    os_, ls_ = [], []
    sink = w["sink"].double()
    for i in rows:
        idx = w["kv_indices"][ip[i]:ip[i + 1]].long()
        k = w["pool_vals"][idx].double()
        q = w["q_vals"][i].double()
        s = (q @ k.T) * w["sm_scale"]
        m = torch.maximum(s.amax(1) if s.shape[1] else torch.full_like(sink, -math.inf), sink)
        e = torch.exp(s - m[:, None])
        den = e.sum(1) + torch.exp(sink - m)
        os_.append((e @ k) / den[:, None])
        ls_.append(m + torch.log(den))
    return torch.stack(os_), torch.stack(ls_)


def metrics(o, lse, ro, rl, atol=2e-2, rtol=2e-2):
    o = o.double()
    lse = lse.double()
    nonfin = (~torch.isfinite(o)).sum().item()
    od, rd = torch.nan_to_num(o, nan=1e30), ro
    diff = (od - rd).abs()
    mism = ((diff > atol) & (diff > rtol * rd.abs())).double().mean().item()
    cos = 1 - 2 * (od * rd).sum().item() / max((od * od + rd * rd).sum().item(), 1e-300)
    lf = torch.isfinite(rl)
    lse_ok_inf = bool(((lse == rl) | lf).all().item())
    lerr = (lse[lf] - rl[lf]).abs().max().item() if lf.any() else 0.0
    if torch.isnan(lse[lf]).any():
        lerr = math.inf
    ok = nonfin == 0 and cos < 1e-4 and mism <= 1e-3 and lerr <= 1e-3 and lse_ok_inf
    return ok, dict(cos_diff=cos, mismatch=mism, lse_max_abs=lerr, nonfinite=nonfin, max_abs=diff.max().item())


def split_table(t, n):
    return torch.arange(t + 1, dtype=torch.int32, device=DEV) * n


# ---------------------------------------------------------------- checks
RESULTS = []


def record(name, ok, m):
    RESULTS.append((name, ok, m))
    log(f"{'PASS' if ok else 'FAIL'} {name} " + " ".join(f"{k}={v:.3g}" for k, v in m.items()))


def check_split(K, hk, lens, t_pad, n, seed, sample=None):
    w = make_workload(hk, lens, t_pad, seed)
    rows = t_pad
    tab = split_table(t_pad, n)
    part_o = torch.full((t_pad * n, hk, 512), float("nan"), device=DEV)
    part_lse = torch.full((t_pad * n, hk), float("nan"), device=DEV)
    o = torch.full((t_pad, hk, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((t_pad, hk), float("nan"), device=DEV)
    K.run_split(w, n, part_o, part_lse, tab, rows)
    K.run_merge(w, part_o, part_lse, tab, rows, o, lse)
    torch.cuda.synchronize()
    rr = sample if sample is not None else list(range(t_pad))
    ro, rl = reference(w, rr)
    ok, m = metrics(o[rr], lse[rr], ro, rl)
    record(f"v4_split hk={hk} n={n} rows={t_pad} lens<={max(lens)}", ok, m)
    return w


def check_hca(K, lens, t_pad, parts, seed, n_rows=None, replays=1, sample=None, junk_tail=False):
    hk = 128
    n_rows = len(lens) if n_rows is None else n_rows
    ws = dict(o_acc=torch.full((2 * parts, hk, 512), float("nan"), device=DEV),
              lse_acc=torch.full((2 * parts, hk), float("nan"), device=DEV),
              counters=torch.zeros(max(t_pad, 1), dtype=torch.int32, device=DEV))
    allok = True
    for rep in range(replays):
        ls = list(lens)
        if rep:  # a replay with new lengths and contents (same buffers would be a graph replay)
            g = np.random.default_rng(seed + rep)
            ls = [int(x) for x in g.permutation(ls)]
        w = make_workload(hk, ls, t_pad, seed + 100 * rep)
        if junk_tail:  # eager N < T: rows past N have nonzero lengths the kernel must ignore
            ip = w["kv_indptr"]
            ip[n_rows + 1:] = ip[n_rows] + 7 * torch.arange(1, t_pad - n_rows + 1, device=DEV, dtype=torch.int32)
            ip.clamp_(max=w["kv_indices"].numel())
        o = torch.full((t_pad, hk, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
        lse = torch.full((t_pad, hk), float("nan"), device=DEV)
        K.run_hca(w, n_rows, parts, ws, o, lse)
        torch.cuda.synchronize()
        real = [i for i in range(n_rows) if w["lens"][i] > 0]
        rr = real if sample is None else [i for i in sample if w["lens"][i] > 0]
        ro, rl = reference(w, rr)
        ok, m = metrics(o[rr], lse[rr], ro, rl)
        untouched = [i for i in range(t_pad) if i >= n_rows or w["lens"][i] == 0]
        unw = bool(torch.isnan(o[untouched].float()).all().item() and torch.isnan(lse[untouched]).all().item()) if untouched else True
        cz = int(ws["counters"].abs().sum().item())
        m["unwritten_ok"] = float(unw)
        m["counters_sum"] = float(cz)
        ok = ok and unw and cz == 0
        allok &= ok
        record(f"hca_persist P={parts} rows={n_rows}/{t_pad} total={sum(ls[:n_rows])} rep={rep}", ok, m)
    return allok


def correctness(K):
    rng = np.random.default_rng(1)
    edge = [0, 1, 5, 31, 32, 33, 64, 127, 128, 129, 300]
    lens_a = edge + [int(x) for x in rng.integers(0, 400, 26)]
    check_split(K, 16, lens_a, 40, 1, 11)
    check_split(K, 16, lens_a, 40, 3, 12)
    check_split(K, 16, lens_a, 40, 16, 13)
    check_split(K, 32, lens_a, 40, 2, 14)
    check_split(K, 64, lens_a, 40, 5, 15)
    lens_d = edge + [int(x) for x in rng.integers(100, 2500, 9)]
    check_split(K, 128, lens_d, 22, 1, 16)
    check_split(K, 128, lens_d, 22, 4, 17)
    lens_e = [int(x) for x in rng.integers(128, 3000, 20)]
    lens_e[7] = 0
    check_hca(K, lens_e, 24, 128, 21, replays=2)
    check_hca(K, lens_e, 24, 7, 22)
    check_hca(K, lens_e, 24, 300, 23)
    check_hca(K, [int(x) for x in rng.integers(1, 6, 16)], 16, 128, 24)  # total < P
    check_hca(K, lens_e, 30, 128, 25, n_rows=15, junk_tail=True)      # eager N < T
    check_hca(K, [5000, 1, 2, 7000, 3], 5, 128, 26)                   # rows over many partitions
    check_hca(K, [256] * 8, 8, 8, 27)                                  # boundaries on row starts
    check_hca(K, [256] * 8, 8, 16, 28)                                 # two pieces, start == lo


# ---------------------------------------------------------------- timing
FLUSH = None


def cold():
    FLUSH.add_(1.0)  # 256 MB read+write evicts the 60 MB L2


def timeit(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        cold()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2], ts[len(ts) // 10], ts[(len(ts) * 9) // 10]


def ceilings():
    x = torch.empty(2 << 30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    x.random_()
    def cp_():
        y.copy_(x)
    med, _, _ = timeit(cp_, reps=10)
    bw = 2 * x.numel() / (med * 1e-6)
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    med2, _, _ = timeit(lambda: a @ b, reps=10)
    tf = 2 * 8192 ** 3 / (med2 * 1e-6)
    log(f"ceiling copy {bw / 1e12:.2f} TB/s (read+write), bf16 matmul {tf / 1e12:.0f} TFLOP/s")
    return bw, tf


def bench(K, label, hk, lens, splits, parts_list, bw, tf, seed=5):
    t = len(lens)
    w = make_workload(hk, lens, t, seed)
    tok = sum(lens)
    flop = 2 * hk * 1024 * tok
    byts = tok * 576 + t * hk * 576 + t * hk * (1024 + 4)
    rows_chk = list(range(0, t, max(1, t // 6)))
    ro, rl = reference(w, rows_chk)
    out = []
    o = torch.empty((t, hk, 512), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((t, hk), device=DEV)
    for n in splits:
        tab = split_table(t, n)
        po = torch.empty((t * n, hk, 512), device=DEV)
        pl = torch.empty((t * n, hk), device=DEV)
        k_only = timeit(lambda: K.run_split(w, n, po, pl, tab, t))
        whole = timeit(lambda: (K.run_split(w, n, po, pl, tab, t), K.run_merge(w, po, pl, tab, t, o, lse)))
        torch.cuda.synchronize()
        ok, m = metrics(o[rows_chk], lse[rows_chk], ro, rl)
        out.append((f"v4_split n={n}", whole, k_only, ok))
    if hk == 128:
        for parts in parts_list:
            ws = dict(o_acc=torch.empty((2 * parts, hk, 512), device=DEV), lse_acc=torch.empty((2 * parts, hk), device=DEV),
                      counters=torch.zeros(t, dtype=torch.int32, device=DEV))
            whole = timeit(lambda: K.run_hca(w, t, parts, ws, o, lse))
            torch.cuda.synchronize()
            ok, m = metrics(o[rows_chk], lse[rows_chk], ro, rl)
            ok = ok and int(ws["counters"].abs().sum().item()) == 0
            out.append((f"hca_persist P={parts}", whole, whole, ok))
    log(f"\n## {label}: hk={hk} rows={t} tokens={tok} mean_len={tok / t:.0f} FLOP={flop / 1e9:.1f}G bytes={byts / 1e6:.1f}MB")
    log(f"{'variant':22s} {'med_us':>9s} {'p10':>8s} {'p90':>8s} {'kern_us':>9s} {'TFLOP/s':>8s} {'%mm':>5s} {'GB/s':>7s} {'%bw':>5s} ok")
    for name, whole, k_only, ok in out:
        med = whole[0]
        log(f"{name:22s} {med:9.1f} {whole[1]:8.1f} {whole[2]:8.1f} {k_only[0]:9.1f} {flop / med / 1e6:8.1f} "
            f"{100 * flop / (med * 1e-6) / tf:5.1f} {byts / med / 1e3:7.0f} {100 * byts / (med * 1e-6) / bw:5.1f} {'ok' if ok else 'FAIL'}")
    return out


def ablate():
    """Times hca_persist builds from kernels/dev/v4_ablate.py: stages removed (results wrong on purpose)
    and the earlier partition-major grid order, on the same machine as the current build."""
    rng = np.random.default_rng(7)
    log("\n## ablations / grid order: hca_persist")
    for rows in (64, 256):
        lens = [int(x) for x in rng.integers(4096, 12289, rows)]
        w = make_workload(128, lens, rows, 5)
        o = torch.empty((rows, 128, 512), dtype=torch.bfloat16, device=DEV)
        lse = torch.empty((rows, 128), device=DEV)
        ws = dict(o_acc=torch.empty((264, 128, 512), device=DEV), lse_acc=torch.empty((264, 128), device=DEV),
                  counters=torch.zeros(rows, dtype=torch.int32, device=DEV))
        names = ("base", "partmajor", "nodq", "noload", "noqk", "nopv") if rows == 64 else ("base", "partmajor")
        for parts in (128, 132):
            for name in names:
                K = Kernels(hca_name=f"hca_persist_h128_{name}")
                if name == "partmajor":
                    run = lambda: K.hca((parts, 2, 1), (256, 1, 1), hca_args(w, rows, parts, ws, o, lse),
                                        shared_mem=smem_bytes(128))
                else:
                    run = lambda: K.run_hca(w, rows, parts, ws, o, lse)
                med, p10, p90 = timeit(run)
                ws["counters"].zero_()
                log(f"rows={rows} P={parts} {name:10s} {med:9.1f} us  (p10 {p10:.1f}, p90 {p90:.1f})")


def hca_args(w, n_rows, parts, ws, o, lse):
    return (P(w["q_packed"]), P(w["q_rope"]), P(w["pool_packed"]), P(w["pool_rope"]),
            P(w["kv_indptr"]), P(w["kv_indices"]), P(w["sink"]), np.float32(w["sm_scale"]),
            np.int32(n_rows), np.int32(parts), P(ws["o_acc"]), P(ws["lse_acc"]), P(ws["counters"]), P(o), P(lse))


def profile_one():
    rng = np.random.default_rng(7)
    lens = [int(x) for x in rng.integers(4096, 12289, 64)]
    w = make_workload(128, lens, 64, 5)
    o = torch.empty((64, 128, 512), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((64, 128), device=DEV)
    ws = dict(o_acc=torch.empty((264, 128, 512), device=DEV), lse_acc=torch.empty((264, 128), device=DEV),
              counters=torch.zeros(64, dtype=torch.int32, device=DEV))
    K = Kernels()
    for _ in range(2):
        K.run_hca(w, 64, 132, ws, o, lse)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--ablate", action="store_true", help="only the ablation timings")
    ap.add_argument("--profile", action="store_true", help="two hca_persist launches (for ncu)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    global FLUSH
    FLUSH = torch.zeros(64 << 20, device=DEV)
    if a.profile:
        return profile_one()
    if a.ablate:
        ablate()
        open(os.path.join(a.out, "v4_ablate.log"), "w").write("\n".join(LOG) + "\n")
        return
    t0 = time.time()
    log(torch.cuda.get_device_name(), torch.__version__, cp.__version__)
    K = Kernels()
    correctness(K)
    log(f"correctness: {sum(r[1] for r in RESULTS)}/{len(RESULTS)} pass ({time.time() - t0:.0f}s)")
    if not a.no_bench:
        bw, tf = ceilings()
        rng = np.random.default_rng(7)
        hca64 = [int(x) for x in rng.integers(4096, 12289, 64)]
        hca256 = [int(x) for x in rng.integers(4096, 12289, 256)]
        bench(K, "HCA 64 rows varied ~8k", 128, hca64, [1, 2, 3, 4, 6, 8], [128, 132, 264], bw, tf)
        bench(K, "HCA 256 rows varied ~8k", 128, hca256, [1, 2, 4], [128, 132, 264], bw, tf)
        bench(K, "SWA 256 rows len 128", 16, [128] * 256, [1, 2, 4], [], bw, tf)
        bench(K, "SWA 64 rows len 128", 16, [128] * 64, [1, 2, 4], [], bw, tf)
    open(os.path.join(a.out, "v4_check.log"), "w").write("\n".join(LOG) + "\n")
    log(f"done in {time.time() - t0:.0f}s; correctness {sum(r[1] for r in RESULTS)}/{len(RESULTS)}")
    for name, ok, m in RESULTS:
        if not ok:
            log("FAILED:", name)


if __name__ == "__main__":
    main()
