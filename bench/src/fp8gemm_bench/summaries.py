"""The tables and lines ``fp8gemm bench`` prints for each report (rich), apart from the command line that runs them."""

from __future__ import annotations

import math
import sys

import torch
from fp8gemm.testing import conformance
from rich.console import Console
from rich.table import Table

from . import accuracy, bench

console = Console(width=None if sys.stdout.isatty() else 160)


def memory_text(ratio) -> str:
    return f"; peak memory converted / bf16 {ratio:.3f}" if ratio is not None else ""


def print_train_summary(report: dict) -> None:
    table = Table(title="Linear layer forward + backward: speed over the other path (its time / this path's)")
    for col in ("path", "vs bf16 (all)", "vs bf16, M >= 4096", "slowest vs bf16, M >= 2048", "vs torchao's fastest"):
        table.add_column(col)

    def cell(s, key="geomean"):
        return f"{s[key]:.2f}x" if s and s["cases"] else "-"

    for name, block in report["summary"]["layer"].items():
        if not block["vs_bf16"]["cases"]:
            continue
        ao = block.get("vs_torchao_fastest")
        table.add_row(name, cell(block["vs_bf16"]), cell(block["vs_bf16_m_ge_4096"]),
                      cell(block["vs_bf16_m_ge_2048"], "slowest"),
                      f"{cell(ao)} (slowest {cell(ao, 'slowest')})" if ao and ao["cases"] else "-")  # fmt: skip
    if table.row_count:  # --wgrad: no layer rows
        console.print(table)
    for key, s in report["summary"]["wgrad"].items():
        if s["cases"]:
            console.print(f"weight-gradient GEMM, {key}: geomean {s['geomean']:.2f}, slowest {s['slowest']:.2f} "
                          f"({s['slowest_case']}), {s['cases']} cases", highlight=False)  # fmt: skip
    for r in report["gradient_errors"]:
        cells = [f"{name} dx {e['dx']:.2e} dw {e['dw']:.2e}" for name, e in r["rel_err"].items()]
        console.print(f"gradient error vs float64 at {r['m']}x{r['n']}x{r['k']}: " + "; ".join(cells), highlight=False)
    for name, why in report["environment"].get("missing", {}).items():
        console.print(f"{name}: {why}", highlight=False)


def print_train_moe_summary(report: dict) -> None:
    """``--train --moe``: each ratio of the summary, the targets, the gradient errors and the paths not run."""
    for key, s in report["summary"].items():
        if key != "targets" and s["cases"]:
            console.print(f"{key}: geomean {s['geomean']:.2f}, from {s['slowest']:.2f} ({s['slowest_case']}) to "
                          f"{s['worst']:.2f} ({s['worst_case']}), {s['cases']} cases", highlight=False)  # fmt: skip
    for key, t in report["summary"]["targets"].items():
        console.print(f"target {key}: {t['target']}, measured {t['measured']}, met {t['met']}", highlight=False)
    for r in report["gradient_errors"]:
        cells = [f"{name} " + " ".join(f"{k} {e:.2e}" for k, e in errs.items()) for name, errs in r["rel_err"].items()]
        console.print(f"gradient error vs float64, {r['model']} E{r['experts']} T{r['tokens']}: " + "; ".join(cells),
                      highlight=False)  # fmt: skip
    for name, why in report["environment"].get("missing", {}).items():
        console.print(f"{name}: {why}", highlight=False)


def print_moe_summary(report: dict) -> None:
    table = Table(title="MoE experts layer: speed of ours over the other path (its time / ours), geomean over cases")
    for col in ("ours", "other path", "cases", "geomean", "slowest", "slowest case"):
        table.add_column(col)
    for key, block in report["summary"].items():
        if not key.endswith(" vs"):
            continue
        for other, s in block.items():
            if s["cases"]:
                table.add_row(key[:-3], other, str(s["cases"]), f"{s['geomean']:.2f}x", f"{s['slowest']:.2f}x",
                              s["slowest_case"])  # fmt: skip
    console.print(table)
    d = report["summary"]["decode_ours_over_grouped_alone"]
    if d["cases"]:
        console.print(f"decode (T <= 64): fused_experts / grouped GEMMs alone: geomean {d['geomean']:.2f}, worst "
                      f"{d['worst']:.2f} ({d['worst_case']}), target <= {d['target_max']}", highlight=False)  # fmt: skip
    for key, launches in (("step_floor", "four"), ("step_floor_fused_combine", "three (combine in the GEMM)")):
        floor = d.get(key, {})
        if floor.get("cases"):
            worst = floor["per_case"].get(d["worst_case"], math.nan)
            console.print(f"  the same GEMMs with {launches} one-element launches: geomean {floor['geomean']:.2f}, "
                          f"{worst:.2f} in {d['worst_case']}", highlight=False)  # fmt: skip
    _print_floor("fused_experts", report["summary"].get("decode_ours_over_weight_floor", {}))
    for name, why in report["environment"].get("missing", {}).items():
        console.print(f"{name}: {why}", highlight=False)
    for name, m in report.get("models", {}).items():
        note = m["weights"].get("note") or m.get("error")
        console.print(
            f"{name}: weight copies {m['weights']['copies']}" + (f" ({note})" if note else ""), highlight=False
        )


def _print_floor(what: str, floor: dict) -> None:
    """A decode time over the weight-read floor (weight_floor.floor_summary), where there are cases."""
    if floor.get("cases"):
        console.print(f"decode, {what} / the weight-read floor: geomean {floor['geomean']:.2f}, worst "
                      f"{floor['worst']:.2f} ({floor['worst_case']}); every case within its target: {floor['met']}",
                      highlight=False)  # fmt: skip


def print_grouped_summary(report: dict) -> None:
    table = Table(title="Grouped GEMM: speed of ours over the other path (its time / ours), geomean over the cases")
    for col in ("comparison", "cases", "geomean", "slowest", "target"):
        table.add_column(col)
    for name, s in report["summary"].items():
        if "target" in s:
            table.add_row(name, str(s["cases"]), f"{s['geomean']:.2f}x", f"{s['slowest']:.2f}x", f">= {s['target']}x")
    console.print(table)
    for layout in ("contiguous", "masked"):
        _print_floor(f"grouped GEMM, {layout}", report["summary"].get(f"decode_{layout}_over_weight_floor", {}))
    for name, why in report["environment"].get("missing", {}).items():
        console.print(f"{name}: {why}", highlight=False)
    console.print("ours runs: " + ", ".join(f"{k} {v}" for k, v in report["environment"]["ours_runs"].items()))


def print_accuracy_table(rows: list[dict]) -> None:
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


def print_bench_table(report: dict) -> None:
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
