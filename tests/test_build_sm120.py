"""fp8gemm-cuda-sm120 without a GPU: it compiles for sm_120 and its SASS holds the FP8 tensor-core MMA."""

from __future__ import annotations

import re
import subprocess

import pytest

from isa import build_wheel, extract_module, needed_libraries, require_tool, sass_opcodes


@pytest.fixture(scope="module")
def sm120_module(tmp_path_factory):
    require_tool("nvcc")
    tmp = tmp_path_factory.mktemp("sm120")
    wheel = build_wheel("fp8gemm-cuda-sm120", tmp / "wheel")
    return extract_module(wheel, tmp / "unpacked")


def test_ships_sm120_machine_code_only(sm120_module):
    cuobjdump = require_tool("cuobjdump")
    elves = subprocess.run([cuobjdump, "-lelf", str(sm120_module)], capture_output=True, text=True, check=True).stdout
    assert re.findall(r"sm_\d+a?", elves) == ["sm_120"], elves


def test_sass_has_fp8_mma_ldmatrix_and_async_copies(sm120_module):
    ops = sass_opcodes(require_tool("cuobjdump"), sm120_module)
    qmma = {op: n for op, n in ops.items() if op.startswith("QMMA")}
    assert qmma.get("QMMA.16832.F32.E4M3.E4M3", 0) >= 64, qmma  # 16 MMAs x 4 K-steps per tile config
    assert any(op.startswith("LDSM") for op in ops), "no ldmatrix"
    assert any(op.startswith("LDGSTS") for op in ops), "no cp.async"
    assert not any(op.startswith(("HMMA", "FFMA")) and "E4M3" in op for op in ops)


def test_no_register_spills(sm120_module):
    out = subprocess.run([require_tool("cuobjdump"), "-res-usage", str(sm120_module)], capture_output=True, text=True, check=True).stdout
    kernels = re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    assert len(kernels) == 3, out  # two tile configs + split-K reduction
    for name, regs, stack, local in kernels:
        assert int(stack) == 0 and int(local) == 0, f"{name} spills: STACK {stack} LOCAL {local}"
        assert int(regs) <= 255


def test_binary_links_neither_torch_nor_the_cuda_runtime(sm120_module):
    needed = needed_libraries(sm120_module)
    assert not any("torch" in lib or "c10" in lib or "cudart" in lib for lib in needed), needed
