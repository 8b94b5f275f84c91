#!/usr/bin/env bash
# One device call (~8 min): the working tree's kernels against a control
# kernels dir (A/B on the c4096 bandwidth cases, 2 rounds, and mla-occupancy,
# 1 round), then the report runs with the working tree's kernels: smoke,
# kimi, mla-bandwidth (scripts/h200-sweep.sh mla) and mla-gather. The
# occupancy A/B's candidate side is the report's mla-occupancy run.
# Kit first, here: kernels/dev/kit.sh DIR base=HEAD   (control = k-base)
# Device call: KIT=DIR bash kernels/dev/ab-report-call.sh   (carry [DIR])
# Writes $OUT/ab.tgz (A/B dirs and pages) and $OUT/runs.tgz (report runs);
# prints the A/B tables and the report's summary lines last.
# Env: CAND_ARGS, host flags of the candidate side and of every report run
# (e.g. "--graph"); the control runs without them.
set -u
D=${KIT:?KIT=kit dir} CTL=${CTL:-$D/k-base} CASE=${CASE:-c4096}
export MLABENCH_CACHE=$PWD/$D/kcache MLABENCH_CUDA_INCLUDE=$PWD/$D/cuinc BIN=$PWD/$D/mlabench
O=${OUT:-/tmp/out}; W=$(mktemp -d); R=$(mktemp -d)
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
DEADLINE_S=150 scripts/kernel-ab.sh $W/bw scenarios/mla-bandwidth.toml 2 $CTL kernels \
    -- --check-rows 16 --case $CASE > $W/bw.txt 2>&1
echo "[t=$(el)s] bandwidth A/B rc=$?"
DEADLINE_S=60 scripts/kernel-ab.sh $W/occ scenarios/mla-occupancy.toml 1 $CTL kernels \
    -- --check-rows 16 > $W/occ.txt 2>&1
echo "[t=$(el)s] occupancy A/B rc=$?"
tar czf $O/ab.tgz -C $W .
RUN_ARGS=${CAND_ARGS:-} RUNS_DIR=$R scripts/h200-sweep.sh $O $BIN $(( 540 - $(el) - 70 )) mla > $W/sweep.txt 2>&1
echo "[t=$(el)s] report mla rc=$?"
timeout $(( 560 - $(el) )) $BIN run scenarios/mla-gather.toml --backend cuda --check-rows 16 ${CAND_ARGS:-} \
    --out $R --run-id mla-gather > $R/mla-gather.log 2>&1
echo "[t=$(el)s] mla-gather rc=$? $(grep -E 'passed, ' $R/mla-gather.log | tail -1)"
tar czf $O/runs.tgz -C $R --transform 's,^\.,runs,' .
tar czf $O/ab.tgz -C $W .
for f in bw occ; do grep -hE "A/B|kernels:|$CASE|b1-|b2-" $W/$f.txt | cut -c1-150 | head -30; done
tail -5 $W/sweep.txt
