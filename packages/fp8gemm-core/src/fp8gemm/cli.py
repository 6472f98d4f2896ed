"""The ``fp8gemm`` command: ``info``, ``check``, ``bench``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from . import __version__, accuracy, bench, conformance, conformance_layer, layer_bench, registry
from .ops import preferred_fp8_dtype

console = Console(width=None if sys.stdout.isatty() else 160)


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _info_dict(device: torch.device, backend: str | None) -> dict:
    info = {"fp8gemm": __version__, "torch": torch.__version__, "device": registry.describe_device(device).describe()}
    info["installed"] = [
        {"name": ib.name, "distribution": ib.distribution, "entry_point": ib.entry_point, "error": ib.error}
        | (
            {
                "platform": ib.backend.platform,
                "targets": list(ib.backend.targets),
                "fp8_dtype": ib.backend.fp8_dtype,
                "version": ib.backend.version,
                "build_info": dict(ib.backend.build_info),
            }  # fmt: skip
            if ib.backend
            else {}
        )
        for ib in registry.installed_backends()
    ]
    try:
        sel = registry.select(device, backend)
        info["selected"] = {"name": sel.backend.name, "reason": sel.reason}
    except RuntimeError as exc:
        info["selected"] = {"name": None, "reason": str(exc)}
    return info


def cmd_info(args) -> int:
    device = torch.device(args.device) if args.device else _default_device()
    info = _info_dict(device, args.backend)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    console.print(f"fp8gemm {info['fp8gemm']}, torch {info['torch']}")
    console.print(f"device: {info['device']}")
    table = Table(title="installed backends (entry points in 'fp8gemm.backends')")
    for col in ("name", "distribution", "targets", "fp8 dtype", "version", "build / load error"):
        table.add_column(col)
    table.add_row("reference", "fp8gemm-core", "any", "e4m3fn / e4m3fnuz", __version__, "pure torch")
    for ib in info["installed"]:
        if ib["error"]:
            table.add_row(ib["name"], ib["distribution"], "?", "?", "?", f"[red]FAILED TO LOAD: {ib['error']}[/red]")
        else:
            build = ", ".join(f"{k}={v}" for k, v in ib["build_info"].items())
            table.add_row(
                ib["name"], ib["distribution"], "/".join(ib["targets"]), ib["fp8_dtype"], ib["version"], build
            )
    console.print(table)
    sel = info["selected"]
    console.print(
        f"selected: [bold]{sel['name']}[/bold] ({sel['reason']})" if sel["name"] else f"[red]{sel['reason']}[/red]"
    )
    return 0


def cmd_check(args) -> int:
    device = torch.device(args.device) if args.device else _default_device()
    chosen = registry.select(device, args.backend).backend
    fp8 = preferred_fp8_dtype(device, args.backend)
    console.print(f"conformance of backend [bold]{chosen.name}[/bold] on {registry.describe_device(device).describe()}")
    table = Table()
    for col in ("case", "rel. error", "tolerance", "result"):
        table.add_column(col)
    failures = 0
    for case in conformance.cases(device, n_random=args.random, seed=args.seed):
        r = conformance.run_case(case, device, fp8, args.backend)
        failures += not r.passed
        verdict = "[green]pass[/green]" if r.passed else f"[red]FAIL[/red] {r.detail}"
        table.add_row(case.id, f"{r.rel_err:.2e}", f"{conformance.TOLERANCE[case.out_dtype]:.0e}", verdict)
    for bad in conformance.BAD_INPUTS:
        ok, detail = conformance.run_bad_input(bad, device, fp8, args.backend)
        failures += not ok
        table.add_row(
            f"bad input: {bad.id}", "", bad.error.__name__, "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        )
    failures += _check_layer(table, device, args.backend)
    console.print(table)
    console.print(f"{'[red]' if failures else '[green]'}{failures} failure(s)")
    return 1 if failures else 0


def _check_layer(table: Table, device: torch.device, backend: str | None) -> int:
    """Activation quantization (bit-exact against the reference) and ``linear`` (against float64) rows."""
    failures = 0
    for case in conformance_layer.quant_cases():
        ok, detail = conformance_layer.run_quant_case(case, device, backend)
        failures += not ok
        table.add_row(
            f"quantize {case.id}", "", "bit-exact", "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        )
    for case in conformance_layer.LINEAR_CASES:
        ok, detail = conformance_layer.run_linear_case(case, device, backend)
        failures += not ok
        verdict = "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        table.add_row(
            f"linear {case.id}", detail if ok else "", f"{conformance_layer.linear_tolerance(case):.0e}", verdict
        )
    return failures


def _shape_argument(text: str) -> tuple[int, int, int]:
    try:
        return bench.parse_shape(text)
    except ValueError as exc:  # argparse names the option, prints usage and exits 2
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_bench(args) -> int:
    device = torch.device(args.device) if args.device else _default_device()
    if device.type != "cuda":
        if args.layer:
            console.print("--layer times Linear layers on a GPU; none here, so:")
        return _bench_without_gpu(args, device)
    if args.layer:
        return _bench_layer(args, device)
    shapes = args.shapes or bench.SHAPE_SETS[args.set]
    out_dtype = torch.float32 if args.out_dtype == "float32" else torch.bfloat16
    n_impls = 1 + len(bench.available_peers(device))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(shapes) * n_impls * args.rounds)
        report = bench.run(
            shapes, device, args.backend, lambda: progress.advance(task), out_dtype, args.gpu_state, args.rounds
        )
    _print_bench_table(report)
    return _write_outputs(args, report, bench.save_json, bench.plot)


def _write_outputs(args, report: dict, save_json, plot) -> int:
    """``--json`` and ``--plot`` of a bench report."""
    for path, write in ((args.json, save_json), (args.plot, plot)):
        if path:
            write(report, Path(path))
            console.print(f"wrote {path}")
    return 0


def _bench_layer(args, device: torch.device) -> int:
    shapes = args.shapes or None
    earlier = None
    if args.resume:
        if not args.json or not Path(args.json).exists():
            raise SystemExit("--resume needs --json naming the earlier run's report")
        earlier = json.loads(Path(args.json).read_text())
    checkpoint = (lambda r: _save_atomically(r, Path(args.json))) if args.json else None
    report = layer_bench.run(
        device,
        shapes,
        progress=lambda text: console.print(text, highlight=False),
        earlier=earlier,
        checkpoint=checkpoint,
    )
    table = Table(title="Linear layer, weights from HBM: speed vs bf16 F.linear (geomean, slowest shape)")
    for col in ("path", "geomean", "slowest"):
        table.add_column(col)
    for name, row in report["summary"].items():
        if isinstance(row, dict):
            table.add_row(name, f"{row['geomean_vs_bf16']:.2f}x", f"{row['slowest_vs_bf16']:.2f}x")
    console.print(table)
    eager = report["eager"]["us_per_call"]
    console.print("eager wall time per call: " + ", ".join(f"{name} {us:.1f} us" for name, us in eager.items()))
    return _write_outputs(args, report, _save_atomically, layer_bench.plot)


def _save_atomically(report: dict, path: Path) -> None:
    """A run killed while writing leaves the previous file whole."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(report, indent=1) + "\n")
    part.replace(path)


def _bench_without_gpu(args, device: torch.device) -> int:
    """No GPU, so nothing to time (ours would only race the reference against itself): show the recipe's accuracy."""
    installed = ", ".join(ib.name for ib in registry.installed_backends()) or "none"
    console.print(
        f"No GPU backend runs here (device: {registry.describe_device(device).describe()}; arch packages installed: "
        f"{installed}): timing compares an arch package's kernels with cuBLASLt, Triton and DeepGEMM on a GPU "
        "(docs/benchmarks.md). Shown instead: the accuracy of the block-scaled FP8 recipe."
    )
    rows = accuracy.run(args.shapes or accuracy.DEFAULT_SHAPES, device, args.backend, seed=args.seed)
    _print_accuracy_table(rows)
    if args.json:
        report = {"environment": bench.environment(device, args.backend), "data": accuracy.DATA, "accuracy": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        accuracy.plot(rows, Path(args.plot))
        console.print(f"wrote {args.plot}")
    return 0


def _print_accuracy_table(rows: list[dict]) -> None:
    table = Table(title="relative error per token against the float64 product of the unquantised inputs")
    table.add_column("M x N x K")
    table.add_column("recipe")
    for kind in accuracy.DATA:
        table.add_column(f"{kind}: median", justify="right")
        table.add_column(f"{kind}: worst token", justify="right")
    cells: dict[tuple, list[str]] = {}
    for r in rows:
        key = (f"{r['m']}x{r['n']}x{r['k']}", r["recipe"])
        cells.setdefault(key, []).extend((f"{r['median_rel_err']:.1e}", f"{r['worst_rel_err']:.1e}"))
    for key, errors in cells.items():
        table.add_row(*key, *errors)
    console.print(table)
    console.print("; ".join(f"{kind}: {meaning}" for kind, meaning in accuracy.DATA.items()))


def _tflops_cell(tflops: float) -> str:
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def _print_bench_table(report: dict) -> None:
    env = report["environment"]
    table = Table(
        title=f"TFLOP/s (median{bench.rounds_suffix(env)}), {env['device']}, torch {env['torch']}, {env['date']}{bench.state_suffix(env)}"
    )
    impls = list(dict.fromkeys(r["impl"] for r in report["results"]))
    table.add_column("M x N x K")
    for impl in impls:
        table.add_column(impl, justify="right")
    by_shape: dict[tuple, dict[str, str]] = {}
    for r in report["results"]:
        cell = _tflops_cell(r["tflops"]) if "tflops" in r else "error"
        if r.get("rel_err") is not None and r["rel_err"] > conformance.TOLERANCE[torch.bfloat16]:
            cell += f" (WRONG, err {r['rel_err']:.2g})"
        by_shape.setdefault((r["m"], r["n"], r["k"]), {})[r["impl"]] = cell
    for (m, n, k), cells in by_shape.items():
        table.add_row(f"{m}x{n}x{k}", *(cells.get(i, "-") for i in impls))
    console.print(table)
    for peer, s in bench.speedups(report).items():
        console.print(f"geomean speedup of fp8gemm over {peer}: {s:.2f}x")
    if "host_overhead" in report:
        h = report["host_overhead"]
        spread = h.get("host_overhead_us_range")
        loops = f", median of {h['loops']} loops: {spread[0]:.1f}-{spread[1]:.1f}" if spread else ""
        console.print(f"host overhead per fp8gemm.gemm call: {h['host_overhead_us']:.1f} us "
                      f"(wall {h['wall_us_per_call']:.1f} us/call, GPU {h['gpu_us_per_call']:.1f} us/call{loops}; "
                      f"with garbage collection on {h.get('host_overhead_us_gc_on', float('nan')):.1f} us)")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fp8gemm", description="FP8 block-scaled GEMM (DeepSeek-V3 recipe)")
    parser.add_argument("--version", action="version", version=f"fp8gemm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    common.add_argument("--backend", help="backend name or 'reference' (default: $FP8GEMM_BACKEND, else best fit)")

    p = sub.add_parser("info", parents=[common], help="device, installed backends, which one is chosen and why")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("check", parents=[common], help="run the conformance suite; non-zero exit on failure")
    p.add_argument("--random", type=int, default=6, help="number of random shapes besides the fixed ones")
    p.add_argument("--seed", type=int, help="seed for the random shapes (default: fresh)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "bench", parents=[common], help="time ours against the available peers (without a GPU: the recipe's accuracy)"
    )
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (RuntimeError, ValueError, TypeError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fp8gemm bench``."""
    p.add_argument("--set", choices=sorted(bench.SHAPE_SETS), default="deepseek-v3", help="named shape set")
    p.add_argument(
        "--shapes",
        nargs="+",
        type=_shape_argument,
        metavar="M,N,K",
        help=f"shapes instead of a set; N a multiple of {bench.N_MULTIPLE}, K of {bench.K_MULTIPLE}",
    )
    p.add_argument("--out-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--json", help="write results to this JSON file")
    p.add_argument("--plot", help="write a bar chart to this PNG file")
    p.add_argument(
        "--gpu-state",
        choices=tuple(bench.GPU_STATES),
        default="sustained",
        help="the GPU's state as each timing starts: " + "; ".join(f"{k}: {v}" for k, v in bench.GPU_STATES.items()),
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every implementation this many times per shape, alternating the order; report the median",
    )
    p.add_argument("--seed", type=int, help="seed for the accuracy data without a GPU (default: fresh)")
    p.add_argument(
        "--layer",
        action="store_true",
        help="time the Linear layer (bf16 in and out: ours, bf16 F.linear and the peers' layer paths) in CUDA graphs",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --layer: keep the shapes already in --json (written after every shape) and time the rest",
    )


if __name__ == "__main__":
    sys.exit(main())
