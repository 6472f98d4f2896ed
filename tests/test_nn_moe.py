"""fp8gemm.nn for mixtures of experts: Fp8Experts (from weights, forward, state dicts, FP8 dtypes), convert on small
randomly initialised Hugging Face Qwen3-MoE and DeepSeek-V3 models (built from configs, nothing downloaded), and FP8
checkpoints whose experts are stored one by one, stacked while they load."""

from __future__ import annotations

import copy

import fp8gemm
import pytest
import torch
from fp8gemm.moe_reference import reference_fused_experts
from fp8gemm.nn import Fp8Experts, convert, load_fp8_checkpoint
from fp8gemm.testing import conformance
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
BF16_BOUND = 6e-3  # fused experts against float64: two GEMMs in a row (tests/test_moe.py says why)
# One FP8 expert layer against its bf16 weights: e4m3 rounds x, w13, the activation and w2 (each ~2.5% RMS), and the
# gate's and up's errors multiply in silu(gate) * up: measured 6.0-6.9% over 8 seeds.
EXPERTS_BOUND = 0.1
# Logits of the two-layer models against bf16, everything but lm_head converted. Qwen3-MoE: 6.8-7.4% over 6 seeds.
# DeepSeek-V3: 12-19%, from its attention's five low-rank projections (converting all but them: 6-13%); its routed
# experts alone move the logits by 2.1-2.4% (Qwen3-MoE's by 0.7-0.8%). A wrong expert, scale or gate/up order: ~100%.
LOGITS_BOUND = {"qwen3_moe": 0.15, "deepseek_v3": 0.3}
EXPERTS_ONLY_BOUND = 0.05
TOP1_AGREEMENT = 0.7  # random weights give close logits, so some argmax flips are expected (measured 75-93%)

COMMON = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)  # fmt: skip
MODELS = {
    "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**COMMON, head_dim=64, num_experts=8, num_experts_per_tok=2)),
    "deepseek_v3": (DeepseekV3ForCausalLM, DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": 4}, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=128, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64,
        v_head_dim=64)),
}  # fmt: skip
MOE_LAYERS = {"qwen3_moe": (0, 1), "deepseek_v3": (1,)}  # DeepSeek-V3's first layer is dense


def _model(kind: str, seed: int, device="cpu", **config):
    torch.manual_seed(seed)
    cls, base = MODELS[kind]
    cfg = copy.deepcopy(base)
    for key, value in config.items():
        setattr(cfg, key, value)
    return cls(cfg).to(device=device, dtype=torch.bfloat16).eval()


def _experts_weights(experts=4, hidden=256, inter=128, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    print(f"experts data seed {seed}")
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / 16).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=gen) / 16).to(dtype)
    return gate_up, down


def _routing(tokens, experts, k, seed):
    gen = torch.Generator().manual_seed(seed)
    weights, ids = torch.randn(tokens, experts, generator=gen).softmax(-1).topk(k)
    return ids, weights


def _bf16_experts(gate_up, down, x, ids, weights):
    """float64 of transformers' experts loop on the unquantized weights."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = down.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            h = gate_up[ids[t, j]].double() @ x[t].double()
            out[t] += weights[t, j].double() * (
                down[ids[t, j]].double() @ (torch.nn.functional.silu(h[:inter]) * h[inter:])
            )
    return out


# --- Fp8Experts --------------------------------------------------------------------------------------------------


def test_from_weights_quantizes_each_expert_and_runs(device):
    gate_up, down = _experts_weights(seed=1)
    module = Fp8Experts.from_weights(gate_up.to(device), down.to(device))
    q, scale = fp8gemm.quantize_weight(gate_up[2].to(device))
    assert torch.equal(module.w13[2].view(torch.uint8), q.view(torch.uint8)) and torch.equal(
        module.w13_scale_inv[2], scale
    )
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    ids, weights = _routing(9, 4, 2, seed=3)
    out = module(x.to(device), ids.to(device), weights.to(device)).cpu()
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    cpu = module.to("cpu")
    expected = reference_fused_experts(x, ids, weights, cpu.w13, cpu.w13_scale_inv, cpu.w2, cpu.w2_scale_inv)
    assert conformance.relative_error(out, expected) < BF16_BOUND
    assert conformance.relative_error(out, _bf16_experts(gate_up, down, x, ids, weights)) < EXPERTS_BOUND


def test_forward_takes_leading_dims():
    module = Fp8Experts.from_weights(*_experts_weights(seed=4))
    x = torch.randn(2, 3, 256).bfloat16()
    ids, weights = _routing(6, 4, 2, seed=5)
    out = module(x, ids.view(2, 3, 2), weights.view(2, 3, 2))
    assert out.shape == (2, 3, 256) and torch.equal(out.view(6, 256), module(x.view(6, 256), ids, weights))


def test_state_dict_round_trip_and_transformers_names():
    gate_up, down = _experts_weights(seed=6)
    module = Fp8Experts.from_weights(gate_up, down)
    state = module.state_dict()
    assert set(state) == {"w13", "w13_scale_inv", "w2", "w2_scale_inv"}
    assert state["w13_scale_inv"].shape == (4, 2, 2) and state["w2_scale_inv"].shape == (4, 2, 1)
    fresh = Fp8Experts(4, 256, 128)
    fresh.load_state_dict(state)
    for name in state:
        assert torch.equal(getattr(fresh, name).view(torch.uint8), getattr(module, name).view(torch.uint8))
    # a bf16 model's fused parameters, quantized on load
    from_bf16 = Fp8Experts(4, 256, 128)
    from_bf16.load_state_dict({"gate_up_proj": gate_up, "down_proj": down})
    assert torch.equal(from_bf16.w2.view(torch.uint8), module.w2.view(torch.uint8))
    # transformers' FP8 experts' names (gate_up_proj + gate_up_proj_scale_inv)
    fp8_names = Fp8Experts(4, 256, 128)
    fp8_names.load_state_dict({"gate_up_proj": state["w13"], "gate_up_proj_scale_inv": state["w13_scale_inv"],
                               "down_proj": state["w2"], "down_proj_scale_inv": state["w2_scale_inv"]})  # fmt: skip
    assert torch.equal(fp8_names.w13_scale_inv, module.w13_scale_inv)


def test_load_state_dict_reports_mismatches():
    state = Fp8Experts.from_weights(*_experts_weights(seed=7)).state_dict()
    with pytest.raises(RuntimeError, match=r"w13: shape \(4, 128, 256\) in the checkpoint, the experts take"):
        Fp8Experts(4, 256, 128).load_state_dict({**state, "w13": state["w13"][:, :128]})
    with pytest.raises(RuntimeError, match="w2: an FP8 weight without its scale"):
        Fp8Experts(4, 256, 128).load_state_dict({"w2": state["w2"]}, strict=False)
    with pytest.raises(RuntimeError, match="only 128x128 weight blocks"):
        Fp8Experts(4, 256, 128).load_state_dict({**state, "w2_scale_inv": state["w2_scale_inv"][:, :1]})


def test_e4m3fnuz_experts_take_an_e4m3fn_checkpoint_exactly():
    """The gfx942 path, forced on CPU: bits kept, scales doubled, dequantized weights equal."""
    module = Fp8Experts.from_weights(*_experts_weights(seed=8))
    target = Fp8Experts(4, 256, 128, fp8_dtype=FNUZ)
    target.load_state_dict(module.state_dict())
    assert target.w13.dtype == FNUZ and torch.equal(target.w2_scale_inv, module.w2_scale_inv * 2)
    for name in ("w13", "w2"):
        got = getattr(target, name).double() * getattr(target, name + "_scale_inv").double().repeat_interleave(128, 1).repeat_interleave(128, 2)  # fmt: skip
        want = getattr(module, name).double() * getattr(module, name + "_scale_inv").double().repeat_interleave(128, 1).repeat_interleave(128, 2)  # fmt: skip
        assert torch.equal(got, want)
    x = torch.randn(5, 256).bfloat16()
    ids, weights = _routing(5, 4, 2, seed=9)
    expected = reference_fused_experts(
        x, ids, weights, target.w13, target.w13_scale_inv, target.w2, target.w2_scale_inv
    )
    assert conformance.relative_error(target(x, ids, weights), expected) < BF16_BOUND


def test_module_dtype_casts_leave_fp8_weights_alone():
    module = Fp8Experts.from_weights(*_experts_weights(seed=10))
    before = {name: t.clone() for name, t in module.state_dict().items()}
    for cast in (lambda m: m.to(torch.float16), lambda m: m.float(), lambda m: m.bfloat16()):
        cast(module)
        for name, t in before.items():
            assert torch.equal(getattr(module, name).view(torch.uint8), t.view(torch.uint8)), name


def test_extra_repr_and_meta():
    assert repr(Fp8Experts(2, 128, 256)) == (
        "Fp8Experts(num_experts=2, hidden_size=128, intermediate_size=256, activation='silu', "
        "fp8_dtype=torch.float8_e4m3fn, weight_block=(128, 128))"
    )
    with torch.device("meta"):
        module = Fp8Experts.from_weights(*(torch.empty(t.shape) for t in _experts_weights()))
    assert module.w13.is_meta and module.w13.dtype == FN


# --- convert on transformers models --------------------------------------------------------------------------------


def test_transformers_experts_are_the_fused_3d_form():
    """transformers' Qwen3-MoE and DeepSeek-V3 hold routed experts as gate_up_proj [E, 2I, H] and down_proj
    [E, H, I] parameters (Qwen3MoeExperts, DeepseekV3Experts) that the MoE block calls with (hidden, ids, weights)."""
    for kind, layers in MOE_LAYERS.items():
        model = _model(kind, seed=0)
        experts = model.model.layers[layers[0]].mlp.experts
        assert fp8gemm.nn.is_fused_experts(experts), type(experts).__name__
        assert experts.gate_up_proj.shape == (8, 256, 256) and experts.down_proj.shape == (8, 256, 128)


@pytest.mark.parametrize("kind", list(MODELS))
@torch.no_grad()
def test_converted_model_tracks_the_bf16_model(kind, device):
    model = _model(kind, seed=0, device=device)
    ids = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(11)).to(device)
    reference = model(ids).logits.double()
    fp8_model = copy.deepcopy(model)
    report = convert(fp8_model)
    experts = [f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS[kind]]
    assert set(experts) <= set(report.converted) and list(report.skipped) == ["lm_head"]
    assert all(isinstance(fp8_model.get_submodule(name), Fp8Experts) for name in experts)
    assert "experts to Fp8Experts" in str(report)
    logits = fp8_model(ids).logits
    assert conformance.relative_error(logits, reference) < LOGITS_BOUND[kind]
    assert (logits.argmax(-1) == reference.argmax(-1)).double().mean().item() >= TOP1_AGREEMENT
    decode = fp8_model(ids[:1, :1]).logits  # T = 1
    assert conformance.relative_error(decode, model(ids[:1, :1]).logits.double()) < LOGITS_BOUND[kind]
    experts_only = copy.deepcopy(model)
    assert convert(experts_only, skip=lambda name, module: not name.endswith(".experts")).converted == experts
    assert conformance.relative_error(experts_only(ids).logits, reference) < EXPERTS_ONLY_BOUND


@pytest.mark.parametrize("kind", list(MODELS))
@torch.no_grad()
def test_converted_experts_inside_the_model_against_float64_and_bf16(kind):
    """The MoE block's own router feeds the converted experts: their output against the float64 reference of
    the same quantized operands, and against the bf16 experts they replaced."""
    model = _model(kind, seed=1)
    layer = MOE_LAYERS[kind][-1]
    block = model.model.layers[layer].mlp
    bf16_experts = block.experts
    gate_up, down = bf16_experts.gate_up_proj.detach(), bf16_experts.down_proj.detach()
    convert(model)
    seen = {}
    block.experts.register_forward_hook(lambda module, args, out: seen.update(args=args, out=out))
    model(torch.randint(0, 1000, (1, 48), generator=torch.Generator().manual_seed(12)))
    x, ids, weights = seen["args"]
    fp8 = block.experts
    expected = reference_fused_experts(x, ids, weights, fp8.w13, fp8.w13_scale_inv, fp8.w2, fp8.w2_scale_inv)
    assert conformance.relative_error(seen["out"], expected) < BF16_BOUND
    assert conformance.relative_error(seen["out"], _bf16_experts(gate_up, down, x, ids, weights)) < EXPERTS_BOUND
    assert conformance.relative_error(seen["out"], bf16_experts(x, ids, weights).double()) < EXPERTS_BOUND


def test_convert_reports_experts_it_leaves_alone():
    odd = _model("qwen3_moe", seed=2, moe_intermediate_size=96)
    report = convert(odd)
    assert (
        "intermediate size (I = 96) is not a positive multiple of 128" in report.skipped["model.layers.0.mlp.experts"]
    )
    assert not any(isinstance(m, Fp8Experts) for m in odd.modules())
    gelu = _model("qwen3_moe", seed=2, hidden_act="gelu")
    assert "is not SiLU" in convert(gelu).skipped["model.layers.1.mlp.experts"]
    skipped = convert(_model("deepseek_v3", seed=2), skip=("experts",))
    assert skipped.skipped["model.layers.1.mlp.experts"] == "skip='experts'"
    assert "model.layers.1.mlp.shared_experts.down_proj" in skipped.converted


def test_torch_compile_fullgraph_of_converted_experts():
    torch._dynamo.reset()
    module = Fp8Experts.from_weights(*_experts_weights(seed=13))
    x = torch.randn(7, 256).bfloat16()
    ids, weights = _routing(7, 4, 2, seed=14)
    with torch.no_grad():
        assert torch.equal(torch.compile(module, fullgraph=True, backend="aot_eager")(x, ids, weights), module(x, ids, weights))  # fmt: skip
    torch._dynamo.reset()


# --- checkpoints with one tensor set per expert --------------------------------------------------------------------


def per_expert_checkpoint(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A converted model's state dict as DeepSeek-V3 / Qwen3-MoE-FP8 checkpoints store experts: gate_proj, up_proj and
    down_proj weights with their weight_scale_inv, one set per expert."""
    out = {}
    for key, t in state.items():
        prefix, _, name = key.rpartition(".")
        if name in ("w13", "w13_scale_inv", "w2", "w2_scale_inv"):
            continue
        out[key] = t
    for key in [k for k in state if k.endswith(".w13")]:
        prefix = key[: -len(".w13")]
        w13, s13, w2, s2 = (state[f"{prefix}.{n}"] for n in ("w13", "w13_scale_inv", "w2", "w2_scale_inv"))
        inter = w13.shape[1] // 2
        for e in range(w13.shape[0]):
            parts = {"gate_proj": (w13[e, :inter], s13[e, : inter // 128]), "up_proj": (w13[e, inter:], s13[e, inter // 128 :]),
                     "down_proj": (w2[e], s2[e])}  # fmt: skip
            for name, (weight, scale) in parts.items():
                out[f"{prefix}.{e}.{name}.weight"] = weight.contiguous()
                out[f"{prefix}.{e}.{name}.weight_scale_inv"] = scale.contiguous()
    return out


def _save_shards(tensors: dict[str, torch.Tensor], folder, first) -> None:
    """Two shards: keys for which ``first(key)`` holds, then the rest, with the index naming them."""
    import json

    shards = {"a.safetensors": {k: v for k, v in tensors.items() if first(k)}}
    shards["b.safetensors"] = {k: v for k, v in tensors.items() if not first(k)}
    for name, part in shards.items():
        save_file(part, folder / name)
    weight_map = {key: name for name, part in shards.items() for key in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("kind", list(MODELS))
@torch.no_grad()
def test_per_expert_fp8_checkpoint_stacks_into_a_converted_model(kind, tmp_path, device):
    source = _model(kind, seed=3)
    convert(source)
    checkpoint = per_expert_checkpoint(source.state_dict())
    assert f"model.layers.{MOE_LAYERS[kind][0]}.mlp.experts.7.up_proj.weight_scale_inv" in checkpoint
    # expert 2's gate in the first shard, its up and down in the second; layer-0 tensors all first
    _save_shards(checkpoint, tmp_path, lambda key: ".experts.2.gate_proj." in key or ".layers.0." in key)
    target = _model(kind, seed=4, device=device)  # other random weights, to be overwritten
    convert(target, fp8_dtype=fp8gemm.preferred_fp8_dtype(device))
    result = load_fp8_checkpoint(target, tmp_path, device=device)
    assert result.missing_keys == [] and result.unexpected_keys == []
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(15))
    # The source on the same device runs the same kernels: the loaded model must reproduce it bit for bit.
    source = source.to(device)
    assert torch.equal(target(ids.to(device)).logits, source(ids.to(device)).logits)


def test_a_missing_expert_is_named_and_extra_experts_are_unexpected(tmp_path):
    source = _model("qwen3_moe", seed=5)
    convert(source)
    checkpoint = per_expert_checkpoint(source.state_dict())
    del checkpoint["model.layers.1.mlp.experts.3.up_proj.weight"], checkpoint["model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"]  # fmt: skip
    checkpoint["model.layers.0.mlp.experts.8.down_proj.weight"] = checkpoint["model.layers.0.mlp.experts.0.down_proj.weight"].clone()  # fmt: skip
    save_file(checkpoint, tmp_path / "model.safetensors")
    target = _model("qwen3_moe", seed=6)
    convert(target)
    with pytest.raises(RuntimeError, match=r"missing \['model.layers.1.mlp.experts.3.up_proj.weight'\], unexpected "
                                           r"\['model.layers.0.mlp.experts.8.down_proj.weight'\]"):  # fmt: skip
        load_fp8_checkpoint(target, tmp_path / "model.safetensors")


def test_experts_skeleton_on_meta_is_filled_expert_by_expert(tmp_path):
    gate_up, down = _experts_weights(seed=16)
    source = torch.nn.Module()
    source.experts = Fp8Experts.from_weights(gate_up, down)
    save_file(per_expert_checkpoint(source.state_dict()), tmp_path / "model.safetensors")
    with torch.device("meta"):
        skeleton = torch.nn.Module()
        skeleton.experts = Fp8Experts(4, 256, 128)
    result = load_fp8_checkpoint(skeleton, tmp_path / "model.safetensors")
    assert result.missing_keys == [] and not skeleton.experts.w13.is_meta
    for name, t in source.state_dict().items():
        assert torch.equal(skeleton.state_dict()[name].view(torch.uint8), t.view(torch.uint8)), name


def test_experts_left_in_bf16_get_the_dequantized_checkpoint(tmp_path):
    source = _model("qwen3_moe", seed=7)
    convert(source)
    save_file(per_expert_checkpoint(source.state_dict()), tmp_path / "model.safetensors")
    target = _model("qwen3_moe", seed=8)
    convert(target, skip=("experts", "lm_head"))
    assert load_fp8_checkpoint(target, tmp_path / "model.safetensors").missing_keys == []
    fp8, plain = source.model.layers[0].mlp.experts, target.model.layers[0].mlp.experts
    dequantized = fp8.w13[5].float() * fp8.w13_scale_inv[5].repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(plain.gate_up_proj[5], dequantized.bfloat16())
