#!/usr/bin/env python3
"""Two Nsight Compute raw-counter exports side by side.

Usage: scripts/ncu-diff.py A.csv B.csv [--ratio R] [--match REGEX] [--all]
Each CSV is `ncu --import X.ncu-rep --page raw --csv` of one kernel launch
(header row, units row, then one row per profiled launch; the first is
read). Prints the numeric counters whose values differ by more than R
times (default 2), or every counter matching REGEX with --all, as
`counter  A  B  B/A  unit`. Exit 2 on unreadable input.
"""
import argparse
import csv
import math
import re
import sys


def die(msg):
    print(f"ncu-diff: {msg}", file=sys.stderr)
    sys.exit(2)


def read(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    if len(rows) < 3:
        die(f"{path} has no data row (export it with `ncu --import X --page raw --csv`)")
    head, units, values = rows[0], rows[1], rows[2]
    out = {}
    for name, unit, value in zip(head, units, values):
        try:
            out[name] = (float(value.replace(",", "")), unit)
        except ValueError:
            continue  # names, launch shapes, strings
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--ratio", type=float, default=2.0, help="show counters differing by more than this factor")
    ap.add_argument("--match", default="", help="only counters whose name matches this regex")
    ap.add_argument("--all", action="store_true", help="every matching counter, whatever the ratio")
    args = ap.parse_args()
    if args.ratio < 1:
        die("--ratio must be at least 1")
    try:
        pat = re.compile(args.match)
    except re.error as e:
        die(f"bad --match regex: {e}")
    a, b = read(args.a), read(args.b)
    shown = 0
    for name in sorted(set(a) & set(b)):
        if not pat.search(name):
            continue
        (va, unit), (vb, _) = a[name], b[name]
        if va == 0 and vb == 0:
            continue
        r = vb / va if va else math.inf
        if args.all or not (1 / args.ratio <= r <= args.ratio):
            print(f"{name:90} {va:>16.6g} {vb:>16.6g} {r:>8.3g}x  {unit}")
            shown += 1
    print(f"{shown} counters shown of {len(set(a) & set(b))} in both", file=sys.stderr)


if __name__ == "__main__":
    main()
