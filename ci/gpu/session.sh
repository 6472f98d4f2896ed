#!/usr/bin/env bash
# One device-machine session: install the core, build the arch packages that run on Hopper, run the
# conformance suite on the GPU, compute-sanitizer, and the benchmark. Results land in $OUT.
# Usage (on the GPU machine, repo root): bash ci/gpu/session.sh [sanitize] [bench]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDACXX=$(command -v nvcc) PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e packages/fp8gemm-core || exit 1
# The sm_120 package's Hopper test build: same source, FP8GEMM_CUDA_ARCH=90.
FP8GEMM_CUDA_ARCH=90 python3 -m pip install -q --no-deps --no-build-isolation packages/fp8gemm-cuda-sm120 \
  > "$OUT/build_sm120.log" 2>&1 || { tail -50 "$OUT/build_sm120.log"; exit 1; }
fp8gemm info | tee "$OUT/info.txt"
FP8GEMM_TEST_DEVICE=cuda python3 -m pytest tests -q -x -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest.txt"
fp8gemm check --random 8 > "$OUT/check.txt" 2>&1; echo "fp8gemm check exit $?"; tail -3 "$OUT/check.txt"
for arg in "$@"; do
  case $arg in
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/gpu/sanitize.py > "$OUT/sanitize_$tool.txt" 2>&1
        echo "compute-sanitizer $tool exit $?"; tail -3 "$OUT/sanitize_$tool.txt"
      done ;;
    bench)
      fp8gemm bench --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.txt" | tail -40 ;;
  esac
done
