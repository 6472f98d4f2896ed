"""fp8gemm-cuda-sm90a's tile order (csrc/tile_order.hpp) without a GPU: the header is plain C++, so a driver built
with the host compiler runs the same arithmetic the kernels run. Its divisions by multiply-high must equal integer
division, and the order must visit every cluster tile of every split exactly once, in groups of group_m M groups
with M fastest inside a group (the division-based order it replaced)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import sm90a_host_driver

DRIVER = r"""
#include <cstdio>
#include "tile_order.hpp"
using namespace fp8gemm_sm90a;
int main() {
  char mode;
  while (std::scanf(" %c", &mode) == 1) {
    if (mode == 'd') {  // d divisor dividend: the quotient
      unsigned d, n;
      std::scanf("%u %u", &d, &n);
      std::printf("%u\n", FastDiv(d).div(n));
    } else {  // o m_groups n_groups group_m splits: every tile's split, M group, N group in order
      int m_groups, n_groups, group_m, splits;
      std::scanf("%d %d %d %d", &m_groups, &n_groups, &group_m, &splits);
      const TileOrder order = make_tile_order(m_groups, n_groups, group_m);
      for (int t = 0; t < m_groups * n_groups * splits; ++t) {
        const TileIndex i = tile_index(order, t);
        std::printf("%d %d %d%c", i.split, i.m, i.n, t + 1 < m_groups * n_groups * splits ? ' ' : '\n');
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    run = sm90a_host_driver(tmp_path_factory.mktemp("sm90a_tile_order"), DRIVER)
    return lambda text: run(text).split("\n")


def division_order(m_groups: int, n_groups: int, group_m: int, splits: int) -> list[tuple[int, int, int]]:
    """The order as the kernels computed it with integer division (before tile_order.hpp)."""
    tiles = []
    for t in range(m_groups * n_groups * splits):
        split, t = divmod(t, m_groups * n_groups)
        first_m = t // (group_m * n_groups) * group_m
        rows = min(group_m, m_groups - first_m)
        t %= group_m * n_groups
        tiles.append((split, first_m + t % rows, t // rows))
    return tiles


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**31 - 1), st.integers(0, 2**31 - 1)), min_size=1, max_size=200))
def test_fast_division_is_integer_division(driver, pairs):
    pairs += [(d, n) for d in (1, 2, 3, 7, 127, 128, 132, 2**16 + 1, 2**31 - 1) for n in (0, 1, d - 1, d, 2**31 - 1)]
    quotients = driver("".join(f"d {d} {n}\n" for d, n in pairs))
    assert [int(q) for q in quotients[: len(pairs)]] == [n // d for d, n in pairs]


@settings(max_examples=80, deadline=None)
@given(
    m_groups=st.integers(1, 40), n_groups=st.integers(1, 40), group_m=st.sampled_from([1, 2, 4, 8, 16]),
    splits=st.integers(1, 4),
)  # fmt: skip
def test_order_visits_each_tile_once_as_the_division_order_did(driver, m_groups, n_groups, group_m, splits):
    line = driver(f"o {m_groups} {n_groups} {group_m} {splits}\n")[0].split()
    tiles = [tuple(map(int, line[i : i + 3])) for i in range(0, len(line), 3)]
    assert tiles == division_order(m_groups, n_groups, group_m, splits)
    assert sorted(tiles) == [(s, m, n) for s in range(splits) for m in range(m_groups) for n in range(n_groups)]
