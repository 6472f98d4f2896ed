"""ci/gpu/inprocess_ab.py's paired ratio, on CPU: it compares each round's times, so a two-state GPU that puts
two identical builds' medians in different states does not make them look 5% apart."""

from __future__ import annotations

import pytest
from scripts import load_script


@pytest.fixture(scope="module")
def inprocess_ab():
    return load_script("ci/gpu/inprocess_ab.py")


def test_paired_ratio_compares_rounds_not_medians(inprocess_ab):
    # Two identical builds timed in a GPU that flips between 11.2 and 11.9 us from round to round (H200, 64x7168x2048):
    # the same state in most rounds, different states in two.
    fast, slow = 11.2, 11.9
    a = [fast, slow, fast, slow, fast, slow, slow, fast, slow]
    b = [fast, slow, fast, slow, fast, fast, fast, fast, slow]
    row_a = {"us": sorted(a)[len(a) // 2], "us_rounds": a}
    row_b = {"us": sorted(b)[len(b) // 2], "us_rounds": b}
    assert row_a["us"] / row_b["us"] == pytest.approx(slow / fast)  # the medians fall in different states
    assert inprocess_ab.paired_ratio(row_a, row_b) == pytest.approx(1.0)


def test_paired_ratio_sees_a_real_difference(inprocess_ab):
    base = [10.0, 10.5, 10.0, 10.5, 10.0]
    faster = [t / 1.02 for t in base]
    assert inprocess_ab.paired_ratio(
        {"us": 10.0, "us_rounds": base}, {"us": 9.8, "us_rounds": faster}
    ) == pytest.approx(1.02)


def test_paired_ratio_of_single_timings(inprocess_ab):
    assert inprocess_ab.paired_ratio({"us": 12.0}, {"us": 10.0}) == pytest.approx(1.2)
