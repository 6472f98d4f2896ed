"""Shapes that fp8gemm-cuda-sm90a's plan (csrc/heuristics.hpp) maps to each of its compiled kernels on 132 SMs
(H100/H200 SXM), unsplit and in K splits, with M and N tails: the GPU tests run these against the float64 oracle,
and tests/test_sm90a_heuristics.py checks without a GPU that they reach the kernels named here, and every one."""

from __future__ import annotations

TWO_SETS, ONE_SET, SPLIT_WARPGROUPS = 0, 1, 2  # tile_config.hpp MainLoop

# (m, n, k): (rows, cols, cluster, main loop, K split). One-set kernels on K of 131 and 150 blocks: B-scale
# segments of 64 K blocks, a partial last one, restarted per split. Warpgroup K splits on odd and even block counts.
KERNEL_SHAPES = {
    (1, 16, 128): (64, 16, 1, TWO_SETS, False),
    (1, 16, 640): (64, 16, 1, TWO_SETS, True),
    (1, 2144, 128): (64, 32, 1, TWO_SETS, False),
    (1, 544, 1664): (64, 32, 1, TWO_SETS, True),
    (1, 4272, 256): (64, 64, 1, TWO_SETS, False),
    (1, 592, 3200): (64, 64, 1, TWO_SETS, True),
    (1, 8528, 16768): (64, 96, 1, TWO_SETS, False),
    (1, 4272, 7168): (64, 96, 1, TWO_SETS, True),
    (1, 12784, 128): (64, 128, 1, TWO_SETS, False),
    (129, 720, 6272): (64, 128, 1, TWO_SETS, True),
    (65, 4272, 256): (128, 64, 1, TWO_SETS, False),
    (65, 656, 6272): (128, 64, 1, TWO_SETS, True),
    (65, 8528, 128): (128, 96, 1, TWO_SETS, False),
    (65, 2144, 6272): (128, 96, 1, TWO_SETS, True),
    (65, 12784, 256): (128, 128, 1, TWO_SETS, False),
    (129, 912, 6272): (128, 128, 1, TWO_SETS, True),
    (1, 1696, 6272): (64, 16, 1, SPLIT_WARPGROUPS, False),  # 49 K blocks
    (1, 1808, 7168): (64, 16, 1, SPLIT_WARPGROUPS, False),  # 56
    (1, 2592, 6272): (64, 32, 1, SPLIT_WARPGROUPS, False),
    (1, 3264, 19200): (64, 32, 1, SPLIT_WARPGROUPS, False),
    (1, 1808, 19200): (64, 32, 1, SPLIT_WARPGROUPS, True),  # 2 splits of 75
    (1, 1248, 19200): (64, 32, 1, SPLIT_WARPGROUPS, True),  # 3 splits of 50
    (65, 12784, 16768): (128, 128, 1, ONE_SET, False),
    (65, 3264, 19200): (128, 128, 1, ONE_SET, True),
    (129, 8528, 19200): (128, 160, 1, ONE_SET, False),
    (129, 784, 19200): (128, 160, 1, ONE_SET, True),
    (65, 21184, 16768): (128, 192, 1, ONE_SET, False),
    (300, 1136, 16768): (128, 192, 1, ONE_SET, True),
    (129, 10656, 16768): (192, 128, 1, ONE_SET, False),
    (129, 1248, 19200): (192, 128, 1, ONE_SET, True),
    (6000, 528, 16768): (256, 128, 1, ONE_SET, False),
    (6000, 80, 19200): (256, 128, 1, ONE_SET, True),
    (200, 12784, 19200): (256, 128, 2, ONE_SET, False),
    (200, 2144, 19200): (256, 128, 2, ONE_SET, True),
}

# The weight-gradient kernels (tile_config.hpp kWgradTiles, heuristics.hpp wgrad_plan_for) on 132 SMs: (m, n, k):
# (rows, cols, cluster). M and N tails (a short last M block whose rows overlap the one before, N off the 128 grid and
# off a store box), K blocks below the unrolled loop's 24 and above it with a remainder, a tile taller than M.
WGRAD_KERNEL_SHAPES = {
    (96, 48, 640): (128, 128, 1),
    (200, 272, 1152): (128, 128, 1),
    (200, 272, 3456): (128, 128, 1),
    (1000, 2160, 1152): (128, 160, 1),
    (1000, 2160, 3456): (128, 160, 1),
    (1022, 2400, 1152): (128, 160, 1),  # a last M block that ends past M without starting early: TMA clips it
    (1100, 2256, 1152): (128, 192, 1),  # N ends inside a 32-column store box
    (1100, 2256, 3456): (128, 192, 1),
    (2308, 1168, 1152): (192, 128, 1),
    (2308, 1168, 3456): (192, 128, 1),
}

# The k-grouped weight-gradient kernels (wgrad_launch.cuh kgrouped_wgrad_launch) on 132 SMs: (tokens of each expert,
# N, K, out) -> (rows, cols, cluster), out "fp32", "bf16" (TMA stores where the plan takes the 128 x 128 tile) or
# "accumulate" (fp32 added into: TMA's reduce-add on the two-warpgroup tiles). Each has an empty expert and experts
# ending inside a 128-token block; N and K are the quantized rows' widths, multiples of 128.
KGROUPED_WGRAD_KERNEL_SHAPES = {
    ((1100, 0, 1300), 256, 256, "bf16"): (128, 128, 1),
    ((1100, 0, 1300), 1536, 640, "fp32"): (192, 128, 1),
    ((1100, 0, 1300), 384, 2304, "fp32"): (128, 192, 1),
    ((2000, 0, 1500, 900), 640, 1024, "accumulate"): (128, 192, 1),
    ((1100, 0, 1300), 384, 2176, "accumulate"): (128, 160, 1),
    ((2000, 0, 1500, 900), 256, 2176, "bf16"): (128, 192, 1),
    ((3000, 0, 3000), 384, 2304, "bf16"): (128, 192, 1),
}


def kgrouped_plan_args(counts, n: int, k: int, out: str, sms: int = 132) -> tuple[int, ...]:
    """wgrad_plan_for's arguments for a k-grouped launch on ``counts``: the per-expert aligned layout's columns
    (128 (E + M // 128 + 1)) less one gap block per expert, shared evenly; TMA stores for plain bf16 out."""
    experts, rows = len(counts), sum(counts)
    k_each = max(128, 128 * (rows // 128 + 1) // experts)
    return n, k, k_each, sms, experts, int(out == "bf16")
