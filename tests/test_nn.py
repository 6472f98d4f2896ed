"""fp8gemm.nn: Fp8Linear (forward, from_linear, state dicts, device and dtype moves), convert, torch.compile."""

from __future__ import annotations

import copy

import fp8gemm
import pytest
import torch
from fp8gemm.nn import Fp8Linear, convert
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance
from torch import nn

BF16_BOUND = 4e-3  # the conformance suite's bound for bf16 output against the float64 oracle


def _linear(k, n, device, seed, bias=True, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    layer = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
    if bias:
        nn.init.normal_(layer.bias, std=0.5)  # nn.Linear's default bias is tiny; make it count
    return layer


def expected_output(layer: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """float64: the reference quantizer's activation times the layer's FP8 weight, plus the bias."""
    x2 = x.reshape(-1, x.shape[-1])
    qa, sa = fp8gemm.quantize_activation(
        x2, fp8_dtype=layer.weight.dtype, pow2_scales=layer.pow2_scales, backend="reference"
    )
    y = oracle(qa, layer.weight, sa, layer.weight_scale_inv)
    if layer.bias is not None:
        y = y + layer.bias.double()
    return y.reshape(*x.shape[:-1], -1)


def test_forward_matches_float64_oracle(device):
    linear = _linear(384, 272, device, seed=0)  # N = 272: the last 128-row scale block is partial
    layer = Fp8Linear.from_linear(linear)
    x = torch.randn(2, 5, 384, dtype=torch.bfloat16, device=device)
    y = layer(x)
    assert y.shape == (2, 5, 272) and y.dtype == torch.bfloat16 and y.device == x.device
    assert conformance.relative_error(y, expected_output(layer, x)) < BF16_BOUND
    # Against the unquantized layer: e4m3 rounds each factor by <= 2^-4 relative, ~2^-4/sqrt(3) RMS,
    # so the product of two quantized operands is off by ~5% RMS at most.
    exact = x.double() @ linear.weight.double().t() + linear.bias.double()
    assert conformance.relative_error(y, exact) < 5e-2


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16])
def test_forward_other_input_dtypes_and_no_bias(device, x_dtype):
    layer = Fp8Linear.from_linear(_linear(256, 64, device, seed=1, bias=False, dtype=torch.float32))
    x = torch.randn(7, 256, device=device, dtype=x_dtype)
    y = layer(x)
    assert y.dtype == x_dtype and layer.bias is None
    assert conformance.relative_error(y, expected_output(layer, x)) < 1e-3


def test_forward_with_power_of_two_scales(device):
    layer = Fp8Linear.from_linear(_linear(256, 128, device, seed=8), pow2_scales=True)
    assert layer.pow2_scales and repr(layer).endswith("pow2_scales=True)")
    x = torch.randn(5, 256, dtype=torch.bfloat16, device=device)
    assert conformance.relative_error(layer(x), expected_output(layer, x)) < BF16_BOUND


def test_a_weight_made_a_parameter_is_still_read(device):
    """forward reads the FP8 buffers from their dict; a weight re-registered as a Parameter (or a tensor attribute)
    since is found where it is, with the same result."""
    layer = Fp8Linear.from_linear(_linear(256, 128, device, seed=12))
    x = torch.randn(3, 256, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        want = layer(x)
        layer.weight = nn.Parameter(layer.weight.detach(), requires_grad=False)
        assert "weight" not in layer._buffers and "weight" in layer._parameters
        assert torch.equal(layer(x), want)
    assert conformance.relative_error(want, expected_output(layer, x)) < BF16_BOUND


def test_from_linear_quantizes_like_quantize_weight():
    linear = _linear(256, 320, "cpu", seed=2)
    for pow2 in (False, True):
        layer = Fp8Linear.from_linear(linear, pow2_scales=pow2)
        q, scale = fp8gemm.quantize_weight(linear.weight.detach(), pow2_scales=pow2)
        assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(layer.weight_scale_inv, scale) and torch.equal(layer.bias, linear.bias.detach())
        assert layer.bias.data_ptr() != linear.bias.data_ptr()  # a copy, not the float layer's storage
    assert torch.equal(layer.weight_scale_inv, torch.exp2(torch.log2(layer.weight_scale_inv).round()))


def test_from_linear_on_meta_gives_an_empty_layer():
    with torch.device("meta"):
        layer = Fp8Linear.from_linear(nn.Linear(256, 128))
    assert layer.weight.is_meta and layer.weight.dtype == torch.float8_e4m3fn
    assert layer.weight_scale_inv.shape == (1, 2)


def test_extra_repr():
    layer = Fp8Linear(256, 48, bias=False)
    assert repr(layer) == (
        "Fp8Linear(in_features=256, out_features=48, bias=False, fp8_dtype=torch.float8_e4m3fn, weight_block=(128, 128))"
    )


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="in_features .* multiple of 128"):
        Fp8Linear(100, 64)
    with pytest.raises(ValueError, match="out_features .* multiple of 16"):
        Fp8Linear(128, 20)
    with pytest.raises(TypeError, match="fp8_dtype must be one of"):
        Fp8Linear(128, 16, fp8_dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype .* must be one of"):
        Fp8Linear(128, 16, dtype=torch.int8)
    with pytest.raises(TypeError, match="must be a torch.nn.Linear"):
        Fp8Linear.from_linear(nn.Conv1d(128, 16, 1))


def test_state_dict_round_trip(device):
    layer = Fp8Linear.from_linear(_linear(512, 320, device, seed=3))
    state = layer.state_dict()
    assert set(state) == {"weight", "weight_scale_inv", "bias"}
    assert state["weight_scale_inv"].is_contiguous() and state["weight_scale_inv"].shape == (3, 4)
    fresh = Fp8Linear(512, 320, device=device)
    assert fresh.load_state_dict(state) is not None
    for name in ("weight", "weight_scale_inv", "bias"):
        got, want = getattr(fresh, name), getattr(layer, name)
        assert got.stride() == want.stride()  # the scale lands in the backend's layout again
        assert torch.equal(got.view(torch.uint8) if name == "weight" else got, want.view(torch.uint8) if name == "weight" else want)  # fmt: skip
    x = torch.randn(3, 512, dtype=torch.bfloat16, device=device)
    assert torch.equal(fresh(x), layer(x))


def test_load_state_dict_reports_mismatches():
    layer = Fp8Linear(256, 128)
    q, scale = fp8gemm.quantize_weight(torch.randn(128, 256))
    with pytest.raises(RuntimeError, match="without its weight_scale_inv"):
        layer.load_state_dict({"weight": q, "bias": torch.zeros(128)}, strict=False)
    with pytest.raises(RuntimeError, match=r"128x128 weight blocks"):
        layer.load_state_dict({"weight": q, "weight_scale_inv": scale[:, :1], "bias": torch.zeros(128)})
    with pytest.raises(RuntimeError, match=r"layer is \[N, K\] = \[128, 256\]"):
        layer.load_state_dict({"weight": q[:64], "weight_scale_inv": scale, "bias": torch.zeros(128)})


def test_load_state_dict_quantizes_a_float_weight():
    w = torch.randn(128, 256)
    layer = Fp8Linear(256, 128, bias=False)
    layer.load_state_dict({"weight": w})
    q, scale = fp8gemm.quantize_weight(w)
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.weight_scale_inv, scale)


def test_module_dtype_casts_leave_fp8_weights_alone(device):
    layer = Fp8Linear.from_linear(_linear(256, 128, device, seed=4))
    weight, scale = layer.weight.clone(), layer.weight_scale_inv.clone()
    for cast in (lambda m: m.to(torch.float16), lambda m: m.float(), lambda m: m.bfloat16()):
        cast(layer)
        assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale_inv.dtype == torch.float32
        assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
        assert torch.equal(layer.weight_scale_inv, scale)
    assert layer.bias.dtype == torch.bfloat16


def test_moving_to_the_device_prepares_the_scale_layout(device):
    layer = Fp8Linear.from_linear(_linear(384, 256, "cpu", seed=5))
    x = torch.randn(4, 384, dtype=torch.bfloat16)
    expected, scale = expected_output(layer, x), layer.weight_scale_inv.clone()
    layer.to(device)  # in place, as Module.to is
    prepared = fp8gemm.prepare_weight_scale(scale.to(device))
    assert layer.weight_scale_inv.stride() == prepared.stride()
    assert layer.weight.dtype == fp8gemm.preferred_fp8_dtype(device)
    assert conformance.relative_error(layer(x.to(device)).cpu(), expected) < BF16_BOUND
    layer.to("cpu")
    assert torch.equal(layer.weight_scale_inv, scale) and layer.weight.device.type == "cpu"


class _Block(nn.Module):
    """Eligible, ineligible, skipped, tied, shared and subclassed linears in one model."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 256)
        self.up = nn.Linear(256, 512)
        self.down = nn.Linear(512, 256, bias=False)
        self.odd_k = nn.Linear(200, 256)
        self.odd_n = nn.Linear(256, 1000)
        self.tied = nn.Linear(256, 16, bias=False)
        self.tied.weight = self.embed.weight
        self.attention = nn.MultiheadAttention(256, 4, batch_first=True)
        self.shared = self.up
        self.lm_head = nn.Linear(256, 512)

    def forward(self, x):
        h = self.down(torch.relu(self.shared(x)))
        h = h + self.attention(h, h, h, need_weights=False)[0]
        return self.lm_head(h)


def test_convert_swaps_eligible_layers_and_lists_the_rest():
    torch.manual_seed(6)
    model = _Block().to(torch.bfloat16)
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    expected = copy.deepcopy(model).double()(x.double())
    report = convert(model)
    assert report.converted == ["up", "down", "shared"]
    assert set(report.skipped) == {"odd_k", "odd_n", "tied", "attention.out_proj", "lm_head"}
    assert "in_features (K = 200)" in report.skipped["odd_k"] and "N = 1000" in report.skipped["odd_n"]
    assert "tied to embed.weight" in report.skipped["tied"]
    assert "subclass" in report.skipped["attention.out_proj"] and report.skipped["lm_head"] == "skip='lm_head'"
    assert isinstance(model.up, Fp8Linear) and model.shared is model.up
    assert type(model.lm_head) is nn.Linear and "5 left alone" in str(report)
    assert conformance.relative_error(model(x), expected) < 8e-2  # FP8 on this block: 4.5-5.2% over 30 seeds
    report = convert(model, skip=lambda name, module: name.startswith("odd"))
    assert report.converted == ["lm_head"] and report.skipped["odd_k"] == "skip predicate"


def test_convert_rejects_bad_arguments():
    with pytest.raises(TypeError, match="use Fp8Linear.from_linear"):
        convert(nn.Linear(128, 16))
    with pytest.raises(TypeError, match=r"use \('lm_head',\)"):
        convert(nn.Sequential(nn.Linear(128, 16)), skip="lm_head")


def test_torch_compile_fullgraph():
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(256, 384), nn.GELU(), nn.Linear(384, 128)).to(torch.bfloat16)
    convert(model)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    graphs = []

    def record(gm, example_inputs):  # Dynamo's graph, before any backend rewrites it
        graphs.append(gm)
        return gm.forward

    assert torch.equal(torch.compile(model, backend=record, fullgraph=True)(x), model(x))
    (graph,) = graphs
    assert sum(node.target is torch.ops.fp8gemm.linear for node in graph.graph.nodes) == 2
    assert torch.equal(torch.compile(model, backend="aot_eager", fullgraph=True)(x), model(x))
