"""``fp8gemm bench --train-run``: a byte-level Llama-style model (``train_model``) trained on the Python standard
library's source twice, in bf16 and after ``fp8gemm.nn.convert(model, training=True)``, from the same seed, weights
and batches: both loss curves, the final loss (the mean of the last ``FINAL_WINDOW`` steps) and its ratio, peak
memory and tokens per second. ``--throughput``: a Llama-3-8B-shaped model of 8 layers, tokens per second of each over
``THROUGHPUT_STEPS`` steps after ``THROUGHPUT_WARMUP``.

Both runs are eager (no ``torch.compile``, no CUDA graphs). The convergence run keeps float32 master weights (the
model computes in bf16; ``train_model.MasterAdamW``); the throughput run keeps its weights and AdamW states in bf16
(14 GB for the 1.75B parameters). Peak memory is ``torch.cuda.max_memory_allocated`` from the built model on.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from pathlib import Path

import torch
from fp8gemm.nn import Fp8TrainingLinear, convert
from fp8gemm.training import reuse_quantized_weights

from .bench import DEFAULT_SEED, environment
from .train_model import (
    CONVERGENCE,
    LLAMA3_8B_8_LAYERS,
    SMOKE,
    Batches,
    MasterAdamW,
    ModelConfig,
    build_model,
    loss_fn,
    lr_at,
    split_corpus,
    stdlib_corpus,
)

BF16, FP8 = "bf16", "fp8gemm convert(training=True)"
MODES = (BF16, FP8)
STEPS, BATCH, SEQ, LR, WARMUP = 1000, 16, 512, 1e-3, 50
FINAL_WINDOW = 50
TIMING_SKIP = 10  # steps before tokens per second are counted (allocator, first-call work)
EVAL_BATCHES = 8
TIME_BUDGET = 450.0  # seconds for both runs: one that reaches it stops there and says so
THROUGHPUT_BATCH, THROUGHPUT_SEQ, THROUGHPUT_WARMUP, THROUGHPUT_STEPS = 4, 2048, 5, 20
SMOKE_RUN = {"steps": 4, "batch": 2, "seq": 64, "warmup": 2, "corpus_bytes": 200_000, "eval_batches": 2}
SMOKE_THROUGHPUT = {"batch": 1, "seq": 128, "warmup": 1, "steps": 2}
TARGETS = {"final_loss_ratio_within": 0.01, "tokens_per_s_ratio": 1.25}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _peak_bytes(device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if torch.device(device).type == "cuda" else None


def _reset_peak(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def prepare_model(mode: str, cfg: ModelConfig, seed: int, device, on_device: bool = False):
    """The model of ``mode``: bf16 as built, or converted for FP8 training; with the conversion report (or None)."""
    model = build_model(cfg, seed, device, on_device=on_device)
    if mode == BF16:
        return model, None
    return model, conversion_record(model, convert(model, training=True))


def conversion_record(model, report) -> dict:
    """What ``convert`` did to ``model``, for a run's report: the converted names, the kept ones with why, and the
    count of ``Fp8TrainingLinear`` layers."""
    return {"converted": list(report.converted), "skipped": dict(report.skipped),
            "fp8_training_linear_layers": sum(isinstance(m, Fp8TrainingLinear) for m in model.modules())}  # fmt: skip


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, batch: int, seq: int, seed: int, device, batches: int) -> float:
    """Mean loss over ``batches`` windows of the held-out text drawn from ``seed``."""
    sampler = Batches(tokens, batch, seq, seed, device)
    return statistics.fmean(loss_fn(model, *next(sampler)).item() for _ in range(batches))


def train(mode: str, cfg: ModelConfig, text: torch.Tensor, held_out: torch.Tensor, *, steps: int, batch: int,
          seq: int, lr: float, warmup: int, seed: int, device, deadline: float | None = None,
          master_dtype=torch.float32, eval_batches: int = EVAL_BATCHES, progress=print, prepare=prepare_model,
          trained_fields=None) -> dict:  # fmt: skip
    """One convergence run; stops early (and says so) past ``deadline`` (``time.perf_counter()`` seconds).
    ``prepare(mode, cfg, seed, device)`` builds the model (``prepare_model``'s contract); ``trained_fields(model)``,
    if given, adds its fields to the result once the model is trained and evaluated."""
    device = torch.device(device)
    model, conversion = prepare(mode, cfg, seed, device)
    _reset_peak(device)
    opt = MasterAdamW(model, lr, master_dtype=master_dtype)
    batches = Batches(text, batch, seq, seed, device)
    losses, timed_from, t0, stopped = [], min(TIMING_SKIP, steps // 2), None, None
    for step in range(steps):
        if step == timed_from:
            _sync(device)
            t0 = time.perf_counter()
        opt.set_lr(lr_at(step, steps, lr, warmup))
        loss = loss_fn(model, *next(batches))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        if step % 100 == 99 or step == steps - 1:
            progress(f"{mode}: step {step + 1}/{steps}, loss {loss.item():.4f}")
        if deadline is not None and step % 10 == 9 and step + 1 < steps and time.perf_counter() > deadline:
            stopped = step + 1
            progress(f"{mode}: stopped at step {stopped}: the time budget is spent")
            break
    _sync(device)
    seconds = time.perf_counter() - t0 if t0 is not None else math.nan
    done = len(losses)
    result = {
        "steps": done,
        "stopped_early_at": stopped,
        "losses": torch.stack(losses).float().cpu().tolist(),
        "tokens_per_s": (done - timed_from) * batch * seq / seconds if done > timed_from else math.nan,
        "seconds_timed": seconds,
        "peak_memory_bytes": _peak_bytes(device),
        "eval_loss": evaluate(model, held_out, batch, seq, seed + 1, device, eval_batches),
    }
    if conversion:
        result["conversion"] = conversion
    if trained_fields:
        result.update(trained_fields(model))
    del model, opt, batches, losses
    _free(device)
    return result


def final_loss(losses: list[float], steps: int, window: int = FINAL_WINDOW) -> float:
    """The mean loss of steps ``steps - window`` to ``steps`` (the first ``steps`` of a curve)."""
    part = losses[max(0, steps - window) : steps]
    return statistics.fmean(part) if part else math.nan


def summarize_convergence(runs: dict) -> dict:
    """Final losses over the steps both runs made, their ratio, and the memory and speed ratios."""
    if not all(m in runs for m in MODES):
        return {}
    steps = min(runs[m]["steps"] for m in MODES)
    final = {m: final_loss(runs[m]["losses"], steps) for m in MODES}
    ratio = final[FP8] / final[BF16]
    peak = {m: runs[m]["peak_memory_bytes"] for m in MODES}
    return {
        "compared_steps": steps,
        "final_loss": final,
        "final_loss_ratio": ratio,
        "final_loss_within_1pct": abs(ratio - 1) <= TARGETS["final_loss_ratio_within"],
        "eval_loss": {m: runs[m]["eval_loss"] for m in MODES},
        "peak_memory_ratio": peak[FP8] / peak[BF16] if None not in peak.values() else None,
        "tokens_per_s_ratio": runs[FP8]["tokens_per_s"] / runs[BF16]["tokens_per_s"],
    }


def run_convergence(device, *, steps: int = STEPS, batch: int = BATCH, seq: int = SEQ, lr: float = LR,
                    warmup: int = WARMUP, seed: int = DEFAULT_SEED, smoke: bool = False,
                    time_budget: float | None = TIME_BUDGET, progress=print, checkpoint=None, cfg=None,
                    prepare=prepare_model, trained_fields=None, report_fields=None) -> dict:  # fmt: skip
    """Both runs, bf16 first; ``checkpoint(report)`` after each. Another model: ``cfg`` (with ``as_dict()`` and
    ``parameters()``), ``prepare`` and ``trained_fields`` as ``train`` takes them; ``report_fields``: more top-level
    fields of the report."""
    device = torch.device(device)
    cfg = cfg or (SMOKE if smoke else CONVERGENCE)
    if smoke:
        steps, batch, seq, warmup = SMOKE_RUN["steps"], SMOKE_RUN["batch"], SMOKE_RUN["seq"], SMOKE_RUN["warmup"]
    data, corpus = stdlib_corpus(limit_bytes=SMOKE_RUN["corpus_bytes"] if smoke else None)
    text, held_out = split_corpus(data)
    env = environment(device, None, seed)
    env.update(gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None, smoke=smoke)
    report = {
        "environment": env,
        "kind": "convergence",
        "model": cfg.as_dict(),
        "corpus": corpus,
        "training": {
            "steps": steps,
            "batch": batch,
            "seq": seq,
            "tokens_per_step": batch * seq,
            "lr": lr,
            "warmup": warmup,
            "schedule": "linear warm-up, cosine to 0.1 x",
            "optimizer": "AdamW (0.9, 0.95), weight decay 0.1 on matrices, grad norm clipped at 1, float32 master weights",
            "final_window": FINAL_WINDOW,
            "time_budget_s": time_budget,
        },  # fmt: skip
        **(report_fields or {}),
        "runs": {},
    }
    progress(f"model {cfg.parameters() / 1e6:.1f}M parameters; {corpus['files']} files, {corpus['bytes']} bytes of "
             f"{corpus['root']}; {steps} steps of {batch} x {seq} bytes")  # fmt: skip
    deadline = time.perf_counter() + time_budget if time_budget else None
    for mode in MODES:
        report["runs"][mode] = train(mode, cfg, text, held_out, steps=steps, batch=batch, seq=seq, lr=lr,
                                     warmup=warmup, seed=seed, device=device, deadline=deadline, progress=progress,
                                     eval_batches=SMOKE_RUN["eval_batches"] if smoke else EVAL_BATCHES,
                                     prepare=prepare, trained_fields=trained_fields)  # fmt: skip
        report["summary"] = summarize_convergence(report["runs"])
        if checkpoint:
            checkpoint(report)
    return report


def _accumulated_step(model, inputs, targets, micro_batches: int, reuse: bool) -> torch.Tensor:
    """The batch's mean loss, its gradients added up over ``micro_batches`` forward + backward passes."""
    if micro_batches == 1:
        loss = loss_fn(model, inputs, targets)
        loss.backward()
        return loss
    total = torch.zeros((), device=inputs.device)
    with reuse_quantized_weights() if reuse else contextlib.nullcontext():
        for part_in, part_target in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
            loss = loss_fn(model, part_in, part_target) / micro_batches
            loss.backward()
            total += loss.detach()
    return total


def run_throughput(device, *, batch: int = THROUGHPUT_BATCH, seq: int = THROUGHPUT_SEQ,
                   warmup: int = THROUGHPUT_WARMUP, steps: int = THROUGHPUT_STEPS, seed: int = DEFAULT_SEED,
                   micro_batches: int = 1, smoke: bool = False, progress=print, checkpoint=None) -> dict:  # fmt: skip
    """Tokens per second of a training step, bf16 against converted, each timed over ``steps`` after ``warmup``.
    ``micro_batches``: each step's batch split into that many, their gradients added up before the optimizer step
    (both models; the converted one inside ``reuse_quantized_weights()``, its weights quantized once a step)."""
    device = torch.device(device)
    cfg = SMOKE if smoke else LLAMA3_8B_8_LAYERS
    if smoke:
        batch, seq, warmup, steps = (SMOKE_THROUGHPUT[k] for k in ("batch", "seq", "warmup", "steps"))
        batch *= micro_batches
    if batch % micro_batches:
        raise ValueError(f"micro_batches ({micro_batches}) must divide the batch of {batch} sequences")
    data, corpus = stdlib_corpus(limit_bytes=SMOKE_RUN["corpus_bytes"] if smoke else None)
    text, _ = split_corpus(data)
    env = environment(device, None, seed)
    env.update(gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None, smoke=smoke)
    report = {
        "environment": env,
        "kind": "throughput",
        "model": cfg.as_dict(),
        "corpus": corpus,
        "training": {
            "batch": batch,
            "seq": seq,
            "tokens_per_step": batch * seq,
            "micro_batches": micro_batches,
            "warmup_steps": warmup,
            "timed_steps": steps,
            "optimizer": "AdamW (torch, fused on a GPU), bf16 weights and states (no master copy)",
            "lr": 1e-4,
        },  # fmt: skip
        "runs": {},
    }
    progress(f"model {cfg.parameters() / 1e6:.1f}M parameters, {batch} x {seq} tokens a step")
    for mode in MODES:
        model, conversion = prepare_model(mode, cfg, seed, device, on_device=True)
        _reset_peak(device)
        opt = MasterAdamW(model, 1e-4, master_dtype=None)
        batches = Batches(text, batch, seq, seed, device)
        times, losses = [], []
        for step in range(warmup + steps):
            _sync(device)
            t0 = time.perf_counter()
            loss = _accumulated_step(model, *next(batches), micro_batches, mode == FP8)
            opt.step()
            opt.zero_grad()
            _sync(device)
            if step >= warmup:
                times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        run = {"step_seconds": times, "tokens_per_s": batch * seq * len(times) / sum(times),
               "median_step_s": statistics.median(times), "peak_memory_bytes": _peak_bytes(device),
               "losses": losses}  # fmt: skip
        if conversion:
            run["conversion"] = conversion
        report["runs"][mode] = run
        progress(f"{mode}: {run['tokens_per_s']:.0f} tokens/s, median step {run['median_step_s'] * 1e3:.1f} ms")
        del model, opt, batches
        _free(device)
        if checkpoint:
            checkpoint(report)
    r = report["runs"]
    peak = [r[m]["peak_memory_bytes"] for m in MODES]
    report["summary"] = {
        "tokens_per_s": {m: r[m]["tokens_per_s"] for m in MODES},
        "tokens_per_s_ratio": r[FP8]["tokens_per_s"] / r[BF16]["tokens_per_s"],
        "target_tokens_per_s_ratio": TARGETS["tokens_per_s_ratio"],
        "peak_memory_ratio": peak[1] / peak[0] if None not in peak else None,
    }
    return report


def smooth_losses(values: list[float], window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(report: dict, path: Path) -> None:
    """Convergence: both loss curves (a 20-step mean over the raw ones) and their ratio; throughput: tokens per
    second and peak memory of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env, runs = report["environment"], report["runs"]
    title = f"{env['device']}, torch {env['torch']}, {env['date'][:10]}"
    if report["kind"] == "convergence":
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8), height_ratios=[3, 1], sharex=True)
        for mode, run in runs.items():
            steps = range(1, len(run["losses"]) + 1)
            line = top.plot(steps, smooth_losses(run["losses"]), label=mode, linewidth=1.2)[0]
            top.plot(steps, run["losses"], color=line.get_color(), alpha=0.2, linewidth=0.5)
        top.set_ylabel("training loss (nats per byte)")
        top.legend(fontsize=8)
        m = report["model"]
        size = f"{m['parameters'] / 1e6:.0f}M parameters"
        if "active_parameters" in m:
            size += f" ({m['active_parameters'] / 1e6:.0f}M active)"
        top.set_title(f"{m.get('name', 'byte-level Llama')}, {size}, Python stdlib source: {title}", fontsize=8)
        if all(mode in runs for mode in MODES):
            n = min(len(runs[mode]["losses"]) for mode in MODES)
            a, b = smooth_losses(runs[FP8]["losses"][:n]), smooth_losses(runs[BF16]["losses"][:n])
            bottom.plot(range(1, n + 1), [x / y for x, y in zip(a, b, strict=True)], color="black", linewidth=1)
            bottom.axhline(1.0, color="gray", linewidth=0.6)
        bottom.set_ylabel("loss ratio FP8 / bf16")
        bottom.set_xlabel("step")
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(runs)
        bars = ax.bar(names, [runs[n]["tokens_per_s"] for n in names])
        for bar, name in zip(bars, names, strict=True):
            peak = runs[name].get("peak_memory_bytes")
            note = f"{runs[name]['tokens_per_s']:.0f} tok/s" + (f"\npeak {peak / 2**30:.1f} GiB" if peak else "")
            ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8)  # fmt: skip
        ax.set_ylabel("training tokens per second")
        m = report["model"]
        ax.set_title(f"{m['layers']}-layer Llama-3-8B-shaped model, {report['training']['tokens_per_step']} tokens "
                     f"a step: {title}", fontsize=8)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
