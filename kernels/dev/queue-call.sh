#!/usr/bin/env bash
# Items 1-3 of kernels/dev/NOTES.md "Next device session" in one device call
# (~8 min): --graph against eager, then the mla-early-kv and merge-obatch-off
# kernels against main's, each on the c4096 bandwidth cases and mla-occupancy.
# Kit first, here: kernels/dev/kit.sh .dev-s7 ekv=mla-early-kv mrg=merge-obatch-off
# Device call: bash kernels/dev/queue-call.sh   (carry [".dev-s7"])
# Writes $OUT/all.tgz (every run dir and A/B page) and prints the tables last.
# Env (to try it on the CPU): KIT, SCEN, OCC, CASE, BACKEND.
set -u
D=${KIT:-.dev-s7} SCEN=${SCEN:-scenarios/mla-bandwidth.toml} OCC=${OCC:-scenarios/mla-occupancy.toml}
CASE=${CASE:-c4096}
export BACKEND=${BACKEND:-cuda}
export MLABENCH_CACHE=$PWD/$D/kcache MLABENCH_CUDA_INCLUDE=$PWD/$D/cuinc BIN=$PWD/$D/mlabench
O=${OUT:-/tmp/out}; W=$(mktemp -d)
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( 570 - $(el) )); }
[[ $BACKEND == cuda ]] && { $BIN device > $W/device.txt 2>&1; grep -E "copy|empty" $W/device.txt; }
mkdir -p $W/graph
for r in 1 2; do for m in eager graph; do
    (( $(left) > 300 )) || continue
    flag=(); [[ $m == graph ]] && flag=(--graph)
    timeout $(left) $BIN run $SCEN --backend $BACKEND --check-rows 16 "${flag[@]}" \
        --out $W/graph --run-id $m-$r -q > $W/graph/$m-$r.log 2>&1
    echo "[t=$(el)s] $m-$r rc=$? $(grep -E 'passed, ' $W/graph/$m-$r.log | tail -1)"
done; done
for k in ekv mrg; do
    (( $(left) > 60 )) || continue
    DEADLINE_S=$(( $(left) / 3 )) scripts/kernel-ab.sh $W/$k $SCEN 2 kernels $D/k-$k \
        -- --check-rows 16 --case $CASE > $W/$k.txt 2>&1
    echo "[t=$(el)s] $k bandwidth rc=$?"
    DEADLINE_S=30 scripts/kernel-ab.sh $W/$k-occ $OCC 1 kernels $D/k-$k -- --check-rows 16 > $W/$k-occ.txt 2>&1
    echo "[t=$(el)s] $k occupancy rc=$?"
done
(cd $W/graph && $BIN ab --control eager-1 --candidate graph-1 --control eager-2 --candidate graph-2 \
    --markdown graph-vs-eager.md > graph-vs-eager.txt 2>&1)
tar czf $O/all.tgz -C $W .
echo "== graph against eager"; grep -E "fp8|A/B|kernels:" $W/graph/graph-vs-eager.txt | cut -c1-140
for k in ekv mrg; do
    echo "== $k"; grep -hE "A/B|kernels:|$CASE|b1-|b2-" $W/$k.txt $W/$k-occ.txt 2>/dev/null | cut -c1-150 | head -30
done
