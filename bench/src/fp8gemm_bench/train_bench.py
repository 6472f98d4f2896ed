"""``fp8gemm bench --train``: one Linear layer's forward and backward (y = x W^T, then dX and dW from dY), ours against
bf16 ``nn.Linear`` and torchao's ``Float8BlockwiseLinear`` with either of its GEMM backends, at the training shapes of
Llama-3-8B and of DeepSeek-V3's dense layers; and the weight-gradient GEMM alone (dW = dY^T X, both operands with 1x128
scales along the tokens, float32 out) against DeepGEMM's sm90 1D1D kernel and torch's blockwise ``scaled_mm``.

Timing (``train_timing``): eager calls as a training step makes them, each path warmed up (at least ``WARMUP_CALLS`` calls and
``WARMUP_SECONDS``, so every path starts from the same loaded clocks), then ``ITERS`` calls each between two CUDA
events; the median. The layer's step sets the gradients to None first (``zero_grad``'s default), so dW is written,
not accumulated. TFLOP/s count the three GEMMs (6 M N K) of the layer, 2 M N K of the GEMM.

Before timing, each weight-gradient path's output is checked on its first rows against the float64 product of the
same FP8 operands (bf16's against its own inputs); a wrong one is reported, not timed. The layer's accuracy is measured
apart, at ``ERROR_M`` tokens: y, dX and dW of each path against float64 autograd of the same bf16 inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from fp8gemm import preferred_fp8_dtype
from fp8gemm.testing.conformance import TOLERANCE, relative_error

from .bench import DEFAULT_SEED, earlier_rows, environment, error_text, geomean, installed_versions, seeded_generator
from .train_peers import (
    BF16,
    FORWARD_FORMS,
    LAYER_PATHS,
    LAYER_PREPARE,
    OURS,
    TORCHAO,
    W_BF16,
    W_DEEPGEMM,
    W_DEEPGEMM_FORWARD,
    W_FORWARD_FORM,
    W_OURS,
    W_OURS_ACC,
    W_SCALED_MM,
    WGRAD_PATHS,
    WGRAD_PREPARE,
    missing_paths,
    wgrad_operands,
)
from .train_timing import Timer, gradient_errors_once, time_cases

# (N, K) of each layer: out_features, in_features. Llama-3-8B: q,k,v fused (4096 + 2 x 1024), gate and up fused.
LLAMA3_8B_NK = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# DeepSeek-V3's dense layers (hidden 7168, dense intermediate 18432, 128 heads, q LoRA rank 1536, kv LoRA rank 512):
# the projections whose N and K are multiples of 128. kv_a (N = 512 + 64 = 576) and the fused q_a + kv_a (2112) are
# not: their output is contracted in the input gradient, so they stay in bf16 (their dW is in the GEMM-alone set).
DEEPSEEK_V3_NK = {
    "q_a": (1536, 7168),  # hidden -> q LoRA rank
    "q_b": (24576, 1536),  # q LoRA rank -> 128 heads x (128 + 64 rope)
    "kv_b": (32768, 512),  # kv LoRA rank -> 128 heads x (128 k + 128 v)
    "o": (7168, 16384),  # 128 heads x 128 -> hidden
    "gate_up": (36864, 7168),  # hidden -> 2 x 18432, fused
    "down": (7168, 18432),  # 18432 -> hidden
}
MODELS = {"llama-3-8b": LLAMA3_8B_NK, "deepseek-v3": DEEPSEEK_V3_NK}
TRAIN_M = (2048, 4096, 16384)
# DeepGEMM's own weight-gradient test shapes (tests/generators.py: 4096 tokens, its 7 (N, K) in the 1D1D form).
DEEPGEMM_WGRAD_NK = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DEEPGEMM_WGRAD_M = 4096
ERROR_M = 512  # tokens of the accuracy rows
CHECK_ROWS = 128  # rows of dW checked against float64 before a weight-gradient path is timed
# --smoke: the harness end to end in seconds on a CPU (the reference), no measurement.
SMOKE_NK = {"smoke": {"a": (256, 128), "b": (128, 384)}}
SMOKE_M, SMOKE_DEEPGEMM_NK, SMOKE_ERROR_M, SMOKE_ITERS = (256,), [(192, 256)], 128, 2
TARGETS = {
    "vs_bf16_geomean_m_ge_4096": 1.35,
    "vs_bf16_slowest_m_ge_2048": 1.0,
    "vs_torchao_fastest_geomean": 2.0,
    "vs_torchao_fastest_slowest": 1.3,
    "wgrad_vs_deepgemm_own_shapes": 1.0,
    "wgrad_over_forward_form_tflops": 0.75,
}


@dataclass(frozen=True)
class Case:
    set: str  # "layer" (forward and backward) or "wgrad" (the weight-gradient GEMM alone)
    model: str
    layer: str
    m: int  # tokens
    n: int  # out_features: dW's rows
    k: int  # in_features: dW's columns

    @property
    def label(self) -> str:
        return f"{self.set} {self.m}x{self.n}x{self.k} {self.model} {self.layer}"


def layer_cases(shapes=None, smoke: bool = False) -> list[Case]:
    """The layer cases: ``shapes`` ([(M, N, K)], N and K multiples of 128) or every TRAIN_M x model layer."""
    if shapes:
        for m, n, k in shapes:
            if n % 128 or k % 128:
                raise ValueError(
                    f"{m},{n},{k}: a trained layer needs N and K multiples of 128 (each is contracted in 128-wide "
                    f"blocks: K in the forward, N in the input gradient)"
                )
        return [Case("layer", "custom", "custom", m, n, k) for m, n, k in shapes]
    models, ms = (SMOKE_NK, SMOKE_M) if smoke else (MODELS, TRAIN_M)
    return [
        Case("layer", model, name, m, n, k) for model, nk in models.items() for name, (n, k) in nk.items() for m in ms
    ]


def wgrad_shape_cases(shapes) -> list[Case]:
    """``shapes`` [(M tokens, N, K)] for the weight-gradient GEMM alone: dW [N, K] over M tokens, N and K multiples
    of 16 (the output's rows and columns; M any: the last 128-token block is partial)."""
    for m, n, k in shapes:
        if n % 16 or k % 16:
            raise ValueError(f"{m},{n},{k}: the weight gradient [N, K] needs N and K multiples of 16")
    return [Case("layer", "custom", "custom", m, n, k) for m, n, k in shapes]


def wgrad_cases(layers: list[Case], smoke: bool = False, own_shapes: bool = True) -> list[Case]:
    """The weight-gradient GEMM on every layer case's sizes, then DeepGEMM's own wgrad shapes not among them."""
    cases = [Case("wgrad", c.model, c.layer, c.m, c.n, c.k) for c in layers]
    seen = {(c.m, c.n, c.k) for c in cases}
    own, own_m = (SMOKE_DEEPGEMM_NK, SMOKE_M[0]) if smoke else (DEEPGEMM_WGRAD_NK, DEEPGEMM_WGRAD_M)
    for n, k in own if own_shapes else []:
        if (own_m, n, k) not in seen:
            cases.append(Case("wgrad", "deepgemm-tests", f"N{n} K{k}", own_m, n, k))
    return cases


def is_deepgemm_own(row: dict) -> bool:
    """A weight-gradient case on one of DeepGEMM's own test shapes."""
    return row["set"] == "wgrad" and row["m"] == DEEPGEMM_WGRAD_M and (row["n"], row["k"]) in DEEPGEMM_WGRAD_NK


def _inputs(seed: int, device, key: str, m: int, n: int, k: int):
    gen = seeded_generator(seed, device, key, m, n, k)
    x = torch.randn(m, k, generator=gen, device=device).bfloat16()
    w = torch.randn(n, k, generator=gen, device=device).div_(math.sqrt(k)).bfloat16()
    dy = torch.randn(m, n, generator=gen, device=device).div_(math.sqrt(n)).bfloat16()
    return x, w, dy


def _free(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def time_layer_case(case: Case, device, seed: int, timer, missing: dict, order: int = 0) -> dict:
    """One layer row: each path's time per forward + backward, TFLOP/s (6 M N K), or why it did not run."""
    x, w, dy = _inputs(seed, device, "train layer", case.m, case.n, case.k)
    row = {**asdict(case), "label": case.label, "us": {}, "tflops": {}, "errors": {}, "host_us": {}, "gpu_us": {}}
    names = LAYER_PATHS if order % 2 == 0 else LAYER_PATHS[::-1]  # alternate, so no path always follows another
    for name in names:
        if name in missing:
            row["errors"][name] = missing[name]
            continue
        module = None
        try:
            module = LAYER_PREPARE[name](w)
            xg = x.detach().requires_grad_()

            def step(module=module, xg=xg):
                xg.grad = module.weight.grad = None
                module(xg).backward(dy)

            seconds = timer(step)
            row["us"][name] = seconds * 1e6
            row["tflops"][name] = 6.0 * case.m * case.n * case.k / seconds / 1e12
            _split_times(row, name, timer, step)
        except Exception as exc:  # a path that cannot run this case is reported, not fatal
            row["errors"][name] = error_text(exc)
        finally:
            module = xg = step = None
            _free(device)
    row["us"] = {n: row["us"][n] for n in LAYER_PATHS if n in row["us"]}  # the fixed order, whatever ran first
    row["tflops"] = {n: row["tflops"][n] for n in LAYER_PATHS if n in row["tflops"]}
    for key in ("host_us", "gpu_us"):
        row[key] = {n: row[key][n] for n in LAYER_PATHS if n in row[key]}
    _ratios(row)
    return row


def _split_times(row: dict, name: str, timer, step) -> None:
    """The path's host and GPU time per call apart, where the timer measures them (a GPU; absent where the calls
    outlasted its sleep kernel); a failure here leaves the timed row as it is, with a note."""
    try:
        split = timer.split(step) if hasattr(timer, "split") else None
    except Exception as exc:  # the time is in; only the split is lost, and said
        split = None
        row.setdefault("notes", {})[name] = f"no host/GPU split: {error_text(exc)}"
    if split:
        row["host_us"][name], row["gpu_us"][name] = split[0] * 1e6, split[1] * 1e6


def _ratios(row: dict) -> None:
    """Each path's speed over bf16's and over torchao's faster backend (their time / its time)."""
    us = row["us"]
    row["vs_bf16"] = {n: us[BF16] / t for n, t in us.items() if BF16 in us}
    ao = [us[n] for n in TORCHAO if n in us]
    row["vs_torchao_fastest"] = {n: min(ao) / t for n, t in us.items()} if ao else {}
    # bf16's time over the path's host time alone: the most it could reach with free kernels, at its host's pace
    host = row.get("host_us", {})
    row["vs_bf16_at_host_pace"] = {n: us[BF16] / t for n, t in host.items() if BF16 in us}


def dequantized64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 rows [R, M_pad] with 1x128 scales [R, M_pad/128] in float64."""
    return q.double() * scale.double().repeat_interleave(128, dim=1)[:, : q.shape[1]]


def time_wgrad_case(case: Case, device, seed: int, timer, missing: dict, fp8_dtype, order: int = 0) -> dict:
    """One weight-gradient row: dW = dY^T X over M tokens, [N, K] float32; each path checked, then timed."""
    x, _, dy = _inputs(seed, device, "train wgrad", case.m, case.n, case.k)
    ops = wgrad_operands(dy, x, fp8_dtype)
    rows = min(CHECK_ROWS, case.n)
    ref_fp8 = dequantized64(ops.dy_t[:rows], ops.dy_t_scale[:rows]) @ dequantized64(ops.x_t, ops.x_t_scale).t()
    ref_bf16 = dy[:, :rows].double().t() @ x.double()
    row = {**asdict(case), "label": case.label, "us": {}, "tflops": {}, "rel_err": {}, "errors": {}, "notes": {}}
    names = WGRAD_PATHS if order % 2 == 0 else WGRAD_PATHS[::-1]
    for name in names:
        if name in missing:
            row["errors"][name] = missing[name]
            continue
        run = None
        try:
            run = WGRAD_PREPARE[name](ops)
            out = run()
            if name in FORWARD_FORMS:  # another quantization of X: held against the unquantized product, untested
                row["rel_err"][name] = relative_error(out[:rows], ref_bf16)
            else:
                err = relative_error(out[:rows], ref_bf16 if name == W_BF16 else ref_fp8)
                row["rel_err"][name] = err
                if err > TOLERANCE[torch.bfloat16]:
                    row["errors"][name] = f"wrong: relative error {err:.3g} against float64 on {rows} rows; not timed"
                    continue
            if getattr(run, "out_dtype", torch.float32) is not torch.float32:
                row["notes"][name] = f"{run.out_dtype} output (float32 refused by this build)"
            seconds = timer(getattr(run, "timed", run))
            row["us"][name] = seconds * 1e6
            row["tflops"][name] = 2.0 * case.m * case.n * case.k / seconds / 1e12
        except Exception as exc:
            row["errors"][name] = error_text(exc)
        finally:
            run = out = None
            _free(device)
    row["us"] = {n: row["us"][n] for n in WGRAD_PATHS if n in row["us"]}
    row["tflops"] = {n: row["tflops"][n] for n in WGRAD_PATHS if n in row["tflops"]}
    if not row["notes"]:
        del row["notes"]
    return row


def gradient_errors(nks, m: int, device, seed: int, missing: dict) -> list[dict]:
    """y, dX and dW of each layer path at ``m`` tokens against float64 autograd of the same bf16 x, W and dY (relative
    Frobenius error), one row per (N, K)."""
    rows = []
    for n, k in nks:
        x, w, dy = _inputs(seed, device, "train grad error", m, n, k)
        x64, w64, dy64 = x.double(), w.double(), dy.double()
        exact = {"y": x64 @ w64.t(), "dx": dy64 @ w64, "dw": dy64.t() @ x64}
        row = {"m": m, "n": n, "k": k, "rel_err": {}, "errors": {}}
        for name in LAYER_PATHS:
            if name in missing:
                row["errors"][name] = missing[name]
                continue
            try:
                module = LAYER_PREPARE[name](w)
                xg = x.detach().requires_grad_()
                y = module(xg)
                y.backward(dy)
                got = {"y": y, "dx": xg.grad, "dw": module.weight.grad}
                row["rel_err"][name] = {key: relative_error(got[key], exact[key]) for key in exact}
            except Exception as exc:
                row["errors"][name] = error_text(exc)
            finally:
                module = xg = y = got = None
                _free(device)
        rows.append(row)
    return rows


def _stat(ratios: list[tuple[float, str]]) -> dict:
    values = [r for r, _ in ratios]
    slowest = min(ratios) if ratios else (math.nan, None)
    return {"geomean": geomean(values), "slowest": slowest[0], "slowest_case": slowest[1], "cases": len(values)}


def _tflops_ratio(rows: list[dict], path: str, against: str) -> dict:
    return _stat([(r["tflops"][path] / r["tflops"][against], r["label"]) for r in rows
                  if {path, against} <= r["tflops"].keys()])  # fmt: skip


def summarize(rows: list[dict]) -> dict:
    """Speed ratios (the other path's time over the path's) over the cases both ran, and the targets' figures."""
    layer = [r for r in rows if r["set"] == "layer"]
    wgrad = [r for r in rows if r["set"] == "wgrad"]
    out: dict = {"layer": {}, "wgrad": {}}
    for name in LAYER_PATHS:
        if name == BF16:
            continue
        block = {
            "vs_bf16": _stat([(r["vs_bf16"][name], r["label"]) for r in layer if name in r["vs_bf16"]]),
            "vs_bf16_m_ge_4096": _stat(
                [(r["vs_bf16"][name], r["label"]) for r in layer if name in r["vs_bf16"] and r["m"] >= 4096]
            ),
            "vs_bf16_m_ge_2048": _stat(
                [(r["vs_bf16"][name], r["label"]) for r in layer if name in r["vs_bf16"] and r["m"] >= 2048]
            ),
            "vs_bf16_at_host_pace_m_ge_2048": _stat(
                [
                    (r["vs_bf16_at_host_pace"][name], r["label"])
                    for r in layer
                    if name in r.get("vs_bf16_at_host_pace", {}) and r["m"] >= 2048
                ]  # fmt: skip
            ),
        }
        if name not in TORCHAO:
            block["vs_torchao_fastest"] = _stat(
                [(r["vs_torchao_fastest"][name], r["label"]) for r in layer if name in r["vs_torchao_fastest"]]
            )
        out["layer"][name] = block

    def wgrad_ratio(other: str, keep=lambda r: True):
        return _stat([(r["us"][other] / r["us"][W_OURS], r["label"]) for r in wgrad
                      if keep(r) and {other, W_OURS} <= r["us"].keys()])  # fmt: skip

    out["wgrad"]["ours_vs_deepgemm_own_shapes"] = wgrad_ratio(W_DEEPGEMM, is_deepgemm_own)
    out["wgrad"]["ours_vs_deepgemm"] = wgrad_ratio(W_DEEPGEMM)
    out["wgrad"]["ours_vs_scaled_mm"] = wgrad_ratio(W_SCALED_MM)
    out["wgrad"]["ours_vs_bf16"] = wgrad_ratio(W_BF16)
    out["wgrad"]["ours_accumulate_time_over_plain"] = wgrad_ratio(W_OURS_ACC)
    out["wgrad"]["ours_tflops_over_forward_form"] = _tflops_ratio(wgrad, W_OURS, W_FORWARD_FORM)
    # the peer's own 1D1D kernel over its forward GEMM on the same sizes: what the per-column promotion costs there
    out["wgrad"]["deepgemm_tflops_over_its_forward_form"] = _tflops_ratio(wgrad, W_DEEPGEMM, W_DEEPGEMM_FORWARD)
    ours = out["layer"].get(OURS, {})
    measured = {
        "vs_bf16_geomean_m_ge_4096": ours.get("vs_bf16_m_ge_4096", {}).get("geomean"),
        "vs_bf16_slowest_m_ge_2048": ours.get("vs_bf16_m_ge_2048", {}).get("slowest"),
        "vs_torchao_fastest_geomean": ours.get("vs_torchao_fastest", {}).get("geomean"),
        "vs_torchao_fastest_slowest": ours.get("vs_torchao_fastest", {}).get("slowest"),
        "wgrad_vs_deepgemm_own_shapes": out["wgrad"]["ours_vs_deepgemm_own_shapes"]["geomean"],
        "wgrad_over_forward_form_tflops": out["wgrad"]["ours_tflops_over_forward_form"]["geomean"],
    }
    out["targets"] = {
        key: {
            "target": TARGETS[key],
            "measured": value,
            "met": None if value is None or math.isnan(value) else value >= TARGETS[key],
        }  # fmt: skip
        for key, value in measured.items()
    }
    return out


def peer_versions() -> dict[str, str]:
    """The installed versions of the training peers, kept in each report's environment."""
    return installed_versions(("torchao", "deep_gemm", "triton"))


def run(device, shapes=None, *, smoke: bool = False, progress=print, earlier: dict | None = None, checkpoint=None,
        seed: int = DEFAULT_SEED, timer=None, wgrad_only: bool = False) -> dict:  # fmt: skip
    """Time every layer case, then every weight-gradient case (``shapes`` narrows both to those (M, N, K)), after the
    accuracy rows; ``earlier``: a cut-short report of the same GPU and software whose cases are kept;
    ``checkpoint(report)`` after every case; ``smoke``: tiny cases and two timed calls (any device, no measurement);
    ``wgrad_only``: the weight-gradient cases alone (no layer rows, no accuracy rows)."""
    device = torch.device(device)
    if device.type != "cuda" and not smoke and timer is None:
        raise ValueError(f"timing needs a GPU, got device {device}; smoke=True runs the harness on tiny cases")
    layers = wgrad_shape_cases(shapes) if wgrad_only and shapes else layer_cases(shapes, smoke)
    cases = ([] if wgrad_only else layers) + wgrad_cases(layers, smoke, own_shapes=not shapes)
    timer = timer or (Timer(device, SMOKE_ITERS, 1, 0.0) if smoke else Timer(device))
    missing = missing_paths(device)
    env = environment(device, None, seed)
    env.update(
        method=f"eager; warm-up >= {timer.warmup_calls} calls and {timer.warmup_seconds} s, then the median of "
        f"{timer.iters} calls each between CUDA events; layer: y = x W^T, y.backward(dY) with grads set to None "
        f"first, TFLOP/s of 6 M N K; wgrad: dW = dY^T X, TFLOP/s of 2 M N K",
        peers=peer_versions(),
        missing=missing,
        smoke=smoke,
        gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    )
    labels = [c.label for c in cases]
    rows = earlier_rows(earlier, env, lambda r: r["label"] in labels)
    env["processes"] = (earlier or {}).get("environment", {}).get("processes", 0) + 1
    report = {"environment": env, "paths": {"layer": list(LAYER_PATHS), "wgrad": list(WGRAD_PATHS)}, "partial": True,
              "rows": rows}  # fmt: skip
    error_m = SMOKE_ERROR_M if smoke else ERROR_M
    nks = [] if wgrad_only else list(dict.fromkeys((c.n, c.k) for c in layers))
    gradient_errors_once(report, earlier, lambda: gradient_errors(nks, error_m, device, seed, missing),
                         _error_text, progress, checkpoint)  # fmt: skip
    fp8 = preferred_fp8_dtype(device)

    def time_case(i: int, case: Case) -> dict:
        if case.set == "layer":
            return time_layer_case(case, device, seed, timer, missing, i)
        return time_wgrad_case(case, device, seed, timer, missing, fp8, i)

    time_cases(cases, report, time_case, summarize, lambda row: progress(_row_text(row)), checkpoint)
    return report


def _error_text(r: dict) -> str:
    cells = [f"{n}: dx {e['dx']:.2e} dw {e['dw']:.2e}" for n, e in r["rel_err"].items()]
    return f"gradient error at {r['m']}x{r['n']}x{r['k']}: " + "; ".join(cells)


def _row_text(row: dict) -> str:
    unit = "TFLOP/s fwd+bwd" if row["set"] == "layer" else "TFLOP/s"
    cells = [f"{name} {t:.0f}" if t >= 10 else f"{name} {t:.3g}" for name, t in row["tflops"].items()]
    wrong = [f"{name}: {why}" for name, why in row["errors"].items() if not why.startswith(("missing", "not run"))]
    split = [f"{name} {h:.0f}/{row['gpu_us'][name]:.0f}" for name, h in row.get("host_us", {}).items()]
    return (f"{row['label']} ({unit}): " + ", ".join(cells) + ("  host/GPU us: " + ", ".join(split) if split else "")
            + ("  errors: " + "; ".join(wrong) if wrong else ""))  # fmt: skip


def _plot_layer(ax, layer: list[dict]) -> None:
    names = [p for p in LAYER_PATHS if p != BF16 and any(p in r["vs_bf16"] for r in layer)]
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [r["vs_bf16"].get(name, 0.0) for r in layer]
        ax.bar([j + i * width for j in range(len(layer))], ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    centre = width * (len(names) - 1) / 2
    ax.set_xticks([j + centre for j in range(len(layer))], [r["label"][6:] for r in layer], rotation=75, fontsize=6,
                  ha="right")  # fmt: skip
    ax.set_ylabel("forward + backward speed vs bf16 nn.Linear")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def plot(report: dict, path: Path) -> None:
    """Top: the layer's forward + backward speed over bf16 per case; bottom: the weight-gradient GEMM's TFLOP/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer = [r for r in report["rows"] if r["set"] == "layer"]
    wgrad = [r for r in report["rows"] if r["set"] == "wgrad"]
    panels = 2 if layer else 1  # --wgrad: the weight-gradient panel alone
    fig, axes = plt.subplots(panels, 1, figsize=(max(10, 0.55 * max(len(layer), len(wgrad), 1)), 5 * panels),
                             squeeze=False)  # fmt: skip
    top, bottom = axes[0][0], axes[-1][0]
    if layer:
        _plot_layer(top, layer)
    names = [p for p in WGRAD_PATHS if any(p in r["tflops"] for r in wgrad)]
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [r["tflops"].get(name, 0.0) for r in wgrad]
        bottom.bar([j + i * width for j in range(len(wgrad))], ys, width, label=name)
    centre = width * (len(names) - 1) / 2
    bottom.set_xticks([j + centre for j in range(len(wgrad))], [r["label"][6:] for r in wgrad], rotation=75,
                      fontsize=6, ha="right")  # fmt: skip
    bottom.set_ylabel("weight-gradient GEMM, TFLOP/s")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    env = report["environment"]
    peers = ", ".join(f"{k} {v}" for k, v in env.get("peers", {}).items())
    top.set_title(f"FP8 training, one Linear layer: {env['device']}, driver {env.get('driver')}, torch {env['torch']}"
                  f"{', ' + peers if peers else ''}, {env['date'][:10]}", fontsize=8)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
