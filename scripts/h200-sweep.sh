#!/usr/bin/env bash
# The whole H200 sweep in one device call (the device machine has no cargo:
# build here, carry a stripped binary and the precompiled kernel cache).
# Usage, on the device machine:
#   scripts/h200-sweep.sh OUTDIR BIN DEADLINE_S [all|mla|sweep|v4|peers|selftest]
# The whole sweep takes longer than one device command may run (10 min), so
# `mla` (smoke, kimi, kimi on a one-GPU NCCL group, bandwidth; ~150 s + the group's), `sweep` (mla-sweep; ~350 s) and
# `v4` (dsv4-pro, splits, v4-sweep; ~200 s) split it into calls. `peers`
# (not in `all`): mla-compute and dsv4-peers beside the peers' adapters
# (docs/protocol.md) named in PEER_MLA (e.g. "adapters/flashmla/impl.toml
# adapters/flashinfer/impl.toml") and PEER_V4 (adapters/flashmla/v4.toml),
# each installed on the machine (results/h200/peers/README.md); ~60-110 s.
# `selftest` (not in `all`): every planted bug of selftest/bugs.toml on the
# GPU; its kernels come from the kit's cache when kit.sh compiled them.
# Env: EXPECT_GPU, a part of the device name the runs are for (default
# H200; empty: any): a lent machine of another card runs nothing (exit 2),
# so its numbers never land under results/h200.
# RUN_ARGS, flags added to every `run` (split on spaces, e.g. "--graph").
# RUNS_DIR, where the run directories go (default OUTDIR/runs). A device
# call returns at most 8 files from $OUT, so there pass a directory outside
# it (RUNS_DIR=$(mktemp -d)) and fetch OUTDIR/runs.tgz alone.
# Runs in priority order; after each run OUTDIR/runs.tgz is refreshed, so a
# run cut off by the deadline loses nothing already measured. Prints each
# run's summary line last.
set -uo pipefail
OUT=${1:?usage: h200-sweep.sh OUTDIR BIN DEADLINE_S}
BIN=${2:?}
DEADLINE=$(( $(date +%s) + ${3:?} ))
PART=${4:-all}
case $PART in all|mla|sweep|v4|peers|selftest) ;; *) echo "part must be all, mla, sweep, v4, peers or selftest, not '$PART'" >&2; exit 2 ;; esac
read -r -a MLA_IMPLS <<<"${PEER_MLA:-}"
read -r -a V4_IMPLS <<<"${PEER_V4:-}"
impl_args() { local f; for f in "$@"; do printf -- '--impl\n%s\n' "$f"; done; }
if [[ $PART == peers ]] && (( ${#MLA_IMPLS[@]} + ${#V4_IMPLS[@]} == 0 )); then
    echo "part peers: set PEER_MLA and/or PEER_V4 to the adapters to run beside ours" >&2; exit 2
fi
R=${RUNS_DIR:-$OUT/runs}
read -r -a EXTRA <<<"${RUN_ARGS:-}"
mkdir -p "$OUT" "$R"
export MLABENCH_CACHE=${MLABENCH_CACHE:-$PWD/.kcache}
summary=()
step() {
    local part=$1 id=$2; shift 2
    [[ $PART == "$part" || ($PART == all && $part != peers && $part != selftest) ]] || return 0
    local left=$(( DEADLINE - $(date +%s) ))
    if (( left < 15 )); then summary+=("$id: not run (deadline)"); return; fi
    local extra=()
    [[ $1 == run ]] && extra=("${EXTRA[@]}")
    local where=(--out "$R" --run-id "$id")
    [[ $1 == selftest ]] && where=(--out "$R/$id")
    timeout "$left" "$BIN" "$@" "${extra[@]}" --backend cuda "${where[@]}" >"$R/$id.log" 2>&1
    local rc=$?
    summary+=("$id (exit $rc): $(grep -E 'passed, |regret|planted bugs caught' "$R/$id.log" | tail -2 | tr '\n' ' ')")
    tar czf "$OUT/runs.tgz" -C "$R" --transform 's,^\.,runs,' .
}
"$BIN" device >"$R/device.txt" 2>&1 || { cat "$R/device.txt"; exit 2; }
card=$(sed -n 's/^device  *//p' "$R/device.txt" | head -1)
want=${EXPECT_GPU-H200}
if [[ -n $want && $card != *"$want"* ]]; then
    echo "this machine's GPU is '$card', not an $want: nothing run (set EXPECT_GPU to the card the runs are for, or EXPECT_GPU= for any)" >&2
    exit 2
fi
step mla smoke run scenarios/smoke.toml --min-time-ms 20
step mla kimi-k3-dcp8 run scenarios/kimi-k3-dcp8.toml --min-time-ms 20
# The DCP step through NCCL on one GPU (world size 1), bf16 and f32 reduce,
# beside the emulation (docs/dcp-groups.md); needs libnccl (PyTorch's wheel has it).
step mla kimi-k3-dcp8-g1 run scenarios/kimi-k3-dcp8.toml --min-time-ms 20 --dcp-devices 1 --dcp-reduce bf16,f32
step mla mla-bandwidth run scenarios/mla-bandwidth.toml --check-rows 16
step v4 dsv4-pro run scenarios/dsv4-pro.toml --check-rows 32 --min-time-ms 20
step v4 dsv4-splits splits scenarios/dsv4-pro.toml --check-rows 8 --min-samples 10 --min-time-ms 20
step sweep mla-sweep run scenarios/mla-sweep.toml --no-timing --check-rows 64
step v4 v4-sweep run scenarios/v4-sweep.toml --no-timing --check-rows 32
if (( ${#MLA_IMPLS[@]} )); then
    mapfile -t a < <(impl_args "${MLA_IMPLS[@]}")
    step peers mla-compute run scenarios/mla-compute.toml --check-rows 16 "${a[@]}"
fi
if (( ${#V4_IMPLS[@]} )); then
    mapfile -t a < <(impl_args "${V4_IMPLS[@]}")
    step peers dsv4-peers run scenarios/dsv4-peers.toml --check-rows 16 --min-time-ms 20 "${a[@]}"
fi
step selftest selftest selftest
cat "$R/device.txt"
printf '%s\n' "${summary[@]}"
