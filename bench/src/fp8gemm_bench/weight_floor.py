"""The weight-read floor of a decode case: the bytes of the FP8 weights (and their block scales) of the experts a
batch touches, over the faster of the device's measured copy and read rates (``floor_bandwidths``). At decode a grouped GEMM or an experts layer cannot finish
before its weights have streamed in once; its time over this floor says how much of the stream it wastes."""

from __future__ import annotations

import math

import torch

from .bench import geomean

COPY_BYTES = 1 << 30  # a copy of 1 GiB on a GPU: far past any L2
SMOKE_COPY_BYTES = 1 << 22  # elsewhere (the harness's smoke runs): a copy that takes milliseconds


def copy_bandwidth(device, timer) -> float:
    """Bytes per second a device copy moves (read plus write), timed by ``timer(calls) -> seconds per call`` (the
    benchmark's own: ``layer_bench.time_graph`` on a GPU)."""
    device = torch.device(device)
    src = torch.empty(COPY_BYTES if device.type == "cuda" else SMOKE_COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timer([lambda: dst.copy_(src)])


def read_bandwidth(device, timer) -> float:
    """Bytes per second a read-only pass takes in (``torch.amax`` over the bytes as int32), timed as the copy."""
    device = torch.device(device)
    src = torch.zeros(COPY_BYTES if device.type == "cuda" else SMOKE_COPY_BYTES, dtype=torch.uint8, device=device)
    words = src.view(torch.int32)
    return src.numel() / timer([lambda: torch.amax(words)])


def floor_bandwidths(device, timer) -> dict:
    """The report's rates: a copy's, a read's, and the floor's, the faster of the two (a decode GEMM reads its
    weights: on an H200 the grouped GEMMs streamed them at up to 4.19 TB/s where a 1 GiB copy moved 2.75, read plus
    write, and the read pass 4.24)."""
    copy, read = copy_bandwidth(device, timer), read_bandwidth(device, timer)
    return {"copy_bandwidth_bytes_per_s": copy, "read_bandwidth_bytes_per_s": read,
            "floor_bandwidth_bytes_per_s": max(copy, read)}  # fmt: skip


def block_scale_bytes(n: int, k: int) -> int:
    """fp32 scales of one [n, k] weight, one per 128x128 block."""
    return 4 * math.ceil(n / 128) * math.ceil(k / 128)


def grouped_weight_bytes(n: int, k: int, groups: int) -> int:
    """The FP8 weights [n, k] and scales of ``groups`` experts of a grouped GEMM."""
    return groups * (n * k + block_scale_bytes(n, k))


def experts_weight_bytes(hidden: int, inter: int, experts: int) -> int:
    """The FP8 w13 [2I, H] and w2 [H, I] with their scales of ``experts`` experts of a layer."""
    return experts * (3 * hidden * inter + block_scale_bytes(2 * inter, hidden) + block_scale_bytes(hidden, inter))


def floor_us(nbytes: int, bandwidth: float) -> float:
    """Microseconds to move ``nbytes`` once at ``bandwidth`` bytes per second (decode floors: ``floor_bandwidths``'
    floor rate; the k-grouped weight gradient's roofline: the copy's, as it writes its output too)."""
    return nbytes / bandwidth * 1e6


def floor_summary(rows: list[dict], path: str, target_of) -> dict:
    """``path``'s time over each row's ``weight_floor_us`` (rows that have both): geomean, worst and per case, with
    each case's target (``target_of(row)``, the largest ratio allowed) and whether every case meets it."""
    cases = [(r["us"][path] / r["weight_floor_us"], r["label"], target_of(r)) for r in rows
             if r.get("weight_floor_us") and path in r["us"]]  # fmt: skip
    worst = max(cases) if cases else (math.nan, None, None)
    return {
        "geomean": geomean([c[0] for c in cases]),
        "worst": worst[0],
        "worst_case": worst[1],
        "cases": len(cases),
        "met": all(ratio <= target for ratio, _, target in cases) if cases else None,
        "per_case": {label: {"ratio": ratio, "target_max": target} for ratio, label, target in cases},
    }
