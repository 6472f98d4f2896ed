"""The gfx942 grouped kernel on the row-ids layout (GROUPED_ROW_IDS: m_indices, each row's group, -1 to skip) on the CPU
emulator: csrc/grouped.hip's row_ids_tile, the workgroup's scan of the ids for the run that holds its row tile, and
the launcher's grid for it, through the protocol's GROUPED_ARGS as the core packs them.

Every group against a float64 oracle of the same FP8 operands (fp8gemm.reference.oracle on that group's rows) within
the grouped tolerances, on seeded random data (seeds printed), outputs poisoned with NaN inside a NaN guard region
(test_gfx942_emulation_grouped's helpers), so a row with an id outside [0, G) that the kernel writes, or any element
outside out, shows up: ids in any order, sorted with -1 padding (DeepGEMM's contiguous layout), all -1, ids out of
range (past G, below -1, the int32 extremes), one row, M off the tile grid, runs longer than a tile and across the
threads' chunks, both tile configs, bf16 and fp32 out; one launch each. Then fp8gemm.grouped_gemm(m_indices=...) on
the emulated backend, which now runs the kernel."""

from __future__ import annotations

import dataclasses
import random

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from fp8gemm.protocol import GROUPED_ROW_IDS
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance
from test_gfx942_emulation_grouped import GUARD_ROWS, OUT_DTYPES, guarded_out, launch, launch_once, make_inputs

emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
BASE_SEED = 4600
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
THREADS = 256  # csrc/launch.hpp kThreads: each work-item scans ceil(m / 256) rows


@dataclasses.dataclass(frozen=True)
class RowIdsProblem:
    """One row-ids call: ``ids`` as the device sees them (any int32), ``groups`` experts."""

    id: str
    ids: tuple[int, ...]
    groups: int
    n: int = 144
    k: int = 256
    expected_m: int = 0
    seed: int = BASE_SEED
    masked = False  # what test_gfx942_emulation_grouped's helpers read

    @property
    def m(self) -> int:
        return len(self.ids)

    @property
    def group_rows(self) -> tuple[int, ...]:
        return self.ids

    def members(self) -> list[list[int]]:
        """Each group's rows: those with its id (ids outside [0, G) select none)."""
        rows = [[] for _ in range(self.groups)]
        for r, g in enumerate(self.ids):
            if 0 <= g < self.groups:
                rows[g].append(r)
        return rows


def _runs(sizes_ids, seed: int) -> tuple[int, ...]:
    """Runs of ``(length, id)`` in a seeded order."""
    runs = list(sizes_ids)
    random.Random(seed).shuffle(runs)
    return tuple(i for length, i in runs for _ in range(length))


def _any_order(m: int, groups: int, seed: int, skip: float = 0.2) -> tuple[int, ...]:
    """Each row's id drawn at random (-1 with probability ``skip``): runs of one or a few rows, ids repeated apart."""
    rng = random.Random(seed)
    return tuple(-1 if rng.random() < skip else rng.randrange(groups) for _ in range(m))


def _long_runs(m: int, groups: int, seed: int, lengths=(33, 100)) -> tuple[int, ...]:
    """Runs of a random id (-1 included) and a random length of more than a 32-row tile, starting at every offset
    into the threads' chunks: a tile boundary counted from the wrong run start leaves rows out."""
    rng, ids = random.Random(seed), []
    while len(ids) < m:
        ids += [rng.randrange(-1, groups)] * rng.randint(*lengths)
    return tuple(ids[:m])


def _deepgemm(sizes, align: int = 128) -> tuple[int, ...]:
    """Sorted by expert, each expert's rows padded with -1 to a multiple of ``align`` (DeepGEMM's contiguous layout)."""
    ids = []
    for g, size in enumerate(sizes):
        ids += [g] * size + [-1] * (-size % align)
    return tuple(ids)


def _sorted(sizes) -> tuple[int, ...]:
    return tuple(g for g, size in enumerate(sizes) for _ in range(size))


S = BASE_SEED
PROBLEMS = [
    RowIdsProblem("any-order", _any_order(300, 5, S + 1), 5, seed=S + 1),
    RowIdsProblem("any-order-32-row-tiles", _any_order(100, 8, S + 2), 8, n=272, expected_m=8, seed=S + 2),
    RowIdsProblem("any-order-no-minus-one", _any_order(77, 3, S + 3, skip=0.0), 3, n=16, k=128, seed=S + 3),
    RowIdsProblem("sorted-minus-one-padding", _deepgemm([37, 0, 130, 5]), 4, seed=S + 4),
    RowIdsProblem("sorted-minus-one-padding-32", _deepgemm([3, 40, 0, 1], 32), 4, expected_m=4, seed=S + 5),
    RowIdsProblem("sorted-m-off-the-tile-grid", _sorted([129, 70]), 2, k=384, seed=S + 6),
    RowIdsProblem("all-minus-one", (-1,) * 70, 3, seed=S + 7),
    RowIdsProblem("one-row", (2,), 3, n=16, k=128, seed=S + 8),
    RowIdsProblem("one-row-minus-one", (-1,), 1, n=16, k=128, seed=S + 9),
    # Long runs in a shuffled order over 600 rows (three rows a work-item): runs cross the chunks' borders, runs of
    # one id apart, runs longer than a tile (cut from their first row), -1 runs between.
    RowIdsProblem("runs-across-chunks", _runs([(150, 0), (3, 1), (200, 2), (1, 0), (40, -1), (129, 1), (77, 2)], S + 10),
                  3, seed=S + 10),  # fmt: skip
    RowIdsProblem("runs-across-chunks-32", _runs([(70, 1), (33, 0), (1, 1), (5, -1), (64, 0), (100, 1)], S + 11), 2,
                  expected_m=16, seed=S + 11),  # fmt: skip
    RowIdsProblem("long-runs-32-row-tiles", _long_runs(800, 3, S + 14), 3, n=16, k=128, expected_m=16, seed=S + 14),
    # Ids the host never checks: past G, below -1, the int32 extremes, and a run of one id split by such a row.
    RowIdsProblem("ids-out-of-range", (0, 0, 3, 1, 1, 7, 1, 1, -2, 2, INT32_MAX, INT32_MIN, 2, 2, -1, 3, 0) * 9, 3,
                  seed=S + 12),  # fmt: skip
    RowIdsProblem("ids-out-of-range-32", (5, 0, 0, -7, 0, INT32_MAX, 1) * 11 + (1,) * 40, 2, expected_m=2, seed=S + 13),
]  # fmt: skip


def check(p: RowIdsProblem, x, buffer: torch.Tensor, dtype: torch.dtype) -> None:
    """Each group's rows within the tolerance of float64; every other element of the buffer still NaN."""
    got = buffer.double()
    written = torch.zeros(got.shape[0], dtype=torch.bool)
    where = f"{p.id} (seed {p.seed}, {str(dtype).removeprefix('torch.')})"
    for g, rows in enumerate(p.members()):
        if not rows:
            continue
        index = torch.tensor(rows)
        want = oracle(x.a[index], x.b[g], x.a_scale[index], x.b_scale[g])
        err = conformance.relative_error(got[GUARD_ROWS + index, : p.n], want)
        assert err <= conformance.TOLERANCE[dtype], f"{where}: group {g} ({len(rows)} rows): relative error {err:.3e}"
        written[GUARD_ROWS + index] = True
    untouched = got.clone()
    untouched[written, : p.n] = float("nan")
    stray = ~torch.isnan(untouched)
    assert not stray.any(), f"{where}: wrote {int(stray.sum())} elements outside its groups: {stray.nonzero()[:5]}"


@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.id for p in PROBLEMS])
def test_row_ids_against_float64_per_group(problem, dtype, emulator, mi300x):
    print(f"{problem.id}: seed {problem.seed}, m {problem.m}, groups {problem.groups}, ids {problem.ids[:40]}...")
    x, buffer = launch_once(emulator, mi300x, problem, dtype, GROUPED_ROW_IDS)
    check(problem, x, buffer, dtype)


def test_problems_cover_the_cases_they_name():
    """The cases above are what their ids say (a test of the test data)."""
    by_id = {p.id: p for p in PROBLEMS}
    runs = by_id["runs-across-chunks"]
    chunk = -(-runs.m // THREADS)
    crossing = [r for r in range(1, runs.m) if runs.ids[r] == runs.ids[r - 1] and r % chunk == 0]
    assert chunk > 1 and crossing  # a run goes on across a chunk's border
    assert any(len(rows) > 128 for rows in runs.members())
    assert by_id["sorted-minus-one-padding"].m % 128 == 0 and -1 in by_id["sorted-minus-one-padding"].ids
    assert by_id["sorted-m-off-the-tile-grid"].m % 128 and by_id["sorted-m-off-the-tile-grid"].m > 128
    assert not any(by_id["all-minus-one"].members())
    bad = by_id["ids-out-of-range"]
    assert {INT32_MAX, INT32_MIN, -2, bad.groups} <= set(bad.ids)
    assert any(any(r1 - r0 > 1 for r0, r1 in zip(rows, rows[1:], strict=False)) for rows in bad.members())


def test_the_oracle_check_can_fail(emulator, mi300x):
    """A wrong B for one group, or a write to a row of id -1, is caught by check()."""
    p = PROBLEMS[0]
    x = make_inputs(p)
    buffer, out = guarded_out(p, torch.float32)
    launch(mi300x, p, x, out, layout=GROUPED_ROW_IDS)
    check(p, x, buffer, torch.float32)
    with pytest.raises(AssertionError, match="relative error"):
        check(p, dataclasses.replace(x, b=x.b.roll(1, dims=0)), buffer, torch.float32)
    buffer[GUARD_ROWS + p.ids.index(-1), 0] = 1.0
    with pytest.raises(AssertionError, match="outside its groups"):
        check(p, x, buffer, torch.float32)


def test_m_indices_runs_the_kernel_through_grouped_gemm(emulator, mi300x):
    """fp8gemm.grouped_gemm(m_indices=...) on the emulated backend: one grouped launch, every group within the
    tolerance, rows of id -1 kept (out=) or zero (functional call)."""
    seed = BASE_SEED + 20
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    groups, m, n, k = 4, 90, 160, 384
    ids = torch.tensor(_any_order(m, groups, seed), dtype=torch.int32)
    a = conformance.random_fp8(m, k, test_gfx942_emulation.FP8, "cpu", gen)
    a_scale = conformance.random_scales(m, k // 128, "cpu", gen)
    b = conformance.random_fp8(groups * n, k, test_gfx942_emulation.FP8, "cpu", gen).view(groups, n, k)
    b_scale = conformance.random_scales(groups * -(-n // 128), k // 128, "cpu", gen).view(groups, -1, k // 128)
    for out in (torch.full((m, n), float("nan")), None):
        launches = emulator.grouped_launches
        got = fp8gemm.grouped_gemm(a, b, a_scale, b_scale, m_indices=ids, out=out, out_dtype=None)
        assert emulator.grouped_launches == launches + 1
        for g in range(groups):
            rows = torch.nonzero(ids == g)[:, 0]
            err = conformance.relative_error(got[rows].double(), oracle(a[rows], b[g], a_scale[rows], b_scale[g]))
            assert err <= conformance.TOLERANCE[got.dtype], f"group {g}: relative error {err:.3e}"
        skipped = got[ids == -1]
        assert bool(skipped.isnan().all() if out is not None else (skipped == 0).all())
