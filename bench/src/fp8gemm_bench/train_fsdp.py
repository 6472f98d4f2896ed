"""``fp8gemm bench --train-fsdp``: a converted model (``convert(model, training=True)``) trained with FSDP2
(``torch.distributed.fsdp.fully_shard``, each block and the root) on two GPUs over NCCL, against the same model, seed
and batches on one GPU: the two loss curves must stay within ``TOLERANCE`` (relative) at every step. Which model is a
``Harness``: ``DENSE`` here (the Llama-style decoder of ``train_model``), the Qwen3-MoE one in ``train_fsdp_moe``.

Each of the two ranks takes half of every global batch (its tokens a multiple of 128, so the 128-token blocks of
the weight gradient's quantization are the one-GPU run's); FSDP2 averages the gradients, the one-GPU run's loss is the
mean over the whole batch (or over the ranks' shares as micro-batches, ``Harness.one_device_parts``), so the two
compute the same step up to the order of sums. The ranks are spawned from this process (``torch.multiprocessing``)
with ``NCCL_NVLS_ENABLE=0``. On a CPU the ranks use gloo (``--smoke``, the check of the harness: FSDP2 runs on CPU
tensors in torch >= 2.6).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fp8gemm.nn import Fp8TrainingExperts, Fp8TrainingLinear, convert
from torch import nn

from .bench import DEFAULT_SEED, environment
from .train_model import SMOKE, Batches, ModelConfig, build_model, loss_fn, lr_at, split_corpus, stdlib_corpus

WORLD = 2
MODEL = ModelConfig(hidden=512, layers=4, heads=4, kv_heads=4, intermediate=1536)  # 13.6M parameters
STEPS, BATCH, SEQ, LR, WARMUP = 50, 16, 256, 1e-3, 5  # 4096 tokens a step, 2048 a rank
SMOKE_RUN = {"steps": 4, "batch": 4, "seq": 64, "corpus_bytes": 100_000}  # 128 tokens a rank
TOLERANCE = 0.005


def _dense_blocks(model) -> list[nn.Module]:
    return list(model.blocks)


@dataclass(frozen=True)
class Harness:
    """The model the check trains: its configs (a frozen dataclass with ``as_dict()``), how it is built from a seed
    and which of its modules are sharded one by one before the root. Module-level functions only: it travels to the
    spawned ranks by pickle."""

    kind: str  # the report's "kind"
    model: Any
    smoke: Any
    build: Callable[..., nn.Module]  # (cfg, seed, device, dtype=) -> the model, its weights drawn on the CPU
    blocks: Callable[[nn.Module], list[nn.Module]]
    one_device_parts: int = 1  # micro-batches of the one-device step (WORLD: each rank's share, in order)


DENSE = Harness("fsdp2", MODEL, SMOKE, build_model, _dense_blocks)


def fully_shard_fn():
    """``fully_shard`` (torch >= 2.6 exports it from torch.distributed.fsdp; 2.4 and 2.5 from _composable)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _setup(harness: Harness, cfg, seed: int, device, dtype):
    model = harness.build(cfg, seed, device, dtype=dtype)
    report = convert(model, training=True)
    return model, len(report.converted)


def _fp8_modules(model: nn.Module) -> dict:
    return {"fp8_training_linear_layers": sum(isinstance(m, Fp8TrainingLinear) for m in model.modules()),
            "fp8_training_experts": sum(isinstance(m, Fp8TrainingExperts) for m in model.modules())}  # fmt: skip


def _shard(p: torch.Tensor) -> dict:
    """A Parameter's global and local shape and placements (a DTensor's; a plain tensor's are its own and none)."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return {
        "global": list(p.shape),
        "local": list(local.shape),
        "placements": [str(x) for x in getattr(p, "placements", ())],
    }


def _shards(model: nn.Module) -> dict:
    """This rank's shard of the first FP8 module of each kind, Parameter by Parameter."""
    found = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, (Fp8TrainingLinear, Fp8TrainingExperts)) and kind not in found:
            found[kind] = {"module": name, **{n: _shard(p) for n, p in module.named_parameters(recurse=False)}}
    return found


def _optimizer(model, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def _train(model, opt, batches, steps: int, lr: float, part=None, reduce=None, parts: int = 1):
    """(each step's loss, seconds): ``part`` of every batch, in ``parts`` micro-batches whose gradients add up."""
    losses, start = [], time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, WARMUP)
        inputs, targets = next(batches)
        if part is not None:
            inputs, targets = inputs[part], targets[part]
        loss = 0.0
        for piece_in, piece_t in zip(inputs.chunk(parts), targets.chunk(parts), strict=True):
            piece = loss_fn(model, piece_in, piece_t) / parts  # the mean over equal parts: the batch's mean
            piece.backward()
            loss = loss + piece.detach()
        opt.step()
        opt.zero_grad()
        if reduce:
            reduce(loss)
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def _rank(rank: int, world: int, port: int, settings: dict, out: str) -> None:
    """One FSDP2 rank: its GPU (or the CPU), half of each batch, the global mean loss of each step to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = settings["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        fully_shard = fully_shard_fn()
        harness, dtype = settings["harness"], getattr(torch, settings["dtype"])
        model, converted = _setup(harness, settings["model"], settings["seed"], device, dtype)
        for block in harness.blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        data, _ = stdlib_corpus(limit_bytes=settings["corpus_bytes"])
        batches = Batches(split_corpus(data)[0], settings["batch"], settings["seq"], settings["seed"], device)
        share = settings["batch"] // world
        part = slice(rank * share, (rank + 1) * share)

        def reduce(loss):
            dist.all_reduce(loss)
            loss /= world

        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        losses, seconds = _train(model, _optimizer(model, settings["lr"]), batches, settings["steps"], settings["lr"],
                                 part, reduce)  # fmt: skip
        if rank == 0:
            Path(out).write_text(json.dumps({
                "losses": losses, "seconds": seconds, "converted": converted, **_fp8_modules(model),
                "shards_rank0": _shards(model),
                "peak_memory_bytes_rank0": torch.cuda.max_memory_allocated(device) if cuda else None,
                "wrapped": type(model).__name__}))  # fmt: skip
    finally:
        try:
            dist.barrier()  # both ranks leave together: no collective is in flight when either exits
        finally:
            dist.destroy_process_group()
    if not cuda:
        _exit_gloo_rank()


def _exit_gloo_rank() -> None:
    """Ends a finished gloo rank without finalizing its interpreter. The gloo group's worker threads outlive
    ``destroy_process_group`` (torch still holds the group) and take the GIL to free a finished collective's Python
    tensors; CPython ends a worker that waits for the GIL as finalization starts, inside a noexcept destructor, and
    the rank aborts ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(device, *, steps: int = STEPS, batch: int = BATCH, seq: int = SEQ, lr: float = LR, seed: int = DEFAULT_SEED,
        smoke: bool = False, dtype: str = "float32", progress=print, harness: Harness = DENSE) -> dict:  # fmt: skip
    """The one-device run, then the FSDP2 run on ``WORLD`` ranks; the report with both curves and their distance."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.device_count() < WORLD:
        raise ValueError(f"the FSDP2 check needs {WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    cfg = harness.smoke if smoke else harness.model
    corpus_bytes = SMOKE_RUN["corpus_bytes"] if smoke else None
    if smoke:
        steps, batch, seq = SMOKE_RUN["steps"], SMOKE_RUN["batch"], SMOKE_RUN["seq"]
    if batch % WORLD or (batch // WORLD * seq) % 128:
        raise ValueError(f"each of the {WORLD} ranks needs a whole share of the batch in 128-token blocks: "
                         f"batch {batch} x seq {seq}")  # fmt: skip
    settings = {"device": device.type, "harness": harness, "model": cfg, "dtype": dtype, "seed": seed, "steps": steps,
                "batch": batch, "seq": seq, "lr": lr, "corpus_bytes": corpus_bytes}  # fmt: skip
    one = torch.device("cuda", 0) if device.type == "cuda" else device
    data, corpus = stdlib_corpus(limit_bytes=corpus_bytes)
    model, converted = _setup(harness, cfg, seed, one, getattr(torch, dtype))
    batches = Batches(split_corpus(data)[0], batch, seq, seed, one)
    if one.type == "cuda":
        torch.cuda.reset_peak_memory_stats(one)
    parts = harness.one_device_parts
    single, seconds = _train(model, _optimizer(model, lr), batches, steps, lr, parts=parts)
    peak = torch.cuda.max_memory_allocated(one) if one.type == "cuda" else None
    progress(f"one device: {steps} steps, loss {single[0]:.4f} -> {single[-1]:.4f} in {seconds:.1f} s")
    del model, batches
    if one.type == "cuda":
        torch.cuda.empty_cache()
    before = os.environ.get("NCCL_NVLS_ENABLE")
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off in the ranks spawned below (they copy the environment)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp, "rank0.json"))
            mp.spawn(_rank, args=(WORLD, _free_port(), settings, out), nprocs=WORLD, join=True)
            fsdp = json.loads(Path(out).read_text())
    finally:
        if before is None:
            del os.environ["NCCL_NVLS_ENABLE"]
        else:
            os.environ["NCCL_NVLS_ENABLE"] = before
    diffs = [abs(a - b) / abs(b) for a, b in zip(fsdp["losses"], single, strict=True)]
    progress(f"FSDP2 on {WORLD} ranks: loss {fsdp['losses'][0]:.4f} -> {fsdp['losses'][-1]:.4f} in "
             f"{fsdp['seconds']:.1f} s; largest relative difference {max(diffs):.2e} (tolerance {TOLERANCE})")  # fmt: skip
    env = environment(one, None, seed)
    env.update(gpu_name=torch.cuda.get_device_name(one) if one.type == "cuda" else None, smoke=smoke,
               gpus=torch.cuda.device_count() if one.type == "cuda" else 0,
               nccl_nvls_enable="0")  # fmt: skip
    return {
        "environment": env,
        "kind": harness.kind,
        "model": cfg.as_dict(),
        "corpus": corpus,
        "training": {
            **{k: settings[k] for k in ("steps", "batch", "seq", "lr", "dtype")},
            "warmup": WARMUP,
            "optimizer": "AdamW (0.9, 0.95), weight decay 0.1, no clipping",
            "sharding": f"fully_shard on each block and the root, {WORLD} ranks, "
            f"{'NCCL' if one.type == 'cuda' else 'gloo'}; each rank half of every batch",
        },  # fmt: skip
        "one_device": {
            "losses": single,
            "seconds": seconds,
            "converted": converted,
            "peak_memory_bytes": peak,
            "micro_batches": parts,
        },
        "fsdp2": {"world": WORLD, "backend": "nccl" if one.type == "cuda" else "gloo", **fsdp},
        "summary": {
            "max_rel_diff": max(diffs),
            "mean_rel_diff": statistics.fmean(diffs),
            "final_rel_diff": diffs[-1],
            "tolerance": TOLERANCE,
            "within_tolerance": max(diffs) <= TOLERANCE,
        },
    }


def plot(report: dict, path: Path) -> None:
    """Both loss curves and their relative difference per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one, fsdp = report["one_device"]["losses"], report["fsdp2"]["losses"]
    steps = range(1, len(one) + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), height_ratios=[2, 1], sharex=True)
    top.plot(steps, one, label="one device", linewidth=1.2)
    top.plot(steps, fsdp, label=f"FSDP2, {report['fsdp2']['world']} ranks", linewidth=1.0, linestyle="--")
    top.set_ylabel("loss")
    top.legend(fontsize=8)
    env = report["environment"]
    name = f", {report['model']['name']}" if "name" in report["model"] else ""
    top.set_title(
        f"FP8 training under FSDP2{name}: {env['device']}, torch {env['torch']}, {env['date'][:10]}", fontsize=8
    )
    bottom.plot(steps, [abs(a - b) / b for a, b in zip(fsdp, one, strict=True)], color="black", linewidth=1)
    bottom.axhline(report["summary"]["tolerance"], color="red", linewidth=0.6)
    bottom.set_ylabel("relative difference")
    bottom.set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
