"""``experts_implementation="fp8gemm"`` (fp8gemm.hf.experts): transformers' own FP8Experts, and a small Qwen3-MoE
model quantized as transformers' FineGrainedFP8Config quantizes it, run as ``fp8gemm.fused_experts``; on CPU, on
fp8gemm's reference. The modules are built as tests/test_transformers_kernel.py builds them (transformers refuses FP8
models on CPU at load), the model as fp8gemm_bench.models' ``--tiny`` mode builds it.

What is compared, and why the bound against transformers' grouped_mm route is not the GEMM bound: both routes quantize
the intermediate silu(gate) * up to FP8 before the down projection, transformers from a gate/up product rounded to bf16
and an activation computed in bf16, fused_experts from the fp32 product. The few codes those roundings move to an FP8
neighbour make the two differ by 1.0-2.5e-2 (seeds 1-3, four draws each), while each is 1.6-2.4e-3 from a float64
model of its own arithmetic and both are 3.9-4.6e-2 from the experts with an unquantized intermediate, neither nearer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import fp8gemm
import pytest
import torch
from fp8gemm import hf
from fp8gemm.hf import experts as hf_experts
from fp8gemm.moe_reference import dequantize64, reference_fused_experts
from fp8gemm.testing.conformance import relative_error
from test_moe import BF16_BOUND
from test_transformers_kernel import (
    EXPERTS,
    EXPERTS_BOUND,
    HIDDEN,
    INTER,
    SEED,
    TOKENS,
    activations,
    build_experts,
    experts64,  # fmt: skip
    fp8_weight,
    needs_transformers,
    routing,
)

pytestmark = needs_transformers
# fp8gemm's route against transformers' grouped_mm route on the same weights: 1.0-2.5e-2 measured (module docstring)
ROUTES_BOUND = 4e-2
# fp8gemm's distance to the unquantized intermediate, over grouped_mm's: 0.94-1.06 measured
NO_WORSE = 1.15
# logits of the tiny model, fp8gemm's experts against transformers' grouped_mm route: 1.9-2.1e-2 measured (seeds 1-4,
# 20261201), while each is 7.5-7.8e-2 from the bf16 model's
LOGITS_BOUND = 4e-2
TINY_MOE = dict(hidden_size=256, moe_intermediate_size=128, intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def fp8gemm_in_transformers():
    """use_in_transformers() for the whole module (it registers "fp8gemm" too): the grouped_mm routes compared here
    and the fallbacks run on fp8gemm's finegrained-fp8 interface. LOCAL_KERNELS is restored after."""
    before = os.environ.get("LOCAL_KERNELS")
    hf.use_in_transformers()
    yield
    if before is None:
        os.environ.pop("LOCAL_KERNELS", None)
    else:
        os.environ["LOCAL_KERNELS"] = before


def direct(experts, hidden, ids, weights) -> torch.Tensor:
    """fp8gemm.fused_experts on the module's own tensors; another rank's experts (ids >= E) as -1."""
    return fp8gemm.fused_experts(hidden, torch.where(ids < EXPERTS, ids, -1), weights, experts.gate_up_proj.detach(),
                                 experts.gate_up_proj_scale_inv.detach(), experts.down_proj.detach(),
                                 experts.down_proj_scale_inv.detach())  # fmt: skip


def unquantized_intermediate64(experts, hidden, ids, weights) -> torch.Tensor:
    """float64 experts on the quantized x and weights with silu(gate) * up kept exact (not requantized to FP8)."""
    xq, xs = fp8gemm.quantize_activation(hidden, fp8_dtype=experts.gate_up_proj.dtype)
    x64 = dequantize64(xq, xs)
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e >= EXPERTS:
                continue
            h = x64[t] @ dequantize64(experts.gate_up_proj[e], experts.gate_up_proj_scale_inv[e]).t()
            gate, up = h[:INTER], h[INTER:]
            down = dequantize64(experts.down_proj[e], experts.down_proj_scale_inv[e])
            out[t] += weights[t, j].double() * ((gate * torch.sigmoid(gate) * up) @ down.t())
    return out


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["all-experts", "ep-sentinels"])
def test_fp8gemm_experts_are_fused_experts_bit_for_bit_and_match_grouped_mm(expert_parallel):
    print(f"data seed {SEED} (FP8GEMM_TEST_SEED)")
    hidden = activations((TOKENS, HIDDEN), 3)
    ids, weights = routing(4, sentinels=expert_parallel)
    experts = build_experts("fp8gemm", expert_parallel)
    out = experts(hidden, ids, weights)  # grad mode, as a model without no_grad: the FP8 parameters require grad
    with torch.no_grad():
        assert torch.equal(out, direct(experts, hidden, ids, weights))
        assert torch.equal(experts(hidden.unsqueeze(0), ids.unsqueeze(0), weights.unsqueeze(0))[0], out)  # [B, T, H]
        grouped = build_experts("grouped_mm", expert_parallel)(hidden, ids, weights)
        own = reference_fused_experts(hidden, torch.where(ids < EXPERTS, ids, -1), weights, experts.gate_up_proj,
                                      experts.gate_up_proj_scale_inv, experts.down_proj,
                                      experts.down_proj_scale_inv)  # fmt: skip
        ideal = unquantized_intermediate64(experts, hidden, ids, weights)
        grouped_own = experts64(experts, hidden, ids, weights)
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
    assert relative_error(out, own) <= BF16_BOUND, f"fused_experts' own yardstick: {relative_error(out, own):.2e}"
    assert relative_error(grouped, grouped_own) <= EXPERTS_BOUND  # the grouped_mm route, as the kernel test checks it
    between = relative_error(out, grouped)
    assert between <= ROUTES_BOUND, f"fp8gemm vs grouped_mm: {between:.2e}"
    ours, theirs = relative_error(out, ideal), relative_error(grouped, ideal)
    assert ours <= NO_WORSE * theirs, f"to the unquantized intermediate: fp8gemm {ours:.2e}, grouped_mm {theirs:.2e}"
    if expert_parallel:
        assert bool((out[1] == 0).all())  # token 1 picked only another rank's experts


def test_torch_compile_fullgraph_traces_the_fused_route():
    torch._dynamo.reset()
    hidden = activations((TOKENS, HIDDEN), 3)
    ids, weights = routing(4, sentinels=True)
    experts = build_experts("fp8gemm", True)
    with torch.no_grad():
        eager = experts(hidden, ids, weights)
        compiled = torch.compile(experts, fullgraph=True, backend="aot_eager")(hidden, ids, weights)
    assert torch.equal(compiled, eager)  # a fallback inside the trace would differ by ~1e-2 (grouped_mm)
    torch._dynamo.reset()


def _ue8m0_pair():
    """The same experts twice: power-of-two scales in fp32, and the same scales as float8_e8m0fnu (scale_fmt="ue8m0")."""
    from transformers.integrations.finegrained_fp8 import FP8Experts

    fp32 = build_experts("fp8gemm", False)
    ue8m0 = FP8Experts(fp32.config, block_size=(128, 128), scale_fmt="ue8m0")
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            pow2 = torch.exp2(torch.round(torch.log2(getattr(fp32, name + "_scale_inv"))))
            getattr(fp32, name + "_scale_inv").copy_(pow2)
            getattr(ue8m0, name).copy_(getattr(fp32, name))
            getattr(ue8m0, name + "_scale_inv").copy_(pow2.to(torch.float8_e8m0fnu))
    return fp32, ue8m0


def test_ue8m0_scales_give_the_fp32_result():
    fp32, ue8m0 = _ue8m0_pair()
    assert ue8m0.gate_up_proj_scale_inv.dtype == torch.float8_e8m0fnu
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 5), routing(6, sentinels=False)
    with torch.no_grad():
        assert torch.equal(ue8m0(hidden, ids, weights), fp32(hidden, ids, weights))


def test_weight_scales_are_converted_once_and_again_when_they_change():
    experts = build_experts("fp8gemm", False)
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 7), routing(8, sentinels=False)
    with torch.no_grad():
        first = experts(hidden, ids, weights)
        kept = hf_experts.weight_scales(experts)
        assert all(a is b for a, b in zip(hf_experts.weight_scales(experts), kept, strict=True))  # kept, not redone
        experts.down_proj_scale_inv.mul_(2)  # a new checkpoint loaded in place: fp32 scales are read in place
        assert hf_experts.weight_scales(experts)[1].data_ptr() == experts.down_proj_scale_inv.data_ptr()
        second = experts(hidden, ids, weights)
        assert torch.equal(second, direct(experts, hidden, ids, weights)) and not torch.equal(second, first)
    assert not any("fp8gemm" in key for key in experts.state_dict())


def test_weight_scales_converted_under_graph_capture_are_not_kept(monkeypatch):
    """A graph's kernels have not run when capture returns: scales converted then (UE8M0 to fp32) must not serve later
    calls; fp32 scales read in place may."""
    fp32, experts = _ue8m0_pair()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the tests' CPU tensors play the GPU's
    monkeypatch.setattr(hf_experts.runtime, "capturing", lambda: True)
    captured = hf_experts.weight_scales(experts)
    assert hf_experts._PLAN not in experts.__dict__
    in_place = hf_experts.weight_scales(fp32)
    assert in_place[0].data_ptr() == fp32.gate_up_proj_scale_inv.data_ptr() and hf_experts._PLAN in fp32.__dict__
    monkeypatch.setattr(hf_experts.runtime, "capturing", lambda: False)
    kept = hf_experts.weight_scales(experts)
    assert kept[0] is not captured[0] and torch.equal(kept[0], captured[0]) and torch.equal(kept[0], in_place[0])
    assert all(a is b for a, b in zip(hf_experts.weight_scales(experts), kept, strict=True))


def test_scales_converted_from_inference_tensors_are_not_kept():
    """An inference tensor keeps no version counter, so a write into it would go unseen: its conversion is redone."""
    with torch.inference_mode():
        fp32, experts = _ue8m0_pair()
        hidden, (ids, weights) = activations((TOKENS, HIDDEN), 5), routing(6, sentinels=False)
        expected = fp32(hidden, ids, weights)
        assert torch.equal(experts(hidden, ids, weights), expected)
        assert torch.equal(experts(hidden, ids, weights), expected) and hf_experts._PLAN not in experts.__dict__


def test_the_plan_is_made_again_when_a_weight_is_replaced_or_moved():
    experts = build_experts("fp8gemm", False)
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 7), routing(8, sentinels=False)
    with torch.no_grad():
        first = experts(hidden, ids, weights)
        plan = hf_experts.experts_plan(experts)
        assert hf_experts.experts_plan(experts) is plan  # kept
        experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.detach().clone(), requires_grad=False)
        assert hf_experts.experts_plan(experts) is not plan  # a new tensor: checked again
        assert torch.equal(experts(hidden, ids, weights), first)
        experts.down_proj.data = torch.zeros_like(experts.down_proj)  # the same Parameter on new memory
        assert torch.equal(experts(hidden, ids, weights), torch.zeros_like(first))


# --- fallbacks and refusals ------------------------------------------------------------------------------------------


def _experts_like(implementation: str, **kwargs):
    """build_experts' module with another config or constructor argument; weights drawn as there."""
    from transformers import Qwen3MoeConfig
    from transformers.integrations.finegrained_fp8 import FP8Experts

    build_experts(implementation, False)  # wraps FP8Experts once
    hidden_act = kwargs.pop("hidden_act", "silu")
    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS, num_experts_per_tok=2,
                            hidden_act=hidden_act)  # fmt: skip
    config._experts_implementation = implementation
    experts = FP8Experts(config, block_size=(128, 128), **kwargs)
    experts.has_gate = kwargs.get("has_gate", True)  # the class wrapper resets it to its own argument
    up = "gate_up_proj" if experts.has_gate else "up_proj"
    rows = (2 if experts.has_gate else 1) * INTER
    with torch.no_grad():
        for name, shape, offset in ((up, (EXPERTS, rows, HIDDEN), 30), ("down_proj", (EXPERTS, HIDDEN, INTER), 40)):
            w, s = fp8_weight(shape, offset, magnitude=0.03)
            getattr(experts, name).copy_(w)
            getattr(experts, name + "_scale_inv").copy_(s)
        if kwargs.get("activation_scheme") == "static":
            experts.gate_up_proj_activation_scale.fill_(0.05)
            experts.down_proj_activation_scale.fill_(0.002)
    return experts


FALLBACKS = {
    "static activation scale: eager": (dict(activation_scheme="static"), "eager", "activation_scheme='static'"),
    "GELU: grouped_mm": (dict(hidden_act="gelu"), "grouped_mm", "activation GELUActivation is not SiLU"),
    "no gate: grouped_mm": (dict(has_gate=False), "grouped_mm", "no gate"),
}


@pytest.mark.parametrize("kwargs,route,why", FALLBACKS.values(), ids=FALLBACKS.keys())
def test_experts_fused_experts_does_not_run_take_transformers_route_with_a_warning(kwargs, route, why):
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 3), routing(4, sentinels=False)
    hf_experts._warned.clear()
    with torch.no_grad():
        expected = _experts_like(route, **dict(kwargs))(hidden, ids, weights)
        experts = _experts_like("fp8gemm", **dict(kwargs))
        with pytest.warns(hf.ExpertsFallbackWarning, match=f"runs transformers' {route} route.*{why}"):
            out = experts(hidden, ids, weights)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per class and reason
            again = experts(hidden, ids, weights)
    assert torch.equal(out, expected) and torch.equal(again, expected)


def test_an_input_that_requires_grad_takes_the_grouped_mm_route():
    """transformers 5.22 gives grouped_mm a backward for the input (FP8GroupedMatmulFunction); in 5.17 it calls the
    kernel directly, and fp8gemm's matmul_grouped refuses an input that requires grad: the same happens here."""
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 3).requires_grad_(), routing(4, sentinels=False)
    try:
        expected = build_experts("grouped_mm", False)(hidden, ids, weights)
    except RuntimeError as exc:
        expected = exc
    hf_experts._warned.clear()
    with pytest.warns(hf.ExpertsFallbackWarning, match="requires grad"):
        if isinstance(expected, Exception):
            with pytest.raises(type(expected), match="has no backward"):
                build_experts("fp8gemm", False)(hidden, ids, weights)
            return
        out = build_experts("fp8gemm", False)(hidden, ids, weights)
    assert torch.equal(out, expected)
    out.float().sum().backward()
    assert hidden.grad is not None and bool(hidden.grad.isfinite().all())


def test_biases_are_refused():
    experts = build_experts("fp8gemm", False)
    experts.has_bias = True
    with torch.no_grad(), pytest.raises(NotImplementedError, match="has biases; fp8gemm.fused_experts has none"):
        experts(activations((TOKENS, HIDDEN), 3), *routing(4, sentinels=False))


def test_bf16_experts_run_transformers_grouped_mm():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS, num_experts_per_tok=2)
    torch.manual_seed(SEED)
    bf16 = Qwen3MoeExperts(config).to(torch.bfloat16)
    torch.nn.init.normal_(bf16.gate_up_proj, std=0.05)
    torch.nn.init.normal_(bf16.down_proj, std=0.05)
    hidden, (ids, weights) = activations((TOKENS, HIDDEN), 3), routing(4, sentinels=False)
    hf_experts._warned.clear()
    with torch.no_grad():
        config._experts_implementation = "grouped_mm"
        expected = bf16(hidden, ids, weights)
        config._experts_implementation = "fp8gemm"
        with pytest.warns(hf.ExpertsFallbackWarning, match="weights are not FP8"):
            assert torch.equal(bf16(hidden, ids, weights), expected)


# --- a whole model ---------------------------------------------------------------------------------------------------


def _models_script():
    from fp8gemm_bench import models

    return models


def test_qwen3_moe_runs_with_experts_implementation_fp8gemm(tmp_path, monkeypatch):
    """A Qwen3-MoE model saved in bf16, loaded with experts_implementation="fp8gemm" (transformers validates the name
    at init, before any quantization), its linears and experts replaced by transformers' FP8 modules as
    fp8gemm_bench.models does on CPU; logits against set_experts_implementation("grouped_mm") on the same model."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(SEED)
    AutoModelForCausalLM.from_config(Qwen3MoeConfig(**TINY_MOE), dtype=torch.bfloat16).save_pretrained(tmp_path)
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, experts_implementation="fp8gemm")
    assert model.config._experts_implementation == "fp8gemm"
    model = _models_script()._manual_fp8(model).eval()
    calls = []
    monkeypatch.setattr(hf_experts, "fused_experts", lambda *a, **k: calls.append(1) or fp8gemm.fused_experts(*a, **k))
    ids = torch.randint(0, TINY_MOE["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        reference = bf16(input_ids=ids, use_cache=False).logits.double()
        ours = model(input_ids=ids, use_cache=False).logits
        assert len(calls) == TINY_MOE["num_hidden_layers"]  # every MoE layer, no fallback
        model.set_experts_implementation("grouped_mm")
        grouped = model(input_ids=ids, use_cache=False).logits
        model.set_experts_implementation("fp8gemm")
        assert model.get_experts_implementation()[""] == "fp8gemm"
        again = model(input_ids=ids, use_cache=False).logits
    assert torch.equal(again, ours) and bool(ours.isfinite().all())
    err = relative_error(ours.float(), grouped.float().double())
    ours_bf16, grouped_bf16 = relative_error(ours.float(), reference), relative_error(grouped.float(), reference)
    print(f"logits rel. err: fp8gemm experts vs grouped_mm {err:.2e}; against bf16: fp8gemm {ours_bf16:.2e}, "
          f"grouped_mm {grouped_bf16:.2e}")  # fmt: skip
    assert 0 < err <= LOGITS_BOUND
    assert ours_bf16 <= NO_WORSE * grouped_bf16


def test_register_experts_implementation_alone_and_from_use_in_transformers(tmp_path):
    """In fresh interpreters: transformers refuses the name before registration and takes it after, by either call."""
    script = (
        "import sys, pytest, fp8gemm.hf\n"
        "from transformers import AutoModelForCausalLM, Qwen3MoeConfig\n"
        f"config = Qwen3MoeConfig(**{TINY_MOE!r})\n"
        "with pytest.raises(ValueError, match='experts_implementation=\"fp8gemm\"'):\n"
        "    AutoModelForCausalLM.from_config(config, experts_implementation='fp8gemm')\n"
        "if sys.argv[1] == 'alone':\n"
        "    assert fp8gemm.hf.register_experts_implementation() == 'fp8gemm'\n"
        "else:\n"
        "    fp8gemm.hf.use_in_transformers()\n"
        "model = AutoModelForCausalLM.from_config(config, experts_implementation='fp8gemm')\n"
        "assert model.config._experts_implementation == 'fp8gemm'\n"
        "model.set_experts_implementation('grouped_mm'); model.set_experts_implementation('fp8gemm')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    for how in ("alone", "use_in_transformers"):
        run = subprocess.run([sys.executable, "-c", script, how], env={**env, "HF_HUB_OFFLINE": "1"},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, f"{how}:\n{run.stdout}\n{run.stderr[-3000:]}"
