"""NVRTC through ctypes: compile kernels/*.cu for sm_90a the way the Rust
backend does (-I kernels -I <cuda include>, plus -D defines) and return the
cubin and the log. Used here (compile checks, ptxas stats) and on the device.

    python3 kernels/dev/nvrtc.py            # compile every supported config, print ptxas stats
"""
import ctypes
import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.dirname(HERE)


def _find(patterns):
    for p in patterns:
        hits = sorted(glob.glob(p))
        if hits:
            return hits[-1]
    return None


def _site_dirs():
    import site
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return dirs


def find_nvrtc():
    pats = [os.environ.get("NVRTC_LIB", "")]
    for d in _site_dirs():
        pats += [f"{d}/nvidia/cu13/lib/libnvrtc.so.13", f"{d}/nvidia/cuda_nvrtc/lib/libnvrtc.so.13"]
    pats += ["/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda*/lib64/libnvrtc.so.13",
             "/usr/local/cuda/lib64/libnvrtc.so"]
    lib = _find([p for p in pats if p])
    if not lib:
        raise RuntimeError("libnvrtc.so.13 not found (set NVRTC_LIB)")
    return lib


def find_include():
    pats = [os.environ.get("CUDA_INCLUDE", "")]
    pats += ["/usr/local/cuda/include", "/usr/local/cuda*/targets/x86_64-linux/include"]
    for d in _site_dirs():
        pats += [f"{d}/nvidia/cu13/include", f"{d}/nvidia/cuda_runtime/include"]
    for p in pats:
        if p and glob.glob(os.path.join(p, "cuda_bf16.h")):
            return glob.glob(os.path.join(p, "cuda_bf16.h"))[0].rsplit("/", 1)[0]
    raise RuntimeError("cuda_bf16.h not found (set CUDA_INCLUDE)")


class Nvrtc:
    def __init__(self):
        lib = find_nvrtc()
        # NVRTC dlopens its builtins by soname: load them from the same folder first.
        for b in sorted(glob.glob(os.path.join(os.path.dirname(lib), "libnvrtc-builtins.so*"))):
            if ".alt." not in b:
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(lib)
        self.inc = find_include()
        L = self.lib
        L.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        L.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        L.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        L.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        L.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcGetPTXSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        L.nvrtcGetPTX.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def compile(self, name, defines, ptxas_verbose=False, want_ptx=False, root=KERNELS):
        """Returns (cubin bytes or None, log, ptx or None). `root`: a kernels/ copy."""
        path = os.path.join(root, name)
        src = open(path, "rb").read()
        opts = ["--gpu-architecture=sm_90a", "-std=c++17", f"-I{root}", f"-I{self.inc}"]
        opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
        if ptxas_verbose:
            opts.append("--ptxas-options=-v")
        prog = ctypes.c_void_p()
        rc = self.lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None)
        assert rc == 0, rc
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        cubin = ptx = None
        if rc == 0:
            self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
            cb = ctypes.create_string_buffer(n.value)
            self.lib.nvrtcGetCUBIN(prog, cb)
            cubin = cb.raw
            if want_ptx:
                self.lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
                pb = ctypes.create_string_buffer(n.value)
                self.lib.nvrtcGetPTX(prog, pb)
                ptx = pb.value.decode()
        self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return cubin, log, ptx


def mla_defines(hk, fp8, mt, stages=None, cvt=None, warps=None, hoist=0):
    """The shipped shape (src/variants/kernels.rs `mla_shape`), with overrides.
    `hoist`: the HOIST define, which the host passes as 1 for fp8 (ps1 and page64)."""
    if mt == 1:
        d = {"WARPS": 16, "GROUPS": 2, "STAGES": 2, "QSMEM": 0 if fp8 else 1}
    else:
        d = {"WARPS": 8, "GROUPS": 1, "STAGES": 4, "QSMEM": 0}
    d.update({"HK": hk, "KV_FP8": int(fp8), "MT": mt, "BN": 64 if fp8 else 32})
    if warps is not None:  # one group of `warps` warps
        d.update({"WARPS": warps, "GROUPS": 1, "QSMEM": 0})
    if stages is not None:
        d["STAGES"] = stages
    if cvt is not None:
        d["FP8_CVT"] = cvt
    if hoist:
        d["HOIST"] = 1
    return d


def all_configs():
    """Every configuration `mlabench kernels --check` compiles, plus the
    one-group 8-warp MT=1 shape."""
    cfgs = []
    for fp8 in (0, 1):
        for hk in range(16, 129, 16):
            for mt, w in ((1, None), (1, 8), (2, None)):
                cfgs.append(("ps1.cu", dict(mla_defines(hk, fp8, mt, warps=w, hoist=fp8), LD_LINES=fp8, EARLY_Q=1)))
                cfgs.append(("page64.cu", mla_defines(hk, fp8, mt, warps=w, hoist=fp8)))
    cfgs.append(("merge.cu", {}))
    return cfgs


def main():
    nv = Nvrtc()
    cfgs = all_configs() if "--all" in sys.argv else [
        ("ps1.cu", mla_defines(16, 0, 1)), ("ps1.cu", mla_defines(16, 1, 1)),
        ("ps1.cu", mla_defines(96, 0, 2)), ("ps1.cu", mla_defines(96, 1, 2)),
        ("ps1.cu", mla_defines(16, 1, 1, cvt=1)), ("ps1.cu", mla_defines(16, 1, 2, stages=3)),
        ("ps1.cu", mla_defines(16, 1, 1, warps=8)), ("ps1.cu", mla_defines(16, 0, 1, warps=8)),
        ("page64.cu", mla_defines(16, 0, 1)), ("page64.cu", mla_defines(128, 1, 2, hoist=1)),
        ("merge.cu", {})]
    want_ptx = "--ptx" in sys.argv

    def one(c):
        name, d = c
        return c, nv.compile(name, d, ptxas_verbose=True, want_ptx=want_ptx)

    bad = 0
    with ThreadPoolExecutor(max_workers=int(os.environ.get("JOBS", "2"))) as ex:
        for (name, d), (cubin, log, ptx) in ex.map(one, cfgs):
            tag = f"{name} {d}"
            if cubin is None:
                bad += 1
                print(f"FAIL {tag}\n{log}")
                continue
            stats = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln or "Compiling" in ln]
            warn = [ln for ln in log.splitlines() if "warning" in ln.lower()]
            print(f"ok   {tag}: " + " | ".join(stats))
            for w in warn:
                print("   ", w)
            if ptx:
                out = os.path.join(HERE, ".out")
                os.makedirs(out, exist_ok=True)
                fn = os.path.join(out, name.replace(".cu", "") + "_" + "_".join(f"{k}{v}" for k, v in sorted(d.items())) + ".ptx")
                open(fn, "w").write(ptx)
    print(f"{len(cfgs) - bad}/{len(cfgs)} compiled")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
