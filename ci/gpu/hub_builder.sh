#!/usr/bin/env bash
# kernel-builder's build of fp8gemm on a GPU machine (sm90a by default, < 5 min on 16 cores), then the core's
# conformance suite through the built op library. Needs torch with CUDA (2.11+cu130), nvcc 13.0, cmake >= 3.26, ninja;
# no network.
#   bash ci/gpu/hub_builder.sh [OUT]      (CXX defaults to /usr/bin/g++-13; ARCHES="sm90a sm120": both in one library)
# Steps: ci/build_hub.py emits the source tree (build.toml, torch-ext/ with the Torch binding, the sm90a csrc);
# ci/hub/kernel_builder.py renders kernel-builder's CMake project from it (kernel-builder's own templates,
# huggingface/kernels@8ac69fc; `kernel-builder create-pyproject` where it is installed gives the same); cmake builds
# the target local_install (build/<variant>/ as kernels.get_local_kernel loads it); ci/hub/check_variant.py runs the
# rows of `fp8gemm check` against that variant with the sm90a backend.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/fp8gemm-hub-builder}
export CXX=${CXX:-/usr/bin/g++-13}
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
rm -rf "$out"
arches=${ARCHES:-sm90a}
python3 ci/build_hub.py --out "$out" --builder-backends cuda --builder-arches $arches
if command -v kernel-builder >/dev/null; then
  kernel-builder create-pyproject "$out" --force --unique-id gpu
else
  python3 ci/hub/kernel_builder.py "$out" --unique-id gpu
fi
start=$SECONDS
cmake -S "$out" -B "$out/_cmake_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVCC_THREADS=2 \
  -DPython3_EXECUTABLE="$(command -v python3)"
cmake --build "$out/_cmake_build" --target local_install -j "$(nproc)"
echo "kernel-builder build: $((SECONDS - start)) s"
variant=$(ls -d "$out"/build/torch*-cu*)
python3 ci/hub/check_variant.py "$variant" --backend sm90a --expect-arches $(printf 'fp8gemm_cuda_%s ' $arches)
