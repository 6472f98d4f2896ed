"""An arch package built without its GPU compiler stops at configure time with its own message: the compiler and
version it needs and where to get it (for nvcc, the PyPI wheels), not CMake's generic "No CMAKE_CUDA_COMPILER"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11
import pytest
from isa import ROOT


def configure(package: str, tmp: Path, *defines: str) -> subprocess.CompletedProcess:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    core = ROOT / "packages" / "fp8gemm-core" / "src"
    bare = os.pathsep.join(d for d in ("/usr/bin", "/bin") if not Path(d, "nvcc").exists())
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_PATH", "CUDA_HOME", "CUDAToolkit_ROOT")}
    env.update(PATH=bare, PYTHONPATH=str(core))
    cmd = [cmake, "-S", str(ROOT / "packages" / package), "-B", str(tmp), f"-DPython_EXECUTABLE={sys.executable}",
           f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", *defines]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("package", ["fp8gemm-cuda-sm90a", "fp8gemm-cuda-sm120"])
def test_cuda_package_without_nvcc_names_the_version_and_the_pypi_wheels(package, tmp_path):
    run = configure(package, tmp_path)
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0
    assert f"{package} is compiled by nvcc >= 12.8" in out and "nvidia-cuda-nvcc" in out, out[-3000:]
    assert "No CMAKE_CUDA_COMPILER could be found" not in out


def test_rocm_package_without_its_hip_compiler_names_hipcc_and_clang(tmp_path):
    run = configure("fp8gemm-rocm-gfx942", tmp_path, "-DFP8GEMM_HIP_COMPILER=no-such-hipcc")
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0
    assert "ROCm 6.3's hipcc" in out and "clang++ 19" in out and "'no-such-hipcc' was not found" in out, out[-3000:]
