#!/usr/bin/env bash
# The H200 sweep, in one device call (the device machine has no cargo: build
# here, carry the binary). Usage, on the device machine:
#   scripts/h200-sweep.sh OUTDIR mla|v4   [binary, default target/release/mlabench]
# Writes OUTDIR/device.txt, OUTDIR/<run>.log and OUTDIR/runs.tgz (every
# run directory), and prints each run's summary line last.
set -uo pipefail
OUT=${1:?usage: h200-sweep.sh OUTDIR mla|v4 [BIN]}
WHAT=${2:?mla or v4}
BIN=${3:-target/release/mlabench}
R="$OUT/runs"
mkdir -p "$R"
export MLABENCH_CACHE=${MLABENCH_CACHE:-$PWD/.kcache}
summary=()
run() {
    local id=$1; shift
    "$BIN" run "$@" --backend cuda --out "$R" --run-id "$id" >"$OUT/$id.log" 2>&1
    local rc=$?
    summary+=("$id (exit $rc): $(grep -E 'passed, ' "$OUT/$id.log" | tail -1)")
}
"$BIN" device >"$OUT/device.txt" 2>&1 || { cat "$OUT/device.txt"; exit 2; }
case "$WHAT" in
mla)
    run smoke scenarios/smoke.toml
    run kimi-k3-dcp8 scenarios/kimi-k3-dcp8.toml
    run mla-sweep scenarios/mla-sweep.toml --no-timing
    run mla-bandwidth scenarios/mla-bandwidth.toml --check-rows 16
    ;;
v4)
    run dsv4-pro scenarios/dsv4-pro.toml --check-rows 64
    run v4-sweep scenarios/v4-sweep.toml --no-timing --check-rows 64
    "$BIN" splits scenarios/dsv4-pro.toml --backend cuda --check-rows 16 --out "$R" --run-id dsv4-splits >"$OUT/dsv4-splits.log" 2>&1
    summary+=("dsv4-splits (exit $?): $(grep -E 'regret' "$OUT/dsv4-splits.log" | tail -1)")
    ;;
esac
tar czf "$OUT/runs.tgz" -C "$OUT" runs
cat "$OUT/device.txt"
printf '%s\n' "${summary[@]}"
