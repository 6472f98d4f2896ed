"""The grouped ops' conformance suite, run on every backend as :mod:`conformance` is for ``gemm``.

Each case draws its data from :func:`conformance.case_seed` (printed with every failure), poisons ``out`` with NaN
first, and compares every group with a float64 oracle computed on slices of the rows the host reads here (not the
device-side masks the reference uses). Rows in no group must stay NaN with ``out=`` and be zeros from the functional
call. Bad inputs to both ops: :data:`BAD_INPUTS`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import torch

from ..grouped import grouped_gemm, grouped_gemm_masked
from ..ops import prepare_weight_scale
from ..quantize import quantize_activation
from ..reference import BLOCK, oracle
from .conformance import DEFAULT_SEED, TOLERANCE, case_seed, random_fp8, random_scales

LAYOUTS = ("offs", "m_indices", "masked")
M_ALIGN = 128  # DeepGEMM's contiguous layout pads each expert's rows with -1 rows to a multiple of this


@dataclasses.dataclass(frozen=True)
class GroupedCase:
    layout: str  # one of LAYOUTS
    rows: tuple[int, ...]  # rows of each group (masked: masked_m)
    n: int
    k: int
    tail: int = 0  # offs: rows past offs[-1]; m_indices: rows with id -1 (not written either way)
    m_max: int = 0  # masked: rows allocated per group
    out_dtype: torch.dtype = torch.bfloat16
    col_major_scales: bool = False  # a_scale and every group of b_scale column-major
    preallocated_out: bool = True  # out= (else the functional call)
    prepared: bool = False  # b_scale through prepare_weight_scale, a and a_scale from quantize_activation
    strides: str = ""  # one of STRIDES: operands as a view with strides a kernel cannot take as they are
    order: str = ""  # m_indices: "" rows in a random order; "sorted": by expert, each padded with -1 rows to M_ALIGN

    @property
    def groups(self) -> int:
        return len(self.rows)

    @property
    def m(self) -> int:
        rows = self.padded_rows() if self.order == "sorted" else self.rows
        return self.m_max if self.layout == "masked" else sum(rows) + self.tail

    def padded_rows(self) -> list[int]:
        return [-(-rows // M_ALIGN) * M_ALIGN for rows in self.rows]

    @property
    def id(self) -> str:
        rows = ",".join(map(str, self.rows)) if len(self.rows) <= 8 else f"{len(self.rows)}groups{sum(self.rows)}rows"
        shape = f"{self.layout}-g{self.groups}[{rows}]" + (f"+{self.tail}" if self.tail else "")
        shape += f"-mmax{self.m_max}" if self.layout == "masked" else ""
        flags = [str(self.out_dtype).removeprefix("torch."), "colscale" if self.col_major_scales else "rowscale"]
        flags += ["functional"] * (not self.preallocated_out) + ["prepared"] * self.prepared
        flags += [self.strides] * bool(self.strides) + [self.order] * bool(self.order)
        return f"{shape}-{self.n}x{self.k}-" + "-".join(flags)


def _permuted(count: int, step: int) -> tuple[int, ...]:
    """0..count-1 in an order that is not sorted (``step`` coprime with ``count``)."""
    return tuple((step * g) % count for g in range(count))


# (layout, rows, n, k, tail, m_max): empty groups, one group, every row in one group, M not a multiple of 128,
# rows past offs[-1], every group empty, -1 rows, and every masked_m from 0 to M_max over the groups.
FIXED_SHAPES = [
    ("offs", (5, 0, 17, 0, 1, 40), 272, 384, 0, 0), ("offs", (37,), 144, 256, 0, 0),
    ("offs", (0, 0, 50, 0), 128, 640, 0, 0), ("offs", (100, 60, 3), 256, 1152, 0, 0),
    ("offs", (7, 9), 48, 256, 11, 0), ("offs", (0, 0, 0), 16, 128, 5, 0), ("offs", (129, 0, 130), 32, 512, 1, 0),
    ("m_indices", (4, 0, 9, 2), 160, 384, 6, 0), ("m_indices", (20,), 16, 256, 0, 0),
    ("m_indices", (0, 33, 0, 70, 1), 80, 1152, 3, 0),
    ("masked", _permuted(17, 5), 48, 256, 0, 16), ("masked", (5, 0, 3), 16, 128, 0, 5),
    ("masked", (130, 1, 129, 64), 144, 384, 0, 130), ("masked", (0,), 32, 256, 0, 7),
]  # fmt: skip
# Mixture-of-experts sizes on a GPU: DeepSeek-V3's down projection (N=7168, K=2048) and gate+up (N=4096, K=7168).
GPU_SHAPES = [
    ("offs", (300, 0, 1000, 77, 2048, 1, 0, 512), 7168, 2048, 0, 0),
    ("m_indices", (64, 0, 9, 128, 1, 200), 4096, 7168, 31, 0),
    ("masked", _permuted(33, 7) + (64,) * 7, 4096, 7168, 0, 64),
]  # fmt: skip
# DeepGEMM's layout with more experts than a kernel may hold runs of at once (sm90a: 32, csrc/run_ring.cuh). Then decode
# over 300 experts, 8 with rows, on both sides of the sm90a run warp's chunks of 32 groups and batches of 256.
DECODE_300 = tuple({0: 3, 31: 1, 32: 130, 95: 9, 255: 64, 256: 2, 257: 17, 299: 40}.get(g, 0) for g in range(300))
GPU_CASES = [GroupedCase("m_indices", _permuted(40, 9), 4096, 7168, tail=5, order="sorted"),
             GroupedCase("offs", DECODE_300, 256, 256, tail=3), GroupedCase("masked", DECODE_300, 256, 256, m_max=130)]  # fmt: skip


# Rows in no group read as zeros from the functional call, every masked_m from 0 to M_max. Then one group with an odd
# M_max and the quantizer's scales viewed as [1, M_max, K/128]: a group stride of M_max floats, which no kernel applies
# but a tensor map must still accept (as every stride it is handed: a multiple of 16 bytes).
EXTRA_CASES = [
    GroupedCase("masked", _permuted(9, 2), 32, 384, m_max=8, col_major_scales=True, preallocated_out=False),
    GroupedCase("masked", _permuted(5, 3), 16, 128, m_max=4, out_dtype=torch.float32, preallocated_out=False),
    GroupedCase("masked", (5,), 16, 128, m_max=7, prepared=True),
    GroupedCase("masked", (7,), 272, 384, m_max=7, prepared=True, out_dtype=torch.float32),
    GroupedCase("masked", (1,), 48, 256, m_max=1, prepared=True, preallocated_out=False),
    GroupedCase("masked", (3,), 144, 128, m_max=3, prepared=True),
    GroupedCase("offs", (7,), 16, 256, prepared=True),
    # m_indices as DeepGEMM's contiguous layout passes it (sorted, -1 padding), every row -1, one row, and rows in a
    # random order over more than one row per work-item of a 256-thread workgroup.
    GroupedCase("m_indices", (4, 0, 9, 2), 144, 256, tail=3, order="sorted"),
    GroupedCase("m_indices", (130, 1, 0, 40), 48, 384, order="sorted", out_dtype=torch.float32, preallocated_out=False),
    GroupedCase("m_indices", (0, 0, 0), 16, 128, tail=5),
    GroupedCase("m_indices", (1,), 272, 128, out_dtype=torch.float32),
    GroupedCase("m_indices", (300, 0, 150, 60), 32, 256, tail=20, prepared=True),
]


# Strides of size-1 dims and scale views, each legal input a kernel cannot read as it is: "size1" gives every dim of
# size 1 (a group of G = 1, a row of M_max = 1, one scale block) an odd stride, as views of torch may report (they
# address nothing); "scale-offset" puts both scales 4 bytes past a 16-byte boundary with rows (and groups) an odd
# number of floats apart. Both must run as the plain operands do: the first by strides no backend ever sees, the
# second by a copy of the scales into the backend's layout.
STRIDES = ("", "size1", "scale-offset")
ODD_M_MAX = (1, 3, 7, 9, 63, 65)


def _odd_m_max_cases() -> list[GroupedCase]:
    """Every M_max of ``ODD_M_MAX`` with one group (masked_m 0, partial and full, one case each) and with six (all
    three in one call), over N, K, out dtype, the quantizer's scale views and :data:`STRIDES`."""
    cases, i = [], 0
    for m_max in ODD_M_MAX:
        counts = sorted({0, (m_max + 1) // 2, m_max})
        for rows in [(c,) for c in counts] + [(counts[-1], 0, counts[1], m_max - 1, 1, counts[1])]:
            n, k = (16, 48, 144, 272)[i % 4], (128, 256, 384)[i % 3]
            cases.append(GroupedCase("masked", rows, n, k, m_max=m_max, out_dtype=(torch.bfloat16, torch.float32)[i % 2],
                                     preallocated_out=i % 5 != 3, prepared=i % 3 != 1, strides=STRIDES[i % 3]))  # fmt: skip
            i += 1
    return cases


# One group and one row through each layout with odd strides on their size-1 dims, and scales the backends copy.
STRIDE_CASES = _odd_m_max_cases() + [
    GroupedCase("offs", (1,), 16, 128, strides="size1"),
    GroupedCase("offs", (1,), 272, 384, prepared=True, strides="size1", out_dtype=torch.float32),
    GroupedCase("offs", (5, 0, 9), 144, 256, tail=1, strides="scale-offset", col_major_scales=True),
    GroupedCase("m_indices", (1,), 48, 256, strides="size1", preallocated_out=False),
    GroupedCase("masked", (1,), 16, 128, m_max=1, strides="size1", col_major_scales=True),
    GroupedCase("masked", (3, 0, 7), 272, 128, m_max=7, strides="scale-offset"),
]


def _variant(i: int, layout, rows, n, k, tail, m_max) -> GroupedCase:
    dtype = torch.float32 if i % 3 == 2 else torch.bfloat16
    return GroupedCase(layout, rows, n, k, tail, m_max, dtype, i % 2 == 1, i % 5 != 4, i % 4 == 3)


def random_shapes(count: int, rng: random.Random) -> list[tuple]:
    """Random splits (a third of the groups empty on average) of each layout."""
    shapes = []
    for i in range(count):
        layout = LAYOUTS[i % 3]
        groups = rng.randint(1, 12)
        m_max = rng.randint(1, 200)
        sizes = tuple(0 if rng.random() < 0.33 else rng.randint(1, m_max) for _ in range(groups))
        tail = 0 if layout == "masked" else rng.choice((0, 0, rng.randint(1, 40)))
        shapes.append((layout, sizes, 16 * rng.randint(1, 40), BLOCK * rng.randint(1, 12), tail, m_max))
    return shapes


def cases(device: torch.device | str, n_random: int = 6, seed: int | None = None) -> list[GroupedCase]:
    """Fixed edge cases (plus mixture-of-experts sizes on a GPU) and ``n_random`` random splits from ``seed``."""
    on_gpu = torch.device(device).type != "cpu"
    rng = random.Random(DEFAULT_SEED if seed is None else seed)
    shapes = FIXED_SHAPES + (GPU_SHAPES if on_gpu else []) + random_shapes(n_random, rng)
    gpu = GPU_CASES if on_gpu else []
    return [_variant(i, *shape) for i, shape in enumerate(shapes)] + EXTRA_CASES + STRIDE_CASES + gpu


def _col_major(scale: torch.Tensor) -> torch.Tensor:
    return scale.transpose(-1, -2).contiguous().transpose(-1, -2)


def odd_size1_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` with an odd stride on every dim of size 1 (a stride never applied: the same elements)."""
    pairs = enumerate(zip(t.shape, t.stride(), strict=True))
    strides = tuple(2 * d + 3 if extent == 1 else stride for d, (extent, stride) in pairs)
    return t.as_strided(t.shape, strides)


def unaligned_scales(t: torch.Tensor) -> torch.Tensor:
    """A copy of the scales ``t`` [(G,) rows, cols] starting 4 bytes past a 16-byte boundary, rows one float further
    apart than their length and groups one float past their rows: strides no backend reads in place."""
    rows, cols = t.shape[-2:]
    strides = (cols + 1, 1) if t.dim() == 2 else (rows * (cols + 1) + 1, cols + 1, 1)
    size = 1 + sum(max(extent - 1, 0) * stride for extent, stride in zip(t.shape, strides, strict=True))
    view = t.new_empty(1 + size).as_strided(t.shape, strides, 1)
    view.copy_(t)
    return view


def make_inputs(case: GroupedCase, fp8_dtype: torch.dtype, device, gen: torch.Generator, backend: str | None = None):
    """``(a, b, a_scale, b_scale, group_rows)`` for ``case``: group_rows is offs, m_indices or masked_m (int32)."""
    g, m, n, k = case.groups, case.m, case.n, case.k
    lead = (g, m) if case.layout == "masked" else (m,)
    b = random_fp8(g * n, k, fp8_dtype, device, gen).view(g, n, k)
    b_scale = random_scales(g * -(-n // BLOCK), k // BLOCK, device, gen).view(g, -1, k // BLOCK)
    if case.prepared:  # activations as the quantizer returns them, viewed as this layout needs
        magnitude = random_scales(math.prod(lead), 1, device, gen).view(*lead, 1)  # rows of very different size
        x = torch.randn(*lead, k, generator=gen, device=device) * magnitude
        a, a_scale = quantize_activation(x, fp8_dtype=fp8_dtype, backend=backend)
        a, a_scale = a.view(*lead, k), a_scale.view(*lead, k // BLOCK)
    else:
        a = random_fp8(math.prod(lead), k, fp8_dtype, device, gen).view(*lead, k)
        a_scale = random_scales(math.prod(lead), k // BLOCK, device, gen).view(*lead, k // BLOCK)
    if case.col_major_scales:
        a_scale, b_scale = _col_major(a_scale), _col_major(b_scale)
    if case.prepared:
        b_scale = prepare_weight_scale(b_scale, backend=backend)
    if case.strides == "scale-offset":
        a_scale, b_scale = unaligned_scales(a_scale), unaligned_scales(b_scale)
    elif case.strides == "size1":
        a, b, a_scale, b_scale = map(odd_size1_strides, (a, b, a_scale, b_scale))
    if case.layout == "offs":
        group_rows = torch.tensor(case.rows, device=device).cumsum(0)
    elif case.layout == "masked":
        group_rows = torch.tensor(case.rows, device=device)
    elif case.order == "sorted":
        ids = []
        for g, (size, rows) in enumerate(zip(case.rows, case.padded_rows(), strict=True)):
            ids += [g] * size + [-1] * (rows - size)
        group_rows = torch.tensor(ids + [-1] * case.tail, device=device)
    else:
        ids = torch.tensor([i for i, size in enumerate(case.rows) for _ in range(size)] + [-1] * case.tail)
        group_rows = ids[torch.randperm(m, generator=torch.Generator().manual_seed(gen.initial_seed()))].to(device)
    return a, b, a_scale, b_scale, group_rows.to(torch.int32)


def grouped_oracle(case: GroupedCase, a, b, a_scale, b_scale, m_indices) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """float64 expected output (zeros in no group) and, per group, the index of its rows in ``out`` flattened to
    [rows, N]: from the case's own sizes (and for m_indices, the ids it drew)."""
    n = case.n
    expected = torch.zeros(case.groups * case.m if case.layout == "masked" else case.m, n, dtype=torch.float64)
    expected = expected.to(a.device)
    members: list[torch.Tensor] = []
    if case.layout == "masked":
        for g, count in enumerate(case.rows):
            members.append(torch.arange(g * case.m, g * case.m + count, device=a.device))
            expected[members[-1]] = oracle(a[g, :count], b[g], a_scale[g, :count], b_scale[g])
        return expected, members
    start = 0
    ids = m_indices if case.layout == "m_indices" else None
    for g, count in enumerate(case.rows):
        if ids is None:
            members.append(torch.arange(start, start + count, device=a.device))
            start += count
        else:
            members.append(torch.nonzero(ids == g)[:, 0])
        expected[members[-1]] = oracle(a[members[-1]], b[g], a_scale[members[-1]], b_scale[g])
    return expected, members


@dataclasses.dataclass
class GroupedResult:
    case: GroupedCase
    rel_err: float
    passed: bool
    detail: str = ""


def _call(case: GroupedCase, a, b, a_scale, b_scale, group_rows, out, backend):
    dtype = None if out is not None else case.out_dtype
    if case.layout == "masked":
        return grouped_gemm_masked(a, b, a_scale, b_scale, group_rows, expected_m=max(case.rows), out=out,
                                   out_dtype=dtype, backend=backend)  # fmt: skip
    rows = {"offs": group_rows} if case.layout == "offs" else {"m_indices": group_rows}
    return grouped_gemm(a, b, a_scale, b_scale, **rows, out=out, out_dtype=dtype, backend=backend)


def run_case(case: GroupedCase, device, fp8_dtype: torch.dtype, backend: str | None = None, seed: int | None = None):
    """``case`` on ``backend``, its data drawn from :func:`conformance.case_seed` of ``seed``."""
    data_seed = case_seed(case, seed)
    result = _run_case(case, device, fp8_dtype, backend, torch.Generator(device=device).manual_seed(data_seed))
    if not result.passed:
        result.detail = f"{result.detail} (data seed {data_seed})".lstrip()
    return result


def _run_case(case: GroupedCase, device, fp8_dtype, backend, gen) -> GroupedResult:
    a, b, a_scale, b_scale, group_rows = make_inputs(case, fp8_dtype, device, gen, backend)
    shape = (case.groups, case.m, case.n) if case.layout == "masked" else (case.m, case.n)
    out = torch.full(shape, math.nan, dtype=case.out_dtype, device=device) if case.preallocated_out else None
    if out is not None and case.strides == "size1":
        out = odd_size1_strides(out)
    try:
        result = _call(case, a, b, a_scale, b_scale, group_rows, out, backend)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a conformance failure, reported in the table
        return GroupedResult(case, math.inf, False, f"{type(exc).__name__}: {exc}")
    if tuple(result.shape) != shape or result.dtype != case.out_dtype:
        return GroupedResult(case, math.inf, False, f"got {tuple(result.shape)} {result.dtype}")
    if out is not None and result.data_ptr() != out.data_ptr():
        return GroupedResult(case, math.inf, False, "out= was not written in place")
    expected, members = grouped_oracle(case, a, b, a_scale, b_scale, group_rows)
    flat = result.reshape(-1, case.n).double()
    written = torch.zeros(flat.shape[0], dtype=torch.bool, device=flat.device)
    worst = 0.0
    for g, rows in enumerate(members):
        written[rows] = True
        if rows.numel():
            got, want = flat[rows], expected[rows]
            err = math.inf if not torch.isfinite(got).all() else ((got - want).norm() / want.norm()).item()
            if not err <= TOLERANCE[case.out_dtype]:
                return GroupedResult(case, err, False, f"group {g} ({rows.numel()} rows): rel. err {err:.3e}")
            worst = max(worst, err)
    rest = flat[~written]
    untouched = torch.isnan(rest).all() if case.preallocated_out else (rest == 0).all()
    if not bool(untouched):
        what = "stay NaN (out= must not write them)" if case.preallocated_out else "be zeros (functional call)"
        return GroupedResult(case, worst, False, f"{rest.shape[0]} rows in no group must {what}")
    return GroupedResult(case, worst, True)


# --- bad input: each must raise the named exception before any launch, with a message naming the argument ---------


@dataclasses.dataclass(frozen=True)
class GroupedBadInput:
    id: str
    op: str  # "grouped_gemm" or "grouped_gemm_masked"
    change: Callable  # (arguments by name, device) -> None: edits the good call's arguments in place
    error: type
    match: str  # a substring the message must contain
    host_values: bool = False  # a value only the host checks, and only in CPU tensors: on a GPU it is the device's


GOOD_SHAPE = {"grouped_gemm": GroupedCase("offs", (9, 0, 20, 3), 256, 512), "grouped_gemm_masked":
              GroupedCase("masked", (9, 0, 16, 3), 256, 512, m_max=16)}  # fmt: skip
OPS = {"grouped_gemm": grouped_gemm, "grouped_gemm_masked": grouped_gemm_masked}


def good_arguments(op: str, device, fp8_dtype: torch.dtype, gen: torch.Generator) -> dict:
    case = GOOD_SHAPE[op]
    a, b, a_scale, b_scale, group_rows = make_inputs(case, fp8_dtype, device, gen)
    rows = "masked_m" if op == "grouped_gemm_masked" else "offs"
    return {"a": a, "b": b, "a_scale": a_scale, "b_scale": b_scale, rows: group_rows}


def _set(**makers):
    """A change that replaces arguments: ``name=lambda args, device: new value``."""

    def change(args, device):
        for name, make in makers.items():
            args[name] = make(args, device)

    return change


def _other_device(t, device):
    return t.cpu() if torch.device(device).type != "cpu" else t.to("meta")


def _misaligned_groups(b, device):
    """b with a group stride of whole rows plus 8 bytes: each group's rows stay aligned, the next group's not."""
    g, n, k = b.shape
    flat = torch.empty(g * (n * k + 8), dtype=b.dtype, device=device)
    view = flat.as_strided(b.shape, (n * k + 8, k, 1))
    view.copy_(b)
    return view


def _misaligned_start(a, device):
    """a copied to one byte past a 16-byte boundary (every stride as before)."""
    view = torch.empty(a.numel() + 1, dtype=a.dtype, device=device)[1:].view(a.shape)
    view.copy_(a)
    return view


def _out_strided(strides, device):
    """A bf16 masked out [4, 16, 256] with ``strides``."""
    size = 1 + sum((extent - 1) * stride for extent, stride in zip((4, 16, 256), strides, strict=True))
    return torch.empty(size, dtype=torch.bfloat16, device=device).as_strided((4, 16, 256), strides)


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


_C, _M = "grouped_gemm", "grouped_gemm_masked"
BAD_INPUTS = [
    GroupedBadInput("a-float16", _C, _set(a=lambda s, d: s["a"].half()), TypeError, "a must be FP8"),
    GroupedBadInput("a-3d", _C, _set(a=lambda s, d: s["a"][None]), ValueError, "a must be 2-D [M, K]"),
    GroupedBadInput("a-list", _C, _set(a=lambda s, d: s["a"].tolist()), TypeError, "a must be a torch.Tensor"),
    GroupedBadInput("b-2d", _C, _set(b=lambda s, d: s["b"][0]), ValueError, "b must be 3-D [G, N, K]"),
    GroupedBadInput("b-other-fp8", _C, _set(b=lambda s, d: s["b"].float().to(torch.float8_e5m2)), TypeError, "b has dtype"),
    GroupedBadInput("b-k", _C, _set(b=lambda s, d: s["b"][:, :, :256].contiguous()), ValueError, "K differs"),
    GroupedBadInput("b-n40", _C, _set(b=lambda s, d: s["b"][:, :40]), ValueError, "N = 40 (b.shape[1]) must be a positive multiple of 16"),
    GroupedBadInput("b-no-group", _C, _set(b=lambda s, d: s["b"][:0], b_scale=lambda s, d: s["b_scale"][:0], offs=lambda s, d: s["offs"][:0]), ValueError, "b holds no group"),
    GroupedBadInput("b-group-stride", _C, _set(b=lambda s, d: _misaligned_groups(s["b"], d)), ValueError, "b group stride"),
    GroupedBadInput("b-transposed", _C, _set(b=lambda s, d: s["b"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "b must be contiguous along its last dim"),
    GroupedBadInput("k-200", _C, _set(a=lambda s, d: s["a"][:, :200]), ValueError, "K = 200 must be a positive multiple of 128"),
    GroupedBadInput("a_scale-bf16", _C, _set(a_scale=lambda s, d: s["a_scale"].bfloat16()), TypeError, "a_scale must be torch.float32"),
    GroupedBadInput("a_scale-shape", _C, _set(a_scale=lambda s, d: s["a_scale"][:-1]), ValueError, "a_scale must be [M, K/128]"),
    GroupedBadInput("b_scale-2d", _C, _set(b_scale=lambda s, d: s["b_scale"][0]), ValueError, "b_scale must be 3-D"),
    GroupedBadInput("b_scale-shape", _C, _set(b_scale=lambda s, d: s["b_scale"][:, :, :-1]), ValueError, "b_scale must be [G, ceil(N/128), K/128]"),
    GroupedBadInput("b_scale-device", _C, _set(b_scale=lambda s, d: _other_device(s["b_scale"], d)), ValueError, "move all inputs"),
    GroupedBadInput("offs-int64", _C, _set(offs=lambda s, d: s["offs"].long()), TypeError, "offs must be torch.int32"),
    GroupedBadInput("offs-length", _C, _set(offs=lambda s, d: s["offs"][:-1]), ValueError, "offs must have G = 4 entries"),
    GroupedBadInput("offs-2d", _C, _set(offs=lambda s, d: s["offs"][None]), ValueError, "offs must be 1-D"),
    GroupedBadInput("offs-device", _C, _set(offs=lambda s, d: _other_device(s["offs"], d)), ValueError, "offs is on"),
    GroupedBadInput("offs-decreasing", _C, _set(offs=lambda s, d: _i32([9, 9, 5, 32], d)), ValueError, "offs must be non-decreasing"),
    GroupedBadInput("offs-negative", _C, _set(offs=lambda s, d: _i32([-1, 9, 29, 32], d)), ValueError, "offs[0] = -1 is negative"),
    GroupedBadInput("offs-past-m", _C, _set(offs=lambda s, d: _i32([9, 9, 29, 33], d)), ValueError, "offs[-1] = 33 is past M = 32"),
    GroupedBadInput("offs-and-m_indices", _C, _set(m_indices=lambda s, d: _i32([0] * 32, d)), ValueError, "pass exactly one of offs"),
    GroupedBadInput("neither", _C, _set(offs=lambda s, d: None), ValueError, "got neither"),
    GroupedBadInput("m_indices-int64", _C, _set(offs=lambda s, d: None, m_indices=lambda s, d: torch.zeros(32, dtype=torch.int64, device=d)), TypeError, "m_indices must be torch.int32"),
    GroupedBadInput("m_indices-length", _C, _set(offs=lambda s, d: None, m_indices=lambda s, d: _i32([0] * 4, d)), ValueError, "m_indices must have M = 32 entries"),
    GroupedBadInput("m_indices-past-g", _C, _set(offs=lambda s, d: None, m_indices=lambda s, d: _i32([0] * 31 + [4], d)), ValueError, "m_indices holds 4, outside [-1, G = 4)", host_values=True),
    GroupedBadInput("out-shape", _C, _set(out=lambda s, d: torch.empty(32, 128, dtype=torch.bfloat16, device=d)), ValueError, "out must be [M, N]"),
    GroupedBadInput("out-fp16", _C, _set(out=lambda s, d: torch.empty(32, 256, dtype=torch.float16, device=d)), TypeError, "out must be torch.bfloat16 or torch.float32"),
    GroupedBadInput("out_dtype-fp16", _C, _set(out_dtype=lambda s, d: torch.float16), TypeError, "out_dtype must be"),
    GroupedBadInput("unknown-backend", _C, _set(backend=lambda s, d: "no-such-backend"), RuntimeError, "is not installed"),
    GroupedBadInput("masked-a-2d", _M, _set(a=lambda s, d: s["a"][0]), ValueError, "a must be 3-D [G, M_max, K]"),
    GroupedBadInput("masked-a-groups", _M, _set(a=lambda s, d: s["a"][:-1], a_scale=lambda s, d: s["a_scale"][:-1]), ValueError, "but b holds G = 4 groups"),
    GroupedBadInput("masked-a_scale-shape", _M, _set(a_scale=lambda s, d: s["a_scale"][:, :, :-1]), ValueError, "a_scale must be [G, M_max, K/128]"),
    GroupedBadInput("masked-b-other-fp8", _M, _set(b=lambda s, d: s["b"].float().to(torch.float8_e5m2)), TypeError, "b has dtype"),
    GroupedBadInput("masked_m-int64", _M, _set(masked_m=lambda s, d: s["masked_m"].long()), TypeError, "masked_m must be torch.int32"),
    GroupedBadInput("masked_m-length", _M, _set(masked_m=lambda s, d: s["masked_m"][:2]), ValueError, "masked_m must have G = 4 entries"),
    GroupedBadInput("masked_m-device", _M, _set(masked_m=lambda s, d: _other_device(s["masked_m"], d)), ValueError, "masked_m is on"),
    GroupedBadInput("masked_m-past-m_max", _M, _set(masked_m=lambda s, d: _i32([9, 0, 17, 3], d)), ValueError, "masked_m holds 17, outside [0, M_max = 16]", host_values=True),
    GroupedBadInput("masked-out-shape", _M, _set(out=lambda s, d: torch.empty(4, 16, 128, dtype=torch.bfloat16, device=d)), ValueError, "out must be [G, M_max, N]"),
    GroupedBadInput("masked-a-group-stride", _M, _set(a=lambda s, d: _misaligned_groups(s["a"], d)), ValueError, "a group stride"),
    GroupedBadInput("masked-a-misaligned", _M, _set(a=lambda s, d: _misaligned_start(s["a"], d)), ValueError, "a data pointer must be 16-byte aligned"),
    GroupedBadInput("masked-out-row-stride", _M, _set(out=lambda s, d: _out_strided((16 * 260, 260, 1), d)), ValueError, "out row stride (260 elements)"),
    GroupedBadInput("masked-out-group-stride", _M, _set(out=lambda s, d: _out_strided((16 * 256 + 4, 256, 1), d)), ValueError, "out group stride"),
    GroupedBadInput("masked-out-overlap", _M, _set(out=lambda s, d: torch.empty(16, 256, dtype=torch.float32, device=d).expand(4, 16, 256)), ValueError, "out's groups overlap"),
    GroupedBadInput("expected_m-negative", _M, _set(expected_m=lambda s, d: -1), ValueError, "expected_m must be >= 0"),
    GroupedBadInput("expected_m-float", _M, _set(expected_m=lambda s, d: 2.5), TypeError, "expected_m must be an int"),
]  # fmt: skip


def run_bad_input(bad: GroupedBadInput, device, fp8_dtype: torch.dtype, backend: str | None = None):
    """``(passed, detail)``; a ``host_values`` case on a GPU passes untried (those values are the device's)."""
    if bad.host_values and torch.device(device).type != "cpu":
        return True, "values in GPU tensors are read by the device alone"
    args = good_arguments(bad.op, device, fp8_dtype, torch.Generator(device=device).manual_seed(DEFAULT_SEED))
    args["backend"] = backend
    bad.change(args, device)
    try:
        OPS[bad.op](**args)
    except bad.error as exc:
        return (bad.match in str(exc)), f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return False, f"raised {type(exc).__name__} instead of {bad.error.__name__}: {exc}"
    return False, f"no error (expected {bad.error.__name__})"
