#!/usr/bin/env bash
# The regression check of a refactor of fp8gemm-cuda-sm90a (docs/benchmarks.md, "Comparing two builds"): the
# build before the change against the build after it, on one GPU machine: both builds in one
# process (ci/gpu/inprocess_ab.py) on the benchmark shapes, then the GPU suite and compute-sanitizer
# (ci/gpu/session.sh sanitize) on the working tree's builds. A pure refactor keeps every paired ratio within the
# same-build spread (about 0.99-1.01 on shapes of 20 us and more, 0.95-1.05 on ~12 us decode shapes).
# Usage (GPU machine, repo root): [SKIP_SUITE=1] bash ci/gpu/refactor_ab.sh OLD_PACKAGE_DIR [ROUNDS]
#   OLD_PACKAGE_DIR: a copy of packages/fp8gemm-cuda-sm90a before the change, e.g. made here with
#   mkdir -p build/ab-old && git archive main packages/fp8gemm-cuda-sm90a | tar -x -C build/ab-old
#   and carried to the GPU machine (build/ is git-ignored).
set -uo pipefail
OLD=${1:?usage: bash ci/gpu/refactor_ab.sh OLD_PACKAGE_DIR [ROUNDS]}
ROUNDS=${2:-3}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDACXX=$(command -v nvcc) PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e packages/fp8gemm-core || exit 1
AB=/tmp/refactor_ab; rm -rf "$AB"; mkdir -p "$AB"
install_to() {  # package dir, target dir, log
  python3 -m pip install -q --no-deps --no-build-isolation --target "$2" "$1" > "$OUT/$3.log" 2>&1 || { tail -40 "$OUT/$3.log"; exit 1; }
}
install_to "$OLD" "$AB/old" build_old & install_to packages/fp8gemm-cuda-sm90a "$AB/new" build_new &
python3 -m pip install -q --no-deps --no-build-isolation packages/fp8gemm-cuda-sm90a > "$OUT/build_sm90a.log" 2>&1 &
FP8GEMM_CUDA_ARCH=90 python3 -m pip install -q --no-deps --no-build-isolation packages/fp8gemm-cuda-sm120 \
  > "$OUT/build_sm120.log" 2>&1 &
wait
# The benchmark shapes (fp8gemm.bench SHAPE_SETS["deepseek-v3"]): decode, prefill, and the three square-ish ones.
SHAPES=$(python3 -c "from fp8gemm.bench import SHAPE_SETS; print(' '.join('%d,%d,%d' % s for s in SHAPE_SETS['deepseek-v3']))")
timeout 300 python3 ci/gpu/inprocess_ab.py "$ROUNDS" old="$AB/old" new="$AB/new" -- $SHAPES | tee "$OUT/refactor_ab.txt"
[ -z "${SKIP_SUITE:-}" ] && SKIP_BUILD=1 bash ci/gpu/session.sh sanitize
