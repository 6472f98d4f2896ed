"""bench/target_bounds.py, on CPU: the bound per shape and the decode speedup a target needs."""

from __future__ import annotations

import math

import pytest
from scripts import load_script


@pytest.fixture(scope="module")
def bounds():
    return load_script("bench/target_bounds.py")


def bench_rows(shape, **us):
    m, n, k = shape
    return [{"impl": impl, "m": m, "n": n, "k": k, "us": t, "tflops": 2 * m * n * k / t / 1e6, "rel_err": 1e-3}
            for impl, t in us.items()]  # fmt: skip


def test_decode_shapes_take_the_read_and_the_others_the_faster_gemm(bounds):
    ours, cublaslt, deepgemm = bounds.OURS, bounds.CUBLASLT, bounds.DEEPGEMM
    bench = {"results": bench_rows((64, 2112, 7168), **{ours: 12.0, cublaslt: 25.0, deepgemm: 13.0})
             + bench_rows((4096, 4096, 7168), **{ours: 200.0, cublaslt: 220.0, deepgemm: 190.0})}  # fmt: skip
    # The decode shape's peers come from the floor run, not from the benchmark's.
    floor = {"shapes": {"64x2112x7168": {"dirty": {bounds.PLAIN_READ: 10.0, cublaslt: 30.0, deepgemm: 15.0}}}}
    decode, large = bounds.shape_bounds(bench, floor)
    assert decode["decode"] and decode["bound_us"] == 10.0
    assert decode["bound"] == {cublaslt: pytest.approx(3.0), deepgemm: pytest.approx(1.5)}
    assert decode["ours"] == {cublaslt: pytest.approx(25 / 12), deepgemm: pytest.approx(13 / 12)}
    assert not large["decode"] and large["bound_us"] == 190.0
    assert large["bound"][deepgemm] == pytest.approx(1.0)
    assert large["ours"][deepgemm] == pytest.approx(0.95)


def test_decode_needed_makes_the_overall_geomean_the_target(bounds):
    peer = bounds.DEEPGEMM
    rows = [{"decode": False, "ours": {peer: 0.95}}, {"decode": False, "ours": {peer: 1.0}}]
    rows += [{"decode": True, "ours": {peer: 1.0}}] * 3
    needed = bounds.decode_needed(rows, peer, 1.05)
    assert bounds.geomean([0.95, 1.0] + [needed] * 3) == pytest.approx(1.05)
    assert needed == pytest.approx(math.exp((5 * math.log(1.05) - math.log(0.95)) / 3))


def test_runs_on_the_recorded_h200_results(bounds, capsys):
    assert bounds.main([]) == 0
    out = capsys.readouterr().out
    assert "geomean bound" in out and "64x2112x7168" in out
