#!/usr/bin/env bash
# Builds a kit for a GPU machine that has no cargo and no network:
# the stripped release binary, the CUDA 13 headers NVRTC reads, one kernels
# dir per git revision to A/B, and a kernel cache precompiled for all of
# them (keyed by the bytes of the sources and headers, not their folders,
# so the kit serves the tree wherever the device puts it).
#
# Usage (here, at the repo root): scripts/kit.sh DIR [NAME=REV|NAME=PATH ...]
#   e.g. scripts/kit.sh .kit base=HEAD~1 cand=/tmp/kernels-cand
# gives DIR/mlabench, DIR/cuinc, DIR/kcache, DIR/k-base (kernels/ at
# HEAD~1) and DIR/k-cand (a copy of an uncommitted candidate's kernels dir);
# the working tree's kernels/ is always compiled too. Then on the device:
#   export MLABENCH_CACHE=$PWD/DIR/kcache MLABENCH_CUDA_INCLUDE=$PWD/DIR/cuinc
#   BIN=DIR/mlabench scripts/kernel-ab.sh OUT SCEN 2 DIR/k-base kernels -- ...
# and pass DIR in the device call's carry (keep it ignored: .git/info/exclude).
# Env: CU13, pip's nvidia/cu13 folder (nvidia-cuda-nvrtc + nvidia-cuda-runtime
# 13.0); found through python3 when unset. KIT_SELFTEST=0 leaves out the
# planted bugs of `mlabench selftest` (about 23 MB of the cache and 7 min on
# 2 cores): a kit that fits a call's carry beside the peers.
set -euo pipefail
DIR=${1:?usage: scripts/kit.sh DIR [NAME=REV|NAME=PATH ...]}
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
    [[ $name != "$spec" && -n $name && -n $rev ]] || { echo "give NAME=REV or NAME=PATH, not '$spec'" >&2; exit 2; }
    rm -rf "$DIR/k-$name" && mkdir -p "$DIR/k-$name"
    if [[ -d $rev ]]; then  # a kernels dir, e.g. a candidate not yet committed
        [[ -d $rev/common ]] || { echo "'$rev' is not a kernels dir (no common/)" >&2; exit 2; }
        cp -r "$rev"/. "$DIR/k-$name"
    else
        git archive "$rev" kernels | tar x -C "$DIR/k-$name" --strip-components=1
    fi
    dirs+=("$DIR/k-$name")
done
ABS=$(cd "$DIR" && pwd)
export LD_LIBRARY_PATH=$CU13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MLABENCH_CUDA_INCLUDE=$ABS/cuinc MLABENCH_CACHE=$ABS/kcache
for d in "${dirs[@]}"; do
    out=$("$DIR/mlabench" kernels --check --arch sm_90a --kernels-dir "$d" 2>&1) || { echo "$out" >&2; echo "$d: a kernel did not compile" >&2; exit 1; }
    echo "$d: $(tail -1 <<<"$out")"
done
# The planted bugs of `mlabench selftest` compile into the same cache; a
# selftest there hits it whatever its --out.
if [[ ${KIT_SELFTEST:-1} != 0 ]]; then
    "$DIR/mlabench" selftest --compile-only --arch sm_90a --out "$(mktemp -d)" | tail -1
fi
du -sh "$DIR"
