#!/usr/bin/env python3
"""Compares the SASS of two kernels dirs, function by function, without a GPU.

Usage:
  mlabench kernels --check --kernels-dir OLD --cubins /tmp/a
  mlabench kernels --check --kernels-dir kernels --cubins /tmp/b
  scripts/sass-diff.py /tmp/a /tmp/b [--all]

Each configuration's cubin (same file name in both dirs) is disassembled
with nvdisasm (NVDISASM, else on PATH; pip: nvidia-cuda-nvdisasm puts one
at site-packages/nvidia/cu13/bin) and each function's instructions are
compared with addresses, encodings, branch labels and the numbers of
shared helper routines (`__internal_N_...`) removed, so code that only
moved compares equal. Prints the configurations that differ (and
with --all the ones that do not), one line per function.
Exit: 0 all the same, 1 some function differs or exists on one side only,
2 bad usage or no nvdisasm.
"""
import os
import re
import shutil
import subprocess
import sys


def nvdisasm():
    p = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not p:
        sys.exit("no nvdisasm: set NVDISASM or put it on PATH "
                 "(pip install nvidia-cuda-nvdisasm: site-packages/nvidia/cu13/bin/nvdisasm)")
    return p


def functions(tool, cubin):
    out = subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True).stdout
    fs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = fs.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # addresses and encodings
        line = re.sub(r"`?\(?\.L_x_\d+\)?", "L", line)  # branch targets
        line = re.sub(r"__internal_\d+_", "__internal_", line)  # shared helpers, numbered per module
        line = line.strip()
        if line and not line.startswith((".", "//")):
            cur.append(line)
    return fs


def main(argv):
    args = [a for a in argv if a != "--all"]
    if len(args) != 2 or not all(os.path.isdir(d) for d in args):
        print(__doc__, file=sys.stderr)
        return 2
    show_all = "--all" in argv
    tool = nvdisasm()
    a_dir, b_dir = args
    a = {f for f in os.listdir(a_dir) if f.endswith(".cubin")}
    b = {f for f in os.listdir(b_dir) if f.endswith(".cubin")}
    differ = 0
    for name in sorted(a | b):
        if name not in a or name not in b:
            differ += 1
            print(f"{name}: only in {a_dir if name in a else b_dir}")
            continue
        fa, fb = functions(tool, os.path.join(a_dir, name)), functions(tool, os.path.join(b_dir, name))
        lines, bad = [], False
        for fn in sorted(set(fa) | set(fb)):
            if fn not in fa or fn not in fb:
                bad = True
                lines.append(f"  {fn}: only in {a_dir if fn in fa else b_dir}")
            elif fa[fn] != fb[fn]:
                bad = True
                lines.append(f"  {fn}: DIFFERENT ({len(fa[fn])} vs {len(fb[fn])} instructions)")
            else:
                lines.append(f"  {fn}: same ({len(fa[fn])} instructions)")
        differ += bad
        if bad or show_all:
            print(name)
            print("\n".join(lines))
    print(f"{len(a & b)} configurations in both, {differ} differ or are on one side only")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
