"""What ``fp8gemm bench`` shows where there is nothing to time: the block-scaled recipe's accuracy.

The same product is computed four ways (this library's block-scaled FP8, per-tensor FP8, per-row FP8
and bf16) on plain random data and on data with the outliers that make FP8 hard: tokens whose
magnitudes span four decades and a few activation channels 100x larger than the rest. Each result is
compared with the float64 product of the unquantised inputs, token by token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from fp8gemm import gemm, preferred_fp8_dtype, prepare_weight_scale, quantize_activation, quantize_weight

from .bench import DEFAULT_SEED, seeded_generator

DATA = {
    "normal": "Gaussian x and w",
    "outliers": "token magnitudes over four decades, 8 activation channels 100x",
}
RECIPES = {
    "block-scaled FP8 (fp8gemm)": "1x128 activation and 128x128 weight scales",
    "per-tensor FP8": "one scale for x, one for w",
    "per-row FP8": "one scale per token and per output channel",
    "bf16": "no quantisation, fp32 accumulation",
}
DEFAULT_SHAPES = [(128, 1024, 2048)]
OUTLIER_CHANNELS, OUTLIER_FACTOR, TOKEN_DECADES = 8, 100.0, 4


def make_data(kind: str, m: int, n: int, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [m, k] and weights [n, k] in float32 for one of DATA's kinds."""
    if kind not in DATA:
        raise ValueError(f"data kind must be one of {', '.join(DATA)}, got {kind!r}")
    x = torch.randn(m, k, generator=generator)
    w = torch.randn(n, k, generator=generator) * k**-0.5
    if kind == "outliers":
        x *= 10 ** (torch.rand(m, 1, generator=generator) * TOKEN_DECADES - (TOKEN_DECADES - 1))
        x[:, torch.randperm(k, generator=generator)[:OUTLIER_CHANNELS]] *= OUTLIER_FACTOR
    return x, w


def _fake_fp8(t: torch.Tensor, fp8_dtype: torch.dtype, dim: int | None) -> torch.Tensor:
    """``t`` rounded through FP8 with one scale per tensor (dim None) or per slice along ``dim``."""
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = amax.clamp_min(1e-12) / torch.finfo(fp8_dtype).max
    return (t / scale).to(fp8_dtype).float() * scale


def _recipe_outputs(x: torch.Tensor, w: torch.Tensor, device, backend: str | None) -> dict[str, torch.Tensor]:
    fp8 = preferred_fp8_dtype(device, backend)
    xd, wd = x.to(device), w.to(device)
    a, a_scale = quantize_activation(xd, fp8_dtype=fp8, backend=backend)
    b, b_scale = quantize_weight(wd, fp8_dtype=fp8)
    block = gemm(a, b, a_scale, prepare_weight_scale(b_scale, backend=backend), backend=backend)

    def fake_fp8_gemm(dim: int | None) -> torch.Tensor:  # FP8 values, fp32 products, bf16 out, as a kernel would
        return (_fake_fp8(xd, fp8, dim) @ _fake_fp8(wd, fp8, dim).t()).bfloat16()

    return {
        "block-scaled FP8 (fp8gemm)": block,
        "per-tensor FP8": fake_fp8_gemm(None),
        "per-row FP8": fake_fp8_gemm(1),
        "bf16": (xd.bfloat16() @ wd.bfloat16().t()).bfloat16(),
    }


def token_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative error of each output row (token): ||out_i - ref_i|| / ||ref_i||, in float64."""
    return (out.double().cpu() - ref).norm(dim=1) / ref.norm(dim=1)


def run(shapes, device: torch.device, backend: str | None = None, seed: int = DEFAULT_SEED) -> list[dict]:
    """One row per (shape, data kind, recipe): the median and the worst token's relative error, on data drawn
    from ``seed`` (the same seed, the same rows)."""
    rows = []
    for m, n, k in shapes:
        for kind in DATA:
            x, w = make_data(kind, m, n, k, seeded_generator(seed, "cpu", kind, m, n, k))
            ref = x.double() @ w.double().t()
            for recipe, out in _recipe_outputs(x, w, device, backend).items():
                err = token_errors(out, ref)
                rows.append({"m": m, "n": n, "k": k, "data": kind, "recipe": recipe,
                             "median_rel_err": err.median().item(), "worst_rel_err": err.max().item()})  # fmt: skip
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Bars of the median token error per recipe, one group per data kind (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(RECIPES)
    for i, recipe in enumerate(RECIPES):
        errors = [
            max(r["median_rel_err"] for r in rows if r["recipe"] == recipe and r["data"] == kind) for kind in DATA
        ]
        ax.bar([d + i * width for d in range(len(DATA))], errors, width, label=recipe)
    ax.set_xticks([d + 0.4 - width / 2 for d in range(len(DATA))])
    ax.set_xticklabels(list(DATA))
    ax.set_yscale("log")
    ax.set_ylabel("median relative error per token (worst shape)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
