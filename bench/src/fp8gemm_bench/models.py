"""Whole transformers models on fp8gemm: Qwen3 (dense) and Qwen3-MoE built from configs with random weights (no
download), in bf16, converted by ``fp8gemm.nn.convert``, and as transformers' own FP8 models
(``FineGrainedFP8Config()`` quantize-on-load) whose finegrained-fp8 kernel is fp8gemm's, by both routes of
docs/transformers.md: (1) ``LOCAL_KERNELS`` naming ci/build_hub.py's layout, (2) ``fp8gemm.hf.use_in_transformers()``,
and, for the MoE model, (3) route 2 with ``experts_implementation="fp8gemm"`` (each experts layer one
``fp8gemm.fused_experts`` call instead of transformers' grouped_mm glue around two grouped matmuls).

Reports logits' relative error against the bf16 model, bitwise equality of the two routes' logits, and the forward
time per batch (batch x seq tokens, ``use_cache=False``, logits of the last token only) captured in a CUDA graph on
static inputs and under ``torch.compile``. Every variant runs in its own process (transformers keeps the first
finegrained-fp8 kernel it loads); a variant or timing that fails is recorded and the rest go on.

    python3 -m fp8gemm_bench.models --out $OUT [--hub output/hub] [--quick]      # GPU
    python3 -m fp8gemm_bench.models --device cpu --tiny --out /tmp/models         # CPU: end to end, no timing graphs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .model_summary import HF_ROUTES, TARGETS, rel, summarize

REPO_ID = "kernels-community/finegrained-fp8"
VARIANTS = ("bf16", "convert", "hf-fp8-local", "hf-fp8-python", "hf-fp8-experts")
HF_VARIANTS = (*HF_ROUTES, "hf-fp8-experts")  # transformers' FP8 models
MOE_ONLY = ("hf-fp8-experts",)  # run on models with experts only
BATCHES = ((1, 1), (8, 1), (32, 1), (1, 512), (4, 2048))  # (batch, seq): decode steps, then prefills
QUICK_BATCHES = ((1, 1), (8, 1), (1, 512))
COMPILE_BATCHES = ((8, 1),)  # each compile of a 2-4 layer model takes ~30-60 s
COMPILE_VARIANTS = ("bf16", "convert", "hf-fp8-local", "hf-fp8-python", "hf-fp8-experts")
REPLAYS = 20
CHECK_SHAPE = (2, 64)  # input ids of the logits check
# Qwen3-8B's sizes with fewer layers; Qwen3-30B-A3B's experts at hidden size 4096 (what the transformers kernel
# and fp8gemm's experts both take), two MoE layers.
MODELS = {
    "qwen3-dense": dict(arch="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=4,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-moe": dict(arch="qwen3_moe", hidden_size=4096, moe_intermediate_size=768, intermediate_size=6144,
                      num_experts=128, num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32,
                      num_key_value_heads=4, head_dim=128, vocab_size=151936, decoder_sparse_step=1,
                      mlp_only_layers=[]),
}  # fmt: skip
TINY = {
    "qwen3-dense": dict(arch="qwen3", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512),
    "qwen3-moe": dict(arch="qwen3_moe", hidden_size=256, moe_intermediate_size=128, intermediate_size=512,
                      num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=512, decoder_sparse_step=1, mlp_only_layers=[]),
}  # fmt: skip
TINY_BATCHES = ((1, 1), (2, 16))


def config_of(spec: dict):
    import transformers

    spec = dict(spec)
    arch = spec.pop("arch")
    cls = transformers.Qwen3Config if arch == "qwen3" else transformers.Qwen3MoeConfig
    return cls(**spec, max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16")


# --- the worker: one variant in its own process ----------------------------------------------------------------------


def _load(variant: str, model_dir: str, device):
    import torch
    from transformers import AutoModelForCausalLM

    info: dict = {}
    if variant in ("bf16", "convert"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
        if variant == "convert":
            import fp8gemm.nn

            report = fp8gemm.nn.convert(model)
            info["converted"] = len(report.converted)
            info["left_alone"] = dict(report.skipped)
        return model.eval(), info
    experts = {}
    if variant in ("hf-fp8-python", "hf-fp8-experts"):
        import fp8gemm.hf

        fp8gemm.hf.use_in_transformers()  # registers experts_implementation="fp8gemm" too
        if variant == "hf-fp8-experts":
            experts = {"experts_implementation": "fp8gemm"}
    from transformers import FineGrainedFP8Config

    try:
        kwargs = {"device_map": str(device)} if device.type == "cuda" else {}
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                     quantization_config=FineGrainedFP8Config(), **kwargs,
                                                     **experts)  # fmt: skip
        info["build"] = "from_pretrained(quantization_config=FineGrainedFP8Config()): quantized on load"
    except Exception as exc:  # no accelerate, or no GPU: transformers' own replacement, filled by us
        info["build"] = (f"manual: from_pretrained with FineGrainedFP8Config failed ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); transformers' replace_with_fp8_linear on the bf16 "
                         "model, its FP8Linear / FP8Experts filled with fp8gemm.quantize_weight (the same 128x128 "
                         "block recipe)")  # fmt: skip
        model = _manual_fp8(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                                 **experts).to(device))  # fmt: skip
    return model.eval(), info


def _manual_fp8(model):
    import fp8gemm
    import torch
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear, replace_with_fp8_linear

    device = next(model.parameters()).device
    before = dict(model.named_modules())
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=FineGrainedFP8Config())
    fp8 = torch.float8_e4m3fn
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, (FP8Linear, FP8Experts)):
                continue
            old = before[name]
            module.to_empty(device=device)
            if isinstance(module, FP8Experts):
                for proj in ("gate_up_proj", "down_proj"):
                    w = getattr(old, proj)
                    pairs = [fp8gemm.quantize_weight(w[e].float(), fp8_dtype=fp8) for e in range(w.shape[0])]
                    getattr(module, proj).copy_(torch.stack([q for q, _ in pairs]))
                    getattr(module, proj + "_scale_inv").copy_(torch.stack([s for _, s in pairs]))
                module._is_expert_parallel = False
            else:
                q, s = fp8gemm.quantize_weight(old.weight.float(), fp8_dtype=fp8)
                module.weight.copy_(q)
                module.weight_scale_inv.copy_(s)
                if old.bias is not None:
                    module.bias.copy_(old.bias)
    return model


def _forward(model, ids, keep):
    return model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits


def _time_graph(fn, device) -> float:
    import torch

    if device.type != "cuda":
        return _time_wall(fn, device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    return _events(graph.replay)


def _events(fn) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _time_wall(fn, device) -> float:
    import torch

    for _ in range(2):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    return _events(fn)


def worker(args) -> int:
    import torch

    device = torch.device(args.device)
    result: dict = {"variant": args.worker, "model": args.model, "times_us": {}, "errors": {}}
    out = Path(args.result)

    def save():
        out.write_text(json.dumps(result, indent=1) + "\n")

    try:
        model, info = _load(args.worker, args.model_dir, device)
        result.update(info)
        if args.worker in HF_VARIANTS:
            from transformers.integrations.finegrained_fp8 import load_finegrained_fp8_kernel

            result["kernel_module"] = load_finegrained_fp8_kernel().matmul.__module__
            result["local_kernels"] = os.environ.get("LOCAL_KERNELS", "")
        result["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        vocab = model.config.vocab_size
        with torch.no_grad():
            ids = torch.randint(0, vocab, CHECK_SHAPE, generator=gen).to(device)
            torch.save(_forward(model, ids, 0).float().cpu(), args.logits)
        save()
        batches = [tuple(map(int, b.split("x"))) for b in args.batches.split(",")]
        compile_batches = [tuple(map(int, b.split("x"))) for b in args.compile_batches.split(",") if b]
        for b, s in batches:
            key = f"{b}x{s}"
            static = torch.randint(0, vocab, (b, s), generator=gen).to(device)
            try:
                with torch.no_grad():
                    mode = "cuda_graph" if device.type == "cuda" else "wall_cpu"  # no graphs on the CPU
                    result["times_us"].setdefault(mode, {})[key] = _time_graph(
                        lambda static=static: _forward(model, static, 1), device
                    )
            except Exception as exc:
                result["errors"][f"timing {key}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if compile_batches and args.compile_mode != "off":
            compiled = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode,
                                     dynamic=False)  # fmt: skip
            result["compile_mode"] = args.compile_mode
            for b, s in compile_batches:
                key = f"{b}x{s}"
                static = torch.randint(0, vocab, (b, s), generator=gen).to(device)
                try:
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        _forward(compiled, static, 1)
                        result.setdefault("compile_seconds", {})[key] = time.perf_counter() - t0
                        result["times_us"].setdefault("torch_compile", {})[key] = _time_wall(
                            lambda static=static: _forward(compiled, static, 1), device
                        )
                except Exception as exc:
                    result["errors"][f"torch_compile {key}"] = (f"{type(exc).__name__}: "
                                                                f"{str(exc).splitlines()[0][:300]}")  # fmt: skip
                # one graph and no break expected; else the time holds eager parts
                from torch._dynamo.utils import counters

                result["compile_graphs"] = {"graphs": counters["stats"]["unique_graphs"],
                                            "breaks": sum(counters["graph_break"].values())}  # fmt: skip
                save()
    except Exception as exc:
        result["errors"]["load"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        result["traceback"] = traceback.format_exc()[-3000:]
    save()
    return 0


# --- the parent --------------------------------------------------------------------------------------------------


def _environment(device: str) -> dict:
    import importlib.metadata

    import torch

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__}  # fmt: skip
    for dist in ("fp8gemm-core", "fp8gemm-cuda-sm90a", "transformers", "kernels", "accelerate", "triton"):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if device.startswith("cuda") and torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["cuda_runtime"] = torch.version.cuda
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
            env["driver"] = smi
        except Exception as exc:
            env["driver"] = f"unknown ({exc})"
    else:
        env["device"] = "cpu"
    env["TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR"] = os.environ.get("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR")
    env["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE")
    return env


def build_model(spec: dict, directory: Path, device: str, seed: int) -> dict:
    """The bf16 model from its config with random weights (seeded), saved as safetensors: every variant loads it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = config_of(spec)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {"config": {k: v for k, v in spec.items()}, "parameters": params}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    p.add_argument("--hub", help="ci/build_hub.py's output directory, for the LOCAL_KERNELS route")
    p.add_argument("--tiny", action="store_true", help="tiny configs (CPU check of the script)")
    p.add_argument("--quick", action="store_true", help=f"batches {QUICK_BATCHES}, no torch.compile")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--compile-mode", default="reduce-overhead",
                   help="torch.compile mode (default: reduce-overhead, what transformers' generate compiles with; "
                        "default, max-autotune-no-cudagraphs, ... or off)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=300, help="seconds per variant process")
    p.add_argument("--name", default="models", help="the report is <out>/<name>.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--logits", help=argparse.SUPPRESS)
    p.add_argument("--batches", help=argparse.SUPPRESS)
    p.add_argument("--compile-batches", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    unknown = sorted({m for m in args.models.split(",") if m} - MODELS.keys())
    unknown += sorted({v for v in args.variants.split(",") if v} - set(VARIANTS))
    if unknown:
        p.error(f"unknown --models/--variants {unknown}: models are {list(MODELS)}, variants {list(VARIANTS)}")

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    specs = TINY if args.tiny else MODELS
    batches = TINY_BATCHES if args.tiny else QUICK_BATCHES if args.quick else BATCHES
    compile_batches = () if args.quick or args.device == "cpu" else (TINY_BATCHES[:1] if args.tiny else COMPILE_BATCHES)
    report: dict = {"environment": _environment(args.device), "method": {
        "batches": [f"{b}x{s}" for b, s in batches], "compile_batches": [f"{b}x{s}" for b, s in compile_batches],
        "compile_mode": args.compile_mode, "replays": REPLAYS, "check_input_ids": list(CHECK_SHAPE),
        "forward": "model(input_ids, use_cache=False, logits_to_keep=1): batch x seq tokens, no KV cache; "
                   "cuda_graph: the forward captured once on static input ids, median replay; torch_compile: "
                   "torch.compile(model, dynamic=False), median of eager calls of the compiled forward",
        "variants": {"bf16": "the bf16 model, experts_implementation grouped_mm (transformers' default)",
                     "convert": "fp8gemm.nn.convert(bf16 model): Fp8Linear and Fp8Experts, lm_head bf16",
                     "hf-fp8-local": f"transformers FP8 (FineGrainedFP8Config), {REPO_ID} mapped by LOCAL_KERNELS "
                                     "to ci/build_hub.py's layout",
                     "hf-fp8-python": "transformers FP8 (FineGrainedFP8Config), fp8gemm.hf.use_in_transformers()",
                     "hf-fp8-experts": "hf-fp8-python with experts_implementation=\"fp8gemm\" (each experts layer "
                                       "one fp8gemm.fused_experts call); models with experts only"},
        "targets": TARGETS}, "models": {}, "results": {}}  # fmt: skip
    json_path = args.out / f"{args.name}.json"

    def save():
        report["summary"] = summarize(report["results"])
        json_path.write_text(json.dumps(report, indent=1) + "\n")

    variants = [v for v in args.variants.split(",") if v]
    with tempfile.TemporaryDirectory(prefix="fp8gemm-models-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            model_dir = Path(tmp) / name
            try:
                report["models"][name] = build_model(specs[name], model_dir, args.device, args.seed)
            except Exception as exc:
                report["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                save()
                continue
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            results = report["results"].setdefault(name, {})
            logits = {}
            for variant in variants:
                if variant in MOE_ONLY and "num_experts" not in specs[name]:
                    continue  # no experts layer: the same model as hf-fp8-python
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                env.pop("LOCAL_KERNELS", None)
                if variant == "hf-fp8-local":
                    if not args.hub:
                        results[variant] = {"errors": {"load": "missing: no --hub (ci/build_hub.py's output)"}}
                        save()
                        continue
                    env["LOCAL_KERNELS"] = f"{REPO_ID}={Path(args.hub).resolve()}"
                result_file, logits_file = Path(tmp) / f"{name}-{variant}.json", Path(tmp) / f"{name}-{variant}.pt"
                cmd = [sys.executable, "-m", "fp8gemm_bench.models", "--worker", variant, "--model", name,
                       "--model-dir", str(model_dir), "--result", str(result_file), "--logits", str(logits_file),
                       "--device", args.device,
                       "--seed", str(args.seed), "--batches", ",".join(f"{b}x{s}" for b, s in batches),
                       "--compile-batches", ",".join(f"{b}x{s}" for b, s in compile_batches
                                                     if variant in COMPILE_VARIANTS),
                       "--compile-mode", args.compile_mode]  # fmt: skip
                t0 = time.perf_counter()
                try:
                    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                    tail = (run.stdout + run.stderr)[-2000:]
                except subprocess.TimeoutExpired as exc:
                    tail = f"timed out after {args.timeout} s: {str(exc.stderr or '')[-1500:]}"
                result = json.loads(result_file.read_text()) if result_file.exists() else {"errors": {}}
                result["seconds"] = time.perf_counter() - t0
                if not result_file.exists() or result.get("errors"):
                    result["log_tail"] = tail
                if logits_file.exists():
                    logits[variant] = torch.load(logits_file)
                    if "bf16" in logits and variant != "bf16":
                        result["logits_rel_err_vs_bf16"] = rel(logits[variant], logits["bf16"])
                if variant == "hf-fp8-experts":
                    if "hf-fp8-python" in logits and variant in logits:
                        result["logits_rel_err_vs_hf_fp8_python"] = rel(logits[variant], logits["hf-fp8-python"])
                    if "convert" in logits and variant in logits:
                        result["logits_bitwise_equal_to_convert"] = torch.equal(logits[variant], logits["convert"])
                if variant == "hf-fp8-python" and {"hf-fp8-local", "hf-fp8-python"} <= logits.keys():
                    result["logits_bitwise_equal_to_local_route"] = torch.equal(logits["hf-fp8-local"],
                                                                                 logits["hf-fp8-python"])  # fmt: skip
                results[variant] = result
                print(f"{name} {variant}: {result.get('times_us')} errors={list(result.get('errors', {}))} "
                      f"({result['seconds']:.0f} s)", flush=True)  # fmt: skip
                save()
    save()
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
