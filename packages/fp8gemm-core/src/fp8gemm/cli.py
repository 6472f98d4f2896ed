"""The ``fp8gemm`` command: ``info`` and ``check``, plus the commands other packages add.

A package adds a command through an entry point in the ``fp8gemm.commands`` group: its name is the command and its
object (a module, say) has ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. The benchmarks'
package (bench/ in a checkout) adds ``fp8gemm bench`` this way.

Exit status: 0 on success; 1 when ``check`` finds a failure; 2 for a mistake in the command line or one the
environment makes (a device or backend that cannot run, an optional package that is not installed): a one-line
message on stderr that says what to change, never a usage block or a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import sys

import torch

from . import __version__, registry
from .cli_args import UsageError, count_argument, default_device, device_argument, error_message, requested_backend
from .ops import preferred_fp8_dtype
from .testing import conformance, conformance_grouped, conformance_layer

COMMAND_GROUP = "fp8gemm.commands"
# Commands that come in other packages, and how to install each where it is missing.
ADDED_COMMANDS = {
    "bench": (
        "time ours against the available peers (the benchmarks' package)",
        "the benchmarks are a package of their own; from a checkout of fp8gemm: pip install ./bench",
    ),
}


def info_dict(device: torch.device, backend: str | None) -> dict:
    """What ``fp8gemm info --json`` prints: versions, the device, every installed backend and the one selected."""
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
    info = info_dict(device, args.backend)
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


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Plain-text columns, each as wide as its widest cell, under a rule."""
    widths = [max(map(len, column)) for column in zip(header, *rows, strict=True)]
    lines = [header, tuple("-" * w for w in widths), *rows]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _print_info(info: dict) -> None:
    print(f"fp8gemm {info['fp8gemm']}, torch {info['torch']}")
    print(f"device: {info['device']}")
    rows = [("reference", "fp8gemm-core", "any", "e4m3fn / e4m3fnuz", info["fp8gemm"], "pure torch")]
    for ib in info["installed"]:
        if ib["error"]:
            rows.append((ib["name"], ib["distribution"], "?", "?", "?", f"FAILED TO LOAD: {ib['error']}"))
        else:
            build = ", ".join(f"{k}={v}" for k, v in ib["build_info"].items())
            rows.append(
                (ib["name"], ib["distribution"], "/".join(ib["targets"]), ib["fp8_dtype"], ib["version"], build)
            )
    print("installed backends (entry points in 'fp8gemm.backends'):")
    print(format_table(("name", "distribution", "targets", "fp8 dtype", "version", "build / load error"), rows))
    sel = info["selected"]
    print(f"selected: {sel['name']} ({sel['reason']})" if sel["name"] else "selected: none")


def _verdict(ok: bool, detail: str) -> str:
    return "pass" if ok else f"FAIL {detail}"


def cmd_check(args) -> int:
    device = args.device or default_device()
    backend = requested_backend(args)
    chosen = registry.select(device, backend).backend
    fp8 = preferred_fp8_dtype(device, backend)
    seed = args.seed
    print(f"conformance of backend {chosen.name} on {registry.describe_device(device).describe()}")
    print(f"seed {seed} (shapes and data; --seed {seed} repeats this run)")
    rows: list[tuple[str, ...]] = []
    for case in conformance.cases(device, n_random=args.random, seed=seed):
        r = conformance.run_case(case, device, fp8, backend, seed=seed)
        tolerance = f"{conformance.TOLERANCE[case.out_dtype]:.0e}"
        rows.append((case.id, f"{r.rel_err:.2e}", tolerance, _verdict(r.passed, r.detail)))
    for bad in conformance.BAD_INPUTS:
        ok, detail = conformance.run_bad_input(bad, device, fp8, backend)
        rows.append((f"bad input: {bad.id}", "", bad.error.__name__, _verdict(ok, detail)))
    rows += check_layer(device, backend, random.Random(seed))
    rows += check_grouped(device, fp8, backend, seed)
    print(format_table(("case", "rel. error", "tolerance", "result"), rows))
    failures = sum(row[-1] != "pass" for row in rows)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


def check_grouped(device: torch.device, fp8: torch.dtype, backend: str | None, seed: int) -> list[tuple[str, ...]]:
    """The grouped GEMMs' rows: every layout against float64 per group, then their bad inputs."""
    rows = []
    for case in conformance_grouped.cases(device, n_random=2, seed=seed):
        r = conformance_grouped.run_case(case, device, fp8, backend, seed=seed)
        tolerance = f"{conformance.TOLERANCE[case.out_dtype]:.0e}"
        rows.append((f"grouped {case.id}", f"{r.rel_err:.2e}", tolerance, _verdict(r.passed, r.detail)))
    for bad in conformance_grouped.BAD_INPUTS:
        ok, detail = conformance_grouped.run_bad_input(bad, device, fp8, backend)
        rows.append((f"grouped bad input: {bad.id}", "", bad.error.__name__, _verdict(ok, detail)))
    return rows


def check_layer(device: torch.device, backend: str | None, seeds: random.Random) -> list[tuple[str, ...]]:
    """Activation quantization (bit-exact against the reference) and ``linear`` (against float64) rows, each case's
    data drawn from the next of ``seeds``."""
    rows = []
    for case in conformance_layer.quant_cases():
        ok, detail = conformance_layer.run_quant_case(case, device, backend, seed=seeds.getrandbits(63))
        rows.append((f"quantize {case.id}", "", "bit-exact", _verdict(ok, detail)))
    for case in conformance_layer.LINEAR_CASES:
        ok, detail = conformance_layer.run_linear_case(case, device, backend, seed=seeds.getrandbits(63))
        tolerance = f"{conformance_layer.linear_tolerance(case):.0e}"
        rows.append((f"linear {case.id}", detail if ok else "", tolerance, _verdict(ok, detail)))
    return rows


class OneLineParser(argparse.ArgumentParser):
    """argparse's mistakes as one line on stderr (the option and the fix), without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_command(sub, common: argparse.ArgumentParser, name: str, ep: importlib.metadata.EntryPoint | None) -> None:
    """The command ``name`` from its entry point ``ep``, or one that says how to install it (``ep`` None) or why its
    package does not load."""
    help_text, install = ADDED_COMMANDS.get(name, ("", f"the package that adds `fp8gemm {name}` is not installed"))
    try:
        command = ep.load() if ep else None
    except Exception as exc:  # a broken package must not take the other commands down with it
        install = f"the package that adds `fp8gemm {name}` ({ep.value}) fails to load: {error_message(exc)}"
        command = None
    if command is None:
        sub.add_parser(name, add_help=False, help=f"{help_text} [not installed]").set_defaults(missing=install)
        return
    p = sub.add_parser(name, parents=[common], help=command.HELP)
    command.add_arguments(p)
    p.set_defaults(func=command.run)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``fp8gemm``; the added commands' packages are imported only when ``command`` is not a core
    one (``info``, ``check``)."""
    parser = OneLineParser(prog="fp8gemm", description="FP8 block-scaled GEMM (DeepSeek-V3 recipe)")
    parser.add_argument("--version", action="version", version=f"fp8gemm {__version__}")
    sub = parser.add_subparsers(dest="command")
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

    if command not in ("info", "check"):
        found = {ep.name: ep for ep in importlib.metadata.entry_points(group=COMMAND_GROUP)}
        for name in dict.fromkeys([*ADDED_COMMANDS, *found]):
            _add_command(sub, common, name, found.get(name))
    return parser


def _mistake(args, extra: list[str]) -> str | None:
    """What is wrong with a command line argparse took, or None: a missing command, an unknown option."""
    if getattr(args, "missing", None):
        return args.missing
    where = f"fp8gemm {args.command}" if args.command else "fp8gemm"
    if extra:
        return f"unrecognized argument(s) {' '.join(extra)}; `{where} --help` lists the options"
    if args.command is None:
        return "name a command; `fp8gemm --help` lists them"
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args, extra = build_parser(command).parse_known_args(argv)
    mistake = _mistake(args, extra)
    if mistake:
        print(f"fp8gemm{' ' + args.command if args.command else ''}: error: {mistake}", file=sys.stderr)
        return 2
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
