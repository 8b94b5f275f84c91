#!/usr/bin/env bash
# Nsight Compute of main's fp8 forwards (session 8): where a 64-token tile's
# time goes now (session 5's profile predates LD_LINES, HOIST, EARLY_Q).
# PAGE=raw prints every collected metric (stall reasons, pipes).
# Kit: kernels/dev/kit.sh DIR base=main ; device: KIT=DIR bash kernels/dev/ncu-call.sh
set -u
D=${KIT:?KIT=kit dir}
export MLABENCH_CACHE=$PWD/$D/kcache MLABENCH_CUDA_INCLUDE=$PWD/$D/cuinc
B=$PWD/$D/mlabench; K=$PWD/$D/k-base; W=$(mktemp -d)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
prof() {  # name scenario case
    timeout 200 "$NCU" --clock-control none --set full --import-source no ${PAGE:+--page $PAGE} -k 'regex:^(ps1_fwd|page64_fwd)$' -c 2 \
        --metrics sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum \
        "$B" run "$2" --backend cuda --case "$3" --no-timing --check-rows 2 --kernels-dir "$K" \
        --out $W/runs --run-id "$1" > $W/$1.txt 2>&1
    echo "$1 rc=$?"
}
prof b64c4096 scenarios/mla-bandwidth.toml b64-c4096-h16x1-s1-q1-fp8
prof b1c262144 scenarios/mla-occupancy.toml b1-c262144-h16x1-s1-q1-fp8
tar czf ${OUT:-/tmp}/ncu.tgz -C $W .
for f in $W/*.txt; do
    echo "== $f"
    grep -E "ps1_fwd|page64_fwd|^    Duration|DRAM Throughput|Issue Slots Busy|Issued Warp Per Scheduler|Executed Ipc A|No Eligible|Warp Cycles Per Issued|sm__cycles_active|smsp__inst_executed.sum|Stall|Tensor|L1/TEX Hit|Mem Busy|Max Bandwidth" $f | head -60
done
