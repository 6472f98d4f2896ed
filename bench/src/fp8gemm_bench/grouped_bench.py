"""``fp8gemm bench --grouped``: grouped (mixture-of-experts) GEMMs, ours against DeepGEMM, a loop of our dense GEMM
over experts and bf16 ``torch._grouped_mm``, on DeepGEMM's own grouped test shapes and DeepSeek-V3's expert shapes.

Every path's calls for one case are captured in one CUDA graph cycling through copies of the expert weights
totalling at least twice the L2 (as ``--layer`` does), so weights stream from HBM; before timing, each path's output
is checked on sampled rows of every group against a float64 oracle, and a wrong path is reported, not timed.
TFLOP/s count real rows only, never DeepGEMM's padding. Method: docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from fp8gemm import preferred_fp8_dtype, quantize_activation, quantize_weight, registry
from fp8gemm.grouped_checks import uses_grouped_kernel
from fp8gemm.protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED
from fp8gemm.reference import oracle
from fp8gemm.testing.conformance import TOLERANCE, relative_error

from .bench import (
    DEFAULT_SEED,
    earlier_rows,
    environment,
    error_text,
    geomean,
    plot_cases,
    row_text,
    seeded_generator,
)
from .grouped_peers import (
    BF16,
    CONTIGUOUS_PATHS,
    DEFAULT_M_ALIGNMENT,
    DENSE_LOOP,
    DG_CONTIGUOUS,
    DG_CONTIGUOUS_GEMM,
    DG_MASKED,
    DG_PADDING,
    LAYOUT_FREE_PATHS,
    MASKED_PATHS,
    OURS_CONTIGUOUS,
    OURS_MASKED,
    OURS_ROW_IDS,
    OURS_ROW_IDS_PADDED,
    PATHS,
    Problem,
    deepgemm_alignment,
    deepgemm_padding,
    missing_paths,
)
from .layer_bench import peer_versions, time_graph
from .weight_floor import floor_bandwidths, floor_summary, floor_us, grouped_weight_bytes

# DeepGEMM's grouped test shapes (groups x expected rows per group; each group's rows drawn in [0.7, 1.3] x that).
DEEPGEMM_CONTIGUOUS_GROUPS = [(4, 8192), (8, 4096)]
DEEPGEMM_MASKED_GROUPS = [(1, 1024), (2, 512), (4, 256), (32, 192)]
DEEPGEMM_NK = [(4096, 7168), (7168, 2048), (6144, 7168), (7168, 3072)]
DEEPGEMM_MASKED_MAX_M = 4096  # M_max of DeepGEMM's masked tests
# DeepSeek-V3's routed experts at 32 local experts (EP8 of 256).
EXPERTS = 32
EXPERT_NK = {"gate+up": (4096, 7168), "down": (7168, 2048)}
TOKENS_PER_EXPERT = tuple(2**i for i in range(14))  # 1 .. 8192
SPLITS = ("balanced", "skewed")
HOT_EXPERTS, HOT_SHARE = 4, 0.75  # skewed: 4 of the 32 experts take 75% of the rows
MASKED_ALIGN = 128  # M_max of an expert case's masked layout: its largest group rounded up to this
MASKED_MAX_BYTES = 8 << 30  # masked layouts (a, scales, out) past this are not built: skewed ones are mostly padding
REFERENCE_MAX_FLOPS = 5e13  # where ours still runs the pure-torch reference, cases costing more of it are not timed
ORACLE_ROWS = 8  # rows of each group checked against float64: the first, the last and random ones
DECODE_MAX_ROWS = 64
TARGETS = {"own_shapes": 1.0, "own_shapes_slowest": 0.95, "skewed_unaligned": 1.1, "decode_vs_bf16": 2.0,
           "decode_vs_dense_loop": 1.2, "decode_weight_floor": 1.3,
           "row_ids": 1 / 1.1}  # m_indices within 1.1x of offs and of DeepGEMM's contiguous GEMM: speed >= 1/1.1  # fmt: skip


@dataclass(frozen=True)
class Case:
    set: str
    label: str
    n: int
    k: int
    counts: tuple[int, ...]
    layouts: tuple[str, ...]  # "contiguous" and/or "masked"
    m_max: int | None = None
    expected_m: int = 1
    split: str = "deepgemm"
    tokens_per_expert: int | None = None
    masked_skipped: str | None = None  # why an expert case has no masked layout


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` into integers that sum to exactly ``total``."""
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def skewed_split(total: int, groups: int, gen: torch.Generator, hot: int = HOT_EXPERTS, share: float = HOT_SHARE):
    """Rows per expert where ``hot`` random experts take ``share`` of ``total`` (seeded by ``gen``, CPU)."""
    w = (torch.rand(groups, generator=gen, dtype=torch.float64) + 0.1).tolist()
    hot_ids = set(torch.randperm(groups, generator=gen)[:hot].tolist())
    hot_sum = sum(w[i] for i in hot_ids)
    cold_sum = sum(w) - hot_sum
    weights = [w[i] * (share / hot_sum if i in hot_ids else (1 - share) / cold_sum) for i in range(groups)]
    return largest_remainder(total, weights)


def deepgemm_split(groups: int, expected: int, gen: torch.Generator) -> list[int]:
    """DeepGEMM's tests' group sizes: ``int(expected * uniform(0.7, 1.3))`` each (seeded by ``gen``, CPU)."""
    return [int(expected * (0.7 + 0.6 * u)) for u in torch.rand(groups, generator=gen, dtype=torch.float64).tolist()]


def _masked_m_max(counts, n: int, k: int) -> tuple[int | None, str | None]:
    m_max = max(MASKED_ALIGN, -(-max(counts) // MASKED_ALIGN) * MASKED_ALIGN)
    nbytes = len(counts) * m_max * (k + k // 32 + 2 * n)
    if nbytes > MASKED_MAX_BYTES:
        why = f"not run: the masked layout of this split ({len(counts)} x {m_max} rows) needs {nbytes / 2**30:.0f} GiB"
        return None, why
    return m_max, None


def all_cases(seed: int = DEFAULT_SEED) -> list[Case]:
    """Every case of the grouped benchmark; group sizes drawn from ``seed``."""
    cases = []
    for groups, expected in DEEPGEMM_CONTIGUOUS_GROUPS:
        for n, k in DEEPGEMM_NK:
            counts = deepgemm_split(groups, expected, seeded_generator(seed, "cpu", "contiguous", groups, n, k))
            cases.append(Case("deepgemm-contiguous", f"contiguous {groups}x{expected} N{n} K{k}", n, k, tuple(counts),
                              ("contiguous",), expected_m=expected))  # fmt: skip
    for groups, expected in DEEPGEMM_MASKED_GROUPS:
        for n, k in DEEPGEMM_NK:
            counts = deepgemm_split(groups, expected, seeded_generator(seed, "cpu", "masked", groups, n, k))
            cases.append(Case("deepgemm-masked", f"masked {groups}x{expected} N{n} K{k}", n, k, tuple(counts),
                              ("masked",), DEEPGEMM_MASKED_MAX_M, expected))  # fmt: skip
    for name, (n, k) in EXPERT_NK.items():
        for tokens in TOKENS_PER_EXPERT:
            for split in SPLITS:
                total = tokens * EXPERTS
                gen = seeded_generator(seed, "cpu", "experts", split, tokens, n, k)
                counts = [tokens] * EXPERTS if split == "balanced" else skewed_split(total, EXPERTS, gen)
                m_max, skipped = _masked_m_max(counts, n, k)
                layouts = ("contiguous",) if m_max is None else ("contiguous", "masked")
                cases.append(Case("deepseek-v3-experts", f"experts {split} {tokens}/expert {name} N{n} K{k}", n, k,
                                  tuple(counts), layouts, m_max, tokens, split, tokens, skipped))  # fmt: skip
    return cases


def case_paths(case: Case) -> list[str]:
    names = [*CONTIGUOUS_PATHS] if "contiguous" in case.layouts or case.masked_skipped else []
    if "masked" in case.layouts or case.masked_skipped:
        names += MASKED_PATHS
    return names + list(LAYOUT_FREE_PATHS)


def check_rows(counts, gen: torch.Generator) -> list[list[int]]:
    """Packed rows of each group to check: its first, its last and up to ORACLE_ROWS - 2 random ones."""
    rows, start = [], 0
    for c in counts:
        picks = {0, c - 1} | set(torch.randint(0, c, (ORACLE_ROWS - 2,), generator=gen).tolist()) if c else set()
        rows.append(sorted(start + i for i in picks))
        start += c
    return rows


def weight_copies(nbytes: int, l2_bytes: int) -> int:
    """Copies of the weights to cycle through so that together they are at least twice the L2 (2 at least)."""
    return max(2, math.ceil(2 * l2_bytes / max(nbytes, 1)))


def _weights(groups, n, k, gen, fp8, device):
    qs = [quantize_weight(torch.randn(n, k, generator=gen, device=device).div_(math.sqrt(k)), fp8_dtype=fp8)
          for _ in range(groups)]  # fmt: skip
    return torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])


def _reference_cost(name: str, case: Case, kernel_layouts: dict) -> float:
    """Work of the pure-torch reference where ours runs it (every group multiplies all rows); 0 where a kernel runs."""
    layout = "masked" if name == OURS_MASKED else "contiguous"
    if name not in (OURS_CONTIGUOUS, OURS_MASKED) or kernel_layouts[layout]:
        return 0.0
    rows = case.m_max if name == OURS_MASKED else sum(case.counts)
    return 2.0 * len(case.counts) * rows * case.n * case.k


def _worst_error(out, rows_of, refs, picks) -> float:
    return max((relative_error(rows_of(out, torch.tensor(p)), ref) for p, ref in zip(picks, refs, strict=True) if p),
               default=0.0)  # fmt: skip


def time_case(case: Case, device, backend, seed, timer, l2_bytes: int, missing: dict, kernel_layouts: dict,
              bandwidth: float | None = None) -> dict:  # fmt: skip
    """One row: each path's time per call and TFLOP/s on real rows, its worst group error, or why it did not run; for a
    decode case, the weight-read floor at ``bandwidth`` (bytes/s)."""
    gen = seeded_generator(seed, device, "grouped", case.label)
    fp8, m, groups = preferred_fp8_dtype(device, backend), sum(case.counts), len(case.counts)
    a, a_scale = quantize_activation(torch.randn(m, case.k, generator=gen, device=device), fp8_dtype=fp8)
    copies = weight_copies(groups * case.n * case.k, l2_bytes)
    weights = [_weights(groups, case.n, case.k, gen, fp8, device) for _ in range(copies)]
    problem = Problem(list(case.counts), a, a_scale, case.n, case.m_max, case.expected_m, backend)
    picks = check_rows(case.counts, seeded_generator(seed, "cpu", "check", case.label))
    b0, s0 = weights[0]
    refs = [oracle(a[p], b0[g], a_scale[p], s0[g]) if p else None for g, p in enumerate(picks)]
    row = {**asdict(case), "rows": m, "us": {}, "tflops": {}, "rel_err": {}, "errors": {}}
    if bandwidth and max(case.counts) <= DECODE_MAX_ROWS:  # the experts with rows stream their weights once
        row["weight_bytes_read"] = grouped_weight_bytes(case.n, case.k, sum(c > 0 for c in case.counts))
        row["weight_floor_us"] = floor_us(row["weight_bytes_read"], bandwidth)
    if "deepgemm" not in str(missing.get(DG_CONTIGUOUS, "")):
        padded = deepgemm_padding(list(case.counts), _alignment())[0]
        row["deepgemm_padded_rows"] = sum(padded)
    for name in case_paths(case):
        if name in missing or (name in MASKED_PATHS and case.masked_skipped):
            row["errors"][name] = missing.get(name) or case.masked_skipped
            continue
        if _reference_cost(name, case, kernel_layouts) > REFERENCE_MAX_FLOPS and device.type == "cuda":
            row["errors"][name] = "not timed: this backend runs the pure-torch reference here, too slow at this size"
            continue
        runs = None
        try:
            runs = [PATHS[name](problem, b, s) for b, s in weights]
            run0, rows_of = runs[0]
            out = run0()
            if name == DG_PADDING:  # no product: the padded copy must hold every packed row's bytes
                flat = [i for p in picks for i in p]
                ok = torch.equal(rows_of(out, torch.tensor(flat)).view(torch.uint8), a[flat].view(torch.uint8))
                err = 0.0 if ok else math.inf
            elif name == BF16:  # checked against the float64 product of its own bf16 operands
                a16, b16 = run0.operands
                bf_refs = [a16[p].double() @ b16[g].double().t() if p else None for g, p in enumerate(picks)]
                err = _worst_error(out, rows_of, bf_refs, picks)
            else:
                err = _worst_error(out, rows_of, refs, picks)
            row["rel_err"][name] = err
            if err > TOLERANCE[torch.bfloat16]:
                row["errors"][name] = f"wrong: relative error {err:.3g} against float64 on a group; not timed"
                continue
            seconds = timer([r for r, _ in runs])
            row["us"][name] = seconds * 1e6
            if name != DG_PADDING:
                row["tflops"][name] = 2.0 * m * case.n * case.k / seconds / 1e12
        except Exception as exc:  # a path that cannot run this case is reported, not fatal
            row["errors"][name] = error_text(exc)
        finally:
            runs = out = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return row


def _alignment() -> int:
    try:
        return deepgemm_alignment()
    except Exception:
        return DEFAULT_M_ALIGNMENT


def _ratios(rows, fast: str, slow: str, keep) -> list[float]:
    return [r["us"][slow] / r["us"][fast] for r in rows if keep(r) and fast in r["us"] and slow in r["us"]]


def _stat(ratios: list[float], target: float) -> dict:
    g = geomean(ratios)
    return {"geomean": g, "slowest": min(ratios) if ratios else math.nan, "cases": len(ratios), "target": target,
            "met": (g >= target) if ratios else None}  # fmt: skip


def summarize(rows: list[dict], alignment: int = DEFAULT_M_ALIGNMENT) -> dict:
    """The geomeans the targets name: speed ratios (the other path's time over ours) over the cases both ran."""

    def own_contiguous(r):
        return r["set"] == "deepgemm-contiguous"

    def own_masked(r):
        return r["set"] == "deepgemm-masked"

    def skewed_or_unaligned(r):
        return r["set"] == "deepseek-v3-experts" and (r["split"] == "skewed" or any(c % alignment for c in r["counts"]))

    def decode(r):
        return max(r["counts"]) <= DECODE_MAX_ROWS

    own = _ratios(rows, OURS_CONTIGUOUS, DG_CONTIGUOUS_GEMM, own_contiguous) + _ratios(
        rows, OURS_MASKED, DG_MASKED, own_masked
    )
    out = {"ours_vs_deepgemm_own_shapes": _stat(own, TARGETS["own_shapes"])}
    out["ours_vs_deepgemm_own_shapes"]["slowest_target"] = TARGETS["own_shapes_slowest"]
    out["skewed_unaligned_vs_deepgemm_incl_padding"] = _stat(
        _ratios(rows, OURS_CONTIGUOUS, DG_CONTIGUOUS, skewed_or_unaligned), TARGETS["skewed_unaligned"]
    )
    for ours, layout in ((OURS_CONTIGUOUS, "contiguous"), (OURS_MASKED, "masked")):
        out[f"decode_{layout}_vs_bf16_grouped_mm"] = _stat(_ratios(rows, ours, BF16, decode), TARGETS["decode_vs_bf16"])
        out[f"decode_{layout}_vs_dense_loop"] = _stat(_ratios(rows, ours, DENSE_LOOP, decode),
                                                      TARGETS["decode_vs_dense_loop"])  # fmt: skip
    every = lambda r: True  # noqa: E731
    out["row_ids_vs_offs"] = _stat(_ratios(rows, OURS_ROW_IDS, OURS_CONTIGUOUS, every), TARGETS["row_ids"])
    out["row_ids_padded_vs_deepgemm_pre_padded"] = _stat(
        _ratios(rows, OURS_ROW_IDS_PADDED, DG_CONTIGUOUS_GEMM, own_contiguous), TARGETS["row_ids"]
    )
    padding = [
        r["us"][DG_PADDING] / r["us"][DG_CONTIGUOUS] for r in rows if {DG_PADDING, DG_CONTIGUOUS} <= r["us"].keys()
    ]
    out["deepgemm_padding_share_of_its_path"] = {"geomean": geomean(padding), "cases": len(padding)}
    for ours, layout in ((OURS_CONTIGUOUS, "contiguous"), (OURS_MASKED, "masked")):
        out[f"decode_{layout}_over_weight_floor"] = floor_summary(rows, ours, lambda r: TARGETS["decode_weight_floor"])
    return out


def run(device, cases: list[Case] | None = None, backend: str | None = None, progress=print, earlier: dict | None = None,
        checkpoint=None, seed: int = DEFAULT_SEED, timer=None) -> dict:  # fmt: skip
    """Time every path on ``cases`` (default: ``all_cases(seed)``); ``earlier``: a cut-short report of the same GPU
    and software whose cases are kept; ``checkpoint(report)`` after every case; ``timer(calls) -> seconds per call``
    (default: one CUDA graph of the calls, median of replays)."""
    device = torch.device(device)
    if timer is None and device.type != "cuda":
        raise ValueError(f"timing needs a GPU, got device {device}")
    cases = cases or all_cases(seed)
    chosen = registry.select(device, backend).backend
    kernel_layouts = {"contiguous": uses_grouped_kernel(chosen, GROUPED_CONTIGUOUS),
                      "masked": uses_grouped_kernel(chosen, GROUPED_MASKED)}  # fmt: skip
    missing = missing_paths(device)
    env = environment(device, backend, seed)
    env.update(method="CUDA graph over expert-weight copies >= 2x L2; median of replays; TFLOP/s on real rows",
               peers=peer_versions(), ours_runs={k: "kernel" if v else "reference" for k, v in kernel_layouts.items()},
               deepgemm_alignment=_alignment(), missing={k: v for k, v in missing.items()},
               **floor_bandwidths(device, timer or time_graph),
               weight_floor="decode cases: the FP8 weights and scales of the groups with rows over the floor bandwidth "
               "(the faster of a 1 GiB copy's read plus write and a read-only pass, per second)")  # fmt: skip
    labels = [c.label for c in cases]
    rows = earlier_rows(earlier, env, lambda r: r["label"] in labels)
    env["processes"] = (earlier or {}).get("environment", {}).get("processes", 0) + 1
    report = {"environment": env, "paths": list(PATHS), "partial": True, "rows": rows}
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    for case in cases:
        if any(r["label"] == case.label for r in rows):
            continue
        rows.append(time_case(case, device, backend, seed, timer or time_graph, l2, missing, kernel_layouts,
                              env["floor_bandwidth_bytes_per_s"]))  # fmt: skip
        progress(row_text(rows[-1]))
        report["summary"] = summarize(rows, env["deepgemm_alignment"])
        if checkpoint:
            checkpoint(report)
    rows.sort(key=lambda r: labels.index(r["label"]))
    report["summary"] = summarize(rows, env["deepgemm_alignment"])
    del report["partial"]
    return report


def plot(report: dict, path: Path) -> None:
    """TFLOP/s (real rows) of every path on every case, log scale."""
    names = [p for p in report["paths"] if p != DG_PADDING and any(p in r["tflops"] for r in report["rows"])]
    plot_cases(report, names, path, "TFLOP/s on real rows (log)", "Grouped FP8 GEMM, weights from HBM")
