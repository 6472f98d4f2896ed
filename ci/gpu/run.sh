#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2046
# The maintainers' GPU script: build, test, sanitize and benchmark on a machine with a GPU, in named steps, results
# in $OUT. How to use each step: docs/benchmarks.md, "Running it on a GPU".
#
# Usage (repository root): bash ci/gpu/run.sh STEP...      e.g. bash ci/gpu/run.sh build tests sanitize
#   build          install the core and the bench package; build every arch package (or test build) whose machine
#                  code runs on this GPU (packages/*/arch.toml); fp8gemm info
#   peers          the benchmarks' peers: torchao and transformers 4.x's Triton FP8 kernels (.whl/), DeepGEMM
#                  (third_party/dg.tar.xz, built in /tmp/dg) and `kernels` (.whl/, in the installed transformers' range)
#   tests          a smoke run per backend (a hung kernel costs a minute), then the test suite on the GPU
#   check          fp8gemm check --random 12 per backend
#   sanitize       compute-sanitizer memcheck and racecheck per backend: GEMMs, grouped GEMMs, quantizers, MoE steps
#   bench-gemm     fp8gemm bench --rounds 3       -> gemm.json, gemm.png, gemm.txt
#   bench-layer    fp8gemm bench --layer          -> layer.json, layer.png, layer.txt
#   bench-grouped  fp8gemm bench --grouped        -> grouped.json, grouped.png, grouped.txt
#   bench-moe      fp8gemm bench --moe            -> moe.json, moe.png, moe.txt
#   bench-train    fp8gemm bench --train          -> train.json, train.png, train.txt
#   bench-train-moe  fp8gemm bench --train --moe  -> train_moe.json, train_moe.png, train_moe.txt
#   train-run      fp8gemm bench --train-run, then --throughput -> train_run.*, train_tput.*; TRAIN_RUN=moe:
#                  fp8gemm bench --train-run --moe instead (a byte-level Qwen3-MoE) -> train_run_moe.*
#   train-fsdp     fp8gemm bench --train-fsdp (two GPUs) -> train_fsdp.*; TRAIN_FSDP=moe: --train-fsdp --moe instead
#                  -> train_fsdp_moe.*, or "dense moe" for both
#   models         python3 -m fp8gemm_bench.models on whole transformers models (the Hub layout in /tmp/hub first)
#   host           python3 ci/host_overhead.py, per call and whole models in eager (`kernels` from .whl/ for
#                  transformers' rows) -> host.txt, host.json, eager.txt, eager.json
#   hub            kernel-builder's build of the Hub kernel, then the conformance rows through the built library
#   ab             AB_OLD=DIR: that copy of an arch package against the working tree's, both built and timed in one
#                  process on the GEMM benchmark's shapes (ci/gpu/inprocess_ab.py) -> ab.txt, inprocess_ab.json
# Environment: OUT (/tmp/out); TIMEOUT_<STEP> seconds (TIMEOUT_BENCH_LAYER=300); BENCH_ARGS, more options of the
# bench-* steps (--quick, --decode); MODELS_ARGS, of models; RESUME_FROM=DIR: a bench-* step continues DIR/<name>.json
# (a report cut short; one already in $OUT is continued too); SANITIZE_BACKENDS (default: every backend built here);
# TRAIN_RUN, the train-run step's runs: dense (default), moe, or "dense moe"; TRAIN_FSDP, the same for train-fsdp;
# AB_ROUNDS (3); HUB_ARCHES (default: the shipped arch builds of this GPU, in one library).
set -uo pipefail  # no -e: a failed step is reported and the next runs; SC2086/SC2046: word lists split on purpose
cd "$(dirname "$0")/../.." || exit 1
STEPS=" build peers tests check sanitize bench-gemm bench-layer bench-grouped bench-moe bench-train bench-train-moe train-run train-fsdp models host hub ab "
[ $# -gt 0 ] || { awk 'NR > 2 && /^#/ {sub(/^# ?/, ""); print; next} NR > 2 {exit}' "$0"; exit 2; }
for step in "$@"; do
  [[ $STEPS == *" $step "* ]] || { echo "run.sh: unknown step '$step'; the steps are:$STEPS" >&2; exit 2; }
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT CXX=${CXX:-/usr/bin/g++-13} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} CUDACXX=${CUDACXX:-$(command -v nvcc)} \
  PYTHONUNBUFFERED=1 FP8GEMM_TEST_DEVICE=cuda HF_HUB_OFFLINE=1
DEEPGEMM=/tmp/dg/DeepGEMM HF4=/tmp/hf HUB=/tmp/hub
failed=()

# Seconds for a step: $TIMEOUT_<STEP> (bench-layer: TIMEOUT_BENCH_LAYER), else the default given.
seconds() { local var="TIMEOUT_${1//-/_}"; var=${var^^}; echo "${!var:-$2}"; }
# A command of a step, its output in $OUT/<log> and its last lines on screen; a failure is counted.
logged() {  # log lines command...
  local log=$1 lines=$2; shift 2
  "$@" > "$OUT/$log" 2>&1; local status=$?
  tail -n "$lines" "$OUT/$log"
  [ $status = 0 ] || { echo "FAILED (exit $status): $* (log: $OUT/$log)"; failed+=("$log"); }
  return $status
}
# This GPU's builds (ci/arches.py gpu-builds: "package backend [VAR=value ...]"), from the core's device description.
gpu_builds() {
  local targets
  targets=$(python3 -c "import fp8gemm; print(' '.join(fp8gemm.describe_device('cuda').targets))") || return 1
  python3 ci/arches.py gpu-builds $targets
}
backends() { gpu_builds | awk '{print $2}' | xargs; }
# The builds as shipped (no test-build variables): their packages, their backends.
shipped() { gpu_builds | awk 'NF == 2 {print $1}' | xargs; }
shipped_backends() { gpu_builds | awk 'NF == 2 {print $2}' | xargs; }

build() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -m pip install -q --no-deps --no-build-isolation -e packages/fp8gemm-core -e bench || return 1
  local builds; builds=$(gpu_builds) || return 1
  [ -n "$builds" ] || { echo "no arch package runs on this GPU"; return 1; }
  local pids=()
  while read -r pkg _ vars; do
    env $vars python3 -m pip install -q --no-deps --no-build-isolation "packages/$pkg" > "$OUT/build_$pkg.log" 2>&1 &
    pids+=("$!:$pkg")
  done <<< "$builds"
  local status=0
  for entry in "${pids[@]}"; do
    wait "${entry%%:*}" || { tail -40 "$OUT/build_${entry#*:}.log"; status=1; }
  done
  fp8gemm info > "$OUT/info.txt"; tail -4 "$OUT/info.txt"
  return $status
}

peers() {
  { python3 -m pip install -q --no-deps .whl/torchao-*.whl
    python3 -m pip install -q --no-deps --target "$HF4" .whl/transformers-4*.whl .whl/huggingface_hub-*.whl \
      .whl/tokenizers-*.whl
    python3 -c "import kernels" 2>/dev/null \
      || python3 -m pip install -q --no-deps $(python3 ci/gpu/kernels_wheels.py .whl)
    [ -d "$DEEPGEMM" ] || { mkdir -p /tmp/dg && tar xJf third_party/dg.tar.xz -C /tmp/dg \
      && (cd "$DEEPGEMM" && PATH=$(dirname "$(command -v python3)"):$PATH bash develop.sh); }
  } > "$OUT/peers.log" 2>&1
  PYTHONPATH=$DEEPGEMM python3 -c "import deep_gemm, torchao, kernels; print('DeepGEMM', deep_gemm.__version__, \
'torchao', torchao.__version__, 'kernels', kernels.__version__)" 2>&1 | tail -1
}

tests() {
  for be in $(backends); do
    logged "smoke_$be.txt" 3 timeout "$(seconds smoke 60)" python3 ci/gpu/sanitize.py "$be" \
      || { echo "the smoke run of $be failed: no further GPU step runs"; exit 1; }
  done
  logged tests.txt 8 timeout "$(seconds tests 500)" python3 -m pytest tests -q -p no:cacheprovider -x \
    --ignore tests/test_recipes.py --ignore tests/test_build_cuda.py --ignore tests/test_install.py \
    --ignore tests/test_build_gfx942.py
}

check() {
  for be in $(backends); do
    logged "check_$be.txt" 3 timeout "$(seconds check 200)" fp8gemm check --backend "$be" --random 12
  done
}

sanitize() {
  local limit; limit=$(seconds sanitize 300)
  for be in ${SANITIZE_BACKENDS:-$(backends)}; do
    for tool in memcheck racecheck; do
      # racecheck runs ~1000x slower than the kernels: the grouped GEMMs' fixed edge cases only (--small)
      logged "san_${be}_$tool.txt" 1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 ci/gpu/sanitize.py "$be" $([ $tool = racecheck ] && echo --small)
      logged "san_${be}_moe_$tool.txt" 1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 ci/gpu/sanitize.py "$be" --moe
      logged "san_${be}_quantize_$tool.txt" 1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m pytest -q -p no:cacheprovider tests/test_layer_conformance.py -k "$be and (quantize or 512)"
      logged "san_${be}_transposed_$tool.txt" 1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m pytest -q -p no:cacheprovider tests/test_gpu_training_quantize.py -k "$be and (float32 or 3d)"
      logged "san_${be}_sources_$tool.txt" 1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m pytest -q -p no:cacheprovider tests/test_gpu_grouped_sources.py -k "$be and not fake"
    done
  done
}

train_fsdp() {  # TRAIN_FSDP: dense (default), moe or "dense moe": the FSDP2 check of that model on two GPUs
  local runs=" ${TRAIN_FSDP:-dense} " kind
  if ! [[ $runs =~ ^( (dense|moe))+\ $ ]]; then
    echo "train-fsdp: TRAIN_FSDP='${TRAIN_FSDP:-}': dense, moe or \"dense moe\""; failed+=(train-fsdp); return
  fi
  for kind in $runs; do
    local name=train_fsdp$([ "$kind" = moe ] && echo _moe)
    logged "$name.txt" 10 timeout "$(seconds "$name" 300)" fp8gemm bench --train-fsdp $([ "$kind" = moe ] && echo --moe) \
      --json "$OUT/$name.json" --plot "$OUT/$name.png"
  done
}

bench() {  # name lines fp8gemm-bench-options...: the report is rewritten after every case, so a cut one resumes
  local name=$1 lines=$2; shift 2
  [ -n "${RESUME_FROM:-}" ] && [ -f "$RESUME_FROM/$name.json" ] && cp "$RESUME_FROM/$name.json" "$OUT/$name.json"
  local resume; resume=$([ "$name" != gemm ] && [ -f "$OUT/$name.json" ] && echo --resume)
  logged "$name.txt" "$lines" timeout "$(seconds "bench-$name" 540)" fp8gemm bench "$@" $resume ${BENCH_ARGS:-} \
    --json "$OUT/$name.json" --plot "$OUT/$name.png"
}

hub_layout() {  # the Hub layout of ci/build_hub.py with this GPU's arch wheels, for the models' LOCAL_KERNELS route
  [ -f "$HUB/build.toml" ] && return 0
  rm -rf /tmp/hubwheels
  for pkg in $(shipped); do
    python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/hubwheels "packages/$pkg" || return 1
  done
  python3 ci/build_hub.py --wheel /tmp/hubwheels/*.whl --out "$HUB" || { rm -rf "$HUB"; return 1; }
}

models() {
  [ -n "${hub_pid:-}" ] && wait "$hub_pid"
  local hub; hub=$([ -f "$HUB/build.toml" ] && echo "--hub $HUB")
  [ -n "$hub" ] || echo "no Hub layout ($OUT/hub_layout.log): the LOCAL_KERNELS route is left out"
  TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR=1 logged models.txt 60 timeout "$(seconds models 540)" \
    python3 -m fp8gemm_bench.models --out "$OUT" $hub ${MODELS_ARGS:-}
}

train_run() {  # dense: the convergence run on the standard library's source, then the throughput of a Llama-3-8B-shaped
  # model; moe: the convergence run of a byte-level Qwen3-MoE
  local runs=" ${TRAIN_RUN:-dense} "
  if ! [[ $runs =~ ^( (dense|moe))+\ $ ]]; then
    echo "train-run: TRAIN_RUN='${TRAIN_RUN:-}': dense, moe or \"dense moe\""; failed+=(train-run); return
  fi
  if [[ $runs == *" dense "* ]]; then
    logged train_run.txt 20 timeout "$(seconds train-run 540)" fp8gemm bench --train-run --json "$OUT/train_run.json" \
      --plot "$OUT/train_run.png"
    logged train_tput.txt 10 timeout "$(seconds train-tput 300)" fp8gemm bench --train-run --throughput \
      --json "$OUT/train_tput.json" --plot "$OUT/train_tput.png"
  fi
  if [[ $runs == *" moe "* ]]; then
    logged train_run_moe.txt 20 timeout "$(seconds train-run-moe 420)" fp8gemm bench --train-run --moe \
      --json "$OUT/train_run_moe.json" --plot "$OUT/train_run_moe.png"
  fi
}

host() {  # per call, then whole models; transformers' rows need `kernels` (its wheels in .whl/, as peers installs them)
  python3 -c "import kernels" 2>/dev/null || python3 -m pip install -q --no-deps $(python3 ci/gpu/kernels_wheels.py .whl)
  logged host.txt 40 timeout "$(seconds host 300)" python3 ci/host_overhead.py --json "$OUT/host.json"
  logged eager.txt 40 timeout "$(seconds eager 400)" python3 ci/host_overhead.py --models --json "$OUT/eager.json"
}

hub() {  # kernel-builder's CMake project from ci/build_hub.py's tree, built, then checked (ci/hub/check_variant.py)
  local tree=/tmp/fp8gemm-hub-builder arches=${HUB_ARCHES:-}
  [ -n "$arches" ] || arches=$(shipped_backends)
  rm -rf "$tree"
  python3 ci/build_hub.py --out "$tree" --builder-backends cuda --builder-arches $arches > "$OUT/hub.txt" 2>&1 \
    || return 1
  if command -v kernel-builder >/dev/null; then
    kernel-builder create-pyproject "$tree" --force --unique-id gpu >> "$OUT/hub.txt" 2>&1
  else
    python3 ci/hub/kernel_builder.py "$tree" --unique-id gpu >> "$OUT/hub.txt" 2>&1
  fi || return 1
  local start=$SECONDS
  { cmake -S "$tree" -B "$tree/_cmake_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVCC_THREADS=2 \
      -DPython3_EXECUTABLE="$(command -v python3)" \
    && cmake --build "$tree/_cmake_build" --target local_install -j "$(nproc)"; } >> "$OUT/hub.txt" 2>&1 \
    || { tail -30 "$OUT/hub.txt"; return 1; }
  echo "kernel-builder build: $((SECONDS - start)) s"
  logged hub_check.txt 4 python3 ci/hub/check_variant.py "$(ls -d "$tree"/build/torch*-cu*)" \
    --backend "${arches%% *}" --expect-arches $(printf 'fp8gemm_cuda_%s ' $arches)
}

ab() {  # AB_OLD: a copy of packages/<package> before the change, e.g. made with
  # mkdir -p build/ab-old && git archive main LICENSE packages/<package> | tar -x -C build/ab-old  (build/: git-ignored)
  if [ -z "${AB_OLD:-}" ] || [ ! -f "$AB_OLD/pyproject.toml" ]; then
    echo "ab: set AB_OLD to a copy of the arch package before the change (a folder with its pyproject.toml)"; return 2
  fi
  local new dir=/tmp/ab; new=packages/$(basename "$AB_OLD")
  rm -rf "$dir"; mkdir -p "$dir"
  python3 -m pip install -q --no-deps --no-build-isolation --target "$dir/old" "$AB_OLD" \
    > "$OUT/ab_build_old.log" 2>&1 &
  local old_pid=$!
  python3 -m pip install -q --no-deps --no-build-isolation --target "$dir/new" "$new" > "$OUT/ab_build_new.log" 2>&1 \
    || { tail -40 "$OUT/ab_build_new.log"; return 1; }
  wait $old_pid || { tail -40 "$OUT/ab_build_old.log"; return 1; }
  local shapes; shapes=$(python3 -c "from fp8gemm_bench.bench import SHAPE_SETS
print(' '.join('%d,%d,%d' % s for s in SHAPE_SETS['deepseek-v3']))") || return 1
  logged ab.txt 30 timeout "$(seconds ab 300)" python3 ci/gpu/inprocess_ab.py "${AB_ROUNDS:-3}" \
    old="$dir/old" new="$dir/new" -- $shapes
}

# The peers' DeepGEMM build and the models' Hub layout compile on the CPU while the earlier steps run.
[[ " $* " == *" peers "* ]] && { peers & peers_pid=$!; }
for step in "$@"; do
  [ -d "$DEEPGEMM" ] && export PYTHONPATH=$DEEPGEMM
  if [[ " $* " == *" models "* ]] && [ -z "${hub_pid:-}" ] && [ "$step" != build ]; then
    hub_layout > "$OUT/hub_layout.log" 2>&1 & hub_pid=$!
  fi
  echo "== $step"
  if [ "$step" != build ] && [ "$step" != peers ] && ! python3 -c "import fp8gemm" 2>/dev/null; then
    echo "run.sh: fp8gemm is not installed here: run the build step first (bash ci/gpu/run.sh build $step)"; exit 1
  fi
  case $step in
    build) build || { echo "build failed: the other steps need it"; exit 1; } ;;
    peers) wait "$peers_pid" || failed+=(peers) ;;
    tests) tests ;;
    check) check ;;
    sanitize) sanitize ;;
    bench-gemm) bench gemm 32 --rounds 3 ;;
    bench-layer) PYTHONPATH=$HF4:${PYTHONPATH:-} bench layer 40 --layer ;;
    bench-grouped) bench grouped 50 --grouped ;;
    bench-moe) bench moe 60 --moe ;;
    bench-train) bench train 40 --train ;;
    bench-train-moe) bench train_moe 40 --train --moe ;;
    train-run) train_run ;;
    train-fsdp) train_fsdp ;;
    models) models ;;
    host) host ;;
    hub) hub || failed+=(hub) ;;
    ab) ab || failed+=(ab) ;;
  esac
done
[ ${#failed[@]} = 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
