"""``Fp8TrainingLinear`` and ``convert(model, training=True)``: a converted MLP trains on CPU, its gradients close to
the bf16 model's and to float64's."""

from __future__ import annotations

import copy

import fp8gemm
import pytest
import torch
from fp8gemm.nn import Fp8TrainingLinear, ReferenceOnCpuWarning, convert
from fp8gemm.testing.conformance import relative_error
from torch import nn

MODEL_GRAD_TOLERANCE = 0.1  # three layers deep: each FP8 layer's ~4% compounds through the activations


def _mlp(seed: int) -> nn.Sequential:
    print(f"seed {seed}")
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 10)).bfloat16()


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(512, 256, generator=gen), torch.randint(0, 10, (512,), generator=gen)


def _convert(model, **kwargs):
    with pytest.warns(ReferenceOnCpuWarning):
        return convert(model, training=True, **kwargs)


def test_from_linear_holds_the_same_parameters_and_runs_training_linear():
    linear = nn.Linear(256, 384, dtype=torch.bfloat16)
    layer = Fp8TrainingLinear.from_linear(linear, pow2_scales=True)
    assert layer.weight is linear.weight and layer.bias is linear.bias and isinstance(layer, nn.Linear)
    assert list(layer.state_dict()) == ["weight", "bias"] and "pow2_scales=True" in repr(layer)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3)).bfloat16().requires_grad_()
    y = layer(x)
    assert torch.equal(y, fp8gemm.training.linear(x, linear.weight, linear.bias, pow2_scales=True))
    y.sum().backward()
    assert linear.weight.grad is not None and x.grad is not None


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"out_features \(N = 144\) is not a positive multiple of 128.*training=True"):
        Fp8TrainingLinear(256, 144)
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear"):
        Fp8TrainingLinear.from_linear(nn.Conv1d(1, 1, 1))


def test_convert_swaps_eligible_layers_and_reports_the_rest():
    model = nn.ModuleDict(
        {
            "up": nn.Linear(256, 384),
            "odd": nn.Linear(256, 144),
            "narrow": nn.Linear(200, 128),
            "lm_head": nn.Linear(384, 256),
        }
    )
    params = {name: module.weight for name, module in model.items()}
    report = _convert(model)
    assert report.converted == ["up"]
    assert report.skipped == {
        "odd": "out_features (N = 144) is not a positive multiple of 128",
        "narrow": "in_features (K = 200) is not a positive multiple of 128",
        "lm_head": "skip='lm_head'",
    }
    assert type(model["up"]) is Fp8TrainingLinear and model["up"].weight is params["up"]
    assert all(type(model[name]) is nn.Linear for name in ("odd", "narrow", "lm_head"))
    with pytest.raises(ValueError, match="fp8_dtype is for inference layers"):
        convert(nn.Sequential(nn.Linear(128, 128)), training=True, fp8_dtype=torch.float8_e4m3fn)


def test_convert_for_training_swaps_fused_experts_onto_their_parameters():
    """Fused experts (transformers' 3-D form) become Fp8TrainingExperts holding the same Parameters; experts that
    fused_experts cannot run stay, with the reason."""

    class Experts(nn.Module):
        def __init__(self, act_fn):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(2, 256, 128))
            self.down_proj = nn.Parameter(torch.randn(2, 128, 128))
            self.act_fn = act_fn

    model = nn.ModuleDict({"experts": Experts(nn.SiLU()), "gelu": Experts(nn.GELU()), "proj": nn.Linear(128, 128)})
    params = (model["experts"].gate_up_proj, model["experts"].down_proj)
    report = _convert(model)
    assert report.converted == ["experts", "proj"]
    assert report.skipped == {"gelu": "activation GELU is not SiLU; fp8gemm.fused_experts runs silu(gate) * up"}
    assert type(model["experts"]) is fp8gemm.nn.Fp8TrainingExperts
    assert (model["experts"].gate_up_proj, model["experts"].down_proj) == params


def test_a_converted_mlp_trains_with_gradients_close_to_bf16():
    base = _mlp(5)
    x, target = _batch(6)
    fp8 = copy.deepcopy(base)
    report = _convert(fp8)
    assert report.converted == ["0", "2"] and list(report.skipped) == ["4"]
    float64 = copy.deepcopy(base).double()
    for model, inputs in ((base, x.bfloat16()), (fp8, x.bfloat16()), (float64, x.double())):
        nn.functional.cross_entropy(model(inputs).float(), target).backward()
    for (name, p), p_bf16, p_64 in zip(fp8.named_parameters(), base.parameters(), float64.parameters(), strict=True):
        against_bf16, against_64 = relative_error(p.grad, p_bf16.grad.double()), relative_error(p.grad, p_64.grad)
        print(f"{name}: gradient relative error against bf16 {against_bf16:.4f}, against float64 {against_64:.4f}")
        assert against_bf16 < MODEL_GRAD_TOLERANCE and against_64 < MODEL_GRAD_TOLERANCE

    losses = {}
    for label, model in (("bf16", base), ("fp8", fp8)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        losses[label] = []
        for _ in range(6):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x.bfloat16()).float(), target)
            loss.backward()
            optimizer.step()
            losses[label].append(loss.item())
    print(f"losses: {losses}")
    assert all(b < a for a, b in zip(losses["fp8"], losses["fp8"][1:], strict=False))  # decreases at every step
    assert losses["fp8"][-1] < losses["fp8"][0] - 0.02
    assert all(abs(f - b) < 0.01 * b for f, b in zip(losses["fp8"], losses["bf16"], strict=True))
