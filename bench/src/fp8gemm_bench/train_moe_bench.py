"""``fp8gemm bench --train --moe``: the experts layer's forward and backward (gradients for x, w13, w2 and
topk_weights) at DeepSeek-V3 (32 and 256 local experts) and Qwen3-30B-A3B sizes, T = 4096 and 16384 tokens, uniform and
skewed routing (``moe_bench``'s), ours against a bf16 layer on ``torch._grouped_mm`` and torchao's FP8 blockwise grouped
GEMM in the same layer; and the k-grouped weight gradient alone on the layer's two products (dW2 = dY^T act,
dW13 = dH^T x) against DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous`` with the padding to 128 tokens its caller pays,
beside its roofline and the dense weight-gradient GEMM's TFLOP/s on the same token count (paths: train_moe_peers.py).

Timing as ``--train``'s (``train_timing.Timer``: eager calls, warm-up, median). TFLOP/s count 3 x 2 T k 3 H I for the
layer, 2 R N K for a k-grouped product (R = T k routed rows). The roofline of a k-grouped product is the larger of its
FLOPs at the dense forward-form GEMM's measured TFLOP/s on [R, N, K] and its bytes (operands, scales, fp32 output) at
the measured copy bandwidth; the bf16-out path's roofline counts a bf16 output. The same roofline at the dense
weight-gradient GEMM's rate (its per-column scale promotion) is the measured bound of today's kernel against it
(``roofline_bound_of_the_promotion``). Layer gradients are measured apart, at
``ERROR_T`` tokens on ``ERROR_EXPERTS`` experts: each path's out, dx, dw13, dw2 and d topk_weights against float64
autograd of the same bf16 inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from fp8gemm import preferred_fp8_dtype
from fp8gemm.testing.conformance import relative_error

from .bench import DEFAULT_SEED, earlier_rows, environment, error_text, geomean, plot_cases, row_text, seeded_generator
from .moe_bench import MODELS, ROUTINGS, MoeModel, layer_flops, routing
from .train_bench import SMOKE_ITERS, dequantized64, peer_versions
from .train_moe_peers import (
    BF16,
    K_DEEPGEMM,
    K_OURS,
    K_OURS_BF16,
    KGROUPED_PATHS,
    KGROUPED_PREPARE,
    LAYER_PATHS,
    OURS,
    TORCHAO,
    expert_blocks,
    float64_layer,
    kgrouped_bytes,
    kgrouped_operands,
    layer_paths,
    missing_paths,
    sort_rows,
)
from .train_peers import W_FORWARD_FORM, W_OURS, WGRAD_PREPARE, padded_rows, wgrad_operands
from .train_timing import Timer, gradient_errors_once, time_cases
from .weight_floor import copy_bandwidth, floor_us

TRAIN_TOKENS = (4096, 16384)
ERROR_T, ERROR_EXPERTS = 512, 32
SMOKE_MODELS = (MoeModel("smoke", 4, 2, 128, 128),)
SMOKE_TOKENS, SMOKE_ERROR_T = (40,), 24
WGRAD_PRODUCTS = ("dw13", "dw2")
TARGETS = {"vs_bf16_geomean": 1.5, "vs_bf16_slowest": 1.0, "vs_torchao_geomean": 1.5,
           "kgrouped_over_roofline_worst": 1.3, "kgrouped_bf16_over_roofline_worst": 1.3,
           "kgrouped_vs_deepgemm_skewed_geomean": 1.1}  # fmt: skip
LOWER_IS_BETTER = ("kgrouped_over_roofline_worst", "kgrouped_bf16_over_roofline_worst")
BF16_ROUNDING = 2.5e-3  # the fp32 sum rounded to nearest bf16 once: ~1.7e-3 (truncated: ~3.3e-3)


@dataclass(frozen=True)
class Case:
    set: str  # "layer" (forward and backward) or "kgrouped" (one weight-gradient product alone)
    model: str
    tokens: int
    routing: str
    product: str = ""  # kgrouped: "dw13" or "dw2"

    @property
    def label(self) -> str:
        return f"{self.set} {self.model} T{self.tokens} {self.routing}" + (f" {self.product}" if self.product else "")


def all_cases(models=MODELS, tokens=TRAIN_TOKENS) -> list[Case]:
    """Every layer case, then the k-grouped products of each."""
    layers = [Case("layer", m.name, t, r) for m in models for t in tokens for r in ROUTINGS]
    return layers + [Case("kgrouped", c.model, c.tokens, c.routing, p) for c in layers for p in WGRAD_PRODUCTS]


def _randn(gen, *shape, scale: float = 1.0, device=None) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=device) * scale).bfloat16()


def layer_inputs(model: MoeModel, tokens: int, kind: str, device, seed: int, experts: int | None = None):
    """x [T, H], routing, bf16 master weights and dOut of one case, seeded (``experts``: fewer, for the errors)."""
    model = MoeModel(model.name, experts or model.experts, model.top_k, model.hidden, model.inter)
    ids, weights = routing(model, tokens, kind, seed)
    gen = seeded_generator(seed, device, "train moe", model.name, model.experts, tokens, kind)
    e, h, i = model.experts, model.hidden, model.inter
    x = _randn(gen, tokens, h, device=device)
    w13 = _randn(gen, e, 2 * i, h, scale=1 / math.sqrt(h), device=device)
    w2 = _randn(gen, e, h, i, scale=1 / math.sqrt(i), device=device)
    dout = _randn(gen, tokens, h, device=device)
    return x, ids.to(device), weights.to(device), w13, w2, dout


def _leaves(x, weights, w13, w2) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in (x, weights, w13, w2)]


def _step(layer, leaves, ids, dout):
    """One training step's layer call: gradients set to None, forward, backward."""
    x, weights, w13, w2 = leaves
    for t in leaves:
        t.grad = None
    layer(x, ids, weights, w13, w2).backward(dout)


def _free(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def time_layer_case(model: MoeModel, case: Case, device, seed: int, timer, missing: dict, paths: dict) -> dict:
    """One layer row: each path's time per forward + backward, TFLOP/s, or why it did not run."""
    x, ids, weights, w13, w2, dout = layer_inputs(model, case.tokens, case.routing, device, seed)
    row = {**asdict(case), "label": case.label, "us": {}, "tflops": {}, "errors": {}}
    flops = 3 * layer_flops(model, case.tokens)
    for name in LAYER_PATHS:
        if name in missing or name not in paths:
            row["errors"][name] = missing.get(name, "missing: not importable here")
            continue
        leaves = None
        try:
            leaves = _leaves(x, weights, w13, w2)
            seconds = timer(lambda layer=paths[name], leaves=leaves: _step(layer, leaves, ids, dout))
            row["us"][name], row["tflops"][name] = seconds * 1e6, flops / seconds / 1e12
        except Exception as exc:  # a path that cannot run this case is reported, not fatal
            row["errors"][name] = error_text(exc)
        finally:
            leaves = None
            _free(device)
    us = row["us"]
    row["vs_bf16"] = {n: us[BF16] / t for n, t in us.items() if BF16 in us}
    row["vs_torchao"] = {n: us[TORCHAO] / t for n, t in us.items() if TORCHAO in us}
    return row


def _product_sources(model: MoeModel, case: Case, device, seed: int):
    """dY [R, N] and X [R, K] of one weight-gradient product, rows sorted by expert, and offs."""
    ids, _ = routing(model, case.tokens, case.routing, seed)
    _, _, offs = sort_rows(ids, model.experts)
    rows, h, i = case.tokens * model.top_k, model.hidden, model.inter
    n, k = (2 * i, h) if case.product == "dw13" else (h, i)
    gen = seeded_generator(seed, device, "train moe kgrouped", case.label)
    return _randn(gen, rows, n, scale=1 / math.sqrt(n), device=device), _randn(gen, rows, k, device=device), offs


def _float64_product(ops, rows: int) -> torch.Tensor:
    """float64 [E, rows, K] of each expert's product of the same FP8 operands (its first ``rows`` rows)."""
    a, b = dequantized64(ops.a_t[:rows], ops.a_scale_t[:rows]), dequantized64(ops.b_t, ops.b_scale_t)
    out = torch.zeros(len(ops.counts), rows, b.shape[0], dtype=torch.float64, device=a.device)
    for e, (first, blocks) in enumerate(expert_blocks(ops)):
        cols = slice(128 * first, 128 * (first + blocks))
        out[e] = a[:, cols] @ b[:, cols].t()
    return out


def _dense_rates(dy, x, timer) -> dict[str, float]:
    """TFLOP/s of fp8gemm.gemm on the dense [R, N, K] weight gradient: the forward form and the per-row form."""
    pad = (0, 0, 0, padded_rows(dy.shape[0]) - dy.shape[0])  # the forward form contracts whole 128-token blocks
    dy, x = F.pad(dy, pad), F.pad(x, pad)
    ops = wgrad_operands(dy, x, preferred_fp8_dtype(dy.device))
    m = dy.shape[0]
    flops = 2.0 * m * dy.shape[1] * x.shape[1]
    return {name: flops / timer(WGRAD_PREPARE[name](ops)) / 1e12 for name in (W_FORWARD_FORM, W_OURS)}


def time_kgrouped_case(model, case: Case, device, seed: int, timer, missing: dict, bandwidth: float) -> dict:
    """One k-grouped row: each path checked against float64 of the same FP8 operands, then timed; the roofline."""
    dy, x, offs = _product_sources(model, case, device, seed)
    ops = kgrouped_operands(dy, x, offs.to(device))
    flops = 2.0 * dy.shape[0] * dy.shape[1] * x.shape[1]
    check_rows = min(128, dy.shape[1])
    exact = _float64_product(ops, check_rows)
    row = {**asdict(case), "label": case.label, "n": dy.shape[1], "k": x.shape[1], "rows": dy.shape[0],
           "largest_expert_rows": max(ops.counts), "us": {}, "tflops": {}, "rel_err": {}, "errors": {}}  # fmt: skip
    for name in KGROUPED_PATHS:
        if name in missing:
            row["errors"][name] = missing[name]
            continue
        try:
            run = KGROUPED_PREPARE[name](ops)
            got = run()
            row["rel_err"][name] = err = relative_error(got[:, :check_rows], exact)
            if err > (1e-3 if got.dtype == torch.float32 else BF16_ROUNDING):
                row["errors"][name] = f"wrong: relative error {err:.3g} against float64 on {check_rows} rows; not timed"
                continue
            seconds = timer(run)
            row["us"][name], row["tflops"][name] = seconds * 1e6, flops / seconds / 1e12
        except Exception as exc:
            row["errors"][name] = error_text(exc)
        finally:
            run = None
            _free(device)
    row["dense_tflops"] = _dense_rates(dy, x, timer)
    compute_us = flops / (row["dense_tflops"][W_FORWARD_FORM] * 1e12) * 1e6
    row["roofline_us"] = max(compute_us, floor_us(kgrouped_bytes(ops), bandwidth))
    row["roofline_bound"] = "compute" if compute_us >= row["roofline_us"] else "memory"
    row["roofline_bf16_us"] = max(compute_us, floor_us(kgrouped_bytes(ops, out_bytes=2), bandwidth))
    # the same roofline at the dense weight gradient's own rate: what the per-column promotion allows this kernel
    wgrad_us = flops / (row["dense_tflops"][W_OURS] * 1e12) * 1e6
    row["wgrad_roofline_us"] = max(wgrad_us, floor_us(kgrouped_bytes(ops), bandwidth))
    return row


def gradient_errors(models, tokens: int, device, seed: int, paths: dict) -> list[dict]:
    """Each layer path's out and gradients against float64 autograd of the same bf16 inputs, per (H, I)."""
    rows = []
    for model in {(m.hidden, m.inter): m for m in models}.values():
        experts = min(model.experts, ERROR_EXPERTS)
        x, ids, weights, w13, w2, dout = layer_inputs(model, tokens, "uniform", device, seed, experts)
        exact = _grads(float64_layer(), [t.double() for t in (x, weights, w13, w2)], ids, dout.double())
        row = {"model": model.name, "experts": experts, "tokens": tokens, "rel_err": {}, "errors": {}}
        for name, layer in paths.items():
            try:
                got = _grads(layer, [x, weights.float(), w13, w2], ids, dout)
                row["rel_err"][name] = {key: relative_error(got[key], exact[key]) for key in exact}
            except Exception as exc:
                row["errors"][name] = error_text(exc)
            finally:
                _free(device)
        rows.append(row)
    return rows


def _error_text(r: dict) -> str:
    cells = [f"{n}: dx {e['dx']:.2e} dw13 {e['dw13']:.2e}" for n, e in r["rel_err"].items()]
    return f"gradient error at {r['tokens']} tokens, {r['model']} on {r['experts']} experts: " + "; ".join(cells)


def _grads(layer, tensors, ids, dout) -> dict[str, torch.Tensor]:
    x, weights, w13, w2 = (t.detach().clone().requires_grad_() for t in tensors)
    out = layer(x, ids, weights, w13, w2)
    out.backward(dout)
    return {"out": out, "dx": x.grad, "dw13": w13.grad, "dw2": w2.grad, "dweights": weights.grad}


# --- the summary and the run ---------------------------------------------------------------------------------------


def _stat(pairs: list[tuple[float, str]]) -> dict:
    out = {"geomean": geomean([p for p, _ in pairs]), "cases": len(pairs)}
    if pairs:
        (low, low_case), (high, high_case) = min(pairs), max(pairs)
        out.update(slowest=low, slowest_case=low_case, worst=high, worst_case=high_case)
    return out


def summarize(rows: list[dict]) -> dict:
    """Ours over bf16 and torchao (their time / ours), the k-grouped GEMM over its roofline and against DeepGEMM,
    and the targets' figures."""
    layer = [r for r in rows if r["set"] == "layer"]
    kgrouped = [r for r in rows if r["set"] == "kgrouped" and K_OURS in r["us"]]
    out = {
        "ours_vs_bf16": _stat([(r["vs_bf16"][OURS], r["label"]) for r in layer if OURS in r.get("vs_bf16", {})]),
        "ours_vs_torchao": _stat(
            [(r["vs_torchao"][OURS], r["label"]) for r in layer if OURS in r.get("vs_torchao", {})]
        ),
        "kgrouped_over_roofline": _stat([(r["us"][K_OURS] / r["roofline_us"], r["label"]) for r in kgrouped]),
        "kgrouped_bf16_over_roofline": _stat(
            [(r["us"][K_OURS_BF16] / r["roofline_bf16_us"], r["label"]) for r in kgrouped if K_OURS_BF16 in r["us"]]
        ),
        "kgrouped_vs_deepgemm_skewed": _stat(
            [
                (r["us"][K_DEEPGEMM] / r["us"][K_OURS], r["label"])
                for r in kgrouped
                if r["routing"] == "skewed" and K_DEEPGEMM in r["us"]
            ]
        ),  # fmt: skip
        "kgrouped_tflops_over_dense_wgrad": _stat(
            [(r["tflops"][K_OURS] / r["dense_tflops"][W_OURS], r["label"]) for r in kgrouped]
        ),
        # the measured bound of kgrouped_over_roofline: the roofline at the dense weight gradient's rate over it
        "roofline_bound_of_the_promotion": _stat(
            [(r["wgrad_roofline_us"] / r["roofline_us"], r["label"]) for r in kgrouped if "wgrad_roofline_us" in r]
        ),
        "kgrouped_over_wgrad_roofline": _stat(
            [(r["us"][K_OURS] / r["wgrad_roofline_us"], r["label"]) for r in kgrouped if "wgrad_roofline_us" in r]
        ),
    }
    measured = {
        "vs_bf16_geomean": out["ours_vs_bf16"]["geomean"],
        "vs_bf16_slowest": out["ours_vs_bf16"].get("slowest"),
        "vs_torchao_geomean": out["ours_vs_torchao"]["geomean"],
        "kgrouped_over_roofline_worst": out["kgrouped_over_roofline"].get("worst"),
        "kgrouped_bf16_over_roofline_worst": out["kgrouped_bf16_over_roofline"].get("worst"),
        "kgrouped_vs_deepgemm_skewed_geomean": out["kgrouped_vs_deepgemm_skewed"]["geomean"],
    }
    out["targets"] = {key: {"target": TARGETS[key], "measured": value, "met": _met(key, value)}
                      for key, value in measured.items()}  # fmt: skip
    return out


def _met(key: str, value) -> bool | None:
    if value is None or math.isnan(value):
        return None
    return value <= TARGETS[key] if key in LOWER_IS_BETTER else value >= TARGETS[key]


def run(device, *, smoke: bool = False, progress=print, earlier: dict | None = None, checkpoint=None,
        seed: int = DEFAULT_SEED, timer=None, models=None) -> dict:  # fmt: skip
    """Time every layer case, then every k-grouped case, after the gradient-error rows; ``earlier``: a cut-short
    report of the same GPU and software whose cases are kept; ``checkpoint(report)`` after every case; ``smoke``:
    tiny cases and two timed calls (any device, no measurement)."""
    device = torch.device(device)
    if device.type != "cuda" and not smoke and timer is None:
        raise ValueError(f"timing needs a GPU, got device {device}; smoke=True runs the harness on tiny cases")
    models = models or (SMOKE_MODELS if smoke else MODELS)
    cases = all_cases(models, SMOKE_TOKENS if smoke else TRAIN_TOKENS)
    timer = timer or (Timer(device, SMOKE_ITERS, 1, 0.0) if smoke else Timer(device))
    missing = missing_paths(device)
    paths, notes = layer_paths(device)
    paths = {n: p for n, p in paths.items() if n not in missing}
    env = environment(device, None, seed)
    bandwidth = copy_bandwidth(device, lambda calls: timer(calls[0]))
    env.update(method=f"eager; warm-up >= {timer.warmup_calls} calls and {timer.warmup_seconds} s, then the median of "
               f"{timer.iters} calls; layer: out.backward(dOut) with grads set to None first, TFLOP/s of 3 x 2 T k 3 H I; "
               "kgrouped: dW_e = dY_e^T X_e for every expert, TFLOP/s of 2 R N K", peers=peer_versions(),
               missing=missing, notes=notes, smoke=smoke, copy_bandwidth_bytes_per_s=bandwidth,
               roofline="max(2 R N K at the dense forward-form GEMM's TFLOP/s on [R, N, K], bytes of both FP8 operands, "
               "their scales and the fp32 output at the copy bandwidth); roofline_bf16: the same with the bf16 "
               "output; wgrad_roofline: the same with the dense per-row weight-gradient GEMM's TFLOP/s")  # fmt: skip
    labels = [c.label for c in cases]
    # a k-grouped row from before the bf16-out path or the weight-gradient roofline is timed again: every row has both
    rows = earlier_rows(
        earlier, env, lambda r: r["label"] in labels and (r["set"] != "kgrouped" or "wgrad_roofline_us" in r)
    )
    env["processes"] = (earlier or {}).get("environment", {}).get("processes", 0) + 1
    report = {"environment": env, "paths": {"layer": list(LAYER_PATHS), "kgrouped": list(KGROUPED_PATHS)},
              "models": [asdict(m) for m in models], "partial": True, "rows": rows}  # fmt: skip
    error_t = SMOKE_ERROR_T if smoke else ERROR_T
    gradient_errors_once(report, earlier, lambda: gradient_errors(models, error_t, device, seed, paths), _error_text,
                         progress, checkpoint)  # fmt: skip
    by_name = {m.name: m for m in models}

    def time_case(_: int, case: Case) -> dict:
        model = by_name[case.model]
        if case.set == "layer":
            return time_layer_case(model, case, device, seed, timer, missing, paths)
        return time_kgrouped_case(model, case, device, seed, timer, missing, bandwidth)

    time_cases(cases, report, time_case, summarize, lambda row: progress(row_text(row)), checkpoint)
    return report


def plot(report: dict, path: Path) -> None:
    """TFLOP/s of every path on every case (the layer's fwd+bwd, then each k-grouped product), log scale."""
    names = [p for p in (*LAYER_PATHS, *KGROUPED_PATHS) if any(p in r["tflops"] for r in report["rows"])]
    plot_cases(report, names, path, "TFLOP/s (log): layer fwd+bwd, k-grouped dW", "FP8 training, MoE experts layer")
