#!/usr/bin/env bash
# Session 9, device call 2 (~7 min): --handoff pdl against main's kernels,
# then the report runs (smoke first as the gate, kimi, mla-bandwidth,
# mla-gather, mla-occupancy, the three mla-fixed-cost runs), all with the
# default hand-off (pdl).
# Kit first, here: kernels/dev/kit.sh DIR base=HEAD
# Device call: KIT=DIR bash kernels/dev/s9b-call.sh   (carry [DIR])
# Sides of the A/B (run ids <scenario>-c<i>-r<round>):
#   c0 main's kernels (k-base), stream order (the control)
#   c1 the working tree's kernels, --handoff pdl (the candidate)
#   c2 the working tree's kernels, --handoff stream (c1 without PDL: its
#      forwards are main's SASS, so its kernel region should be c0's)
# Writes $OUT/ab.tgz (A/B runs and pages) and $OUT/runs.tgz (report runs).
set -u
D=${KIT:?KIT=kit dir}
export MLABENCH_CACHE=$PWD/$D/kcache MLABENCH_CUDA_INCLUDE=$PWD/$D/cuinc
BIN=$PWD/$D/mlabench
O=${OUT:-/tmp/out}; W=$(mktemp -d); R=$(mktemp -d)
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
packw() { tar czf $O/ab.tgz -C $W .; }
packr() { tar czf $O/runs.tgz -C $R --transform 's,^\.,runs,' .; }
rep() {  # run id, seconds, args...: a report run into $R
    local id=$1 t=$2; shift 2
    timeout $t $BIN run "$@" --backend cuda --out $R --run-id $id > $R/$id.log 2>&1
    echo "[t=$(el)s] $id rc=$?: $(grep -E 'passed, ' $R/$id.log | tail -1)"
    packr
}
$BIN device > $R/device.txt 2>&1
rep smoke 120 scenarios/smoke.toml --min-time-ms 20
grep -q " 0 failed, .* 0 errors" $R/smoke.log || { grep -E "FAIL|ERROR" $R/smoke.log | head; exit 1; }
KD=($D/k-base kernels kernels) HO=(stream pdl stream)
side() {  # side, round, tag, scenario, args...
    local i=$1 r=$2 tag=$3 scen=$4; shift 4
    local id=$tag-c$i-r$r
    timeout 150 $BIN run $scen --backend cuda --kernels-dir ${KD[$i]} --handoff ${HO[$i]} \
        --out $W --run-id $id -q "$@" > $W/$id.log 2>&1
    echo "[t=$(el)s] $id (${KD[$i]}, ${HO[$i]}) rc=$?: $(grep -E 'passed, ' $W/$id.log | tail -1)"
}
for r in 1 2; do for i in 0 1 2; do side $i $r bw scenarios/mla-bandwidth.toml --check-rows 16 --case c4096; done; done
for i in 0 1 2; do
    side $i 1 occ scenarios/mla-occupancy.toml --check-rows 16 --case b8-c32768 --case b16-c32768 --case b1-c262144
done
for i in 1 2; do
    for reg in variant kernel; do
        $BIN ab --control $W/bw-c0-r1 --control $W/bw-c0-r2 --candidate $W/bw-c$i-r1 --candidate $W/bw-c$i-r2 \
            --region $reg --markdown $W/ab-bw-c$i-$reg.md > $W/ab-bw-c$i-$reg.txt 2>&1
        $BIN ab --control $W/occ-c0-r1 --candidate $W/occ-c$i-r1 --region $reg \
            --markdown $W/ab-occ-c$i-$reg.md > $W/ab-occ-c$i-$reg.txt 2>&1
    done
done
packw
rep kimi-k3-dcp8 90 scenarios/kimi-k3-dcp8.toml --min-time-ms 20
rep mla-bandwidth 150 scenarios/mla-bandwidth.toml --check-rows 16
rep mla-occupancy 90 scenarios/mla-occupancy.toml --check-rows 16
for m in "" warm graph; do
    case $m in warm) f=--warm-l2 ;; graph) f=--graph ;; *) f= ;; esac
    rep mla-fixed-cost${m:+-$m} 60 scenarios/mla-fixed-cost.toml --check-rows 16 $f
done
left=$(( 575 - $(el) ))
(( left > 30 )) && rep mla-gather $left scenarios/mla-gather.toml --check-rows 16
cat $R/device.txt | grep -iE "copy|mma|gather|empty|graph" | head -8
for i in 1 2; do
    for t in bw occ; do
        echo "== c$i $t: $(grep -h '^\*\*' $W/ab-$t-c$i-kernel.md) (kernel region)"
        grep -E '^\*\*|^\| `' $W/ab-$t-c$i-variant.md | sed -e 's/-h16x1-s1-q1//' -e 's/ µs/us/g' | cut -c1-120
    done
done
