"""``fp8gemm::float_to_e4m3<7>`` (e4m3fn) and ``<8>`` (e4m3fnuz), the integer rounding the quantization
kernels use where the target has no conversion instruction to check against, compiled for the host from
the core's header and compared with torch's conversion after clamping to the format's maximum (the
quantizers saturate): every code's value, the exact midpoints between neighbouring codes and one fp32
ulp either side, signed zeros, subnormals of both formats, fp32 denormals, huge values, infinities, NaNs
and a million random floats. NaN is compared as NaN; every other result code for code."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import fp8gemm
import pytest
import torch
from isa import require_tool

SOURCE = r"""
#define FP8GEMM_QFN inline
#include "fp8gemm/quantize_rows.cuh"

extern "C" void to_e4m3fn(const float* x, uint8_t* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = fp8gemm::float_to_e4m3<7>(x[i]);
}
extern "C" void to_e4m3fnuz(const float* x, uint8_t* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = fp8gemm::float_to_e4m3<8>(x[i]);
}
"""
FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("c++") or require_tool("g++")
    tmp = tmp_path_factory.mktemp("fp8-convert")
    (tmp / "convert.cpp").write_text(SOURCE)
    lib = tmp / "libconvert.so"
    cmd = [compiler, "-std=c++17", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{fp8gemm.get_include()}"]
    run = subprocess.run([*cmd, str(tmp / "convert.cpp"), "-o", str(lib)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = ctypes.CDLL(str(lib))
    for name in FORMATS:
        getattr(loaded, f"to_{name}").argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return loaded


def convert(library, name: str, x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float32).contiguous()
    out = torch.full(x.shape, 0x55, dtype=torch.uint8)
    getattr(library, f"to_{name}")(x.data_ptr(), out.data_ptr(), x.numel())
    return out.view(FORMATS[name])


def expected(name: str, x: torch.Tensor) -> torch.Tensor:
    fp8_max = torch.finfo(FORMATS[name]).max
    return x.to(torch.float32).clamp(-fp8_max, fp8_max).to(FORMATS[name])


def finite_code_values(name: str) -> torch.Tensor:
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FORMATS[name]).float()
    return values[values.isfinite()]


def midpoints(name: str) -> torch.Tensor:
    """Halfway between neighbouring codes (exact in fp32), one ulp below and above, both signs."""
    positive = finite_code_values(name).abs().unique().sort().values
    halves = (positive[1:] + positive[:-1]) / 2
    halves = torch.cat([halves, positive[-1:] * (1 + 1 / 32)])  # halfway past the maximum: saturates
    near = torch.cat([halves, halves.nextafter(torch.zeros(())), halves.nextafter(torch.full((), float("inf")))])
    return torch.cat([near, -near])


def specials(name: str) -> torch.Tensor:
    tiny = torch.finfo(torch.float32).tiny
    smallest = finite_code_values(name).abs().unique().sort().values[1]  # the smallest subnormal code
    values = [0.0, -0.0, smallest / 2, smallest / 4, smallest * 0.75, smallest * 1.5, smallest * 2.5]
    values += [tiny, tiny / 2, 1e-45, 1e-40, 2.0**-149, 2.0**-126 * (1 - 2.0**-23)]  # fp32 (de)normals
    values += [1e30, 3.4028234663852886e38, float("inf"), float("nan")]
    x = torch.tensor(values, dtype=torch.float32)
    nan_payloads = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000], dtype=torch.int32).view(torch.float32)
    return torch.cat([x, -x, nan_payloads, -nan_payloads])


def random_floats(count: int) -> torch.Tensor:
    """Half over every fp32 bit pattern, half scaled normals across the FP8 range and its edges."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    bits = torch.randint(-(2**31), 2**31, (count // 2,), generator=gen, dtype=torch.int64).to(torch.int32)
    scaled = torch.randn(count - count // 2, generator=gen) * torch.pow(
        2.0, torch.randint(-14, 10, (count - count // 2,), generator=gen).float()
    )
    return torch.cat([bits.view(torch.float32), scaled])


def assert_same(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    got_nan, want_nan = got.float().isnan(), want.float().isnan()
    wrong = (got_nan != want_nan) | (~want_nan & (got.view(torch.uint8) != want.view(torch.uint8)))
    if wrong.any():
        i = wrong.nonzero().flatten()[:8]
        codes = zip(x[i].tolist(), x[i].view(torch.int32).tolist(), got.view(torch.uint8)[i].tolist(),
                    want.view(torch.uint8)[i].tolist(), strict=True)  # fmt: skip
        rows = [f"{v!r} (0x{b & 0xFFFFFFFF:08x}): got 0x{g:02x}, want 0x{w:02x}" for v, b, g, w in codes]
        raise AssertionError(f"{int(wrong.sum())} of {x.numel()} differ, e.g.\n" + "\n".join(rows))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("inputs", ["codes", "midpoints", "specials", "random"])
def test_float_to_e4m3_matches_torch(library, name, inputs):
    x = {
        "codes": lambda: torch.cat([finite_code_values(name), -finite_code_values(name)]),
        "midpoints": lambda: midpoints(name),
        "specials": lambda: specials(name),
        "random": lambda: random_floats(1_000_000),
    }[inputs]()
    assert_same(convert(library, name, x), expected(name, x), x)
