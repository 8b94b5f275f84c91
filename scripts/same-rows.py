#!/usr/bin/env python3
"""Whether two runs give the same rows apart from timing.

    scripts/same-rows.py BEFORE AFTER

BEFORE and AFTER are run directories (or their rows.csv). Rows are matched
by (case_id, variant); every column except the timing ones (latencies,
spread, sample count, noise, clock, throughput and fractions of peak) must
be equal as text; a column only one of them has is named, not compared.
A change that should not change what mlabench checks (a refactor, a build
flag) is shown to be one by running the same scenarios with both binaries
(`mlabench run S --backend cpu --no-timing`) and this script. Exit 0 when
the rows agree, 1 when they differ (the first differences are printed),
2 on bad input.
"""
import csv
import sys
from pathlib import Path

TIMING = {
    "kernel_median_ms", "kernel_p10_ms", "kernel_p90_ms",
    "variant_median_ms", "variant_p10_ms", "variant_p90_ms", "variant_min_ms",
    "rel_spread", "samples", "noise", "noise_capped", "clock", "gbps", "tflops", "frac_bw", "frac_tc", "tc_ceiling",
}


def load(arg):
    p = Path(arg)
    if p.is_dir():
        p = p / "rows.csv"
    if not p.is_file():
        sys.exit(f"same-rows: {arg}: no rows.csv there; give a run directory or its rows.csv")
    with p.open(newline="") as f:
        rows = list(csv.DictReader(f))
    keyed = {}
    for r in rows:
        k = (r["case_id"], r["variant"])
        if k in keyed:
            sys.exit(f"same-rows: {p}: row {k} appears twice")
        keyed[k] = r
    return p, keyed


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    (pa, a), (pb, b) = load(sys.argv[1]), load(sys.argv[2])
    diffs = []
    # A column one version has and the other lacks is named once, not per row.
    cols_a = set(next(iter(a.values()), {}))
    cols_b = set(next(iter(b.values()), {}))
    only = (cols_a ^ cols_b) - TIMING
    if only:
        print(f"columns in one run only (not compared): {', '.join(sorted(only))}")
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            diffs.append(f"{k[0]} {k[1]}: only in {pb if k not in a else pa}")
            continue
        for col in sorted((set(a[k]) & set(b[k])) - TIMING):
            x, y = a[k].get(col), b[k].get(col)
            if x != y:
                diffs.append(f"{k[0]} {k[1]} {col}: {x!r} -> {y!r}")
    if diffs:
        for d in diffs[:40]:
            print(d)
        print(f"{len(diffs)} differences in {len(set(a) | set(b))} rows ({pa} vs {pb})")
        return 1
    print(f"same rows: {len(a)} rows agree apart from timing ({pa} vs {pb})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
