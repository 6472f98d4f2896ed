"""The conformance suite every backend must pass: ``fp8gemm check`` and ``tests/`` both run it.

Numbers: relative Frobenius error against a float64 oracle (the contract's per-block sum), random data
from a seed each case derives from the suite's seed and its own name (printed with every failure, so any
run repeats), outputs poisoned with NaN first so an unwritten element fails. Views of larger buffers are
surrounded by NaN, so a kernel that reads past a view fails too.
"""

from __future__ import annotations

import dataclasses
import math
import random
import zlib
from collections.abc import Callable

import torch

from ..ops import gemm
from ..reference import BLOCK, oracle

TOLERANCE = {torch.bfloat16: 4e-3, torch.float32: 5e-4}
DEFAULT_SEED = 20251126  # the suite's data and random shapes; fp8gemm check --seed picks another
VIEWS = ("", "rows", "one-row", "columns")  # how the operands are carved from larger buffers (see make_inputs)

# (M, N, K): tails of M and N, K/128 odd and not a multiple of 4 (cuBLASLt's failing K = 2304).
FIXED_SHAPES = [
    (1, 16, 128), (1, 2112, 7168), (7, 48, 256), (64, 2112, 2304), (100, 272, 384),
    (129, 1040, 640), (256, 4096, 1152), (300, 528, 2304), (1000, 144, 1408), (4096, 256, 384),
]  # fmt: skip
# Large enough to exercise persistent scheduling and multi-wave grids; float64 oracle on the GPU.
GPU_SHAPES = [
    (4096, 7168, 2304), (6144, 7168, 2304), (2048, 24576, 1536), (3000, 2112, 7168),
    (64, 7168, 16384), (128, 4096, 7168), (4097, 4112, 512), (31, 32768, 512),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    out_dtype: torch.dtype = torch.bfloat16
    col_major_scales: bool = False  # a_scale and b_scale passed column-major
    strided: bool = False  # a, b and out are row slices of wider buffers (ld > row length)
    preallocated_out: bool = True  # out= path (else the functional path)
    view: str = ""  # one of VIEWS: the operands are slices of larger buffers

    @property
    def id(self) -> str:
        flags = [str(self.out_dtype).removeprefix("torch."), "colscale" if self.col_major_scales else "rowscale"]
        flags += ["strided"] * self.strided + ["functional"] * (not self.preallocated_out)
        flags += [f"view-{self.view}"] * bool(self.view)
        return f"{self.m}x{self.n}x{self.k}-" + "-".join(flags)


def case_seed(case, seed: int | None = None) -> int:
    """The data seed of ``case`` (any case with an ``id``) within a suite run from ``seed`` (default :data:`DEFAULT_SEED`)."""
    return ((DEFAULT_SEED if seed is None else seed) * 1_000_003 + zlib.crc32(case.id.encode())) % 2**63


def _variant(i: int, m: int, n: int, k: int) -> Case:
    return Case(m, n, k, torch.float32 if i % 3 == 2 else torch.bfloat16, i % 2 == 1, i % 4 == 3, i % 5 != 4)


def random_shapes(count: int, rng: random.Random, max_flops: float) -> list[tuple[int, int, int]]:
    shapes = []
    while len(shapes) < count:
        m = max(1, int(math.exp(rng.uniform(0, math.log(4096)))))
        n, k = 16 * rng.randint(1, 512), BLOCK * rng.randint(1, 40)
        if 2.0 * m * n * k <= max_flops:
            shapes.append((m, n, k))
    return shapes


# Slices a caller makes: an odd row offset (one expert's tokens), one row (one token of a batch), sub-tensors at a
# column offset; the scales' starts then fall anywhere, not on 16 bytes.
VIEW_CASES = [
    Case(1, 2112, 7168, view="one-row"), Case(1, 16, 128, col_major_scales=True, view="one-row"),
    Case(7, 48, 256, view="rows"), Case(64, 2112, 2304, col_major_scales=True, view="rows"),
    Case(129, 1040, 640, view="columns"), Case(300, 528, 2304, torch.float32, col_major_scales=True, view="columns"),
    Case(2, 256, 1152, col_major_scales=True, preallocated_out=False, view="one-row"),
    Case(1, 272, 640, view="transposed-row"), Case(1, 64, 256, torch.float32, view="transposed-row"),
]  # fmt: skip
# "transposed-row": a and out are one row of a transposed column ([K, 1].t()): torch reports row stride 1 there, a
# stride never stepped over, which a kernel must not be handed


def cases(device: torch.device | str, n_random: int = 6, seed: int | None = None) -> list[Case]:
    """Fixed edge shapes, plus GPU-sized ones on a GPU, views of larger buffers, plus ``n_random`` random shapes
    drawn from ``seed`` (default :data:`DEFAULT_SEED`)."""
    on_gpu = torch.device(device).type != "cpu"
    rng = random.Random(DEFAULT_SEED if seed is None else seed)
    shapes = FIXED_SHAPES + (GPU_SHAPES if on_gpu else [])
    shapes += random_shapes(n_random, rng, 2e12 if on_gpu else 4e9)
    return [_variant(i, *s) for i, s in enumerate(shapes)] + VIEW_CASES + [Case(0, 256, 512)]


def random_fp8(rows: int, cols: int, fp8_dtype: torch.dtype, device, gen: torch.Generator) -> torch.Tensor:
    # randn * 2 spans most of e4m3's exponent range without reaching its max.
    return (torch.randn(rows, cols, generator=gen, device=device) * 2).to(fp8_dtype)


def random_scales(rows: int, cols: int, device, gen: torch.Generator) -> torch.Tensor:
    # Widely varying magnitudes, so a scale applied to the wrong block shows up in the error.
    exponent = torch.randint(-6, 7, (rows, cols), generator=gen, device=device).float()
    return torch.exp2(exponent) * (0.5 + torch.rand(rows, cols, generator=gen, device=device))


def _rows_with_stride(t: torch.Tensor, extra: int) -> torch.Tensor:
    wide = torch.empty(t.shape[0], t.shape[1] + extra, dtype=t.dtype, device=t.device)
    wide[:, : t.shape[1]] = t
    return wide[:, : t.shape[1]]


def _transposed_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, cols] as the transpose of a [cols, rows] tensor: one row then has row stride 1."""
    column = torch.empty(t.shape[1], t.shape[0], dtype=t.dtype, device=t.device)
    column.t().copy_(t)
    return column.t()


def carve(t: torch.Tensor, row_offset: int, col_offset: int, col_major: bool = False) -> torch.Tensor:
    """``t`` copied into a NaN-filled buffer with room around it, returned as the view at (row_offset, col_offset).
    FP8 operands keep rows of whole 16 bytes (the contract's); scales get odd strides and starts."""
    pad = 16 if t.element_size() == 1 else 5
    rows, cols = row_offset + t.shape[0] + 3, col_offset + t.shape[1] + pad
    nan = torch.full((cols, rows) if col_major else (rows, cols), math.nan, device=t.device).to(t.dtype)
    big = nan.t() if col_major else nan
    view = big[row_offset : row_offset + t.shape[0], col_offset : col_offset + t.shape[1]]
    view.copy_(t)
    return view


def _as_view(case: Case, a, b, a_scale, b_scale):
    """The operands as ``case.view`` slices of larger buffers; b's rows move by whole 128-row blocks."""
    col_major = case.col_major_scales
    if case.view == "transposed-row":
        return _transposed_rows(a), b, a_scale, b_scale
    if case.view in ("rows", "one-row"):
        offset = 5 if case.view == "rows" else 3
        return (
            carve(a, offset, 0),
            carve(b, BLOCK, 0),
            carve(a_scale, offset, 0, col_major),
            carve(b_scale, 1, 0, col_major),
        )
    return carve(a, 1, BLOCK), carve(b, 0, 2 * BLOCK), carve(a_scale, 1, 1, col_major), carve(b_scale, 0, 3, col_major)


def make_inputs(case: Case, fp8_dtype: torch.dtype, device, gen: torch.Generator):
    m, n, k = case.m, case.n, case.k
    a, b = random_fp8(m, k, fp8_dtype, device, gen), random_fp8(n, k, fp8_dtype, device, gen)
    a_scale = random_scales(m, k // BLOCK, device, gen)
    b_scale = random_scales(-(-n // BLOCK), k // BLOCK, device, gen)
    if case.col_major_scales:
        a_scale, b_scale = a_scale.t().contiguous().t(), b_scale.t().contiguous().t()
    if case.strided:
        a, b = _rows_with_stride(a, BLOCK), _rows_with_stride(b, 2 * BLOCK)
    if case.view:
        a, b, a_scale, b_scale = _as_view(case, a, b, a_scale, b_scale)
    return a, b, a_scale, b_scale


@dataclasses.dataclass
class CaseResult:
    case: Case
    rel_err: float
    passed: bool
    detail: str = ""


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    denom = ref.norm().item()
    return (out.double() - ref).norm().item() / denom if denom else (out.double() - ref).norm().item()


def run_case(
    case: Case, device, fp8_dtype: torch.dtype, backend: str | None = None, seed: int | None = None
) -> CaseResult:
    """``case`` on ``backend``, its data drawn from :func:`case_seed` of ``seed``."""
    data_seed = case_seed(case, seed)
    result = _run_case(case, device, fp8_dtype, backend, torch.Generator(device=device).manual_seed(data_seed))
    if not result.passed:
        result.detail = f"{result.detail} (data seed {data_seed})".lstrip()
    return result


def _run_case(case: Case, device, fp8_dtype: torch.dtype, backend: str | None, gen: torch.Generator) -> CaseResult:
    a, b, a_scale, b_scale = make_inputs(case, fp8_dtype, device, gen)
    try:
        if case.preallocated_out:
            out = torch.empty(case.m, case.n, dtype=case.out_dtype, device=device)
            out = _transposed_rows(out) if case.view == "transposed-row" else _rows_with_stride(out, 16 * case.strided)
            out.fill_(math.nan)  # poison: an element the kernel skips stays NaN and fails the check
            result = gemm(a, b, a_scale, b_scale, out=out, backend=backend)
            if result.data_ptr() != out.data_ptr():
                return CaseResult(case, math.inf, False, "out= was not written in place")
        else:
            result = gemm(a, b, a_scale, b_scale, out_dtype=case.out_dtype, backend=backend)
        if device != "cpu" and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a conformance failure, reported in the table
        return CaseResult(case, math.inf, False, f"{type(exc).__name__}: {exc}")
    if tuple(result.shape) != (case.m, case.n) or result.dtype != case.out_dtype:
        return CaseResult(case, math.inf, False, f"got {tuple(result.shape)} {result.dtype}")
    if case.m == 0:
        return CaseResult(case, 0.0, True)
    ref = oracle(a, b, a_scale, b_scale)
    err = relative_error(result, ref)
    return CaseResult(case, err, err <= TOLERANCE[case.out_dtype])


# --- bad input: each must raise the named exception with a message that names the argument ---------


@dataclasses.dataclass(frozen=True)
class BadInput:
    id: str
    build: Callable  # (device, fp8_dtype, gen) -> (args, kwargs)
    error: type
    match: str  # a substring the message must contain


def _good(device, fp8, gen, m=32, n=256, k=512):
    return list(make_inputs(Case(m, n, k), fp8, device, gen))


def _replace(i: int, make: Callable, **shape):
    def build(device, fp8, gen):
        args = _good(device, fp8, gen, **shape)
        args[i] = make(args[i], device)
        return args, {}

    return build


def _kwargs(**kw_makers):
    def build(device, fp8, gen):
        args = _good(device, fp8, gen)
        return args, {key: make(args, device) for key, make in kw_makers.items()}

    return build


def _misaligned(t, device):
    flat = torch.empty(t.numel() + 16, dtype=t.dtype, device=device)
    view = flat[8 : 8 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _other_device(t, device):
    return t.cpu() if torch.device(device).type != "cpu" else t.to("meta")


BAD_INPUTS = [
    BadInput("a-not-tensor", _replace(0, lambda t, d: t.tolist()), TypeError, "a must be a torch.Tensor"),
    BadInput("a-float16", _replace(0, lambda t, d: t.half()), TypeError, "a must be FP8"),
    BadInput("b-other-fp8", _replace(1, lambda t, d: t.float().to(torch.float8_e5m2)), TypeError, "b has dtype"),
    BadInput("a-3d", _replace(0, lambda t, d: t.unsqueeze(0)), ValueError, "a must be 2-D"),
    BadInput("a_scale-bf16", _replace(2, lambda t, d: t.bfloat16()), TypeError, "a_scale must be torch.float32"),
    BadInput("a_scale-shape", _replace(2, lambda t, d: t[:, :-1]), ValueError, "a_scale must be [M, K/128]"),
    BadInput("b_scale-floor-n", _replace(3, lambda t, d: t[:-1], n=144), ValueError, "b_scale must be [ceil(N/128)"),
    BadInput("k-mismatch", _replace(1, lambda t, d: t[:, :256].contiguous()), ValueError, "K differs"),
    BadInput("a-transposed", _replace(0, lambda t, d: t.t().contiguous().t()), ValueError, "a must be contiguous"),
    BadInput("a-misaligned", _replace(0, _misaligned), ValueError, "a data pointer must be 16-byte aligned"),
    BadInput("a-row-stride", _replace(0, lambda t, d: torch.cat([t, t[:, :8]], 1)[:, : t.shape[1]]), ValueError, "multiple of 16 bytes"),
    BadInput("a_scale-device", _replace(2, _other_device), ValueError, "move all inputs"),
    BadInput("out-shape", _kwargs(out=lambda a, d: torch.empty(32, 128, dtype=torch.bfloat16, device=d)), ValueError, "out must be [M, N]"),
    BadInput("out-fp16", _kwargs(out=lambda a, d: torch.empty(32, 256, dtype=torch.float16, device=d)), TypeError, "out must be torch.bfloat16 or torch.float32"),
    BadInput("out_dtype-fp16", _kwargs(out_dtype=lambda a, d: torch.float16), TypeError, "out_dtype must be"),
    BadInput("out-vs-out_dtype", _kwargs(out=lambda a, d: torch.empty(32, 256, dtype=torch.float32, device=d), out_dtype=lambda a, d: torch.bfloat16), TypeError, "out_dtype="),
    BadInput("unknown-backend", _kwargs(backend=lambda a, d: "no-such-backend"), RuntimeError, "is not installed"),
]  # fmt: skip
BAD_INPUTS += [
    BadInput(
        "k-200",
        lambda d, f, g: _bad_shape(d, f, g, 32, 256, 200),
        ValueError,
        "K = 200 must be a positive multiple of 128",
    ),
    BadInput(
        "n-40",
        lambda d, f, g: _bad_shape(d, f, g, 32, 40, 256),
        ValueError,
        "N = 40 (b.shape[0]) must be a positive multiple of 16",
    ),
]


def _bad_shape(device, fp8, gen, m, n, k):
    a, b = random_fp8(m, k, fp8, device, gen), random_fp8(n, k, fp8, device, gen)
    kb = -(-k // BLOCK)
    return [a, b, random_scales(m, kb, device, gen), random_scales(-(-n // BLOCK), kb, device, gen)], {}


def run_bad_input(bad: BadInput, device, fp8_dtype: torch.dtype, backend: str | None = None) -> tuple[bool, str]:
    gen = torch.Generator(device=device).manual_seed(DEFAULT_SEED)
    args, kwargs = bad.build(device, fp8_dtype, gen)
    kwargs.setdefault("backend", backend)
    try:
        gemm(*args, **kwargs)
    except bad.error as exc:
        return (bad.match in str(exc)), f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return False, f"raised {type(exc).__name__} instead of {bad.error.__name__}: {exc}"
    return False, f"no error (expected {bad.error.__name__})"
