"""Whole transformers models, eager, for ci/host_overhead.py ``--models``: Qwen3 and Qwen3-MoE built from their configs
(random weights, no download) in bf16 and in each FP8 route, timed per batch x sequence in turns; and the per-call
timer (the best of seven loops) both parts of the tool use."""

from __future__ import annotations

import contextlib
import copy
import gc
import time
import warnings

import fp8gemm
import torch

MODELS = {
    "qwen3": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, vocab_size=151936),
    "qwen3-moe": dict(hidden_size=4096, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
                      num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                      vocab_size=151936, decoder_sparse_step=1, mlp_only_layers=[]),
}  # fmt: skip
TINY_MODELS = {
    "qwen3": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  vocab_size=512),
    "qwen3-moe": dict(hidden_size=256, moe_intermediate_size=128, intermediate_size=512, num_experts=8,
                      num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                      decoder_sparse_step=1, mlp_only_layers=[]),
}  # fmt: skip
BATCHES = "1x1,16x1,64x1,1x2048,4x2048"
TINY_BATCHES = "1x1,4x1,2x16"


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(calls, 100)):
        fn()
    best = float("inf")
    for _ in range(7):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


# --- whole models, eager ---------------------------------------------------------------------------------------------


def build_model(name: str, spec: dict, layers: int, device: str):
    """The bf16 model from its config, random weights from a fixed seed."""
    import transformers

    cls = transformers.Qwen3Config if name == "qwen3" else transformers.Qwen3MoeConfig
    config = cls(**spec, num_hidden_layers=layers, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def transformers_fp8(model):
    """transformers' own FP8 model of ``model``, in place: ``replace_with_fp8_linear`` with ``FineGrainedFP8Config()``
    (the modules quantize-on-load puts in), filled with the bf16 weights quantized per 128x128 block."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear, replace_with_fp8_linear

    device = next(model.parameters()).device
    before = dict(model.named_modules())
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=FineGrainedFP8Config())
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (FP8Linear, FP8Experts)):
                module.to_empty(device=device)
                for proj in ("gate_up_proj", "down_proj") if isinstance(module, FP8Experts) else ("weight",):
                    w = getattr(before[name], proj).detach().float()
                    pairs = [fp8gemm.quantize_weight(m) for m in w.reshape(-1, *w.shape[-2:])]
                    getattr(module, proj).copy_(torch.stack([q for q, _ in pairs]).view(w.shape))
                    scale = getattr(module, "weight_scale_inv" if proj == "weight" else proj + "_scale_inv")
                    scale.copy_(torch.stack([s for _, s in pairs]).view(scale.shape))
    if hasattr(model, "set_experts_implementation") and any(isinstance(m, FP8Experts) for m in model.modules()):
        model.set_experts_implementation("fp8gemm")
    return model


@contextlib.contextmanager
def null_fp8_linear_kernel():
    """transformers' FP8Linear with a kernel that only allocates its output (its ``finegrained_fp8_linear``
    replaced): what its own Python costs per call, the floor of its route. Yields whether it could be replaced."""
    from transformers.integrations import finegrained_fp8

    real = getattr(finegrained_fp8, "finegrained_fp8_linear", None)
    if real is None:
        yield False
        return

    def null(input, weight, *args, **kwargs):
        return input.new_empty((*input.shape[:-1], weight.shape[0]))

    finegrained_fp8.finegrained_fp8_linear = null
    try:
        yield True
    finally:
        finegrained_fp8.finegrained_fp8_linear = real


def forward_us(model, ids, forwards: int) -> float:
    def forward():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    for _ in range(2):
        forward()
    return per_call_us(forward, forwards) if forwards else float("nan")


def compare_models(args, device: str) -> dict:
    """Each model in each variant, timed per batch x sequence: us per forward and the ratio to bf16."""
    specs = TINY_MODELS if args.tiny else MODELS
    batches = args.batches or (TINY_BATCHES if args.tiny else BATCHES)
    shapes = [tuple(map(int, b.split("x"))) for b in batches.split(",")]
    results = {}
    warnings.simplefilter("ignore", fp8gemm.nn.ReferenceOnCpuWarning)  # --tiny on the CPU: the reference, knowingly
    for name in args.which.split(","):
        results[name] = compare_model(name, specs[name], shapes, args, device)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def model_variants(name: str, spec: dict, args, device: str) -> tuple[dict, int]:
    """Every variant's model, all held at once so that they are timed in turns: {variant: (model, patch)}, where
    patch is a context manager around each of its calls; and how many modules the swap converted."""
    bf16 = build_model(name, spec, args.layers, device)
    converted = copy.deepcopy(bf16)
    fp8gemm.nn.convert(converted)
    hf_model = transformers_fp8(copy.deepcopy(bf16))
    swapped = copy.deepcopy(hf_model)
    count = len(fp8gemm.nn.convert(swapped).converted)
    variants = {"bf16": (bf16, contextlib.nullcontext), "convert": (converted, contextlib.nullcontext),
                "hf-fp8": (hf_model, contextlib.nullcontext)}  # fmt: skip
    with null_fp8_linear_kernel() as patched:
        if patched and not args.null:  # transformers' own host path: the most its route can reach
            variants["hf-fp8, null kernel"] = (hf_model, null_fp8_linear_kernel)
    variants["hf-fp8+convert"] = (swapped, contextlib.nullcontext)
    return variants, count


def compare_model(name: str, spec: dict, shapes, args, device: str) -> dict:
    """Each variant timed per batch in turns, the order rotated each round (a host drifts over minutes: one variant
    after another measured the same modules up to 1.3x apart), the best of the rounds kept."""
    variants, swapped = model_variants(name, spec, args, device)
    bf16 = variants["bf16"][0]
    gen = torch.Generator().manual_seed(1)
    inputs = {f"{b}x{s}": torch.randint(0, spec["vocab_size"], (b, s), generator=gen).to(device) for b, s in shapes}
    entry = {"config": spec, "layers": args.layers, "us": {v: {} for v in variants}, "vs_bf16": {}, "swapped": swapped,
             "rounds": args.rounds, "bf16_experts_implementation": getattr(bf16.config, "_experts_implementation", None)}  # fmt: skip
    order = list(variants)
    with getattr(torch, args.mode)():
        logits = {v: model(input_ids=inputs[next(iter(inputs))], use_cache=False).logits for v, (model, _) in
                  variants.items() if v != "hf-fp8, null kernel"}  # fmt: skip
        for key, ids in inputs.items():
            for turn in range(args.rounds):
                for variant in order[turn % len(order) :] + order[: turn % len(order)]:
                    model, patch = variants[variant]
                    with patch():
                        t = forward_us(model, ids, args.forwards)
                    entry["us"][variant][key] = min(entry["us"][variant].get(key, t), t)
    print(f"  {'model':10s} {'us/forward':20s}" + "".join(f"{k:>10s}" for k in inputs))
    for variant, times in entry["us"].items():
        ratios = entry["vs_bf16"][variant] = {key: entry["us"]["bf16"][key] / t for key, t in times.items()}
        print(f"  {name:10s} {variant:20s}" + "".join(f"{t:10.0f}" for t in times.values())
              + "   vs bf16: " + " ".join(f"{r:.2f}x" for r in ratios.values()), flush=True)  # fmt: skip
    if not args.null:  # the null backend writes nothing: its outputs are not numbers
        entry["swap_logits_equal"] = bool(torch.equal(logits["hf-fp8"], logits["hf-fp8+convert"]))
        print(f"  {name}: hf-fp8+convert's logits equal hf-fp8's bit for bit: {entry['swap_logits_equal']}")
    return entry
