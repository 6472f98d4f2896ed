#!/usr/bin/env bash
# The Linear layer on a machine with a Hopper GPU: build (session.sh), the layer and quantization
# conformance on the GPU, compute-sanitizer on the quantization kernel, then the layer benchmark
# against the peers that travel as wheels (.whl/) and DeepGEMM (third_party/dg.tar.xz).
# Usage (GPU machine, repo root): bash ci/gpu/layer.sh [peers] [tests] [sanitize] [bench]
# (peers alone: install the peers only; SKIP_BUILD=1: the packages are installed already; a layer run longer
# than one command: bring its $OUT/layer.json back into the tree and pass it as LAYER_JSON to finish it;
# LAYER_TIMEOUT: seconds for the bench, default 540)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++-13 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 FP8GEMM_TEST_DEVICE=cuda
peers() {  # torchao, transformers' Triton FP8 kernels (< 5, with the hub/tokenizers it needs), DeepGEMM
  python3 -m pip install -q --no-deps .whl/torchao-*.whl > "$OUT/peers.log" 2>&1
  python3 -m pip install -q --no-deps --target /tmp/hf .whl/transformers-4*.whl .whl/huggingface_hub-*.whl \
    .whl/tokenizers-*.whl >> "$OUT/peers.log" 2>&1
  mkdir -p /tmp/dg && tar xJf third_party/dg.tar.xz -C /tmp/dg && (cd /tmp/dg/DeepGEMM && bash develop.sh) >> "$OUT/peers.log" 2>&1
}
if [ "${1:-}" = peers ]; then peers; exit 0; fi
if [ -z "${SKIP_BUILD:-}" ]; then
  peers & SKIP_TESTS=1 bash ci/gpu/session.sh || exit 1
  wait
fi
export PYTHONPATH=/tmp/hf:/tmp/dg/DeepGEMM
python3 -c "import deep_gemm, torchao, transformers; print('peers:', transformers.__version__, torchao.__version__)" 2>&1 | tail -1
for arg in "$@"; do
  case $arg in
    tests)
      timeout 300 python3 -m pytest tests/test_layer_conformance.py tests/test_quantize.py tests/test_nn.py tests/test_nn_checkpoint.py tests/test_nn_transformer.py -q -p no:cacheprovider -x 2>&1 \
        | tail -6 | tee "$OUT/pytest_layer.txt" ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
          tests/test_layer_conformance.py -k "sm90a and (quantize or 512)" > "$OUT/san_quantize_$tool.txt" 2>&1
        echo "compute-sanitizer $tool quantize: exit $? $(tail -1 "$OUT/san_quantize_$tool.txt")"
      done ;;
    bench)  # the report is rewritten after every shape; LAYER_JSON=<an earlier partial report> resumes it
      [ -n "${LAYER_JSON:-}" ] && cp "$LAYER_JSON" "$OUT/layer.json"
      resume=$([ -f "$OUT/layer.json" ] && echo --resume)
      timeout ${LAYER_TIMEOUT:-540} fp8gemm bench --layer $resume --json "$OUT/layer.json" --plot "$OUT/layer.png" 2>&1 | tee "$OUT/layer.txt" | tail -40 ;;
  esac
done
