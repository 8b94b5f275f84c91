"""Builds timing-only variants of hca_persist with one stage removed (results
are wrong on purpose) to place the time inside the kernel, plus the earlier
partition-major grid order for comparison; v4_check.py --ablate times them. usage: python3 kernels/dev/v4_ablate.py [outdir]"""
import ctypes, os, shutil, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_nvrtc  # noqa: E402

PATCHES = {
    "base": [],
    "nodq": [("    dequant_tile(sm, (i + 1) & 1);\n", "")],
    "noload": [("    issue_tile(sm, s, i & 1, idx_next, (i + 2) * BN + tk < ntok);\n", "")],
    "noqk": [("mma_bf16(sc[mt][2 * nb]", "if (false) mma_bf16(sc[mt][2 * nb]"),
             ("mma_bf16(sc[mt][2 * nb + 1]", "if (false) mma_bf16(sc[mt][2 * nb + 1]")],
    # the earlier grid order (P, HK/64): a partition's two head groups in different waves
    "partmajor": [("const int h0 = blockIdx.x * HG, p = blockIdx.y;", "const int h0 = blockIdx.y * HG, p = blockIdx.x;"),
                  ("static_cast<int>(gridDim.x);", "static_cast<int>(gridDim.y);")],
    "nopv": [("mma_bf16(acc.o[mt][2 * nd]", "if (false) mma_bf16(acc.o[mt][2 * nd]"),
             ("mma_bf16(acc.o[mt][2 * nd + 1]", "if (false) mma_bf16(acc.o[mt][2 * nd + 1]")],
}


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/v4_build"
    os.makedirs(outdir, exist_ok=True)
    nv = ctypes.CDLL(v4_nvrtc.LIB)
    core = open(os.path.join(v4_nvrtc.KDIR, "v4_core.cuh")).read()
    for name, pats in PATCHES.items():
        tmp = tempfile.mkdtemp()
        src = core
        hca = open(os.path.join(v4_nvrtc.KDIR, "hca_persist.cu")).read()
        for a, b in pats:
            assert a in src or a in hca, (name, a)
            src = src.replace(a, b)
            hca = hca.replace(a, b)
        open(os.path.join(tmp, "v4_core.cuh"), "w").write(src)
        open(os.path.join(tmp, "hca_persist.cu"), "w").write(hca)
        old = v4_nvrtc.KDIR
        v4_nvrtc.KDIR = tmp
        ok, log = v4_nvrtc.compile_one(nv, f"hca_persist_h128_{name}", "hca_persist.cu", ["-DV4_HEADS=128"], outdir)
        v4_nvrtc.KDIR = old
        regs = [l.strip() for l in log.splitlines() if "registers" in l or "spill" in l]
        print(name, "ok" if ok else "FAILED", regs)
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
