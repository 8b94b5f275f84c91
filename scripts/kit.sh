#!/usr/bin/env bash
# Builds a kit for a GPU machine that has no cargo and no network:
# the stripped release binary, the CUDA 13 headers NVRTC reads, one kernels
# dir per git revision to A/B, and a kernel cache precompiled for all of
# them (the cache key holds the -I paths, so run from the same checkout
# path there; the device copy of the tree sits at the same path).
#
# Usage (here, at the repo root): scripts/kit.sh DIR [NAME=REV ...]
#   e.g. scripts/kit.sh .kit base=HEAD~1
# gives DIR/mlabench, DIR/cuinc, DIR/kcache and DIR/k-base (the
# working tree's kernels/ is always compiled too). Then on the device:
#   export MLABENCH_CACHE=$PWD/DIR/kcache MLABENCH_CUDA_INCLUDE=$PWD/DIR/cuinc
#   BIN=DIR/mlabench scripts/kernel-ab.sh OUT SCEN 2 DIR/k-base kernels -- ...
# and pass DIR in the device call's carry (keep it ignored: .git/info/exclude).
# Env: CU13, pip's nvidia/cu13 folder (nvidia-cuda-nvrtc + nvidia-cuda-runtime
# 13.0); found through python3 when unset.
set -euo pipefail
DIR=${1:?usage: scripts/kit.sh DIR [NAME=REV ...]}
shift
CU13=${CU13:-$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')}
[[ -d $CU13/include && -d $CU13/lib ]] || { echo "no CUDA 13 headers/libs under '$CU13' (pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96, or set CU13)" >&2; exit 2; }
cargo build --release
mkdir -p "$DIR"
cp target/release/mlabench "$DIR/mlabench"
strip "$DIR/mlabench"
rm -rf "$DIR/cuinc" && cp -r "$CU13/include" "$DIR/cuinc"
dirs=(kernels)
for spec in "$@"; do
    name=${spec%%=*} rev=${spec#*=}
    [[ $name != "$spec" && -n $name && -n $rev ]] || { echo "give NAME=REV, not '$spec'" >&2; exit 2; }
    rm -rf "$DIR/k-$name" && mkdir -p "$DIR/k-$name"
    git archive "$rev" kernels | tar x -C "$DIR/k-$name" --strip-components=1
    dirs+=("$DIR/k-$name")
done
export LD_LIBRARY_PATH=$CU13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MLABENCH_CUDA_INCLUDE=$PWD/$DIR/cuinc MLABENCH_CACHE=$PWD/$DIR/kcache
for d in "${dirs[@]}"; do
    echo "$d: $("$DIR/mlabench" kernels --check --arch sm_90a --kernels-dir "$d" | tail -1)"
done
# The planted bugs of `mlabench selftest` compile into the same cache.
"$DIR/mlabench" selftest --compile-only --arch sm_90a --out "$DIR/selftest-compile" | tail -1
du -sh "$DIR"
