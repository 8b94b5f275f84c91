#!/usr/bin/env python3
"""Compile kernels/<file>.cu with NVRTC (ctypes, no GPU) and print the log.

Development aid only; the Rust build does not need it.

  python3 kernels/dev/nvrtc_check.py probe.cu [-DNAME=VALUE ...] [--ptx out.ptx] [--verbose]

Finds libnvrtc via $MLABENCH_NVRTC_LIB or the pip package nvidia-cuda-nvrtc
(nvidia/cu13/lib), and headers via $MLABENCH_CUDA_INCLUDE or nvidia/cu13/include.
--verbose passes -Xptxas -v so the log carries registers / spills per kernel.
"""
import ctypes
import os
import sys


def cu13_dir():
    import nvidia  # namespace package from the pip wheels

    for p in nvidia.__path__:
        d = os.path.join(p, "cu13")
        if os.path.isdir(d):
            return d
    raise SystemExit("nvidia/cu13 not found; pip install nvidia-cuda-nvrtc==13.0.88")


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src_name = args[0]
    defines = [a for a in args[1:] if a.startswith("-D")]
    ptx_out = args[args.index("--ptx") + 1] if "--ptx" in args else None
    lib = os.environ.get("MLABENCH_NVRTC_LIB") or os.path.join(cu13_dir(), "lib", "libnvrtc.so.13")
    inc = os.environ.get("MLABENCH_CUDA_INCLUDE") or os.path.join(cu13_dir(), "include")
    # NVRTC dlopens its builtins by soname; load them first by path so that
    # no LD_LIBRARY_PATH is needed.
    libdir = os.path.dirname(lib)
    for f in sorted(os.listdir(libdir)):
        if f.startswith("libnvrtc-builtins.so."):
            ctypes.CDLL(os.path.join(libdir, f), mode=ctypes.RTLD_GLOBAL)
    nv = ctypes.CDLL(lib)
    src = open(os.path.join(kernels, src_name), "rb").read()
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, src_name.encode(), 0, None, None) == 0
    opts = ["--gpu-architecture=sm_90a", "-std=c++17", "-I" + kernels, "-I" + inc] + defines
    if "--verbose" in args:
        opts += ["-Xptxas", "-v"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    print(log.value.decode(errors="replace"))
    if rc == 0 and ptx_out:
        nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        nv.nvrtcGetPTX(prog, buf)
        open(ptx_out, "wb").write(buf.value)
    if rc == 0:
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        print(f"{src_name} {' '.join(defines)}: OK, cubin {n.value} bytes")
    else:
        print(f"{src_name} {' '.join(defines)}: FAILED (nvrtc {rc})")
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
