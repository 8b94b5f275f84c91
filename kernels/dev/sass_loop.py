"""The tile loop of an MLA forward, from its SASS: how many instructions one
pass of the loop holds, by opcode, for each kernels dir given. Read before
spending device time on a kernel change: session 8's changes outside the
loop (an epilogue store, a prologue load) still moved ptxas's allocation
of the loop, and the A/B found the loop slower. The loop is the innermost
backward branch whose body holds both the tile loads (LDGSTS) and the P V
mma (HMMA); both of qk_wgmma's warpgroup paths are in it, one runs.
Equal counts are no all-clear: with ps1's epilogue as asm stores the fp8
loop kept its 733 instructions and ran 3-4% slower, and the bf16 loop
kept 236 and ran 2.7% faster; the differences were in order and in
which pipe an integer op lands on (IADD3 or VIADD, LEA or IMAD), and
ncu puts the ALU pipe at 39% with math-pipe throttle the second stall.

    python3 kernels/dev/sass_loop.py ps1.cu ps1_fwd KERNELS_DIR [KERNELS_DIR ...]
        [--bf16] [--mt 2] [-D NAME=VALUE ...]
The shipped defines (nvrtc.py mla_defines, HK 16; ps1 adds LD_LINES,
EARLY_Q) plus any -D. Env: NVDISASM, as sass_diff.py.
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_diff  # noqa: E402


def tile_loop(text):
    """(opcodes of the loop body, start address, end address)."""
    ins, at, pending = [], {}, []
    for line in text.splitlines():
        lab = re.match(r"^\s*\.(L_x_\d+):", line)
        if lab:
            pending.append(lab.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$", line)
        if m:
            a = int(m.group(1), 16)
            for p in pending:
                at[p] = a
            pending = []
            ins.append((a, m.group(2)))
    best = None
    for a, t in ins:
        b = re.search(r"BRA.*`\(\.(L_x_\d+)\)", t)
        if not b or at.get(b.group(1), a + 1) > a:
            continue
        body = [x for x in ins if at[b.group(1)] <= x[0] <= a]
        ops = [(t.split()[1] if t.startswith("@") else t.split()[0]) for _, t in body]
        if any(o.startswith("LDGSTS") for o in ops) and any(o.startswith("HMMA") for o in ops):
            if best is None or len(ops) < len(best[0]):
                best = (ops, at[b.group(1)], a)
    if best is None:
        sys.exit("no loop with both LDGSTS and HMMA")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("entry")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--mt", type=int, default=1)
    ap.add_argument("-D", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in a.D)
    counts = []
    for d in a.dirs:
        ops, s, e = tile_loop(sass_diff.entry_text(d, a.file, a.entry, 0 if a.bf16 else 1, a.mt, extra))
        c = collections.Counter(o.split(".")[0] for o in ops)
        counts.append(c)
        print(f"{d}: {len(ops)} instructions in the tile loop [{s:#x}, {e:#x}]")
    keys = sorted(set().union(*counts), key=lambda k: -counts[0].get(k, 0))
    print("opcode".ljust(12) + "".join(f"{i:>8}" for i in range(len(counts))))
    for k in keys:
        row = [c.get(k, 0) for c in counts]
        if len(set(row)) > 1 or row[0] >= 8:
            print(k.ljust(12) + "".join(f"{v:>8}" for v in row))


if __name__ == "__main__":
    main()
