"""Times every compiled sm90a grouped kernel on the grouped benchmark's cases, beside the plan's own pick: the data
behind csrc/heuristics.hpp kGroupedRates (which tile the plan should pick for which groups).

Usage (Hopper GPU, fp8gemm-cuda-sm90a installed): python3 ci/gpu/grouped_tile_times.py OUT.json [SET ...]
SET: case sets of `fp8gemm bench --grouped` (default: deepgemm-contiguous deepgemm-masked).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
from fp8gemm import grouped_bench, registry
from fp8gemm.grouped_peers import OURS_CONTIGUOUS, OURS_MASKED, PATHS
from fp8gemm.layer_bench import time_graph
from fp8gemm.registry import Selection
from fp8gemm_cuda_sm90a import _C

OURS = (OURS_CONTIGUOUS, OURS_MASKED)


def timed_with(case, device, select, index: int | None) -> dict:
    """Our paths' times on ``case`` with the grouped kernel ``index`` (None: the plan's)."""
    backend = select(device, "sm90a").backend
    if index is not None:
        backend = dataclasses.replace(backend, grouped_launch=lambda args: _C.grouped_launch_tile(args, index))
    registry.select = lambda device, name=None: Selection(backend, "timed tile")
    try:
        missing = {name: "not timed here" for name in PATHS if name not in OURS}
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        layouts = {"contiguous": True, "masked": True}
        row = grouped_bench.time_case(
            case, device, "sm90a", grouped_bench.DEFAULT_SEED, time_graph, l2, missing, layouts
        )
    finally:
        registry.select = select
    return {
        name: row["us"].get(name) or row["errors"].get(name) for name in OURS if name in grouped_bench.case_paths(case)
    }


def main(out: str, sets: list[str]) -> None:
    device = torch.device("cuda")
    select = registry.select
    tiles = [f"{r}x{c}" + (f"c{k}" if k > 1 else "") for r, c, k in _C.grouped_tiles()]
    rows = []
    for case in grouped_bench.all_cases():
        if case.set not in sets:
            continue
        times = {"plan": timed_with(case, device, select, None)}
        for index, name in enumerate(tiles):
            times[name] = timed_with(case, device, select, index)
        rows.append({"label": case.label, "counts": case.counts, "n": case.n, "k": case.k, "times_us": times})
        for path in times["plan"]:
            us = {t: v[path] for t, v in times.items() if isinstance(v.get(path), float)}
            best = min((v, t) for t, v in us.items() if t != "plan")
            print(
                f"{case.label:40s} {path[-8:]:8s} plan {us.get('plan', float('nan')):8.1f}  best {best[1]:10s} "
                f"{best[0]:8.1f}  " + " ".join(f"{t}={v:.1f}" for t, v in us.items() if t != "plan"),
                flush=True,
            )
        with open(out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "tiles": tiles, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["deepgemm-contiguous", "deepgemm-masked"])
