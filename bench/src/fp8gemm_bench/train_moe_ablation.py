"""Where the Qwen3-MoE convergence run's FP8 gap comes from (``python -m fp8gemm_bench.train_moe_ablation``): the run
of ``train_moe_run`` (same model, seed, batches and steps) in several modes, each a separate training run:

* ``bf16``: the model as built; ``fp8``: ``convert(model, training=True)`` (experts and attention projections);
* ``fp8 experts``: only the experts converted; ``fp8 attention``: only the attention projections;
* ``emulated experts``: the experts in float32 torch operations with every operand of the DeepSeek-V3 recipe's six
  GEMMs quantized and dequantized in place (1x128 activation and gradient blocks, 128x128 weight blocks, the weight
  gradients' blocks along each expert's own tokens): the recipe itself, with none of fp8gemm's kernels;
* ``emulated experts (bf16 intermediate)``: the same with the down projection's input left unquantized.

Where ``fp8 experts`` lands on ``emulated experts``, the gap is the recipe's at this size, not the kernels'.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from fp8gemm.nn import convert

from . import train_moe_run, train_run
from .train_model import split_corpus, stdlib_corpus

BF16, FP8 = train_run.BF16, "fp8"
FP8_EXPERTS, FP8_ATTENTION = "fp8 experts", "fp8 attention"
EMULATED, EMULATED_BF16_MID = "emulated experts", "emulated experts (bf16 intermediate)"
MODES = (BF16, FP8, FP8_EXPERTS, FP8_ATTENTION, EMULATED, EMULATED_BF16_MID)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
FP8_MAX = 448.0  # float8_e4m3fn


def fake_quantize(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [..., m, n] quantized to float8_e4m3fn and back in blocks of rows x cols (amax / 448 scales), in float32;
    the last blocks partial (zero padding never sets a scale)."""
    m, n = t.shape[-2:]
    padded = F.pad(t.float(), (0, -n % cols, 0, -m % rows))
    pm, pn = padded.shape[-2:]
    blocks = padded.reshape(-1, pm // rows, rows, pn // cols, cols)
    scale = blocks.abs().amax(dim=(2, 4), keepdim=True).clamp(min=1e-12) / FP8_MAX
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (codes.float() * scale).reshape(padded.shape)[..., :m, :n]


def along_k(t: torch.Tensor) -> torch.Tensor:
    return fake_quantize(t, 1, 128)


def weight_blocks(w: torch.Tensor) -> torch.Tensor:
    return fake_quantize(w, 128, 128)


class RecipeMatmul(torch.autograd.Function):
    """a [E, M, K] @ w [E, N, K]^T per expert, every operand of the forward, input-gradient and weight-gradient GEMMs
    quantized as the recipe does (``quantize_a=False``: a and its transpose kept in float32)."""

    @staticmethod
    def forward(ctx, a, w, quantize_a: bool):
        ctx.save_for_backward(a, w)
        ctx.quantize_a = quantize_a
        return (along_k(a) if quantize_a else a.float()) @ weight_blocks(w).transpose(-1, -2)

    @staticmethod
    def backward(ctx, dy):
        a, w = ctx.saved_tensors
        dy = dy.float()
        da = along_k(dy) @ weight_blocks(w)
        a_t = a.float().transpose(-1, -2)
        dw = along_k(dy.transpose(-1, -2)) @ (along_k(a_t) if ctx.quantize_a else a_t).transpose(-1, -2)
        return da.to(a.dtype), dw.to(w.dtype), None


def emulated_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Qwen3MoeExperts' forward on the recipe's numerics: each expert's rows padded to a common multiple of 128 (the
    padding is zeros, so every block restarts at an expert's first row, as fp8gemm's k-grouped blocks do)."""
    tokens, top_k = top_k_index.shape
    experts = self.num_experts
    with torch.no_grad():
        ids = top_k_index.reshape(-1)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=experts)
        rows = max(128, -(-int(counts.max()) // 128) * 128)
        slot = torch.arange(tokens * top_k, device=ids.device) - (torch.cumsum(counts, 0) - counts)[ids[order]]
        place = ids[order] * rows + slot
        token, choice = order // top_k, order % top_k
    x = hidden_states.new_zeros(experts * rows, hidden_states.shape[1])
    x = x.index_copy(0, place, hidden_states[token]).view(experts, rows, -1)
    gate, up = RecipeMatmul.apply(x, self.gate_up_proj, True).chunk(2, dim=-1)
    y = RecipeMatmul.apply(F.silu(gate) * up, self.down_proj, self.quantize_intermediate)
    y = y.reshape(experts * rows, -1)[place] * top_k_weights[token, choice, None].float()
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    return out.index_add(0, token, y).to(hidden_states.dtype)


def prepare_model(mode: str, cfg, seed: int, device):
    """``train_run.prepare_model``'s contract for the modes above."""
    model = train_moe_run.build_model(cfg, seed, device)
    if mode == FP8:
        convert(model, training=True)
    elif mode == FP8_EXPERTS:
        convert(model, training=True, skip=("lm_head", *ATTENTION))
    elif mode == FP8_ATTENTION:
        convert(model, training=True, skip=("lm_head", "experts"))
    elif mode in (EMULATED, EMULATED_BF16_MID):
        for experts in model.experts_modules():
            experts.quantize_intermediate = mode == EMULATED
            experts.forward = types.MethodType(emulated_experts_forward, experts)
    elif mode != BF16:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    model.count_routing()
    return model, None


def run(device, modes=MODES, *, steps: int = train_moe_run.STEPS, seed: int = 0, smoke: bool = False,
        progress=print, checkpoint=None) -> dict:  # fmt: skip
    """Each mode's run, in order; ``summary``: final and held-out losses over the first mode's."""
    cfg = train_moe_run.SMOKE if smoke else train_moe_run.MOE
    batch, seq, warmup = train_moe_run.BATCH, train_moe_run.SEQ, train_moe_run.WARMUP
    if smoke:
        steps, batch, seq, warmup = (train_run.SMOKE_RUN[k] for k in ("steps", "batch", "seq", "warmup"))
    data, corpus = stdlib_corpus(limit_bytes=train_run.SMOKE_RUN["corpus_bytes"] if smoke else None)
    text, held_out = split_corpus(data)
    env = train_run.environment(torch.device(device), None, seed)
    env.update(gpu_name=torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None)
    report = {"environment": env, "kind": "convergence ablation", "model": cfg.as_dict(), "corpus": corpus,
              "training": {"steps": steps, "batch": batch, "seq": seq, "lr": train_moe_run.LR, "warmup": warmup},
              "runs": {}}  # fmt: skip
    for mode in modes:
        report["runs"][mode] = train_run.train(
            mode, cfg, text, held_out, steps=steps, batch=batch, seq=seq, lr=train_moe_run.LR, warmup=warmup,
            seed=seed, device=torch.device(device), progress=progress, prepare=prepare_model,
            eval_batches=train_run.SMOKE_RUN["eval_batches"] if smoke else train_run.EVAL_BATCHES,
        )  # fmt: skip
        report["summary"] = summarize(report["runs"], modes[0])
        if checkpoint:
            checkpoint(report)
    return report


def summarize(runs: dict, base: str) -> dict:
    steps = min(r["steps"] for r in runs.values())
    final = {mode: train_run.final_loss(r["losses"], steps) for mode, r in runs.items()}
    return {
        "compared_steps": steps,
        "final_loss": final,
        "final_loss_ratio": {mode: loss / final[base] for mode, loss in final.items()},
        "eval_loss": {mode: r["eval_loss"] for mode, r in runs.items()},
        "of": base,
    }


def plot(report: dict, path: Path) -> None:
    """Each mode's loss curve (a 20-step mean) and its ratio to the first mode's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env, runs, base = report["environment"], report["runs"], report["summary"]["of"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8), height_ratios=[2, 1], sharex=True)
    reference = train_run.smooth_losses(runs[base]["losses"])
    for mode, r in runs.items():
        curve = train_run.smooth_losses(r["losses"])
        steps = range(1, len(curve) + 1)
        top.plot(steps, curve, label=mode, linewidth=1.1)
        bottom.plot(steps, [x / y for x, y in zip(curve, reference, strict=False)], linewidth=1.1)
    top.set_ylabel("training loss (nats per byte)")
    top.legend(fontsize=8)
    top.set_title(f"{report['model']['name']}: where the FP8 gap comes from; {env['device']}, torch {env['torch']}, "
                  f"{env['date'][:10]}", fontsize=8)  # fmt: skip
    bottom.axhline(1.0, color="gray", linewidth=0.6)
    bottom.set_ylabel(f"loss / {base}")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, the first is the base of the ratios")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=train_moe_run.STEPS)
    p.add_argument("--smoke", action="store_true", help="tiny model, a few steps (any device)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    modes = tuple(args.modes.split(","))
    for mode in modes:
        if mode not in MODES:
            p.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")

    def save(report):
        args.json.write_text(json.dumps(report, indent=1, default=str))

    report = run(args.device, modes, steps=args.steps, smoke=args.smoke, checkpoint=save,
                 progress=lambda *a: print(*a, flush=True))  # fmt: skip
    if args.plot:
        plot(report, args.plot)
    for mode, ratio in report["summary"]["final_loss_ratio"].items():
        print(f"{mode:40s} final loss {report['summary']['final_loss'][mode]:.4f} ({ratio:.3f}x {modes[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
