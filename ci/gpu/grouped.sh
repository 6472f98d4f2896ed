#!/usr/bin/env bash
# The grouped GEMMs on a machine with a Hopper GPU: build (session.sh), the grouped suites on the GPU, bitwise
# repeatability, compute-sanitizer on the grouped kernels, then the grouped benchmark against DeepGEMM
# (third_party/dg.tar.xz), a dense loop and bf16 torch._grouped_mm.
# Usage (GPU machine, repo root): bash ci/gpu/grouped.sh [tests] [sanitize] [bench]   (SKIP_BUILD=1: installed already;
# GROUPED_JSON: an earlier partial report to resume; GROUPED_TIMEOUT: seconds for the bench, default 480)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 FP8GEMM_TEST_DEVICE=cuda
deepgemm() {
  mkdir -p /tmp/dg && tar xJf third_party/dg.tar.xz -C /tmp/dg \
    && (cd /tmp/dg/DeepGEMM && PATH=$(dirname "$(command -v python3)"):$PATH bash develop.sh) > "$OUT/deepgemm.log" 2>&1 \
    || echo "DeepGEMM build failed: $(tail -3 "$OUT/deepgemm.log")"
}
if [ -z "${SKIP_BUILD:-}" ]; then
  deepgemm & SKIP_TESTS=1 bash ci/gpu/session.sh || exit 1
  wait
fi
export PYTHONPATH=/tmp/dg/DeepGEMM
python3 -c "import deep_gemm; print('DeepGEMM', deep_gemm.__version__)" 2>&1 | tail -1
for arg in "$@"; do
  case $arg in
    tests)
      timeout 60 python3 ci/gpu/sanitize.py sm90a > "$OUT/smoke_sm90a.txt" 2>&1 || { echo "smoke failed:"; tail -20 "$OUT/smoke_sm90a.txt"; exit 1; }
      timeout 300 python3 -m pytest tests/test_grouped.py tests/test_grouped_dispatch.py tests/test_conformance.py \
        tests/test_errors.py -q -p no:cacheprovider -x 2>&1 | tail -6 | tee "$OUT/pytest_grouped.txt"
      timeout 200 fp8gemm check --backend sm90a --random 12 > "$OUT/check_sm90a.txt" 2>&1; echo "fp8gemm check sm90a: exit $?"
      timeout 60 python3 ci/gpu/repeatable.py sm90a 2>&1 | tee "$OUT/repeatable.txt" | tail -3 ;;
    sanitize)
      # racecheck on the fixed edge cases only: it runs the mixture-of-experts sizes past any time limit
      for tool in memcheck racecheck; do
        timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/gpu/sanitize.py sm90a --grouped-only \
          $([ $tool = racecheck ] && echo --small) > "$OUT/san_grouped_$tool.txt" 2>&1
        echo "compute-sanitizer $tool grouped sm90a: exit $? $(tail -1 "$OUT/san_grouped_$tool.txt")"
      done ;;
    bench)
      [ -n "${GROUPED_JSON:-}" ] && cp "$GROUPED_JSON" "$OUT/grouped.json"
      resume=$([ -f "$OUT/grouped.json" ] && echo --resume)
      timeout ${GROUPED_TIMEOUT:-480} fp8gemm bench --grouped $resume --json "$OUT/grouped.json" --plot "$OUT/grouped.png" \
        2>&1 | tee "$OUT/grouped.txt" | tail -50 ;;
  esac
done
