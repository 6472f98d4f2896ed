"""Conformance cases for activation quantization and ``linear`` (``fp8gemm check`` and ``tests/``).

Quantization must match the pure-torch reference exactly: scales bit for bit, FP8 codes equal (NaN
codes compared as NaN). ``linear`` is held to the GEMM's tolerance against a float64 oracle on the
same quantized operands. Random data from each case's seed (printed with a failure); outputs come from memory
poisoned first.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..linear import linear
from ..ops import gemm
from ..quantize import quantize_activation, quantize_weight
from ..reference import BLOCK, oracle, reference_quantize
from .conformance import TOLERANCE, case_seed, relative_error

IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# (M, K): M = 0 and 1, tails of 16 rows, odd K/128, a 3-D input, decode and prefill sizes.
QUANT_SHAPES = [(0, 256), (1, 128), (1, 7168), (7, 384), (17, 1152), (129, 2048), (300, 640), (4096, 7168)]


@dataclasses.dataclass(frozen=True)
class QuantCase:
    m: int
    k: int
    dtype: torch.dtype = torch.bfloat16
    pow2: bool = False
    strided: bool = False  # rows of a wider buffer (row stride > K)
    batched: bool = False  # passed as [2, M/2, K] (M even)

    @property
    def id(self) -> str:
        flags = [str(self.dtype).removeprefix("torch.")] + ["pow2"] * self.pow2
        flags += ["strided"] * self.strided + ["3d"] * self.batched
        return f"{self.m}x{self.k}-" + "-".join(flags)


def quant_cases() -> list[QuantCase]:
    out = []
    for i, (m, k) in enumerate(QUANT_SHAPES):
        out.append(QuantCase(m, k, IN_DTYPES[i % 3], i % 2 == 1, i % 4 == 2, m % 2 == 0 and m > 0 and i % 3 == 0))
    return out + [QuantCase(64, 512, dtype, pow2) for dtype in IN_DTYPES for pow2 in (False, True)]


def poison_allocator(nbytes: int, device) -> None:
    """Leave ``nbytes`` of 0xFF (NaN in fp32 and FP8) in the caching allocator's next blocks."""
    if torch.device(device).type == "cuda":
        torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(0xFF)


def special_values(m: int, k: int, dtype, device, gen) -> torch.Tensor:
    """Random rows with magnitudes from 1e-30 to 1e3, and blocks that test the documented edge rules."""
    x = torch.randn(m, k, generator=gen, device=device)
    exponent = torch.randint(-30 if dtype == torch.float32 else -4, 4, (m, 1), generator=gen, device=device)
    x = x * torch.pow(10.0, exponent.float())
    if m >= 1 and k >= 4 * BLOCK:
        x[0, :BLOCK] = 0.0  # all-zero block: finite scale, zero codes
        x[0, BLOCK : 2 * BLOCK] = _ties(BLOCK, device, gen)  # exact RNE ties after scaling
        x[0, 2 * BLOCK + 5] = math.nan  # NaN block
        x[0, 3 * BLOCK + 9] = -math.inf  # infinite block
    return x.to(dtype)


def _ties(count: int, device, gen) -> torch.Tensor:
    """Values landing exactly halfway between two e4m3 codes once divided by the block's scale (1/8)."""
    mantissa = torch.randint(8, 15, (count,), generator=gen, device=device).float() + 0.5  # m + 1/2 of 8 steps
    t = mantissa / 8 * torch.pow(2.0, torch.randint(-3, 4, (count,), generator=gen, device=device).float())
    t[0] = 448.0 / 8  # amax = 56: scale exactly 1/8, so x / scale is exact
    return t.abs() * torch.where(torch.rand(count, generator=gen, device=device) < 0.5, -1.0, 1.0)


def _source(case: QuantCase, device, gen) -> torch.Tensor:
    x = special_values(case.m, case.k, case.dtype, device, gen)
    if case.strided:
        wide = torch.empty(case.m, case.k + BLOCK, dtype=case.dtype, device=device)
        wide[:, : case.k] = x
        x = wide[:, : case.k]
    return x.view(2, case.m // 2, case.k) if case.batched else x


def _same_codes(got: torch.Tensor, want: torch.Tensor) -> bool:
    nan_got, nan_want = torch.isnan(got.float()), torch.isnan(want.float())
    same = got.view(torch.uint8) == want.view(torch.uint8)
    return bool(torch.equal(nan_got, nan_want) and (same | nan_want).all())


def _same_scales(got: torch.Tensor, want: torch.Tensor) -> bool:
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    same = got.contiguous().view(torch.int32) == want.contiguous().view(torch.int32)
    return bool(torch.equal(nan_got, nan_want) and (same | nan_want).all())


def _seeded(check):
    """``check(case, device, backend, gen)`` run on data from the case's seed (conformance.case_seed), which a
    failure's detail names so the run repeats."""

    def run(case, device, backend: str | None, seed: int | None = None) -> tuple[bool, str]:
        data_seed = case_seed(case, seed)
        ok, detail = check(case, device, backend, torch.Generator(device=device).manual_seed(data_seed))
        return ok, detail if ok else f"{detail} (data seed {data_seed})"

    return run


@_seeded
def run_quant_case(case: QuantCase, device, backend: str | None, gen: torch.Generator) -> tuple[bool, str]:
    x = _source(case, device, gen)
    poison_allocator(4 * case.m * case.k + (1 << 20), device)
    try:
        q, scale = quantize_activation(x, pow2_scales=case.pow2, backend=backend)
    except Exception as exc:  # reported as a failed case
        return False, f"{type(exc).__name__}: {exc}"
    if tuple(q.shape) != (case.m, case.k) or tuple(scale.shape) != (case.m, case.k // BLOCK):
        return False, f"shapes {tuple(q.shape)} / {tuple(scale.shape)}"
    want_q, want_scale = reference_quantize(x.reshape(-1, case.k).cpu(), q.dtype, case.pow2)
    if not _same_scales(scale.cpu(), want_scale):
        return False, "scales differ from the reference"
    if not _same_codes(q.cpu(), want_q):
        return False, "FP8 codes differ from the reference"
    return True, ""


@dataclasses.dataclass(frozen=True)
class LinearCase:
    shape: tuple[int, ...]  # x's shape [..., K]
    n: int
    dtype: torch.dtype = torch.bfloat16
    bias: bool = False
    pow2: bool = False

    @property
    def id(self) -> str:
        lead = "x".join(map(str, self.shape))
        return f"{lead}->{self.n}-{str(self.dtype).removeprefix('torch.')}" + "-bias" * self.bias + "-pow2" * self.pow2


# Small batches with the decode shapes' N and K reach every sm90a decode tile (64 x 16 .. 64 x 96, the
# warpgroup K split, 128 x 64, split-K) with 1, 17, 64, 96 and 128 rows.
LINEAR_CASES = [
    LinearCase((1, 512), 272), LinearCase((3, 5, 384), 128, torch.float32, True), LinearCase((64, 1024), 2112),
    LinearCase((130, 256), 320, torch.float16, True), LinearCase((0, 256), 64), LinearCase((512, 7168), 576),
    LinearCase((1, 7168), 2112), LinearCase((17, 2048), 7168, bias=True), LinearCase((64, 7168), 2112, torch.float16),
    LinearCase((96, 2048), 7168, pow2=True), LinearCase((128, 7168), 576), LinearCase((2, 32, 1536), 3072, pow2=True),
]  # fmt: skip
# Relative error of the whole layer (x and W quantized) against the unquantized float64 product.
RECIPE_TOLERANCE = 6e-2


@_seeded
def run_linear_case(case: LinearCase, device, backend: str | None, gen: torch.Generator) -> tuple[bool, str]:
    k = case.shape[-1]
    x = torch.randn(case.shape, generator=gen, device=device).to(case.dtype)
    w = torch.randn(case.n, k, generator=gen, device=device) / math.sqrt(k)
    bias = torch.randn(case.n, generator=gen, device=device).to(case.dtype) if case.bias else None
    fp8 = _fp8_for(device, backend)
    qw, w_scale = quantize_weight(w, fp8_dtype=fp8)
    poison_allocator(4 * x.numel() + 4 * case.n * x.numel() // k + (1 << 20), device)
    try:
        y = linear(x, qw, w_scale, bias, pow2_scales=case.pow2, backend=backend)
    except Exception as exc:  # reported as a failed case
        return False, f"{type(exc).__name__}: {exc}"
    if tuple(y.shape) != (*case.shape[:-1], case.n) or y.dtype != case.dtype:
        return False, f"got {tuple(y.shape)} {y.dtype}"
    if not x.numel():
        return True, ""
    if not torch.equal(y, _two_steps(x, qw, w_scale, bias, case, backend)):
        return False, "differs from quantize_activation + gemm on the same backend"
    qx, x_scale = reference_quantize(x.reshape(-1, k), fp8, case.pow2)
    want = oracle(qx, qw, x_scale, w_scale) + (bias.double() if case.bias else 0)
    got = y.reshape(-1, case.n)
    err = relative_error(got, want)
    tol = linear_tolerance(case)
    if err > tol:
        return False, f"rel. err {err:.3e} against the quantized operands (tolerance {tol})"
    exact = x.reshape(-1, k).double() @ w.double().t() + (bias.double() if case.bias else 0)
    recipe_err = relative_error(got, exact)
    if recipe_err > RECIPE_TOLERANCE:
        return False, f"rel. err {recipe_err:.3e} against the unquantized layer"
    return True, f"{err:.2e}"


def _two_steps(x, qw, w_scale, bias, case: LinearCase, backend: str | None) -> torch.Tensor:
    """The layer as its parts: the backend's linear entry must give these very bits (same codes, same GEMM)."""
    q, scale = quantize_activation(x, pow2_scales=case.pow2, backend=backend)
    y = gemm(q, qw, scale, w_scale, out_dtype=torch.bfloat16 if case.dtype == torch.bfloat16 else torch.float32,
             backend=backend)  # fmt: skip
    if bias is not None:
        y = y + bias
    return y.to(case.dtype).view(*case.shape[:-1], case.n)


def linear_tolerance(case: LinearCase) -> float:
    """The GEMM's tolerance for the output dtype; fp16 output is the fp32 GEMM result rounded to fp16."""
    return (
        1e-3
        if case.dtype == torch.float16
        else TOLERANCE[torch.float32 if case.dtype == torch.float32 else torch.bfloat16]
    )


def _fp8_for(device, backend: str | None) -> torch.dtype:
    from ..ops import preferred_fp8_dtype

    return preferred_fp8_dtype(device, backend)
