"""The gfx942 grouped kernel (csrc/grouped.hip and its launcher csrc/launch.cpp grouped_launch, unchanged) on the CPU
emulator, driven through the protocol's GROUPED_ARGS as the core packs them: every group against a float64 oracle
(fp8gemm.reference.oracle on that group's rows) on seeded random data, outputs poisoned with NaN inside a NaN guard
region, so a row the kernel must not write, or any element outside ``out``, shows up. Contiguous splits (empty
groups, groups smaller than a tile, one group with every row, M off the tile grid), masked groups with every
masked_m from 0 to M_max, out-of-range group_rows values, both tile configs, bf16 and fp32 out; each call is one
launch of the kernel (row ids: test_gfx942_emulation_grouped_row_ids.py). Then the core's grouped ops
(fp8gemm.grouped_gemm with offs or m_indices, grouped_gemm_masked) and their conformance suite on the emulated
backend."""

from __future__ import annotations

import dataclasses
import math

import pytest
import test_gfx942_emulation
import torch
from fp8gemm.protocol import GROUPED_ARGS, GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS
from fp8gemm.reference import BLOCK, oracle
from fp8gemm.testing import conformance, conformance_grouped

FP8 = test_gfx942_emulation.FP8
emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
OUT_DTYPES = (torch.bfloat16, torch.float32)
# NaN around out: rows before it, rows after it (a whole tile, so a kernel that stores a full tile past the end is
# reported, not a crash), columns past N in every row.
GUARD_ROWS, GUARD_AFTER, GUARD_COLS = 8, 128, 16
BASE_SEED = 4500
SPARE_ROWS = 128  # A and its scales continue this far past their end (finite values), for a kernel that reads there


@dataclasses.dataclass(frozen=True)
class Problem:
    """One grouped call: ``group_rows`` as the device will see it (out-of-range values included)."""

    id: str
    masked: bool
    m: int  # contiguous: rows of a/out; masked: M_max
    n: int
    k: int
    group_rows: tuple[int, ...]
    expected_m: int = 0
    seed: int = BASE_SEED

    @property
    def groups(self) -> int:
        return len(self.group_rows)

    def row_ranges(self) -> list[tuple[int, int]]:
        """Each group's [begin, end) rows after the kernel's clamping (ends: [previous end, m]; masked: [0, M_max])."""
        if self.masked:
            return [(0, min(max(r, 0), self.m)) for r in self.group_rows]
        ranges, begin = [], 0
        for end in self.group_rows:
            end = min(max(end, begin), self.m)
            ranges.append((begin, end))
            begin = end
        return ranges


def _contiguous(id, sizes, n=144, k=256, tail=0, **kw) -> Problem:
    """Groups of `sizes` rows in order, then `tail` rows in no group."""
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    return Problem(id, False, ends[-1] + tail, n, k, tuple(ends), **kw)


CONTIGUOUS = [
    _contiguous("empty-groups", [0, 37, 0, 0, 130, 5, 0], seed=BASE_SEED + 1),
    _contiguous("smaller-than-a-tile", [3, 200, 1], n=272, seed=BASE_SEED + 2),
    _contiguous("one-group-all-rows", [0, 0, 300, 0], k=384, seed=BASE_SEED + 3),
    _contiguous("m-off-the-tile-grid", [129, 70], seed=BASE_SEED + 4),
    _contiguous("rows-past-the-last-end", [20, 50], tail=9, seed=BASE_SEED + 5),
    _contiguous("decode-32-row-tiles", [7, 0, 32, 1, 19, 33, 2, 30], seed=BASE_SEED + 6),
    _contiguous("hint-32-row-tiles", [40, 90, 3, 65], expected_m=16, seed=BASE_SEED + 7),
    _contiguous("hint-128-row-tiles", [5, 3, 9, 0], expected_m=200, seed=BASE_SEED + 8),
    _contiguous("single-group", [77], n=16, k=128, seed=BASE_SEED + 9),
]
M_MAX = 40
MASKED = [
    # One group per masked_m from 0 to M_max, in a seeded order: every value in one launch, on both tile configs.
    Problem("every-masked-m-128-row-tiles", True, M_MAX, 144, 256, (), seed=BASE_SEED + 10),
    Problem("every-masked-m-32-row-tiles", True, M_MAX, 144, 256, (), expected_m=8, seed=BASE_SEED + 11),
    Problem("masked-past-a-tile", True, 130, 272, 256, (0, 1, 127, 128, 129, 130), seed=BASE_SEED + 12),
    Problem("one-group", True, 50, 16, 128, (33,), seed=BASE_SEED + 13),
]
# Values only the device sees, clamped there: ends past m, decreasing, negative; masked_m past M_max or negative.
# The values just past the end come first: a kernel that misses a clamp writes into the guard rows, while the huge
# ones may take the process down.
OUT_OF_RANGE = [
    Problem("end-just-past-m", False, 100, 144, 256, (30, 103, 105), seed=BASE_SEED + 19),
    Problem("masked-m-just-past-m-max", True, 37, 144, 256, (40, 5, 39), seed=BASE_SEED + 20),
    Problem("end-past-m-then-decreasing", False, 150, 144, 256, (5, 400, 3, -7, 2**31 - 1), seed=BASE_SEED + 14),
    Problem("negative-first-end", False, 100, 144, 256, (-3, 60, 40, 100), seed=BASE_SEED + 15),
    Problem("decode-end-past-m", False, 40, 144, 128, (10, 12, 2**31 - 1, 11), seed=BASE_SEED + 16),
    Problem("masked-m-out-of-range", True, 37, 144, 256, (42, -1, 2**31 - 1, -(2**31), 7), seed=BASE_SEED + 17),
    Problem("masked-m-out-of-range-32", True, 37, 144, 256, (38, -5, 36), expected_m=4, seed=BASE_SEED + 18),
]


def _with_every_masked_m(problem: Problem) -> Problem:
    if problem.group_rows:
        return problem
    gen = torch.Generator().manual_seed(problem.seed)
    return dataclasses.replace(problem, group_rows=tuple(torch.randperm(problem.m + 1, generator=gen).tolist()))


PROBLEMS = CONTIGUOUS + [_with_every_masked_m(p) for p in MASKED] + OUT_OF_RANGE


def _mn_major(a_scale: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[..., rows, kb] -> [..., kb, ld] with ld a multiple of 4 (the backend's a_scale_layout). The padding is huge
    but finite: read for a row in a group it wrecks that row's error; written to a row outside, it is no NaN."""
    rows, kb = a_scale.shape[-2:]
    ld = -(-rows // 4) * 4
    shape = (*a_scale.shape[:-2], kb, ld)
    scale = torch.full((math.prod(shape) + SPARE_ROWS,), 1e6)[: math.prod(shape)].view(shape)  # finite beyond, too
    scale[..., :rows] = a_scale.transpose(-1, -2)
    return scale, ld


@dataclasses.dataclass
class Inputs:
    a: torch.Tensor  # [m, k] or [groups, M_max, k]
    b: torch.Tensor  # [groups, n, k]
    a_scale: torch.Tensor  # [m, kb] or [groups, M_max, kb]
    b_scale: torch.Tensor  # [groups, ceil(n / 128), kb]


def make_inputs(p: Problem) -> Inputs:
    gen = torch.Generator().manual_seed(p.seed)
    kb, lead = p.k // BLOCK, (p.groups,) if p.masked else ()
    rows = p.groups * p.m if p.masked else p.m
    # Finite FP8 rows past the end: a kernel that reads there writes numbers (not NaN) that the guard check sees.
    a = conformance.random_fp8(rows + SPARE_ROWS, p.k, FP8, "cpu", gen)[:rows].reshape(*lead, p.m, p.k)
    b = conformance.random_fp8(p.groups * p.n, p.k, FP8, "cpu", gen).reshape(p.groups, p.n, p.k)
    a_scale = conformance.random_scales(max(rows, 1), kb, "cpu", gen)[:rows].reshape(*lead, p.m, kb)
    b_scale = conformance.random_scales(p.groups * -(-p.n // BLOCK), kb, "cpu", gen).reshape(p.groups, -1, kb)
    return Inputs(a, b, a_scale, b_scale)


def guarded_out(p: Problem, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): out [m, n] (masked [groups, M_max, n]) inside a NaN buffer with guard rows and columns."""
    rows = p.groups * p.m if p.masked else p.m
    buffer = torch.full((GUARD_ROWS + rows + GUARD_AFTER, p.n + GUARD_COLS), math.nan, dtype=dtype)
    out = buffer[GUARD_ROWS : GUARD_ROWS + rows, : p.n]
    return buffer, out.reshape(p.groups, p.m, p.n) if p.masked else out


def launch(backend, p: Problem, x: Inputs, out: torch.Tensor, layout: int | None = None) -> None:
    """One grouped_launch with GROUPED_ARGS packed here, as the core packs them."""
    masked = p.masked
    a_scale, a_scale_ld = _mn_major(x.a_scale)
    group_rows = torch.tensor(p.group_rows, dtype=torch.int32)
    fields = dict(
        a=x.a.data_ptr(), b=x.b.data_ptr(), a_scale=a_scale.data_ptr(), b_scale=x.b_scale.data_ptr(),
        out=out.data_ptr(), workspace=0, group_rows=group_rows.data_ptr(), m=p.m, n=p.n, k=p.k, groups=p.groups,
        lda=x.a.stride(-2), ldb=x.b.stride(1), ldo=out.stride(-2), a_scale_ld=a_scale_ld,
        b_scale_ld=x.b_scale.stride(1), a_group_stride=x.a.stride(0) if masked else 0, b_group_stride=x.b.stride(0),
        out_group_stride=out.stride(0) if masked else 0, a_scale_group_stride=a_scale.stride(0) if masked else 0,
        b_scale_group_stride=x.b_scale.stride(0), expected_m=p.expected_m,
        layout=layout if layout is not None else GROUPED_MASKED if masked else GROUPED_CONTIGUOUS,
        out_kind=int(out.dtype == torch.float32), stream=0,
    )  # fmt: skip
    backend.grouped_launch(GROUPED_ARGS.pack(*(fields[name] for name in GROUPED_ARGS.fields)))


def expected(p: Problem, x: Inputs) -> tuple[torch.Tensor, list[tuple[int, slice]]]:
    """The float64 buffer the call must leave (NaN wherever nothing is written) and each group's rows in it."""
    buffer, out = guarded_out(p, torch.float64)
    groups = []
    for g, (begin, end) in enumerate(p.row_ranges()):
        a, a_scale = (x.a[g], x.a_scale[g]) if p.masked else (x.a, x.a_scale)
        view = out[g] if p.masked else out
        view[begin:end] = oracle(a[begin:end], x.b[g], a_scale[begin:end], x.b_scale[g])
        base = GUARD_ROWS + (g * p.m if p.masked else 0)
        groups.append((g, slice(base + begin, base + end)))
    return buffer, groups


def check(p: Problem, x: Inputs, buffer: torch.Tensor, dtype: torch.dtype) -> None:
    want, groups = expected(p, x)
    got = buffer.double()
    where = f"{p.id} (seed {p.seed}, {str(dtype).removeprefix('torch.')})"
    stray = torch.isnan(want) & ~torch.isnan(got)
    assert not stray.any(), f"{where}: wrote {int(stray.sum())} elements outside its groups: {stray.nonzero()[:5]}"
    for g, rows in groups:
        err = conformance.relative_error(got[rows, : p.n], want[rows, : p.n])
        assert err <= conformance.TOLERANCE[dtype], f"{where}: group {g} rows {rows}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.id for p in PROBLEMS])
def test_grouped_against_float64_per_group(problem, dtype, emulator, mi300x):
    print(f"{problem.id}: seed {problem.seed}, group_rows {problem.group_rows}")
    x, buffer = launch_once(emulator, mi300x, problem, dtype)
    check(problem, x, buffer, dtype)


def launch_once(emulator, backend, p, dtype: torch.dtype, layout: int | None = None) -> tuple[Inputs, torch.Tensor]:
    """``p``'s inputs and its guarded out, after exactly one grouped launch (no dense one) of ``layout``."""
    x = make_inputs(p)
    buffer, out = guarded_out(p, dtype)
    launches, dense = emulator.grouped_launches, emulator.launches
    launch(backend, p, x, out, layout)
    assert (emulator.grouped_launches, emulator.launches) == (launches + 1, dense)  # one grouped launch, no loop
    return x, buffer


def test_problems_cover_the_cases_they_name():
    """The cases above are what their ids say (a test of the test data)."""
    ranges = {p.id: p.row_ranges() for p in PROBLEMS}
    every = [p for p in PROBLEMS if p.id.startswith("every-masked-m")]
    assert all(sorted(e - b for b, e in ranges[p.id]) == list(range(M_MAX + 1)) for p in every)
    assert ranges["end-past-m-then-decreasing"] == [(0, 5), (5, 150), (150, 150), (150, 150), (150, 150)]
    assert ranges["masked-m-out-of-range"] == [(0, 37), (0, 0), (0, 37), (0, 0), (0, 7)]
    assert any(e - b == 0 for b, e in ranges["empty-groups"]) and ranges["one-group-all-rows"][2] == (0, 300)
    assert ranges["rows-past-the-last-end"][-1][1] < 79


def test_the_oracle_check_can_fail(emulator, mi300x):
    """A wrong B for one group, or a row written outside the groups, is caught by check()."""
    p = CONTIGUOUS[0]
    x = make_inputs(p)
    buffer, out = guarded_out(p, torch.float32)
    launch(mi300x, p, x, out)
    check(p, x, buffer, torch.float32)
    swapped = dataclasses.replace(x, b=x.b.roll(1, dims=0))
    with pytest.raises(AssertionError, match="relative error"):
        check(p, swapped, buffer, torch.float32)
    buffer[0, 0] = 1.0  # a guard row
    with pytest.raises(AssertionError, match="outside its groups"):
        check(p, x, buffer, torch.float32)


def test_layouts_it_takes_and_refuses(emulator, mi300x):
    """Contiguous, masked and row ids (tests/test_gfx942_emulation_grouped_row_ids.py); any other layout is refused
    with what it takes, before anything is written."""
    assert mi300x.grouped_layouts == (GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS)
    p = CONTIGUOUS[0]
    x = make_inputs(p)
    buffer, out = guarded_out(p, torch.float32)
    for layout in (GROUPED_ROW_IDS + 1, -1):
        with pytest.raises(
            test_gfx942_emulation.gfx942_emulator.EmulationError,
            match=rf"grouped_launch: layout {layout} is not supported \(contiguous, masked and row ids are\)",
        ):
            launch(mi300x, p, x, out, layout=layout)
    assert torch.isnan(buffer).all()


def test_no_rows_or_no_groups_launch_nothing(emulator, mi300x):
    for p in (Problem("no-rows", False, 0, 144, 256, (0, 0)), Problem("no-rows-masked", True, 0, 144, 256, (3,))):
        x = make_inputs(p)
        buffer, out = guarded_out(p, torch.bfloat16)
        launch(mi300x, p, x, out)
        assert torch.isnan(buffer.float()).all()


def test_workspace_and_argument_sizes(emulator, mi300x):
    assert emulator.grouped_workspace_bytes(GROUPED_CONTIGUOUS, 4096, 4096, 7168, 32) == 0  # no split-K
    assert mi300x.grouped_workspace_bytes(GROUPED_MASKED, 64, 4096, 7168, 32) == 0
    assert emulator.args_sizes()["grouped_launch"] == GROUPED_ARGS.size


CORE_CASES = conformance_grouped.cases("cpu", n_random=6)  # random splits from conformance.DEFAULT_SEED


@pytest.mark.parametrize("case", CORE_CASES, ids=[c.id for c in CORE_CASES])
def test_core_grouped_conformance(case, emulator, mi300x):
    """The core's suite through fp8gemm.grouped_gemm / grouped_gemm_masked: every layout (offs, m_indices, masked)
    runs the kernel, once a case with rows."""
    launches = emulator.grouped_launches
    result = conformance_grouped.run_case(case, "cpu", FP8, mi300x.name)
    assert result.passed, f"{case.id}: rel. err {result.rel_err:.3e} {result.detail}"
    assert emulator.grouped_launches == launches + (case.m > 0)


@pytest.mark.parametrize("bad", conformance_grouped.BAD_INPUTS, ids=[b.id for b in conformance_grouped.BAD_INPUTS])
def test_core_grouped_bad_input_is_rejected_before_a_launch(bad, emulator, mi300x):
    launches = emulator.grouped_launches
    ok, detail = conformance_grouped.run_bad_input(bad, "cpu", FP8, mi300x.name)
    assert ok, f"expected {bad.error.__name__} mentioning {bad.match!r}; got {detail}"
    assert emulator.grouped_launches == launches
