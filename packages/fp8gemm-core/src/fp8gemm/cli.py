"""The ``fp8gemm`` command: ``info``, ``check``, ``bench``.

Exit status: 0 on success; 1 when ``check`` finds a failure; 2 for a mistake in the command line or one the
environment makes (a device or backend that cannot run, an optional package that is not installed): a one-line
message on stderr that says what to change, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import torch
from rich.table import Table

from . import __version__, conformance, conformance_grouped, conformance_layer, registry
from .cli_args import UsageError, count_argument, default_device, device_argument, error_message, requested_backend
from .cli_bench import add_bench_arguments, cmd_bench, console
from .ops import preferred_fp8_dtype


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
    """Everything installed and the backend chosen for the device; exit 2 where none can run there."""
    device = args.device or default_device()
    info = _info_dict(device, args.backend)
    try:
        requested_backend(args)
    except UsageError as exc:
        info["selected"] = {"name": None, "reason": str(exc)}
    sel = info["selected"]
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        _print_info(info)
    if sel["name"] is None:
        print(f"fp8gemm info: error: {sel['reason']}", file=sys.stderr)
        return 2
    return 0


def _print_info(info: dict) -> None:
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
    console.print(f"selected: [bold]{sel['name']}[/bold] ({sel['reason']})" if sel["name"] else "selected: none")


def cmd_check(args) -> int:
    device = args.device or default_device()
    backend = requested_backend(args)
    chosen = registry.select(device, backend).backend
    fp8 = preferred_fp8_dtype(device, backend)
    seed = args.seed
    console.print(f"conformance of backend [bold]{chosen.name}[/bold] on {registry.describe_device(device).describe()}")
    console.print(f"seed {seed} (shapes and data; --seed {seed} repeats this run)", highlight=False)
    table = Table()
    for col in ("case", "rel. error", "tolerance", "result"):
        table.add_column(col)
    failures = 0
    for case in conformance.cases(device, n_random=args.random, seed=seed):
        r = conformance.run_case(case, device, fp8, backend, seed=seed)
        failures += not r.passed
        verdict = "[green]pass[/green]" if r.passed else f"[red]FAIL[/red] {r.detail}"
        table.add_row(case.id, f"{r.rel_err:.2e}", f"{conformance.TOLERANCE[case.out_dtype]:.0e}", verdict)
    for bad in conformance.BAD_INPUTS:
        ok, detail = conformance.run_bad_input(bad, device, fp8, backend)
        failures += not ok
        table.add_row(
            f"bad input: {bad.id}", "", bad.error.__name__, "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        )
    failures += _check_layer(table, device, backend, random.Random(seed))
    failures += _check_grouped(table, device, fp8, backend, seed)
    console.print(table)
    console.print(f"{'[red]' if failures else '[green]'}{failures} failure(s)")
    return 1 if failures else 0


def _check_grouped(table: Table, device: torch.device, fp8: torch.dtype, backend: str | None, seed: int) -> int:
    """The grouped GEMMs' rows: every layout against float64 per group, then their bad inputs."""
    failures = 0
    for case in conformance_grouped.cases(device, n_random=2, seed=seed):
        r = conformance_grouped.run_case(case, device, fp8, backend, seed=seed)
        failures += not r.passed
        verdict = "[green]pass[/green]" if r.passed else f"[red]FAIL[/red] {r.detail}"
        table.add_row(f"grouped {case.id}", f"{r.rel_err:.2e}", f"{conformance.TOLERANCE[case.out_dtype]:.0e}", verdict)
    for bad in conformance_grouped.BAD_INPUTS:
        ok, detail = conformance_grouped.run_bad_input(bad, device, fp8, backend)
        failures += not ok
        verdict = "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        table.add_row(f"grouped bad input: {bad.id}", "", bad.error.__name__, verdict)
    return failures


def _check_layer(table: Table, device: torch.device, backend: str | None, seeds: random.Random) -> int:
    """Activation quantization (bit-exact against the reference) and ``linear`` (against float64) rows, each case's
    data drawn from the next of ``seeds``."""
    failures = 0
    for case in conformance_layer.quant_cases():
        ok, detail = conformance_layer.run_quant_case(case, device, backend, seed=seeds.getrandbits(63))
        failures += not ok
        table.add_row(
            f"quantize {case.id}", "", "bit-exact", "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        )
    for case in conformance_layer.LINEAR_CASES:
        ok, detail = conformance_layer.run_linear_case(case, device, backend, seed=seeds.getrandbits(63))
        failures += not ok
        verdict = "[green]pass[/green]" if ok else f"[red]FAIL[/red] {detail}"
        table.add_row(
            f"linear {case.id}", detail if ok else "", f"{conformance_layer.linear_tolerance(case):.0e}", verdict
        )
    return failures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fp8gemm", description="FP8 block-scaled GEMM (DeepSeek-V3 recipe)")
    parser.add_argument("--version", action="version", version=f"fp8gemm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--device", type=device_argument, help="torch device: cpu, cuda or cuda:N (default: cuda if available)"
    )
    common.add_argument("--backend", help="backend name or 'reference' (default: $FP8GEMM_BACKEND, else best fit)")

    p = sub.add_parser(
        "info", parents=[common], help="device, installed backends, which one is chosen and why (exit 2: none runs)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("check", parents=[common], help="run the conformance suite; non-zero exit on failure")
    p.add_argument("--random", type=count_argument(0), default=6, help="number of random shapes besides the fixed ones")
    p.add_argument(
        "--seed",
        type=count_argument(0),
        default=conformance.DEFAULT_SEED,
        help=f"seed of the random shapes and every case's data (default: {conformance.DEFAULT_SEED})",
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "bench", parents=[common], help="time ours against the available peers (without a GPU: the recipe's accuracy)"
    )
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"fp8gemm {args.command}: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ImportError, OSError, RuntimeError, ValueError, TypeError) as exc:
        print(f"fp8gemm {args.command}: error: {error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
