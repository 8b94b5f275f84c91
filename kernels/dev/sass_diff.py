"""Is one kernel entry the same machine code in two kernels dirs? Compiles
FILE with each dir's own nvrtc.py (the shipped defines, HK 16, bf16 and
fp8, MT 1 and 2), disassembles with nvdisasm and compares the entry's
.text section with label numbers normalised. Tells device drift from a
kernel change when a row moves between two reports.

    python3 kernels/dev/sass_diff.py OLD_KERNELS NEW_KERNELS page64.cu page64_fwd
    (old dir e.g. from `git archive REV kernels | tar x -C /tmp/old`)
Env: NVDISASM (default: next to pip's nvidia/cu13 libnvrtc, else PATH).
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile


def load(kdir):
    spec = importlib.util.spec_from_file_location(f"nvrtc_{abs(hash(kdir))}", os.path.join(kdir, "dev", "nvrtc.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def nvdisasm():
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    import nvidia
    for d in nvidia.__path__:
        p = os.path.join(d, "cu13", "bin", "nvdisasm")
        if os.path.exists(p):
            return p
    return shutil.which("nvdisasm") or sys.exit("nvdisasm not found: set NVDISASM")


def entry_text(kdir, file, entry, fp8, mt, extra=None):
    """The nvdisasm text of `entry`, compiled from kdir with the shipped
    defines (HK 16) plus `extra`; label names as nvdisasm prints them."""
    m = load(kdir)
    d = m.mla_defines(16, fp8, mt, hoist=fp8)
    if file == "ps1.cu":
        d.update(LD_LINES=fp8, EARLY_Q=1)
    d.update(extra or {})
    cubin, log, _ = m.Nvrtc().compile(file, d)
    if cubin is None:
        sys.exit(f"{kdir}/{file} {d}: compile failed\n{log}")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    secs = [s for s in re.split(r"\.section\s+\.text\.", sass) if s.startswith(entry)]
    if not secs:
        sys.exit(f"no .text.{entry} in {kdir}/{file}")
    return secs[0]


def entry_sass(kdir, file, entry, fp8, mt):
    return re.sub(r"\.L_x_\d+", "L", entry_text(kdir, file, entry, fp8, mt))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    old, new, file, entry = sys.argv[1:]
    same = True
    for fp8 in (0, 1):
        for mt in (1, 2):
            eq = entry_sass(old, file, entry, fp8, mt) == entry_sass(new, file, entry, fp8, mt)
            same &= eq
            print(f"{entry} HK16 {'fp8' if fp8 else 'bf16'} MT{mt}: {'same' if eq else 'DIFFERENT'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
