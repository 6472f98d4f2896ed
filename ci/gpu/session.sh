#!/usr/bin/env bash
# Everything a GPU machine checks: install the core, build every arch package (or test build) whose target runs on
# this GPU (packages/*/arch.toml), run the suite on the GPU, compute-sanitizer, the benchmark.
# Results land in $OUT. Usage (GPU machine, repo root): bash ci/gpu/session.sh [sanitize] [bench]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDACXX=$(command -v nvcc) PYTHONUNBUFFERED=1 FP8GEMM_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e packages/fp8gemm-core || exit 1
build() {  # package [env...]
  local pkg=$1; shift
  env "$@" python3 -m pip install -q --no-deps --no-build-isolation "packages/$pkg" > "$OUT/build_$pkg.log" 2>&1 \
    || { tail -40 "$OUT/build_$pkg.log"; exit 1; }
}
# This GPU's targets as the core describes them (sm_90a and sm_90 on Hopper), then the builds that run on them.
targets=$(python3 -c "import fp8gemm; print(' '.join(fp8gemm.describe_device('cuda').targets))") || exit 1
builds=$(python3 ci/arches.py gpu-builds $targets)
[ -n "$builds" ] || { echo "no arch package runs on $targets"; exit 1; }
backends=$(echo "$builds" | awk '{print $2}' | xargs)
if [ -z "${SKIP_BUILD:-}" ]; then
  while read -r pkg _ vars; do build "$pkg" $vars & done <<< "$builds"
  wait
fi
fp8gemm info > "$OUT/info.txt"; tail -4 "$OUT/info.txt"
[ -z "${SKIP_TESTS:-}" ] && for be in $backends; do  # smoke run first: a hung kernel costs a minute, not the whole lease
  timeout 60 python3 ci/gpu/sanitize.py $be > "$OUT/smoke_$be.txt" 2>&1 || { echo "smoke $be failed:"; tail -20 "$OUT/smoke_$be.txt"; exit 1; }
done
[ -z "${SKIP_TESTS:-}" ] && timeout 500 python3 -m pytest tests -q -p no:cacheprovider -x --ignore tests/test_recipes.py --ignore tests/test_build_cuda.py --ignore tests/test_install.py \
  --ignore tests/test_build_gfx942.py 2>&1 | tail -8 | tee "$OUT/pytest.txt"
for arg in "$@"; do
  case $arg in
    sanitize)
      for be in ${SANITIZE_BACKENDS:-$backends}; do for tool in memcheck racecheck; do
        timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/gpu/sanitize.py $be > "$OUT/san_${be}_$tool.txt" 2>&1
        echo "compute-sanitizer $tool $be: exit $? $(tail -1 "$OUT/san_${be}_$tool.txt")"
      done; done ;;
    bench)
      timeout 540 fp8gemm bench --rounds 3 --json "$OUT/bench.json" --plot "$OUT/bench.png" > "$OUT/bench.txt" 2>&1; tail -32 "$OUT/bench.txt" ;;
  esac
done
