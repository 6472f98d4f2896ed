"""``fp8gemm bench`` on a GPU: our backend against its peers, same inputs, same GPU, one process."""

from __future__ import annotations

import datetime
import functools
import gc
import hashlib
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from fp8gemm import (
    __version__,
    gemm,
    preferred_fp8_dtype,
    prepare_weight_scale,
    quantize_activation,
    quantize_weight,
    registry,
)
from fp8gemm.reference import oracle
from fp8gemm.testing.conformance import relative_error

from .peers import available_peers

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
SHAPE_SETS: dict[str, list[tuple[int, int, int]]] = {
    # DeepSeek-V3 dense projections at decode (64, 128) and prefill (4096) batch sizes.
    "deepseek-v3": [(m, n, k) for m in (64, 128, 4096) for n, k in DEEPSEEK_NK]
    + [(1024, 1536, 7168), (6144, 7168, 2304), (8192, 8192, 8192)],
}
N_MULTIPLE, K_MULTIPLE = 16, 128  # what fp8gemm.gemm accepts (validation.py)
OURS = "fp8gemm"
# The float64 oracle for every shape costs more than the timing on big shapes; above this it is skipped.
ORACLE_MAX_FLOPS = 3e12

# The GPU's state when a timing window opens moves large shapes by 10-20%: after an idle moment (a
# peer's JIT compile, say) a ~100 ms window runs at boost clocks (1.98 GHz on an H200), after a
# sustained load at the power cap's (~1.4 GHz at 700 W). Timed as-is, each implementation inherits
# whatever ran before it, which skewed single shapes by up to 17% (docs/benchmarks.md). So every
# implementation is timed in the same state, by default its own sustained load.
GPU_STATES = {
    "sustained": "each implementation runs back-to-back for 0.5 s before its timing (a loaded GPU's clocks)",
    "rested": "the GPU idles 2 s before each timing (boost clocks: a burst after idle)",
    "as-is": "no settling: the state the previous timing left",
}
SUSTAIN_SECONDS, REST_SECONDS = 0.5, 2.0
# The seed of every random draw when none is given (--seed): runs of one build on one GPU time the same data.
DEFAULT_SEED = 0


def seeded_generator(seed: int, device, *key) -> torch.Generator:
    """A generator on ``device`` for the data named by ``key`` (a shape, say) in a run of ``seed``: the same data
    whichever shapes ran before it, so a resumed or narrowed run draws what the full run drew."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


def parse_shape(text: str) -> tuple[int, int, int]:
    """ "M,N,K" -> (M, N, K), or a ValueError that says what is wrong and how to write it."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"{text!r} has {len(parts)} value(s); write a shape as M,N,K, e.g. 128,7168,2048")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r}: M, N and K must be integers, e.g. 128,7168,2048") from None
    if m < 1:
        raise ValueError(f"{text!r}: M = {m} must be at least 1")
    for name, value, multiple in (("N", n, N_MULTIPLE), ("K", k, K_MULTIPLE)):
        if value < multiple or value % multiple:
            fixed = max(multiple, -(-value // multiple) * multiple)
            raise ValueError(
                f"{text!r}: {name} = {value} must be a positive multiple of {multiple} (pad it to {fixed})"
            )
    return m, n, k


def time_gpu(fn: Callable[[], object], gpu_state: str = "as-is") -> float:
    """Seconds per call of `fn` (do_bench median, L2 flushed), timed from `gpu_state` (GPU_STATES)."""
    _check_gpu_state(gpu_state)
    import triton.testing

    _settle(fn, gpu_state)
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def _check_gpu_state(state: str) -> None:
    if state not in GPU_STATES:
        raise ValueError(f"gpu_state must be one of {', '.join(GPU_STATES)}, got {state!r}")


def _settle(fn: Callable[[], object], state: str) -> None:
    """Bring the GPU into `state` (GPU_STATES) before `fn` is timed."""
    torch.cuda.synchronize()
    if state == "rested":
        time.sleep(REST_SECONDS)
    elif state == "sustained":
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        # Calls of one synchronised call's length: queueing by wall time alone would enqueue seconds
        # of a large shape's kernels.
        for _ in range(int(SUSTAIN_SECONDS / max(time.perf_counter() - start, 1e-6))):
            fn()
        torch.cuda.synchronize()


def _ours(backend: str | None) -> Callable:
    def prepare(a, b, a_scale, b_scale, out_dtype):
        b_scale = prepare_weight_scale(b_scale, backend=backend)
        out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
        return lambda: gemm(a, b, a_scale, b_scale, out=out, backend=backend)

    return prepare


def environment(device: torch.device, backend: str | None, seed: int = DEFAULT_SEED) -> dict:
    """What a report was measured with: software, device, backend and the data's ``seed``."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fp8gemm": __version__,
        "device": registry.describe_device(device).describe(),
        "seed": seed,
    }
    selection = registry.select(device, backend)
    env["backend"] = selection.backend.name
    env["backend_build"] = dict(selection.backend.build_info)
    if device.type == "cuda":
        env["cuda_runtime"] = torch.version.cuda or torch.version.hip
        env["driver"] = _driver_version()
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def _driver_version() -> str:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def run(
    shapes,
    device: torch.device,
    backend: str | None = None,
    progress=None,
    out_dtype=torch.bfloat16,
    gpu_state: str = "sustained",
    rounds: int = 1,
    seed: int = DEFAULT_SEED,
) -> dict:
    """Time ours and every available peer on each shape of a GPU; returns the JSON-able results.

    Each timing starts in `gpu_state` (GPU_STATES). With `rounds` > 1 every implementation is timed
    that many times per shape, the order reversed each round, and its row keeps the median (``us``)
    and every round (``us_rounds``): one timing per implementation moves single shapes by up to 9%
    between processes (docs/benchmarks.md). The data of each shape is drawn from ``seed`` (``seeded_generator``).
    """
    _check_gpu_state(gpu_state)
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if device.type != "cuda":
        raise ValueError(f"timing needs a GPU, got device {device}; on CPU, fp8gemm.accuracy.run shows the accuracy")
    impls = {OURS: _ours(backend), **available_peers(device)}
    timer = functools.partial(time_gpu, gpu_state=gpu_state)
    fp8 = preferred_fp8_dtype(device, backend)
    rows = []
    for m, n, k in shapes:
        gen = seeded_generator(seed, device, m, n, k)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen)
        a, a_scale = quantize_activation(x, fp8_dtype=fp8)
        b, b_scale = quantize_weight(w, fp8_dtype=fp8)
        ref = oracle(a, b, a_scale, b_scale) if 2.0 * m * n * k <= ORACLE_MAX_FLOPS else None
        shape_rows, runners = {}, {}
        for name, prepare in impls.items():
            shape_rows[name] = {"impl": name, "m": m, "n": n, "k": k}
            try:
                runners[name] = prepare(a, b, a_scale, b_scale, out_dtype)
                result = runners[name]()
                shape_rows[name]["rel_err"] = relative_error(result, ref) if ref is not None else None
            except Exception as exc:  # a peer that cannot run this shape is recorded, not fatal
                shape_rows[name]["error"] = error_text(exc)
                runners.pop(name, None)
        time_rounds(runners, shape_rows, timer, rounds, progress)
        rows.extend(shape_rows.values())
    report = {"environment": environment(device, backend, seed), "results": rows}
    report["environment"].update(rounds=rounds, gpu_state=gpu_state, gpu_state_meaning=GPU_STATES[gpu_state])
    report["host_overhead"] = host_overhead(device, backend, seed=seed)
    return report


def error_text(exc: Exception) -> str:
    """Why a path was not timed, in one line: the exception's type and the start of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def _tflops(m: int, n: int, k: int, seconds: float) -> float:
    return 2.0 * m * n * k / seconds / 1e12


def time_rounds(runners: dict, rows: dict, timer, rounds: int, progress) -> None:
    """Time each runner `rounds` times, alternating the order, into its row (median us, TFLOP/s)."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    names = list(rows)  # every implementation, for the progress count; only runners are timed
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if name in runners:
                try:
                    samples[name].append(timer(runners[name]))
                except Exception as exc:
                    rows[name]["error"] = error_text(exc)
                    del runners[name], samples[name]
            if progress:
                progress()
    for name, seconds in samples.items():
        row, median = rows[name], statistics.median(seconds)
        row.update(us=median * 1e6, tflops=_tflops(row["m"], row["n"], row["k"], median))
        if rounds > 1:
            row["us_rounds"] = [t * 1e6 for t in seconds]


def host_seconds_per_call(call, device: torch.device, calls: int, collect: bool, warmup: int = 100) -> float:
    """Wall seconds per call of ``calls`` back-to-back calls, the GPU drained before and after; with ``collect``
    false, garbage collection is off in the loop (as ``timeit`` times)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize(device)
    gc.collect()
    enabled = gc.isenabled()
    if not collect:
        gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / calls
    finally:
        if enabled:
            gc.enable()


def host_overhead(
    device: torch.device, backend: str | None, calls: int = 3000, repeats: int = 7, seed: int = DEFAULT_SEED
) -> dict:
    """Wall time of one ``fp8gemm.gemm`` call from Python on a tiny shape, minus the GPU's time for it.

    When the host is the bottleneck, back-to-back calls run at host speed, so the difference is the
    host's cost per call (validation, dispatch, launch) that a small decode GEMM cannot hide. Timed
    as ``timeit`` times: garbage collection off in the loop, because a collection's pause (tens of
    milliseconds in a process holding torch, triton and the peers) lands on whichever call happens to
    trigger it; the figure with collection on is reported beside it. The median of ``repeats`` loops of
    ``calls`` calls, alternating collection off and on: on cloud H200 hosts one loop's figure moves from 5 to
    13 us between back-to-back processes with the same build (docs/benchmarks.md).
    """
    gen, fp8 = seeded_generator(seed, device, "host overhead"), preferred_fp8_dtype(device, backend)
    a, a_scale = quantize_activation(torch.randn(16, 256, device=device, generator=gen), fp8_dtype=fp8)
    b, b_scale = quantize_weight(torch.randn(128, 256, device=device, generator=gen), fp8_dtype=fp8)
    b_scale = prepare_weight_scale(b_scale, backend=backend)
    out = torch.empty(16, 128, dtype=torch.bfloat16, device=device)

    def call():
        return gemm(a, b, a_scale, b_scale, out=out, backend=backend)

    kernel = time_gpu(call)
    walls, walls_gc = [], []
    for _ in range(repeats):
        walls.append(host_seconds_per_call(call, device, calls, collect=False))
        walls_gc.append(host_seconds_per_call(call, device, calls, collect=True))
    wall, wall_gc = statistics.median(walls), statistics.median(walls_gc)

    def overhead_us(wall_per_call_s: float) -> float:
        return max(0.0, wall_per_call_s - kernel) * 1e6

    return {"shape": [16, 128, 256], "wall_us_per_call": wall * 1e6, "gpu_us_per_call": kernel * 1e6,
            "host_overhead_us": overhead_us(wall), "host_overhead_us_range": [overhead_us(min(walls)), overhead_us(max(walls))],
            "loops": repeats, "calls_per_loop": calls,
            "wall_us_per_call_gc_on": wall_gc * 1e6, "host_overhead_us_gc_on": overhead_us(wall_gc)}  # fmt: skip


def state_suffix(environment: dict) -> str:
    """Title suffix naming the GPU state a report was timed in (", GPU sustained"); "" if it has none."""
    return f", GPU {environment['gpu_state']}" if "gpu_state" in environment else ""


def rounds_suffix(environment: dict) -> str:
    """ " of N interleaved rounds" for a report timed in rounds (``run(rounds=N)``, N > 1); "" otherwise."""
    rounds = environment.get("rounds", 1)
    return f" of {rounds} interleaved rounds" if rounds > 1 else ""


def geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def speedups(report: dict) -> dict[str, float]:
    """Geometric-mean speedup of ours over each peer, over the shapes both ran."""
    by_shape: dict[tuple, dict[str, float]] = {}
    for r in report["results"]:
        if "tflops" in r:
            by_shape.setdefault((r["m"], r["n"], r["k"]), {})[r["impl"]] = r["tflops"]
    peers = {r["impl"] for r in report["results"]} - {OURS}
    return {p: geomean([t[OURS] / t[p] for t in by_shape.values() if OURS in t and p in t]) for p in sorted(peers)}


def save_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    report = dict(report, geomean_speedup_of_ours=speedups(report))
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


def _round_spread(rows: dict, shapes: list, heights: list) -> list[list[float]] | None:
    """Whiskers from each bar (the median) down to its slowest round and up to its fastest; None without rounds."""
    if not any("us_rounds" in r for r in rows.values()):
        return None
    low, high = [], []
    for shape, height in zip(shapes, heights, strict=True):
        us = rows.get(shape, {}).get("us_rounds")
        low.append(max(0.0, height - _tflops(*shape, max(us) * 1e-6)) if us else 0.0)  # max(): rounding at the median
        high.append(max(0.0, _tflops(*shape, min(us) * 1e-6) - height) if us else 0.0)
    return [low, high]


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((r["m"], r["n"], r["k"]) for r in report["results"]))
    impls = list(dict.fromkeys(r["impl"] for r in report["results"]))
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(8, len(shapes) * 0.8), 5))
    for i, impl in enumerate(impls):
        rows = {(r["m"], r["n"], r["k"]): r for r in report["results"] if r["impl"] == impl}
        heights = [rows[s].get("tflops", 0.0) if s in rows else 0.0 for s in shapes]
        ax.bar([s + i * width for s in range(len(shapes))], heights, width, label=impl,
               yerr=_round_spread(rows, shapes, heights), error_kw={"elinewidth": 0.6, "capsize": 1.5})  # fmt: skip
    ax.set_xticks([s + 0.4 - width / 2 for s in range(len(shapes))])
    ax.set_xticklabels([f"{m}x{n}x{k}" for m, n, k in shapes], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    env = report["environment"]
    rounds = f", median{rounds_suffix(env)} (whiskers: fastest to slowest)" if rounds_suffix(env) else ""
    ax.set_title(f"FP8 block-scaled GEMM, {env['device']}, {env['date'][:10]}{state_suffix(env)}{rounds}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def row_text(row: dict) -> str:
    """One case's progress line: each path's time per call, and why a path was not timed (missing peers aside)."""
    cells = [f"{name}={us:.1f}us" for name, us in row["us"].items()]
    wrong = [f"{name}: {why}" for name, why in row["errors"].items() if not why.startswith("missing")]
    return f"{row['label']}: " + " ".join(cells) + ("  errors: " + "; ".join(wrong) if wrong else "")


def plot_cases(report: dict, names: list[str], path: Path, ylabel: str, subject: str) -> None:
    """Bars of every path in ``names`` on every case of ``report``, TFLOP/s on a log scale (decode and prefill cases
    differ 1000x); the title names the GPU, driver, torch and date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.5), 6))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [r["tflops"].get(name, 0.0) for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], ys, width, label=name)
    ax.set_yscale("log")
    ax.set_xticks([j + 0.4 for j in range(len(rows))], [r["label"] for r in rows], rotation=80, fontsize=6)
    ax.set_ylabel(ylabel)
    env = report["environment"]
    ax.set_title(f"{subject}: {env['device']}, driver {env.get('driver')}, torch {env['torch']}, {env['date'][:10]}",
                 fontsize=8)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# What an earlier report (--resume) must share with this run for its rows to be kept.
SAME_SETUP = ("host", "device", "driver", "torch", "fp8gemm", "backend_build", "peers", "seed")


def earlier_rows(earlier: dict | None, env: dict, keep: Callable[[dict], bool]) -> list[dict]:
    """The rows of ``earlier`` that ``keep`` selects, after checking it was timed on the same GPU with the same
    software (``SAME_SETUP``)."""
    if not earlier:
        return []
    before = earlier.get("environment", {})
    for key in SAME_SETUP:
        if before.get(key) != env.get(key):
            raise ValueError(
                f"--resume: the earlier report's {key} is {before.get(key)!r}, this run's is {env.get(key)!r}; "
                "resume only on the same GPU and software, or start a new report"
            )
    return [r for r in earlier.get("rows", []) if keep(r)]


def _module_version(name: str) -> str:
    import importlib

    try:
        return str(getattr(importlib.import_module(name), "__version__", "unknown"))
    except Exception as exc:  # a broken build: say so rather than fail the report
        return f"unknown (import failed: {type(exc).__name__})"


def installed_versions(dists: tuple[str, ...]) -> dict[str, str]:
    """The version of each distribution in ``dists`` that is installed, or else importable (a source build on the
    path, as DeepGEMM's develop.sh leaves it): its module's ``__version__``."""
    import importlib.metadata
    import importlib.util

    versions = {}
    for dist in dists:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if importlib.util.find_spec(dist) is not None:
                versions[dist] = _module_version(dist)
    return versions
