"""``fp8gemm bench``: the GEMM or the Linear layer timed against the peers on a GPU; without one, the recipe's
accuracy. Every random draw comes from one seed (``--seed``, default ``bench.DEFAULT_SEED``), printed and kept in
the ``--json`` report's environment.

The core's ``fp8gemm`` command finds this module through the ``fp8gemm.commands`` entry point ``bench`` and uses its
``HELP``, ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from fp8gemm import registry
from fp8gemm.cli_args import UsageError, count_argument, default_device, error_message, requested_backend
from rich.progress import Progress
from rich.table import Table

from . import (
    accuracy,
    bench,
    grouped_bench,
    layer_bench,
    moe_bench,
    train_bench,
    train_fsdp,
    train_fsdp_moe,
    train_moe_bench,
    train_moe_run,
    train_run,
)
from .summaries import (
    console,
    memory_text,
    print_accuracy_table,
    print_bench_table,
    print_grouped_summary,
    print_moe_summary,
    print_train_moe_summary,
    print_train_summary,
)

HELP = "time ours against the available peers (without a GPU: the recipe's accuracy)"


def shape_argument(text: str) -> tuple[int, int, int]:
    """``--shapes``: one ``M,N,K`` the GEMM accepts, or argparse's error naming the option and the fix."""
    try:
        return bench.parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_argument(text: str) -> Path:
    """``--json``: a file path whose folder exists or can be made (not under a file, not a folder itself)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it, e.g. {path / 'report.json'}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, not a folder; name a path in a folder")
        if parent.exists():
            break
    return path


def plot_argument(text: str) -> Path:
    """``--plot``: a PNG path, refused at once where matplotlib is missing (not after a run of minutes)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(error_message(ModuleNotFoundError(name="matplotlib")))
    return output_argument(text)


def moe_models_argument(text: str) -> tuple:
    """``--models``: comma-separated names of the MoE benchmarks' models, or argparse's error listing them."""
    known = {m.name: m for m in moe_bench.MODELS}
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: name one or more of {', '.join(known)}, comma-separated")
    return tuple(known[name] for name in dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fp8gemm bench``."""
    p.add_argument("--set", choices=sorted(bench.SHAPE_SETS), default="deepseek-v3", help="named shape set")
    p.add_argument(
        "--shapes",
        nargs="+",
        type=shape_argument,
        metavar="M,N,K",
        help=f"shapes instead of a set; N a multiple of {bench.N_MULTIPLE}, K of {bench.K_MULTIPLE}",
    )
    p.add_argument("--out-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--json", type=output_argument, help="write results to this JSON file")
    p.add_argument("--plot", type=plot_argument, help="write a bar chart to this PNG file (needs matplotlib)")
    p.add_argument(
        "--gpu-state",
        choices=tuple(bench.GPU_STATES),
        default="sustained",
        help="the GPU's state as each timing starts: " + "; ".join(f"{k}: {v}" for k, v in bench.GPU_STATES.items()),
    )
    p.add_argument(
        "--rounds",
        type=count_argument(1),
        default=1,
        help="time every implementation this many times per shape, alternating the order; report the median",
    )
    p.add_argument(
        "--seed",
        type=count_argument(0),
        default=bench.DEFAULT_SEED,
        help=f"seed of every random draw; the same seed draws the same data (default: {bench.DEFAULT_SEED})",
    )
    p.add_argument(
        "--layer",
        action="store_true",
        help="time the Linear layer (bf16 in and out: ours, bf16 F.linear and the peers' layer paths) in CUDA graphs",
    )
    p.add_argument(
        "--grouped",
        action="store_true",
        help="time grouped (MoE) GEMMs: ours contiguous and masked, DeepGEMM's (with its padding), a dense loop over "
        "experts and bf16 torch._grouped_mm, in CUDA graphs (docs/benchmarks.md)",
    )
    p.add_argument(
        "--moe",
        action="store_true",
        help="time the MoE experts layer fp8gemm.fused_experts at DeepSeek-V3 and Qwen3-30B-A3B sizes against bf16 "
        "experts as transformers runs them, DeepGEMM's pipeline and transformers' FP8Experts, in CUDA graphs "
        "(docs/benchmarks.md); with --train, --train-run or --train-fsdp: their mixture-of-experts variant",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="time one Linear layer's forward and backward (ours, bf16 nn.Linear, torchao's Float8BlockwiseLinear on "
        "either GEMM backend) at Llama-3-8B and DeepSeek-V3 shapes, the weight-gradient GEMM alone (ours, DeepGEMM's "
        "1D1D, torch's blockwise scaled_mm) and each layer's gradient error (docs/training.md); with --moe: the "
        "experts layer's forward and backward (ours, bf16 torch._grouped_mm, torchao's FP8 blockwise grouped_mm) and "
        "the k-grouped weight gradient (ours, DeepGEMM's with its padding) against its roofline",
    )
    p.add_argument(
        "--wgrad",
        action="store_true",
        help="with --train: the weight-gradient GEMM alone (its rows on the layer sizes and DeepGEMM's own shapes, or "
        "on --shapes M,N,K: dW [N, K] over M tokens, N a multiple of 16), no layer rows",
    )
    p.add_argument(
        "--train-run",
        action="store_true",
        help="train a byte-level Llama-style model (103M parameters) on the Python standard library's source in bf16 "
        "and converted (convert(training=True)), same seed and batches: loss curves, peak memory, tokens/s; with "
        "--moe: a byte-level Qwen3-MoE (transformers' Qwen3MoeForCausalLM, 8 layers of 16 experts, top 4)",
    )
    p.add_argument(
        "--throughput",
        action="store_true",
        help="with --train-run: tokens/s of a Llama-3-8B-shaped model of 8 layers, 8192 tokens a step, bf16 vs converted",
    )
    p.add_argument(
        "--micro-batches",
        type=count_argument(1),
        help="with --train-run --throughput: each step's batch as this many micro-batches whose gradients add up "
        "(both models; the converted one quantizes its weights once a step: fp8gemm.training.reuse_quantized_weights)",
    )
    p.add_argument(
        "--train-fsdp",
        action="store_true",
        help="FSDP2 (fully_shard) of a converted model on 2 GPUs against one GPU, same seed and batches: the loss "
        "curves within 0.5%% (exit status 1 if not); with --moe: a byte-level Qwen3-MoE (4 layers of 8 experts, top 2)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="with --train, --train-run or --train-fsdp: tiny sizes and a few steps, on any device (the CPU runs "
        "fp8gemm's reference); checks the harness, measures nothing",
    )
    p.add_argument("--steps", type=count_argument(1), help="with --train-run or --train-fsdp: steps of each run")
    p.add_argument("--quick", action="store_true", help="with --moe: a subset (T 1, 64, 4096; uniform routing)")
    p.add_argument(
        "--models",
        type=moe_models_argument,
        help="with --moe or --train --moe: these MoE models only, comma-separated ("
        + ", ".join(m.name for m in moe_bench.MODELS)
        + ")",
    )
    p.add_argument("--decode", action="store_true", help="with --moe: the decode cases alone (T <= 64, both routings)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --layer, --grouped or --moe: keep the cases already in --json (written after every case) and time "
        "the rest",
    )


def run(args) -> int:
    """Run ``fp8gemm bench``; its exit status."""
    device = args.device or default_device()
    backend = requested_backend(args)
    moe_alone = args.moe and not (args.train or args.train_run or args.train_fsdp)  # --train --moe: one benchmark
    modes = {"--layer": args.layer, "--grouped": args.grouped, "--moe": moe_alone, "--train": args.train,
             "--train-run": args.train_run, "--train-fsdp": args.train_fsdp}  # fmt: skip
    if sum(map(bool, modes.values())) > 1:
        chosen = [name for name, on in modes.items() if on]
        raise UsageError(f"{', '.join(chosen[:-1])} and {chosen[-1]} are separate benchmarks; run one, then the other")
    if args.models and (not args.moe or args.train_run or args.train_fsdp or args.smoke):
        raise UsageError("--models goes with --moe or --train --moe (--smoke times its own tiny model)")
    if args.wgrad and not (args.train and not args.moe):
        raise UsageError("--wgrad goes with --train (the dense weight-gradient GEMM's rows alone)")
    if args.train or args.train_run or args.train_fsdp:
        return _train_modes(args, device)
    if args.smoke or args.steps or args.throughput or args.micro_batches:
        raise UsageError(
            "--smoke and --steps go with --train, --train-run or --train-fsdp; --throughput with --train-run; "
            "--micro-batches with --train-run --throughput"
        )
    if (args.grouped or args.moe) and args.shapes:
        which = "--grouped" if args.grouped else "--moe"
        raise UsageError(f"{which} times its own case list (docs/benchmarks.md); leave --shapes out")
    if (args.quick or args.decode) and not args.moe:
        raise UsageError("--quick and --decode go with --moe")
    if args.resume and not ((args.layer or args.grouped or args.moe) and args.json):
        raise UsageError(
            "--resume goes with --layer or --grouped and --json naming the earlier run's report (or with "
            "--moe and --json)"
        )
    console.print(f"data seed {args.seed} (--seed {args.seed} draws the same data)", highlight=False)
    if device.type != "cuda":
        if args.layer:
            console.print("--layer times Linear layers on a GPU, and the device is the CPU, so:")
        if args.grouped:
            console.print("--grouped times grouped GEMMs on a GPU, and the device is the CPU, so:")
        if args.moe:
            console.print("--moe times the MoE experts layer on a GPU, and the device is the CPU, so:")
        return _bench_without_gpu(args, device, backend)
    if args.layer:
        return _bench_layer(args, device)
    if args.grouped:
        return _bench_grouped(args, device, backend)
    if args.moe:
        return _bench_moe(args, device, backend)
    shapes = args.shapes or bench.SHAPE_SETS[args.set]
    out_dtype = torch.float32 if args.out_dtype == "float32" else torch.bfloat16
    n_impls = 1 + len(bench.available_peers(device))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(shapes) * n_impls * args.rounds)
        report = bench.run(
            shapes,
            device,
            backend,
            lambda: progress.advance(task),
            out_dtype,
            args.gpu_state,
            args.rounds,
            seed=args.seed,
        )
    print_bench_table(report)
    return _write_outputs(args, report, bench.save_json, bench.plot)


def _train_modes(args, device: torch.device) -> int:
    """``--train``, ``--train-run`` and ``--train-fsdp`` (docs/training.md)."""
    if args.throughput and not args.train_run:
        raise UsageError("--throughput goes with --train-run")
    if args.micro_batches and not args.throughput:
        raise UsageError("--micro-batches goes with --train-run --throughput")
    if args.micro_batches and not args.smoke and train_run.THROUGHPUT_BATCH % args.micro_batches:
        raise UsageError(
            f"--micro-batches must divide the throughput run's {train_run.THROUGHPUT_BATCH} sequences a step"
        )
    if args.throughput and args.moe:
        raise UsageError("--throughput times the dense model; --train-run --moe is the MoE convergence run")
    if args.steps and not (args.train_run or args.train_fsdp):
        raise UsageError("--steps goes with --train-run or --train-fsdp; --train times its own case list")
    if args.shapes and not (args.train and not args.moe):
        raise UsageError("--shapes goes with --train; the training runs and --train --moe have their own cases")
    if args.resume and not (args.train and args.json):
        raise UsageError("--resume goes with --train and --json naming the earlier run's report")
    if args.quick or args.decode:
        raise UsageError("--quick and --decode go with --moe")
    if device.type != "cuda" and not args.smoke:
        raise UsageError(
            f"the training benchmarks time a GPU and the device is {device.type}; add --smoke to run the harness on "
            "tiny sizes there (fp8gemm's reference on the CPU: no measurement)"
        )
    if args.shapes:
        try:
            (train_bench.wgrad_shape_cases if args.wgrad else train_bench.layer_cases)(args.shapes)
        except ValueError as exc:
            raise UsageError(f"--shapes: {exc}") from None
    if args.train_fsdp and device.type == "cuda" and torch.cuda.device_count() < train_fsdp.WORLD:
        raise UsageError(f"--train-fsdp runs on {train_fsdp.WORLD} GPUs and this machine has "
                         f"{torch.cuda.device_count()}; run it on a machine with two")  # fmt: skip
    console.print(f"data seed {args.seed} (--seed {args.seed} draws the same data)", highlight=False)
    say = lambda text: console.print(text, highlight=False)  # noqa: E731
    if args.train and args.moe:
        return _bench_train_moe(args, device, say)
    if args.train:
        earlier = _earlier_report(args)
        checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
        report = train_bench.run(device, args.shapes or None, smoke=args.smoke, progress=say, earlier=earlier,
                                 checkpoint=checkpoint, seed=args.seed, wgrad_only=args.wgrad)  # fmt: skip
        print_train_summary(report)
        return _write_outputs(args, report, _save_atomically, train_bench.plot)
    if args.train_fsdp:
        kwargs = {"steps": args.steps} if args.steps else {}
        check = train_fsdp_moe if args.moe else train_fsdp
        report = check.run(device, smoke=args.smoke, seed=args.seed, progress=say, **kwargs)
        _write_outputs(args, report, _save_atomically, check.plot)
        return 0 if report["summary"]["within_tolerance"] else 1
    checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
    if args.moe:
        kwargs = {"steps": args.steps} if args.steps else {}
        report = train_moe_run.run(device, smoke=args.smoke, seed=args.seed, progress=say, checkpoint=checkpoint,
                                   **kwargs)  # fmt: skip
        _say_convergence(say, report)
        return _write_outputs(args, report, _save_atomically, train_moe_run.plot)
    if args.throughput:
        kwargs = {"steps": args.steps} if args.steps else {}
        if args.micro_batches:
            kwargs["micro_batches"] = args.micro_batches
        report = train_run.run_throughput(device, smoke=args.smoke, seed=args.seed, progress=say,
                                          checkpoint=checkpoint, **kwargs)  # fmt: skip
        s = report["summary"]
        say(f"tokens/s: {', '.join(f'{m} {v:.0f}' for m, v in s['tokens_per_s'].items())}; converted / bf16 "
            f"{s['tokens_per_s_ratio']:.3f}x" + memory_text(s.get("peak_memory_ratio")))  # fmt: skip
    else:
        kwargs = {"steps": args.steps} if args.steps else {}
        report = train_run.run_convergence(device, smoke=args.smoke, seed=args.seed, progress=say,
                                           checkpoint=checkpoint, **kwargs)  # fmt: skip
        _say_convergence(say, report)
    return _write_outputs(args, report, _save_atomically, train_run.plot)


def _say_convergence(say, report: dict) -> None:
    s = report["summary"]
    say(f"final loss (mean of the last {train_run.FINAL_WINDOW} of {s['compared_steps']} steps): "
        + ", ".join(f"{m} {v:.4f}" for m, v in s["final_loss"].items())
        + f"; converted / bf16 {s['final_loss_ratio']:.4f}; tokens/s ratio {s['tokens_per_s_ratio']:.3f}x"
        + memory_text(s.get("peak_memory_ratio")))  # fmt: skip


def _bench_train_moe(args, device: torch.device, say) -> int:
    """``--train --moe``: the experts layer's forward and backward and the k-grouped weight gradient."""
    checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
    report = train_moe_bench.run(device, smoke=args.smoke, progress=say, earlier=_earlier_report(args),
                                 checkpoint=checkpoint, seed=args.seed, models=args.models)  # fmt: skip
    print_train_moe_summary(report)
    return _write_outputs(args, report, _save_atomically, train_moe_bench.plot)


def _write_outputs(args, report: dict, save_json, plot) -> int:
    """``--json`` and ``--plot`` of a bench report."""
    for path, write in ((args.json, save_json), (args.plot, plot)):
        if path:
            write(report, path)
            console.print(f"wrote {path}")
    return 0


def _earlier_report(args) -> dict | None:
    """The report ``--resume`` continues, or None without it."""
    if not args.resume:
        return None
    if not args.json.exists():
        raise UsageError(f"--resume: {args.json} does not exist; run without --resume to start the report")
    try:
        return json.loads(args.json.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"--resume: {args.json} is not a JSON report ({exc}); start a new one") from None


def _bench_grouped(args, device: torch.device, backend: str | None) -> int:
    earlier = _earlier_report(args)
    checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
    report = grouped_bench.run(device, backend=backend, progress=lambda text: console.print(text, highlight=False),
                               earlier=earlier, checkpoint=checkpoint, seed=args.seed)  # fmt: skip
    print_grouped_summary(report)
    return _write_outputs(args, report, _save_atomically, grouped_bench.plot)


def _bench_moe(args, device: torch.device, backend: str | None) -> int:
    earlier = _earlier_report(args)
    checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
    report = moe_bench.run(device, backend=backend, progress=lambda text: console.print(text, highlight=False),
                           earlier=earlier, checkpoint=checkpoint, seed=args.seed, quick=args.quick,
                           decode=args.decode, models=args.models or moe_bench.MODELS)  # fmt: skip
    print_moe_summary(report)
    return _write_outputs(args, report, _save_atomically, moe_bench.plot)


def _bench_layer(args, device: torch.device) -> int:
    earlier = _earlier_report(args)
    checkpoint = (lambda r: _save_atomically(r, args.json)) if args.json else None
    report = layer_bench.run(
        device,
        args.shapes or None,
        progress=lambda text: console.print(text, highlight=False),
        earlier=earlier,
        checkpoint=checkpoint,
        seed=args.seed,
    )
    table = Table(title="Linear layer, weights from HBM: speed vs bf16 F.linear (geomean, slowest shape)")
    for col in ("path", "geomean", "slowest"):
        table.add_column(col)
    for name, row in report["summary"].items():
        if isinstance(row, dict):
            table.add_row(name, f"{row['geomean_vs_bf16']:.2f}x", f"{row['slowest_vs_bf16']:.2f}x")
    console.print(table)
    eager = report["eager"]["us_per_call"]
    console.print("eager wall time per call: " + ", ".join(f"{name} {us:.1f} us" for name, us in eager.items()))
    return _write_outputs(args, report, _save_atomically, layer_bench.plot)


def _save_atomically(report: dict, path: Path) -> None:
    """A run killed while writing leaves the previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(report, indent=1) + "\n")
    part.replace(path)


def _bench_without_gpu(args, device: torch.device, backend: str | None) -> int:
    """No GPU, so nothing to time (ours would only race the reference against itself): show the recipe's accuracy."""
    gpu_backends = [ib.name for ib in registry.installed_backends()]
    installed = f"GPU backends installed: {', '.join(gpu_backends)}" if gpu_backends else "no GPU backend installed"
    console.print(
        f"Nothing to time on {registry.describe_device(device).describe()} ({installed}): timing compares an arch "
        "package's kernels with cuBLASLt, Triton and DeepGEMM on a GPU (docs/benchmarks.md). Shown instead: the "
        "accuracy of the block-scaled FP8 recipe."
    )
    rows = accuracy.run(args.shapes or accuracy.DEFAULT_SHAPES, device, backend, seed=args.seed)
    print_accuracy_table(rows)
    if args.json:
        env = bench.environment(device, backend, args.seed)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "data": accuracy.DATA, "accuracy": rows}, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        accuracy.plot(rows, args.plot)
        console.print(f"wrote {args.plot}")
    return 0
