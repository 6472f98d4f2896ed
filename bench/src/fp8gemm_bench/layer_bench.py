"""``fp8gemm bench --layer``: the Linear layer (bf16 in, bf16 out), ours against bf16 and the peers.

GPU time: every path's calls for one shape are captured in one CUDA graph that cycles through copies
of the weight totalling at least twice the L2, so weights stream from HBM as in a model with many
layers; the graph's replay time over its calls is the time per layer. Eager: host wall time per call.
Method and caveats: docs/benchmarks.md.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch
from fp8gemm import gemm, linear, prepare_weight_scale, quantize_activation, quantize_weight, runtime
from fp8gemm.protocol import IN_BF16, LAUNCH_ARGS, LINEAR_ARGS, OUT_BF16
from fp8gemm.testing.conformance import relative_error

from .bench import (
    DEFAULT_SEED,
    earlier_rows,
    environment,
    geomean,
    host_seconds_per_call,
    installed_versions,
    seeded_generator,
)
from .layer_peers import BF16, GEMM_ALONE, OURS, gemm_alone, layer_paths
from .weight_floor import copy_bandwidth

LAYER_NK = [(2112, 7168), (7168, 2048), (4096, 7168), (24576, 1536)]
LAYER_M = [1, 16, 64, 128, 512, 4096]
FLOOR_X = "x cast to FP8 (one kernel, the quantizer's bytes)"
TWO_LAUNCH_BOUND = "bound: GEMM alone + x cast to FP8"
RAW_LINEAR = "backend linear entry, arguments ready"
RAW_LAUNCH = "backend launch entry, arguments ready"
REPLAYS = 15


def _copies(bytes_per_copy: int, device) -> int:
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, math.ceil(2 * l2 / max(bytes_per_copy, 1)))


def time_graph(calls: list) -> float:
    """Seconds per call: ``calls`` captured in one CUDA graph, median over replays."""
    for call in calls:  # JIT compilation and autotuning stay out of the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del graph
    return statistics.median(times) / len(calls)


def _weight_bytes(name: str, n: int, k: int) -> int:
    return n * k * (2 if name == BF16 else 1)


def time_shape(m: int, n: int, k: int, paths: dict, device, seed: int = DEFAULT_SEED) -> dict:
    """One row: every path's time per call on ``m x n x k``, its error against float64, the bound's parts."""
    gen = seeded_generator(seed, device, m, n, k)
    x = torch.randn(m, k, generator=gen, device=device).bfloat16()
    row = {"m": m, "n": n, "k": k, "us": {}, "rel_err": {}, "errors": {}}
    for name, prepare in [*paths.items(), (GEMM_ALONE, None)]:
        try:
            copies = _copies(_weight_bytes(name, n, k), device)
            weights = [
                torch.randn(n, k, generator=gen, device=device).div_(math.sqrt(k)).bfloat16() for _ in range(copies)
            ]
            if prepare is None:
                calls = [gemm_alone(w, x) for w in weights]
            else:
                forwards = [prepare(w) for w in weights]
                calls = [lambda f=f: f(x) for f in forwards]
            row["us"][name] = time_graph(calls) * 1e6
            if prepare is not None:
                exact = x.double() @ weights[0].double().t()
                row["rel_err"][name] = relative_error(forwards[0](x), exact)
        except Exception as exc:  # a peer that cannot run this shape is reported, not fatal
            row["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        finally:
            weights = calls = forwards = None
            torch.cuda.empty_cache()
    codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=device)
    # Reads x and writes its codes, as any separate quantizer must; 16 calls, as 4 leave the graph's launch in.
    row["us"][FLOOR_X] = time_graph([lambda: codes.copy_(x)] * 16) * 1e6
    return row


def eager_wall(
    device, m: int = 1, n: int = 256, k: int = 512, calls: int = 2000, repeats: int = 7, seed: int = DEFAULT_SEED
) -> dict:
    """Host wall time per call of ``linear`` and of ``gemm`` on pre-quantized input, same process; beside them,
    the backend's own entries called with every argument ready (the launches' cost without Python)."""
    gen = seeded_generator(seed, device, "eager", m, n, k)
    x = torch.randn(m, k, device=device, generator=gen).bfloat16()
    qw, w_scale = quantize_weight(torch.randn(n, k, device=device, generator=gen))
    w_scale = prepare_weight_scale(w_scale)
    qx, x_scale = quantize_activation(x)
    funcs = {"linear": lambda: linear(x, qw, w_scale), "gemm": lambda: gemm(qx, qw, x_scale, w_scale)}
    funcs.update(_raw_entries(x, qw, w_scale, qx, x_scale))
    walls = {name: [] for name in funcs}
    for _ in range(repeats):  # interleaved, and without garbage collection in the loop, as timeit times
        for name, fn in funcs.items():
            walls[name].append(host_seconds_per_call(fn, device, calls, collect=False, warmup=1) * 1e6)
    return {
        "shape": [m, n, k],
        "us_per_call": {name: statistics.median(w) for name, w in walls.items()},
        "loops": walls,
    }


def _raw_entries(x, qw, w_scale, qx, x_scale) -> dict:
    """The backend's ``linear`` and ``launch`` entries on buffers allocated once, where it has both."""
    dev = x.get_device()
    backend, _, read_a_ld, read_b_ld = (runtime.fast_backend(dev, None) or (None,) * 4)[:4]
    if backend is None or backend.linear is None:
        return {}
    (m, k), n = x.shape, qw.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    ws_bytes = max(backend.linear_workspace_bytes(m, n, k, IN_BF16), backend.workspace_bytes(m, n, k))
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device)
    stream, b_ld = runtime.raw_stream(dev), read_b_ld(w_scale.stride(), w_scale.shape[0], w_scale.shape[1])
    a_ld = read_a_ld(x_scale.stride(), m, k // 128)
    ptrs = (qw.data_ptr(), w_scale.data_ptr(), out.data_ptr(), ws.data_ptr())
    return {
        RAW_LINEAR: lambda: backend.linear(
            LINEAR_ARGS.pack(x.data_ptr(), *ptrs, m, n, k, k, k, n, b_ld, OUT_BF16, IN_BF16, 0, stream)
        ),
        RAW_LAUNCH: lambda: backend.launch(
            LAUNCH_ARGS.pack(
                qx.data_ptr(),
                qw.data_ptr(),
                x_scale.data_ptr(),
                *ptrs[1:],
                m,
                n,
                k,
                k,
                k,
                n,
                a_ld,
                b_ld,
                OUT_BF16,
                stream,
            )
        ),  # fmt: skip
    }


def quantize_bandwidth(device, shapes, seed: int = DEFAULT_SEED) -> list[dict]:
    """The quantization kernel alone (inputs cycled past the L2), as a fraction of a large device copy's bandwidth
    and of a copy of x (the same inputs, bf16 out) in the same harness: below a few MB launch and drain dominate."""
    copy_gbs = copy_bandwidth(device, time_graph) * 1e-9
    rows = []
    for m, k in shapes:
        nbytes = m * k * 2 + m * k + m * (k // 128) * 4
        gen = seeded_generator(seed, device, "quantize", m, k)
        xs = [torch.randn(m, k, device=device, generator=gen).bfloat16() for _ in range(_copies(m * k * 2, device))]
        seconds = time_graph([lambda x=x: quantize_activation(x) for x in xs])
        dst = torch.empty_like(xs[0])
        copy_seconds = time_graph([lambda x=x, dst=dst: dst.copy_(x) for x in xs])
        gbs = nbytes / seconds * 1e-9
        rows.append(
            {
                "m": m,
                "k": k,
                "us": seconds * 1e6,
                "gbs": gbs,
                "of_copy": gbs / copy_gbs,
                "copy_of_x_us": copy_seconds * 1e6,
                "of_copy_of_x": gbs / (m * k * 4 / copy_seconds * 1e-9),
            }
        )
        del xs, dst
    return [{"copy_gbs": copy_gbs}, *rows]


def summarize(rows: list[dict]) -> dict:
    """Geomean speed of each path over bf16 F.linear, its slowest shape, and our layer over the GEMM alone; the
    bound of any two-launch layer is the GEMM alone plus the cast of x, timed apart."""
    names = sorted({name for r in rows for name in r["us"]} - {BF16, FLOOR_X})
    out = {}
    bound = [r["us"][BF16] / (r["us"][GEMM_ALONE] + r["us"][FLOOR_X]) for r in rows
             if {BF16, GEMM_ALONE, FLOOR_X} <= r["us"].keys()]  # fmt: skip
    if bound:
        out[TWO_LAUNCH_BOUND] = {"geomean_vs_bf16": geomean(bound), "slowest_vs_bf16": min(bound)}
    for name in names:
        ratios = [r["us"][BF16] / r["us"][name] for r in rows if name in r["us"] and BF16 in r["us"]]
        out[name] = {"geomean_vs_bf16": geomean(ratios), "slowest_vs_bf16": min(ratios) if ratios else math.nan}
    small = [
        r["us"][OURS] / r["us"][GEMM_ALONE] for r in rows if r["m"] <= 128 and OURS in r["us"] and GEMM_ALONE in r["us"]
    ]
    out["layer_over_gemm_alone_m_le_128_max"] = max(small) if small else math.nan
    return out


def run(
    device, shapes=None, progress=print, earlier: dict | None = None, checkpoint=None, seed: int = DEFAULT_SEED
) -> dict:
    """Time ``shapes`` (default: every LAYER_M x LAYER_NK), then the eager and quantization-bandwidth parts, on
    data drawn from ``seed``.

    ``earlier``: a partial report of a run cut short on the same GPU; its rows are kept and their shapes skipped.
    ``checkpoint(report)`` is called with the partial report after every shape.
    """
    paths = layer_paths(device)
    shapes = shapes or [(m, n, k) for n, k in LAYER_NK for m in LAYER_M]
    report = {"environment": environment(device, None, seed), "paths": list(paths) + [GEMM_ALONE], "partial": True}
    report["environment"]["method"] = "CUDA graph over weight copies >= 2x L2; median of replays"
    report["environment"]["peers"] = peer_versions()
    rows = earlier_rows(earlier, report["environment"], lambda r: (r["m"], r["n"], r["k"]) in shapes)
    report["environment"]["processes"] = (earlier or {}).get("environment", {}).get("processes", 0) + 1
    report["rows"] = rows
    for m, n, k in shapes:
        if any((r["m"], r["n"], r["k"]) == (m, n, k) for r in rows):
            continue
        rows.append(time_shape(m, n, k, paths, device, seed))
        progress(_row_text(rows[-1]))
        if checkpoint:
            checkpoint(report)
    rows.sort(key=lambda r: shapes.index((r["m"], r["n"], r["k"])))
    report["summary"] = summarize(rows)
    report["eager"] = eager_wall(device, seed=seed)
    big = sorted({(m, k) for m, _, k in shapes if m >= 512})
    report["quantize_bandwidth"] = quantize_bandwidth(device, big, seed)
    del report["partial"]
    return report


def peer_versions() -> dict[str, str]:
    """The installed versions of the layer peers, kept in each report's environment."""
    return installed_versions(("torchao", "transformers", "deep_gemm", "triton"))


def _row_text(row: dict) -> str:
    cells = [f"{name}={us:.1f}" for name, us in row["us"].items()]
    return (
        f"{row['m']}x{row['n']}x{row['k']}: "
        + " ".join(cells)
        + ("  errors: " + "; ".join(row["errors"]) if row["errors"] else "")
    )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [p for p in report["paths"] if p != BF16]
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.6), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ys = [r["us"][BF16] / r["us"][name] if name in r["us"] and BF16 in r["us"] else 0 for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 for j in range(len(rows))], labels, rotation=70, fontsize=7)
    ax.set_ylabel("speed vs bf16 F.linear (higher is faster)")
    env = report["environment"]
    ax.set_title(
        f"Linear layer, weights from HBM: {env['device']}, driver {env.get('driver')}, torch {env['torch']}, {env['date'][:10]}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
