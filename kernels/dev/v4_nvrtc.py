"""Compile the V4 kernels with NVRTC (no GPU needed): logs, ptxas -v, PTX and cubin.

usage: python3 kernels/dev/v4_nvrtc.py [outdir]   (writes <outdir>/<name>.cubin/.ptx)
Finds libnvrtc via $NVRTC_LIB or the pip nvidia-cu13 wheel; include dir via $CUDA_INC.
"""
import ctypes, os, sys, glob

SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13"
LIB = os.environ.get("NVRTC_LIB", SITE + "/lib/libnvrtc.so.13")
INC = os.environ.get("CUDA_INC", SITE + "/include")
HERE = os.path.dirname(os.path.abspath(__file__))
KDIR = os.path.dirname(HERE)

# (output name, source file, defines)
CONFIGS = [(f"v4_split_h{h}", "v4_split.cu", [f"-DV4_HEADS={h}"]) for h in (16, 32, 64, 128)]
CONFIGS += [("hca_persist_h128", "hca_persist.cu", ["-DV4_HEADS=128"])]
CONFIGS += [("v4_merge_dev", "dev/v4_merge_dev.cu", [])]


def compile_one(nv, name, src, defs, outdir, extra=()):
    code = open(os.path.join(KDIR, src), "rb").read()
    prog = ctypes.c_void_p()
    r = nv.nvrtcCreateProgram(ctypes.byref(prog), code, src.encode(), 0, None, None)
    assert r == 0, r
    opts = ["--gpu-architecture=sm_90a", "-std=c++17", f"-I{KDIR}", f"-I{INC}", "-Xptxas", "-v", *defs, *extra]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = nv.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    ok = r == 0
    if ok:
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        cub = ctypes.create_string_buffer(n.value)
        nv.nvrtcGetCUBIN(prog, cub)
        open(os.path.join(outdir, name + ".cubin"), "wb").write(cub.raw)
        nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        nv.nvrtcGetPTX(prog, ptx)
        open(os.path.join(outdir, name + ".ptx"), "wb").write(ptx.value)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return ok, text


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/v4_build"
    os.makedirs(outdir, exist_ok=True)
    nv = ctypes.CDLL(LIB)
    bad = 0
    for name, src, defs in CONFIGS:
        ok, log = compile_one(nv, name, src, defs, outdir)
        print(f"== {name}: {'ok' if ok else 'FAILED'}")
        for line in log.splitlines():
            if any(k in line for k in ("error", "warning", "registers", "spill", "stack", "Compiling entry")):
                print("  ", line.strip())
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
