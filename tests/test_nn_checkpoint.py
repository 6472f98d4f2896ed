"""FP8 checkpoints (DeepSeek-V3 / Qwen3-FP8 format) into fp8gemm.nn: state dicts, safetensors, e4m3fnuz."""

from __future__ import annotations

import json

import fp8gemm
import pytest
import torch
from fp8gemm.nn import Fp8Linear, convert, load_fp8_checkpoint, to_fp8_dtype
from fp8gemm.testing import conformance
from safetensors.torch import save_file
from test_nn import BF16_BOUND, expected_output
from torch import nn

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def deepseek_state(n=320, k=512, seed=0, negative_zeros=True):
    """A layer as those checkpoints store it: e4m3fn weight, fp32 weight_scale_inv [ceil(N/128), K/128]."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen)
    if negative_zeros:  # -0.0 quantizes to 0x80: NaN if its bits were read as e4m3fnuz unchanged
        w[::7, ::5] = -0.0
    weight, scale = fp8gemm.quantize_weight(w, fp8_dtype=FN)
    return {"weight": weight, "weight_scale_inv": scale, "bias": torch.randn(n, generator=gen).bfloat16()}


def _dequantized64(weight, scale):
    n, k = weight.shape
    per_element = scale.double().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)
    return weight.double() * per_element


def test_scale_is_the_dequantization_multiplier():
    """weight_scale_inv multiplies, as DeepSeek-V3's weight_dequant does (y = x * s)."""
    state = deepseek_state(negative_zeros=False)
    w = _dequantized64(state["weight"], state["weight_scale_inv"])
    assert torch.equal(w.float(), fp8gemm.dequantize(state["weight"], state["weight_scale_inv"]))
    assert state["weight_scale_inv"].shape == (3, 4)


def test_deepseek_state_dict_loads_and_runs(device):
    state = deepseek_state(seed=1)
    layer = Fp8Linear(512, 320, device=device)
    layer.load_state_dict({key: t.to(device) for key, t in state.items()})
    assert torch.equal(layer.weight_scale_inv.cpu(), state["weight_scale_inv"])
    x = torch.randn(3, 4, 512, dtype=torch.bfloat16, device=device)
    assert conformance.relative_error(layer(x), expected_output(layer, x)) < BF16_BOUND


def test_e4m3fn_to_e4m3fnuz_is_exact():
    state = deepseek_state(seed=2)
    weight, scale = state["weight"], state["weight_scale_inv"]
    assert (weight.view(torch.uint8) == 0x80).sum() > 100
    converted, new_scale = to_fp8_dtype(weight, scale, FNUZ)
    assert converted.dtype == FNUZ and not converted.float().isnan().any()
    assert torch.equal(new_scale, scale * 2)
    bits, new_bits = weight.view(torch.uint8), converted.view(torch.uint8)
    assert torch.equal(new_bits, torch.where(bits == 0x80, 0, bits))
    assert torch.equal(_dequantized64(converted, new_scale), _dequantized64(weight, scale))


def test_e4m3fnuz_to_e4m3fn_rounds_only_below_two_to_minus_six():
    gen = torch.Generator().manual_seed(3)
    weight, scale = fp8gemm.quantize_weight(torch.randn(256, 256, generator=gen), fp8_dtype=FNUZ)
    converted, same_scale = to_fp8_dtype(weight, scale, FN)
    assert converted.dtype == FN and same_scale is scale
    before, after = weight.double(), converted.double()
    normal = before.abs() >= 2.0**-6
    assert torch.equal(after[normal], before[normal])
    assert ((after - before).abs() <= 2.0**-10).all()


def test_nan_codes_are_refused():
    state = deepseek_state(seed=4)
    bits = state["weight"].view(torch.uint8).clone()
    bits[0, 0] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        to_fp8_dtype(bits.view(FN), state["weight_scale_inv"], FNUZ)
    bits[0, 0] = 0x80
    with pytest.raises(ValueError, match="NaN"):
        to_fp8_dtype(bits.view(FNUZ), state["weight_scale_inv"], FN)


def test_e4m3fnuz_layer_converts_an_e4m3fn_checkpoint_once():
    """The gfx942 path, forced on CPU: the reference runs either FP8 dtype."""
    state = deepseek_state(seed=5)
    layer = Fp8Linear(512, 320, fp8_dtype=FNUZ)
    layer.load_state_dict(state)
    assert layer.weight.dtype == FNUZ
    assert torch.equal(layer.weight_scale_inv, state["weight_scale_inv"] * 2)
    assert torch.equal(
        _dequantized64(layer.weight, layer.weight_scale_inv),
        _dequantized64(state["weight"], state["weight_scale_inv"]),
    )
    x = torch.randn(6, 512, dtype=torch.bfloat16)
    assert conformance.relative_error(layer(x), expected_output(layer, x)) < BF16_BOUND


def _model(k=256, hidden=512, out=128):
    return nn.Sequential(nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, out, bias=False), nn.Linear(out, 40))


def test_safetensors_round_trip_into_a_meta_skeleton(tmp_path):
    torch.manual_seed(6)
    source = _model().to(torch.bfloat16)
    report = convert(source)
    assert report.converted == ["0", "2"] and "N = 40" in report.skipped["3"]
    save_file(source.state_dict(), tmp_path / "model.safetensors")
    with torch.device("meta"):
        skeleton = _model().to(torch.bfloat16)
    convert(skeleton)
    result = load_fp8_checkpoint(skeleton, tmp_path / "model.safetensors")
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert not any(t.is_meta for t in skeleton.state_dict().values())
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    assert torch.equal(skeleton(x), source(x))


def test_sharded_checkpoint_with_a_layer_split_across_shards(tmp_path):
    torch.manual_seed(7)
    source = _model().to(torch.bfloat16)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    exact = source.double()(x.double())
    source.bfloat16()
    convert(source)
    state = source.state_dict()
    first = {"0.weight", "0.bias", "2.weight_scale_inv"}  # layer 2's weight and scale in different shards
    shards = {"a.safetensors": {k: v for k, v in state.items() if k in first}}
    shards["b.safetensors"] = {k: v for k, v in state.items() if k not in first}
    for name, tensors in shards.items():
        save_file(tensors, tmp_path / name)
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    target = _model().to(torch.bfloat16)
    convert(target, fp8_dtype=FNUZ)  # a materialised model, loaded in place, in the other FP8 dtype
    load_fp8_checkpoint(target, tmp_path)
    assert target[2].weight.dtype == FNUZ
    for i in (0, 2):
        assert torch.equal(target[i].weight_scale_inv, source[i].weight_scale_inv * 2)
        assert torch.equal(
            _dequantized64(target[i].weight, target[i].weight_scale_inv),
            _dequantized64(source[i].weight, source[i].weight_scale_inv),
        )
    assert conformance.relative_error(target(x), exact) < 5e-2  # as test_nn's bound against the float layer


def test_fp8_weights_of_skipped_layers_are_dequantized(tmp_path):
    state = deepseek_state(n=320, k=512, seed=8)
    save_file({f"proj.{k}": v for k, v in state.items()}, tmp_path / "model.safetensors")
    model = nn.Module()
    model.proj = nn.Linear(512, 320, dtype=torch.float32)
    convert(model, skip=("proj",))
    load_fp8_checkpoint(model, tmp_path / "model.safetensors")
    assert torch.equal(model.proj.weight.detach(), fp8gemm.dequantize(state["weight"], state["weight_scale_inv"]))


def test_strict_loading_names_missing_and_unexpected_keys(tmp_path):
    state = deepseek_state(n=128, k=256, seed=9)
    save_file(
        {"other.weight": state["weight"].clone(), **{f"0.{k}": v for k, v in state.items()}}, tmp_path / "m.safetensors"
    )
    model = nn.Sequential(Fp8Linear(256, 128), Fp8Linear(256, 128))
    with pytest.raises(RuntimeError, match=r"missing \['1.bias', '1.weight', '1.weight_scale_inv'\], unexpected \['other.weight'\]"):  # fmt: skip
        load_fp8_checkpoint(model, [tmp_path / "m.safetensors"])
    result = load_fp8_checkpoint(model, tmp_path / "m.safetensors", strict=False)
    assert result.unexpected_keys == ["other.weight"] and len(result.missing_keys) == 3
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_fp8_checkpoint(model, tmp_path / "absent.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors file"):
        load_fp8_checkpoint(model, tmp_path / "empty")


@pytest.mark.parametrize("skeleton_on_meta", [True, False], ids=["meta-skeleton", "materialised"])
def test_a_bf16_checkpoint_is_quantized_on_load_into_a_converted_model(tmp_path, skeleton_on_meta):
    torch.manual_seed(10)
    source = _model().to(torch.bfloat16)
    save_file(source.state_dict(), tmp_path / "model.safetensors")  # plain bf16 weights, no weight_scale_inv
    with torch.device("meta" if skeleton_on_meta else "cpu"):
        target = _model().to(torch.bfloat16)
    convert(target)
    result = load_fp8_checkpoint(target, tmp_path / "model.safetensors")  # strict: nothing may be reported missing
    assert result.missing_keys == [] and result.unexpected_keys == []
    convert(source)  # quantizes the same bf16 weights with fp8gemm.quantize_weight, as loading must
    for i in (0, 2):
        assert torch.equal(target[i].weight.view(torch.uint8), source[i].weight.view(torch.uint8))
        assert torch.equal(target[i].weight_scale_inv, source[i].weight_scale_inv)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(target(x), source(x))
