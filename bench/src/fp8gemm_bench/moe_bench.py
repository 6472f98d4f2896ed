"""``fp8gemm bench --moe``: the experts layer ``fp8gemm.fused_experts`` at DeepSeek-V3 and Qwen3-30B-A3B sizes, against
bf16 experts as transformers runs them, DeepGEMM's pipeline and transformers' own FP8 experts module, with our two
grouped GEMMs alone as the bound (paths: ``moe_peers.py``).

Every path's calls for one case are captured in one CUDA graph cycling through copies of the expert weights (enough
that the weights one call reads, times the copies, exceed the L2 three times, within a memory budget), so weights
stream from HBM; before timing, each path's output on a sub-sample of tokens is checked against a float64 reference,
and a wrong path is reported, not timed. Method: docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from fp8gemm import preferred_fp8_dtype, prepare_weight_scale, quantize_weight, registry
from fp8gemm.grouped_checks import uses_grouped_kernel
from fp8gemm.moe_reference import dequantize64, reference_fused_experts
from fp8gemm.protocol import GROUPED_CONTIGUOUS
from fp8gemm.testing.conformance import relative_error

from .bench import (
    DEFAULT_SEED,
    earlier_rows,
    environment,
    error_text,
    geomean,
    installed_versions,
    plot_cases,
    row_text,
    seeded_generator,
)
from .moe_peers import (
    BF16_GROUPED,
    BF16_LOOP,
    BF16_PATHS,
    DEEPGEMM_PATHS,
    DG_PIPELINE,
    DG_PIPELINE_EXACT,
    GROUPED_ALONE,
    HF_FP8,
    NOTES,
    OURS_CONTIGUOUS,
    PATH_ORDER,
    PATHS,
    STEP_FLOOR,
    STEP_FLOOR_FUSED_COMBINE,
    STEP_FLOORS,
    WEIGHT_KIND,
    Bf16Weights,
    Fp8Weights,
    Inputs,
    distinct_experts,
    missing_paths,
)
from .weight_floor import experts_weight_bytes, floor_bandwidths, floor_summary, floor_us


@dataclass(frozen=True)
class MoeModel:
    name: str
    experts: int  # E
    top_k: int  # k
    hidden: int  # H
    inter: int  # I (moe_intermediate_size)


MODELS = (
    MoeModel("deepseek-v3", 256, 8, 7168, 2048),
    MoeModel("deepseek-v3-ep8", 32, 8, 7168, 2048),  # the 32 local experts of 8-way expert parallelism
    MoeModel("qwen3-30b-a3b", 128, 8, 2048, 768),
)
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
ROUTINGS = ("uniform", "skewed")
QUICK_TOKENS = (1, 64, 4096)
QUICK_ROUTINGS = ("uniform",)
HOT_EXPERTS, HOT_PROBABILITY = 6, 0.9  # skewed: each token picks each of 6 hot experts with p = 0.9 (~2/3 of rows)
WEIGHT_BUDGET_BYTES = 40 << 30  # rotating weight copies of one model, FP8 and bf16 together
L2_MULTIPLE = 3  # copies x the bytes one call reads >= this x the L2
MIN_CALLS = 8  # calls per graph for T <= CALLS_TOKENS (fewer leave the graph's launch in a decode time)
CALLS_TOKENS = 1024
CHECK_TOKENS = 64  # tokens checked against float64: 8 made the error a noisy estimate
DECODE_MAX_TOKENS = 64
# Bounds of the check (relative Frobenius error on the sampled tokens). Ours against the float64 yardstick of the
# same quantized operands (moe_reference.py): tests/test_moe.py's bound for two GEMMs in a row. The bf16 paths and
# the FP8 paths that quantize otherwise (DeepGEMM's, transformers' with bf16 gate/up) against the float64 layer on
# the unquantized activations: FP8 activations (two quantizations, e4m3 steps of 6-12%) land at 3-5e-2 there;
# a wrong expert, scale or permutation at O(1).
YARDSTICK_BOUND = 6e-3
EXACT_BOUND = {"bf16": 2e-2, "fp8": 0.1}
YARDSTICK_PATHS = (OURS_CONTIGUOUS, GROUPED_ALONE, *STEP_FLOORS)
TARGETS = {"vs_bf16": 1.0, "decode_vs_grouped_alone_max": 1.2}
# fused_experts in a decode case over its weight-read floor, at most: Qwen3-30B-A3B at T = 1 (a 38 MB layer, where the
# step kernels' time must hide under the weight stream), every other decode case.
FLOOR_TARGET_SMALL_T1, FLOOR_TARGET = 2.0, 1.3


def floor_target(row: dict) -> float:
    return FLOOR_TARGET_SMALL_T1 if row["model"].startswith("qwen3") and row["tokens"] == 1 else FLOOR_TARGET


@dataclass(frozen=True)
class Case:
    model: str
    tokens: int
    routing: str

    @property
    def label(self) -> str:
        return f"{self.model} T{self.tokens} {self.routing}"


def all_cases(quick: bool = False, models=MODELS, decode: bool = False) -> list[Case]:
    """Every case; ``quick``: a subset; ``decode``: the cases of the decode target (T <= DECODE_MAX_TOKENS)."""
    tokens, routings = (QUICK_TOKENS, QUICK_ROUTINGS) if quick else (TOKENS, ROUTINGS)
    tokens = [t for t in tokens if t <= DECODE_MAX_TOKENS] if decode else tokens
    return [Case(m.name, t, r) for m in models for r in routings for t in tokens]


def routing(model: MoeModel, tokens: int, kind: str, seed: int):
    """(topk_ids int64 [T, k], topk_weights fp32 [T, k]) on the CPU, seeded. uniform: k distinct experts at random;
    skewed: each token takes each of HOT_EXPERTS hot experts with probability HOT_PROBABILITY, the rest at random."""
    gen = seeded_generator(seed, "cpu", "routing", model.name, tokens, kind)
    scores = torch.rand(tokens, model.experts, generator=gen, dtype=torch.float64)
    if kind == "skewed":
        hot = torch.randperm(model.experts, generator=gen)[:HOT_EXPERTS]
        picked = torch.rand(tokens, len(hot), generator=gen, dtype=torch.float64) < HOT_PROBABILITY
        scores[:, hot] += 2.0 * picked
    elif kind != "uniform":
        raise ValueError(f"routing {kind!r}: one of {ROUTINGS}")
    ids = scores.topk(model.top_k, dim=1).indices
    weights = torch.randn(tokens, model.top_k, generator=gen, dtype=torch.float64).softmax(-1).float()
    return ids, weights


def expert_bytes(model: MoeModel, kind: str) -> int:
    return 3 * model.hidden * model.inter * (2 if kind == "bf16" else 1)


def plan_copies(model: MoeModel, min_experts_read: int, l2_bytes: int, budget: int = WEIGHT_BUDGET_BYTES) -> dict:
    """Rotating copies per weight kind: enough that copies x (bytes one call reads) >= L2_MULTIPLE x L2, within
    ``budget`` for both kinds together (bf16 copies given up first)."""
    want = {kind: max(1, math.ceil(L2_MULTIPLE * l2_bytes / max(1, min_experts_read * expert_bytes(model, kind))))
            for kind in ("fp8", "bf16")}  # fmt: skip
    have = dict(want)
    total = {kind: model.experts * expert_bytes(model, kind) for kind in have}
    while sum(have[k] * total[k] for k in have) > budget and (have["bf16"] > 1 or have["fp8"] > 1):
        have["bf16" if have["bf16"] > 1 else "fp8"] -= 1
    out = {"copies": have, "wanted": want, "bytes_per_copy": total}
    if have != want:
        out["note"] = (f"copies cut to fit {budget / 2**30:.0f} GiB: the weights one call reads at the smallest T "
                       f"({min_experts_read} experts) times the copies are below {L2_MULTIPLE}x the L2 where wanted "
                       "> copies")  # fmt: skip
    return out


def make_weights(model: MoeModel, copies: dict, device, backend, seed: int):
    """FP8 copies (each expert quantized per 128x128 block; every copy drawn from the seed) and bf16 copies: the
    FP8 numbers dequantized to bf16, so both formats compute the same layer."""
    fp8 = preferred_fp8_dtype(device, backend)
    e, h, i = model.experts, model.hidden, model.inter
    fp8_copies, bf16_copies = [], []
    for c in range(max(copies["fp8"], copies["bf16"])):
        gen = seeded_generator(seed, device, "weights", model.name, c)
        w13 = torch.empty(e, 2 * i, h, dtype=fp8, device=device)
        w2 = torch.empty(e, h, i, dtype=fp8, device=device)
        s13 = torch.empty(e, 2 * i // 128, h // 128, device=device)
        s2 = torch.empty(e, h // 128, i // 128, device=device)
        for x in range(e):
            w13[x], s13[x] = quantize_weight(torch.randn(2 * i, h, generator=gen, device=device) / math.sqrt(h),
                                             fp8_dtype=fp8)  # fmt: skip
            w2[x], s2[x] = quantize_weight(torch.randn(h, i, generator=gen, device=device) / math.sqrt(i),
                                           fp8_dtype=fp8)  # fmt: skip
        if c < copies["bf16"]:
            bf16_copies.append(Bf16Weights(_dequantized(w13, s13), _dequantized(w2, s2)))
        if c < copies["fp8"]:
            fp8_copies.append(Fp8Weights(w13, s13, w2, s2, prepare_weight_scale(s13, backend=backend),
                                         prepare_weight_scale(s2, backend=backend)))  # fmt: skip
        del w13, w2, s13, s2
    return {"fp8": fp8_copies, "bf16": bf16_copies}


def _dequantized(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    for e in range(q.shape[0]):
        rows = s[e].repeat_interleave(128, 0)[: q.shape[1]].repeat_interleave(128, 1)[:, : q.shape[2]]
        out[e] = (q[e].float() * rows).bfloat16()
    return out


def exact_reference(x, ids, weights, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
    """float64 [t, H]: the layer on the unquantized activations and the dequantized weights (no FP8 rounding of x
    or of the activation); one expert's weights dequantized at a time."""
    inter = w2.shape[2]
    x64, out = x.double(), torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        token, choice = (ids == e).nonzero(as_tuple=True)
        h = x64[token] @ dequantize64(w13[e], w13_scale[e]).t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ dequantize64(w2[e], w2_scale[e]).t()
        out.index_add_(0, token, y * weights[token, choice].double()[:, None])
    return out


def check_tokens(tokens: int, gen: torch.Generator) -> list[int]:
    """Every token up to CHECK_TOKENS, else the first, the last and CHECK_TOKENS - 2 distinct others."""
    if tokens <= CHECK_TOKENS:
        return list(range(tokens))
    inner = (torch.randperm(tokens - 2, generator=gen)[: CHECK_TOKENS - 2] + 1).tolist()
    return sorted({0, tokens - 1, *inner})


def checked_tokens(case: Case, seed: int) -> list[int]:
    return check_tokens(case.tokens, seeded_generator(seed, "cpu", "check", case.label))


def case_inputs(model: MoeModel, case: Case, device, backend, seed: int) -> Inputs:
    """The case's seeded tokens and routing, shared by every path."""
    ids_cpu, w_cpu = routing(model, case.tokens, case.routing, seed)
    gen = seeded_generator(seed, device, "x", case.label)
    x = torch.randn(case.tokens, model.hidden, generator=gen, device=device).bfloat16()
    return Inputs(x, ids_cpu.to(device), w_cpu.to(device), model.experts, ids_cpu, backend)


def _calls(runs: list, tokens: int) -> list:
    n = len(runs) * math.ceil(MIN_CALLS / len(runs)) if tokens <= CALLS_TOKENS else len(runs)
    return [runs[c % len(runs)] for c in range(n)]


def case_paths(model: MoeModel, case: Case) -> tuple[list[str], dict[str, str]]:
    """The paths of a case, and those left out with why (the step launches' floor past decode)."""
    skipped = {}
    if case.tokens > DECODE_MAX_TOKENS:
        skipped.update(dict.fromkeys(STEP_FLOORS, f"not run: decode cases only (T <= {DECODE_MAX_TOKENS})"))
    return [p for p in PATH_ORDER if p not in skipped], skipped


def layer_flops(model: MoeModel, tokens: int) -> float:
    return 2.0 * tokens * model.top_k * 3 * model.hidden * model.inter


def time_case(model: MoeModel, case: Case, weights: dict, device, backend, seed, timer, missing: dict,
              bandwidth: float | None = None) -> dict:  # fmt: skip
    """One row: each path's time per layer call, its errors against float64, or why it did not run; for a decode
    case, the weight-read floor at ``bandwidth`` (bytes/s)."""
    inp = case_inputs(model, case, device, backend, seed)
    x, ids_cpu = inp.x, inp.ids_cpu
    counts = torch.bincount(ids_cpu.reshape(-1), minlength=model.experts)
    row = {**asdict(case), "label": case.label, "experts": model.experts, "top_k": model.top_k,
           "hidden": model.hidden, "inter": model.inter, "experts_hit": distinct_experts(ids_cpu),
           "largest_expert_rows": int(counts.max()), "us": {}, "tflops": {}, "rel_err": {}, "rel_err_exact": {},
           "errors": {}}  # fmt: skip
    if bandwidth and case.tokens <= DECODE_MAX_TOKENS:
        row["weight_bytes_read"] = experts_weight_bytes(model.hidden, model.inter, row["experts_hit"])
        row["weight_floor_us"] = floor_us(row["weight_bytes_read"], bandwidth)
    sub = torch.tensor(checked_tokens(case, seed), device=device)
    w0 = weights["fp8"][0]
    args = (x[sub], inp.topk_ids[sub], inp.topk_weights[sub], w0.w13, w0.w13_scale, w0.w2, w0.w2_scale)
    yardstick, exact = reference_fused_experts(*args), exact_reference(*args)
    paths, skipped = case_paths(model, case)
    row["errors"].update(skipped)
    for name in paths:
        if name in missing:
            row["errors"][name] = missing[name]
            continue
        runs = out = None
        try:
            runs = [PATHS[name](inp, w) for w in weights[WEIGHT_KIND[name]]]
            run0, tokens_of = runs[0]
            out = tokens_of(run0())[sub]
            row["rel_err"][name] = relative_error(out, yardstick)
            row["rel_err_exact"][name] = err = relative_error(out, exact)
            if name in YARDSTICK_PATHS and row["rel_err"][name] > YARDSTICK_BOUND:
                row["errors"][name] = (f"wrong: relative error {row['rel_err'][name]:.3g} against the float64 "
                                       f"yardstick > {YARDSTICK_BOUND}; not timed")  # fmt: skip
                continue
            bound = EXACT_BOUND[WEIGHT_KIND[name]]
            if not err <= bound:
                row["errors"][name] = f"wrong: relative error {err:.3g} against the float64 layer > {bound}; not timed"
                continue
            seconds = timer(_calls([r for r, _ in runs], case.tokens))
            row["us"][name] = seconds * 1e6
            row["tflops"][name] = layer_flops(model, case.tokens) / seconds / 1e12
        except Exception as exc:  # a path that cannot run this case is reported, not fatal
            row["errors"][name] = error_text(exc)
        finally:
            runs = out = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return row


# --- the summary -------------------------------------------------------------------------------------------------


def _stat(rows: list[dict], fast: str, slow: str, target: float | None = None, keep=lambda r: True) -> dict:
    pairs = [(r["us"][slow] / r["us"][fast], r["label"]) for r in rows if keep(r) and {fast, slow} <= r["us"].keys()]
    out = {"geomean": geomean([p for p, _ in pairs]), "cases": len(pairs)}
    if pairs:
        low = min(pairs)
        out.update(slowest=low[0], slowest_case=low[1])
    if target is not None:
        out.update(target=target, met=(out.get("slowest", 0) >= target) if pairs else None)
    return out


def _decode_ratio(rows: list[dict], path: str) -> dict:
    """path's time over the grouped GEMMs alone in the decode cases (T <= 64): geomean, worst, per case."""
    decode = [(r["us"][path] / r["us"][GROUPED_ALONE], r["label"]) for r in rows
              if r["tokens"] <= DECODE_MAX_TOKENS and {path, GROUPED_ALONE} <= r["us"].keys()]  # fmt: skip
    worst = max(decode) if decode else (math.nan, None)
    target = TARGETS["decode_vs_grouped_alone_max"]
    return {
        "geomean": geomean([d for d, _ in decode]), "worst": worst[0], "worst_case": worst[1], "cases": len(decode),
        "target_max": target, "met": (worst[0] <= target) if decode else None,
        "per_case": {label: ratio for ratio, label in decode},
    }  # fmt: skip


def summarize(rows: list[dict]) -> dict:
    """Speed of ours over each other path (its time / ours): geomean and slowest case, over all cases and per
    model; the decode ratio to the grouped GEMMs alone. Paths of older reports that are no longer timed (the
    removed masked ``fused_experts``) are left out."""
    out: dict = {}
    models = sorted({r["model"] for r in rows})
    block = {}
    for other in (*BF16_PATHS, *DEEPGEMM_PATHS, HF_FP8):
        target = TARGETS["vs_bf16"] if other in BF16_PATHS else None
        block[other] = _stat(rows, OURS_CONTIGUOUS, other, target)
        block[other]["by_model"] = {m: _stat(rows, OURS_CONTIGUOUS, other, target, lambda r, m=m: r["model"] == m)
                                    for m in models}  # fmt: skip
    out[f"{OURS_CONTIGUOUS} vs"] = block
    out["decode_ours_over_grouped_alone"] = _decode_ratio(rows, OURS_CONTIGUOUS)
    out["decode_ours_over_grouped_alone"]["step_floor"] = _decode_ratio(rows, STEP_FLOOR)
    out["decode_ours_over_grouped_alone"]["step_floor_fused_combine"] = _decode_ratio(rows, STEP_FLOOR_FUSED_COMBINE)
    out["decode_ours_over_weight_floor"] = floor_summary(rows, OURS_CONTIGUOUS, floor_target)
    out["decode_grouped_alone_over_weight_floor"] = floor_summary(rows, GROUPED_ALONE, floor_target)
    return out


# --- the run -----------------------------------------------------------------------------------------------------


def _peer_versions() -> dict[str, str]:
    return installed_versions(("transformers", "kernels", "deep_gemm", "triton"))


def run(device, cases: list[Case] | None = None, backend: str | None = None, progress=print, earlier: dict | None = None,
        checkpoint=None, seed: int = DEFAULT_SEED, timer=None, quick: bool = False, models=MODELS,
        decode: bool = False) -> dict:  # fmt: skip
    """Time every path on ``cases`` (default: ``all_cases(quick, models, decode)``); ``earlier``: a cut-short report
    of the same GPU and software whose cases are kept; ``checkpoint(report)`` after every case;
    ``timer(calls) -> seconds per call`` (default: one CUDA graph of the calls, median of replays)."""
    from .layer_bench import time_graph

    device = torch.device(device)
    if timer is None and device.type != "cuda":
        raise ValueError(f"timing needs a GPU, got device {device}")
    by_name = {m.name: m for m in models}
    cases = cases or all_cases(quick, models, decode)
    chosen = registry.select(device, backend).backend
    layouts = {"contiguous": uses_grouped_kernel(chosen, GROUPED_CONTIGUOUS)}
    missing = missing_paths(device)
    env = environment(device, backend, seed)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    rates = floor_bandwidths(device, timer or time_graph)
    bandwidth = rates["floor_bandwidth_bytes_per_s"]
    env.update(method=f"CUDA graph of >= {MIN_CALLS} calls (T <= {CALLS_TOKENS}) cycling through weight copies; "
               "median of replays; TFLOP/s = 2*T*k*3*H*I / time", peers=_peer_versions(), l2_bytes=l2,
               ours_runs={k: "kernel" if v else "reference" for k, v in layouts.items()}, missing=missing,
               notes=dict(NOTES), quick=quick, decode=decode, **rates,
               weight_floor="decode cases: the FP8 weights and scales of the experts the batch touches over the floor "
               "bandwidth (the faster of a 1 GiB copy's read plus write and a read-only pass, per second)")  # fmt: skip
    labels = [c.label for c in cases]
    rows = earlier_rows(earlier, env, lambda r: r["label"] in labels)
    env["processes"] = (earlier or {}).get("environment", {}).get("processes", 0) + 1
    report = {"environment": env, "paths": list(PATH_ORDER), "models": {}, "partial": True, "rows": rows}
    report["models"].update((earlier or {}).get("models", {}))
    for name in dict.fromkeys(c.model for c in cases):
        todo = [c for c in cases if c.model == name and c.label not in {r["label"] for r in rows}]
        if not todo:
            continue
        model = by_name[name]
        fewest = min(distinct_experts(routing(model, c.tokens, c.routing, seed)[0]) for c in todo)
        copies = plan_copies(model, fewest, l2)
        report["models"][name] = {**asdict(model), "weights": copies}
        weights = None
        try:
            weights = make_weights(model, copies["copies"], device, backend, seed)
            for case in todo:
                rows.append(time_case(model, case, weights, device, backend, seed, timer or time_graph, missing,
                                      bandwidth))  # fmt: skip
                progress(row_text(rows[-1]))
                report["summary"] = summarize(rows)
                if checkpoint:
                    checkpoint(report)
        except Exception as exc:  # weights that do not fit: the model's cases are reported, the others still run
            report["models"][name]["error"] = error_text(exc)
            progress(f"{name}: {error_text(exc)}")
        finally:
            weights = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    rows.sort(key=lambda r: labels.index(r["label"]) if r["label"] in labels else len(labels))
    report["summary"] = summarize(rows)
    del report["partial"]
    return report


def plot(report: dict, path: Path) -> None:
    """TFLOP/s of every path on every case, log scale."""
    names = [p for p in report["paths"] if any(p in r["tflops"] for r in report["rows"])]
    plot_cases(report, names, path, "TFLOP/s of the experts layer (log)", "MoE experts layer, weights from HBM")


__all__ = ["MODELS", "TOKENS", "Case", "MoeModel", "all_cases", "run", "summarize", "plot", "DG_PIPELINE",
           "DG_PIPELINE_EXACT", "BF16_LOOP", "BF16_GROUPED"]  # fmt: skip
