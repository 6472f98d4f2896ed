#!/usr/bin/env bash
# The MoE experts layer and whole transformers models on a machine with a Hopper GPU: build (grouped.sh: session.sh
# and DeepGEMM from third_party/dg.tar.xz), then `fp8gemm bench --moe` and ci/gpu/models.py, results in $OUT.
# Usage (GPU machine, repo root): bash ci/gpu/moe.sh [bench] [quick] [models] [models-quick]
#   bench: fp8gemm bench --moe (quick: its --quick subset) -> $OUT/moe.json, moe.png, moe.txt
#   models: ci/gpu/models.py (models-quick: --quick) -> $OUT/models.json, models.txt; it first lays out the Hub
#           kernel (ci/build_hub.py with a freshly built sm90a wheel, /tmp/hub) for the LOCAL_KERNELS route
# SKIP_BUILD=1: installed already (a warm machine). MOE_JSON: an earlier partial moe.json to resume.
# MOE_TIMEOUT / MODELS_TIMEOUT: seconds (default 540 each). MODELS_ARGS: more models.py options, e.g.
# "--models qwen3-moe --name models_moe" to split the full run over two commands. Needs .whl/kernels-*.whl carried if kernels is missing,
# in the installed transformers' range (ci/gpu/kernels_wheels.py picks it; kernels 0.16 also needs its kernels_data).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CUDACXX=$(command -v nvcc) PYTHONUNBUFFERED=1 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR=1
if [ -z "${SKIP_BUILD:-}" ]; then
  bash ci/gpu/grouped.sh || exit 1
fi
export PYTHONPATH=/tmp/dg/DeepGEMM
python3 -c "import kernels" 2>/dev/null || { wheels=$(python3 ci/gpu/kernels_wheels.py .whl) \
  && python3 -m pip install -q --no-deps $wheels > "$OUT/kernels.log" 2>&1; } \
  || echo "kernels is not installed and .whl has none in the installed transformers' range: its FP8 paths will report it"
python3 -c "import transformers, kernels, deep_gemm; print('transformers', transformers.__version__, 'kernels', kernels.__version__)" 2>&1 | tail -1
hub() {  # the Hub layout of ci/build_hub.py with this machine's sm90a wheel (the LOCAL_KERNELS route)
  [ -f /tmp/hub/build.toml ] && return 0
  rm -rf /tmp/hubwheels && python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/hubwheels \
    packages/fp8gemm-cuda-sm90a > "$OUT/hub.log" 2>&1 \
    && python3 ci/build_hub.py --wheel /tmp/hubwheels/*.whl --out /tmp/hub >> "$OUT/hub.log" 2>&1 \
    || { echo "hub build failed: $(tail -3 "$OUT/hub.log")"; rm -rf /tmp/hub; }
}
hub_pid=
case " $* " in *" models"*) hub & hub_pid=$! ;; esac  # compiles on the CPU while the bench runs on the GPU
for arg in "$@"; do
  case $arg in
    bench|quick)
      [ -n "${MOE_JSON:-}" ] && cp "$MOE_JSON" "$OUT/moe.json"
      resume=$([ -f "$OUT/moe.json" ] && echo --resume)
      timeout ${MOE_TIMEOUT:-540} fp8gemm bench --moe $([ $arg = quick ] && echo --quick) $resume \
        --json "$OUT/moe.json" --plot "$OUT/moe.png" 2>&1 | tee "$OUT/moe.txt" | tail -60 ;;
    models|models-quick)
      [ -n "$hub_pid" ] && wait $hub_pid; hub_pid=
      hubarg=$([ -f /tmp/hub/build.toml ] && echo --hub /tmp/hub)
      timeout ${MODELS_TIMEOUT:-540} python3 ci/gpu/models.py --out "$OUT" $hubarg \
        $([ $arg = models-quick ] && echo --quick --name models_quick) ${MODELS_ARGS:-} 2>&1 | tee "$OUT/models.txt" | tail -60 ;;
  esac
done
