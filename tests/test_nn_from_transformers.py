"""``fp8gemm.nn.convert`` on transformers' FP8 models: its ``FP8Linear`` and ``FP8Experts`` become ``Fp8Linear`` and
``Fp8Experts`` holding the same FP8 weights and scales (the same memory, bit for bit: nothing is quantized again), and
the model gives the logits of transformers' FP8 route on fp8gemm.hf bit for bit, on CPU on fp8gemm's reference.

transformers refuses FP8 models on CPU at load, so the models are built as tests/test_transformers_kernel.py builds
its modules: tiny Qwen3 and Qwen3-MoE from configs, ``replace_with_fp8_linear`` with ``FineGrainedFP8Config`` (what
quantize-on-load puts in), every FP8 weight and scale drawn from a printed seed."""

from __future__ import annotations

import os

import fp8gemm
import pytest
import torch
from fp8gemm import hf
from fp8gemm.nn import Fp8Experts, Fp8Linear, convert, to_fp8_dtype
from fp8gemm.testing.conformance import TOLERANCE, relative_error
from test_transformers_kernel import SEED, activations, fp8_weight, gemm64, needs_transformers

pytestmark = [needs_transformers, pytest.mark.filterwarnings("ignore::fp8gemm.nn.ReferenceOnCpuWarning")]
LAYERS = 2
DENSE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=512, tie_word_embeddings=False)  # fmt: skip
MOE = dict(DENSE, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
           mlp_only_layers=[])  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def fp8gemm_in_transformers():
    """transformers' FP8 modules on fp8gemm.hf, and experts_implementation="fp8gemm" registered."""
    before = os.environ.get("LOCAL_KERNELS")
    hf.use_in_transformers()
    yield
    if before is None:
        os.environ.pop("LOCAL_KERNELS", None)
    else:
        os.environ["LOCAL_KERNELS"] = before


def fp8_model(moe: bool, scale_fmt: str = "float"):
    """A tiny model with transformers' FP8 modules, weights and scales from the seed (scales powers of two for
    ``scale_fmt="ue8m0"``, stored as float8_e8m0fnu as transformers stores them)."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config, Qwen3Config, Qwen3MoeConfig
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear, replace_with_fp8_linear

    torch.manual_seed(SEED)
    config = Qwen3MoeConfig(**MOE) if moe else Qwen3Config(**DENSE)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    quantization = FineGrainedFP8Config(scale_fmt=scale_fmt)
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=quantization)
    offset = 1000
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (FP8Linear, FP8Experts)):
                module.to_empty(device="cpu")
                for name in ("gate_up_proj", "down_proj") if isinstance(module, FP8Experts) else ("weight",):
                    w, s = fp8_weight(tuple(getattr(module, name).shape), offset, magnitude=0.05)
                    offset += 2
                    scale = getattr(module, "weight_scale_inv" if name == "weight" else name + "_scale_inv")
                    if scale_fmt == "ue8m0":
                        s = torch.exp2(torch.round(torch.log2(s)))
                    getattr(module, name).copy_(w)
                    scale.copy_(s.to(scale.dtype))
                if isinstance(module, FP8Experts):
                    module._is_expert_parallel = False
    if moe:
        model.set_experts_implementation("fp8gemm")
    return model.eval()


def fp8_modules(model) -> dict:
    from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear

    return {name: m for name, m in model.named_modules() if isinstance(m, (FP8Linear, FP8Experts))}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3-moe"])
@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_the_swap_keeps_the_checkpoint_bits_and_the_route_s_logits(moe, scale_fmt):
    print(f"data seed {SEED} (FP8GEMM_TEST_SEED)")
    model = fp8_model(moe, scale_fmt)
    before = fp8_modules(model)
    ids = torch.randint(0, DENSE["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        route = model(input_ids=ids, use_cache=False).logits
        report = convert(model)
        swapped = model(input_ids=ids, use_cache=False).logits
    assert sorted(report.converted) == sorted(before) and list(report.skipped) == ["lm_head"]
    assert len(before) == LAYERS * (5 if moe else 7)
    for name, old in before.items():
        new = model.get_submodule(name)
        pairs = (("w13", "gate_up_proj"), ("w2", "down_proj")) if moe and name.endswith("experts") else (("weight", "weight"),)  # fmt: skip
        assert isinstance(new, Fp8Experts if len(pairs) == 2 else Fp8Linear), name
        for ours, theirs in pairs:
            weight, scale = getattr(new, ours), getattr(new, ours + "_scale_inv")
            old_weight, old_scale = getattr(old, theirs), getattr(old, theirs + "_scale_inv")
            assert same_bits(weight, old_weight) and weight.data_ptr() == old_weight.data_ptr(), name  # no copy
            assert scale.dtype == torch.float32 and torch.equal(scale, old_scale.float()), name
            if scale_fmt == "float":
                assert scale.data_ptr() == old_scale.data_ptr(), name
    assert bool(route.isfinite().all()) and torch.equal(swapped, route)


def test_a_swapped_layer_matches_float64():
    model = fp8_model(moe=False)
    layer = model.model.layers[0].mlp.down_proj
    weight, scale = layer.weight.detach(), layer.weight_scale_inv.detach()
    convert(model)
    x = activations((3, 5, 512), 7)
    with torch.no_grad():
        out = model.model.layers[0].mlp.down_proj(x)
    assert relative_error(out, gemm64(x, weight, scale)) <= TOLERANCE[torch.bfloat16]


def dequantized(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """[E, N, K] FP8 times its [E, N/128, K/128] scales, exactly (fp64 holds every product)."""
    return w.double() * s.double().repeat_interleave(128, -2).repeat_interleave(128, -1)


def test_fp8_dtype_re_expresses_the_same_values():
    """On gfx942 the backend takes e4m3fnuz: the swap converts exactly (to_fp8_dtype), the same values in the other
    format; the activations are then quantized to that format too, so the logits are not the e4m3fn route's."""
    model = fp8_model(moe=True)
    before = {n: (m.gate_up_proj.detach().clone(), m.gate_up_proj_scale_inv.detach().clone())
              for n, m in fp8_modules(model).items() if n.endswith("experts")}  # fmt: skip
    convert(model, fp8_dtype=torch.float8_e4m3fnuz)
    for name, (w, s) in before.items():
        new = model.get_submodule(name)
        expected = to_fp8_dtype(w, s, torch.float8_e4m3fnuz)
        assert same_bits(new.w13, expected[0]) and torch.equal(new.w13_scale_inv, expected[1])
        assert torch.equal(dequantized(new.w13, new.w13_scale_inv), dequantized(w, s))
    ids = torch.randint(0, DENSE["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(SEED + 1))
    with torch.no_grad():
        assert bool(model(input_ids=ids, use_cache=False).logits.isfinite().all())


def test_layers_fp8gemm_does_not_run_as_transformers_defines_them_are_left_with_a_reason():
    from transformers.integrations.finegrained_fp8 import FP8GroupedLinear, FP8Linear

    model = fp8_model(moe=True)
    layer = model.model.layers[0]
    static = FP8Linear(256, 256, block_size=(128, 128), activation_scheme="static")
    per_tensor = FP8Linear(256, 256, block_size=None)
    layer.self_attn.o_proj, layer.self_attn.q_proj = static, per_tensor
    layer.extra = FP8GroupedLinear(128, 256, n_groups=2, block_size=(128, 128))
    model.model.layers[1].mlp.experts._is_expert_parallel = True
    report = convert(model)
    assert report.skipped == {
        "model.layers.0.self_attn.q_proj": "block_size = None; Fp8Linear takes one scale per 128x128 block",
        "model.layers.0.self_attn.o_proj": "activation_scheme='static'; Fp8Linear quantizes activations per token per 128",
        "model.layers.0.extra": "FP8GroupedLinear is a subclass of nn.Linear; only plain nn.Linear is converted",
        "model.layers.1.mlp.experts": "expert parallel (ids of other ranks' experts); Fp8Experts holds every expert",
        "lm_head": "skip='lm_head'",
    }  # fmt: skip
    assert layer.self_attn.o_proj is static and isinstance(layer.mlp.experts, Fp8Experts)
    assert isinstance(layer.self_attn.k_proj, Fp8Linear) and fp8gemm.nn.ConversionReport is type(report)
