#!/usr/bin/env bash
# A/B of kernel sources in one GPU session: the control and each candidate
# kernels dir run the same scenario, alternated for ROUNDS rounds (ABAB...),
# so slow drift of clocks and memory shows up as control-vs-control change
# instead of being credited to a candidate. Between device sessions the same
# binary moves 2-5 points of %BW, more than many kernel changes are worth.
#
# Usage: scripts/kernel-ab.sh OUT SCENARIO ROUNDS CONTROL_DIR CAND_DIR... [-- RUN_ARGS...]
#   e.g. scripts/kernel-ab.sh ab scenarios/mla-bandwidth.toml 2 /tmp/kernels-base kernels \
#          -- --case fp8 --check-rows 16
# Env: BIN (default target/release/mlabench), BACKEND (default cuda),
#      DEADLINE_S (stop starting runs after this many seconds; default none),
#      CAND_ARGS (run flags for the candidates only, split on spaces: A/B a
#      host option with one kernels dir, e.g. CAND_ARGS="--ps1-schedule payload"
#      scripts/kernel-ab.sh ab SCEN 2 kernels kernels),
#      CAND_BIN (the binary the candidates run, default BIN: A/B a host
#      change, e.g. the previous build as BIN and the new one as CAND_BIN).
# Writes OUT/c<i>-r<round>/ per run (c0 = the control, c1.. = candidates)
# and OUT/ab-c<i>.md, and prints per candidate `mlabench ab` over the rounds:
# medians over rounds, each side's drift, a verdict per (case, variant).
# Exit: 2 on bad usage or a run that could not start, 1 if a check failed
# in any run or a candidate is slower or broke a check, else 0.
set -uo pipefail
usage() { echo "usage: $0 OUT SCENARIO ROUNDS CONTROL_DIR CAND_DIR... [-- RUN_ARGS...]" >&2; exit 2; }
(( $# >= 5 )) || usage
OUT=$1 SCEN=$2 ROUNDS=$3; shift 3
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2; exit 2; }
[[ -f $SCEN ]] || { echo "no scenario file '$SCEN'" >&2; exit 2; }
DIRS=()
while (( $# )) && [[ $1 != -- ]]; do DIRS+=("$1"); shift; done
(( $# )) && shift
RUN_ARGS=("$@")
(( ${#DIRS[@]} >= 2 )) || usage
for d in "${DIRS[@]}"; do
    [[ -d $d ]] || { echo "no kernels dir '$d' (give the control first, then the candidates)" >&2; exit 2; }
done
BIN=${BIN:-target/release/mlabench}
[[ -x $BIN ]] || { echo "no binary at '$BIN' (cargo build --release, or set BIN)" >&2; exit 2; }
CAND_BIN=${CAND_BIN:-$BIN}
[[ -x $CAND_BIN ]] || { echo "no binary at CAND_BIN '$CAND_BIN'" >&2; exit 2; }
BACKEND=${BACKEND:-cuda}
read -r -a CAND <<<"${CAND_ARGS:-}"
T0=$(date +%s)
mkdir -p "$OUT"
failed=0
ran=()
for ((r = 1; r <= ROUNDS; r++)); do
    for i in "${!DIRS[@]}"; do
        id="c$i-r$r"
        if [[ -n ${DEADLINE_S:-} ]] && (( $(date +%s) - T0 >= DEADLINE_S )); then
            echo "$id: not run (DEADLINE_S=$DEADLINE_S reached)"
            continue
        fi
        side=() bin=$BIN
        (( i > 0 )) && side=("${CAND[@]}") bin=$CAND_BIN
        tag=""
        [[ $bin != "$BIN" ]] && tag=" [$bin]"
        "$bin" run "$SCEN" --backend "$BACKEND" --kernels-dir "${DIRS[$i]}" --out "$OUT" --run-id "$id" \
            -q "${RUN_ARGS[@]}" "${side[@]}" >"$OUT/$id.log" 2>&1
        rc=$?
        echo "$id (${DIRS[$i]}${side[*]:+ ${side[*]}}${tag}): exit $rc, $(grep -E 'passed, ' "$OUT/$id.log" | tail -1)"
        case $rc in
            0) ran+=("$id") ;;
            1) ran+=("$id"); failed=1 ;;
            *) echo "$id could not run; its log:" >&2; tail -5 "$OUT/$id.log" >&2; exit 2 ;;
        esac
    done
done
has() { [[ " ${ran[*]} " == *" $1 "* ]]; }
# Each candidate against the control, pooled over the rounds both finished:
# `mlabench ab` judges a change against each side's round-to-round drift.
status=$failed
for ((i = 1; i < ${#DIRS[@]}; i++)); do
    args=()
    for ((r = 1; r <= ROUNDS; r++)); do
        has "c0-r$r" && has "c$i-r$r" && args+=(--control "$OUT/c0-r$r" --candidate "$OUT/c$i-r$r")
    done
    (( ${#args[@]} )) || { echo "c$i: no round finished for both sides"; continue; }
    echo "== c$i (${DIRS[$i]}) against the control (${DIRS[0]})"
    "$BIN" ab "${args[@]}" --markdown "$OUT/ab-c$i.md"
    rc=$?
    (( rc == 2 )) && exit 2
    (( rc == 1 )) && status=1
done
exit $status
