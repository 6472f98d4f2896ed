"""What issue 3's speed targets would take, from recorded H200 measurements.

python3 bench/target_bounds.py [BENCH_JSON] [FLOOR_JSON]

A bound, not a forecast: each shape gets the fastest time anything measured on it could justify.
- Decode shapes (those in FLOOR_JSON, M <= 128): a kernel that only reads the weights, the fastest plain read of
  the n x k bytes measured in the benchmark's own harness (do_bench after its L2 flush), against cuBLASLt and
  DeepGEMM timed in that same run. A GEMM also reads A, writes the output and computes, so it is not expected to be
  faster than the fastest such read.
- The other shapes: the faster of ours and DeepGEMM in BENCH_JSON. They run at the H200's 700 W cap (README, "Why
  the GPU state"), where time per call follows energy per call, and neither kernel sustains more.
The geometric means of those times' speedups over cuBLASLt and DeepGEMM are the most the shape set allows. Then, per
target, the speedup the decode shapes would need if the other shapes stay where ours measured, beside the bound's
and ours. Also printed: the best TFLOP/s any implementation reached on the M = 4096, K >= 2048 shapes (target 1300),
and the plain read's time at 64x2112x7168 against the target's 7.2 us (270 TFLOP/s).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from fp8gemm.bench import geomean
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_BENCH = RESULTS / "hopper_h200_2026-11-24_f_rounds3.json"
DEFAULT_FLOOR = RESULTS / "sm90a_decode_floor_h200_2026-11-24.json"
OURS, CUBLASLT, DEEPGEMM = "fp8gemm", "torch._scaled_mm blockwise", "DeepGEMM"
PLAIN_READ = "best plain read of b (Triton)"
FLUSH = "dirty"  # do_bench's flush, as the benchmark times
TARGETS = {CUBLASLT: 1.35, DEEPGEMM: 1.05}
PEER_NAMES = {CUBLASLT: "cuBLASLt", DEEPGEMM: "DeepGEMM"}


def shape_bounds(bench: dict, floor: dict) -> list[dict]:
    """Per benchmark shape: the bound's speedup over each peer (the peer timed in the bound's run) and ours'."""
    times: dict[str, dict[str, float]] = {}
    for row in bench["results"]:
        times.setdefault(f"{row['m']}x{row['n']}x{row['k']}", {})[row["impl"]] = row["us"]
    rows = []
    for shape, measured in times.items():
        decode = shape in floor["shapes"]
        run = floor["shapes"][shape][FLUSH] if decode else measured
        bound_us = run[PLAIN_READ] if decode else min(measured[OURS], measured[DEEPGEMM])
        rows.append({
            "shape": shape, "decode": decode, "bound_us": bound_us,
            "bound": {peer: run[peer] / bound_us for peer in TARGETS},
            "ours": {peer: measured[peer] / measured[OURS] for peer in TARGETS},
        })  # fmt: skip
    return rows


def decode_needed(rows: list[dict], peer: str, target: float) -> float:
    """The geomean speedup over `peer` the decode shapes need for `target` overall, the others as ours measured."""
    others = [r["ours"][peer] for r in rows if not r["decode"]]
    n_decode = len(rows) - len(others)
    return math.exp((len(rows) * math.log(target) - sum(math.log(v) for v in others)) / n_decode)


def best_large_tflops(bench: dict) -> tuple[float, str, str]:
    """The highest TFLOP/s any implementation reached on an M = 4096, K >= 2048 shape: (TFLOP/s, impl, shape)."""
    rows = [r for r in bench["results"] if r["m"] == 4096 and r["k"] >= 2048 and r["rel_err"] < 0.01]
    best = max(rows, key=lambda r: r["tflops"])
    return best["tflops"], best["impl"], f"{best['m']}x{best['n']}x{best['k']}"


def main(argv: list[str]) -> int:
    bench = json.loads(Path(argv[0] if argv else DEFAULT_BENCH).read_text())
    floor = json.loads(Path(argv[1] if len(argv) > 1 else DEFAULT_FLOOR).read_text())
    rows = shape_bounds(bench, floor)
    console = Console(width=120)
    table = Table(title="Speedup over the peers: the bound and ours")
    for column in ("shape", "bound from", "bound / cuBLASLt", "bound / DeepGEMM", "ours / cuBLASLt", "ours / DeepGEMM"):
        table.add_column(column, justify="left" if column in ("shape", "bound from") else "right")
    for r in rows:
        table.add_row(r["shape"], "read of B" if r["decode"] else "best GEMM",
                      *(f"{r[key][peer]:.3f}" for key in ("bound", "ours") for peer in TARGETS))  # fmt: skip
    console.print(table)
    decode = [r for r in rows if r["decode"]]
    for peer, target in TARGETS.items():
        name = PEER_NAMES[peer]
        console.print(
            f"{name}: geomean bound {geomean(r['bound'][peer] for r in rows):.3f}x, ours "
            f"{geomean(r['ours'][peer] for r in rows):.3f}x (target {target:.2f}x). For the target, the "
            f"{len(decode)} decode shapes would need {decode_needed(rows, peer, target):.3f}x over {name}, the "
            f"others as ours measured; a read of B is {geomean(r['bound'][peer] for r in decode):.3f}x, ours "
            f"{geomean(r['ours'][peer] for r in decode):.3f}x"
        )
    tflops, impl, shape = best_large_tflops(bench)
    console.print(f"best on M = 4096, K >= 2048: {tflops:.0f} TFLOP/s ({impl}, {shape}; target 1300)")
    read = floor["shapes"]["64x2112x7168"][FLUSH]
    console.print(f"64x2112x7168: plain read of B {read[PLAIN_READ]:.2f} us, empty kernel {read['empty']:.2f} us "
                  "(target 7.2 us: 270 TFLOP/s)")  # fmt: skip
    console.print(f"bench: {bench['environment']['date']}, {bench['environment']['device']}; "
                  f"floor: {floor['environment']['date']}, {floor['environment']['gpu']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
