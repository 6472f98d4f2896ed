"""Every bad input to the public API, and the words its error must contain: the caller's own argument name and the
fix. One exception type per kind of mistake, across ops: TypeError for a wrong type or dtype, ValueError for a
wrong shape, layout, value or device, RuntimeError for what the installation cannot run (conformance.BAD_INPUTS
holds gemm's own table, run on every backend)."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from conftest import device_under_test
from fp8gemm.nn import Fp8Experts, Fp8Linear
from fp8gemm.nn.experts import quantize_experts

SEED = 45
DEVICE = device_under_test()


def _good():
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(4, 256, generator=gen).bfloat16().to(DEVICE)
    q, scale = fp8gemm.quantize_weight((torch.randn(128, 256, generator=gen) / 16).to(DEVICE))
    bias = torch.randn(128, generator=gen).bfloat16().to(DEVICE)
    return x, q, fp8gemm.prepare_weight_scale(scale), bias


def _linear(**change):
    def call():
        x, weight, weight_scale, bias = _good()
        args = {"x": x, "weight": weight, "weight_scale": weight_scale, "bias": bias}
        args.update({key: make(args[key]) for key, make in change.items()})
        return fp8gemm.linear(**args)

    return call


def _gemm(**change):
    def call():
        x, b, b_scale, _ = _good()
        a, a_scale = fp8gemm.quantize_activation(x)
        args = {"a": a, "b": b, "a_scale": a_scale, "b_scale": b_scale}
        args.update({key: make(args[key]) for key, make in change.items()})
        return fp8gemm.gemm(**args)

    return call


def _grouped(op="grouped_gemm", **change):
    """A grouped call with two experts (rows 3 and 1) whose arguments differ from a good call in ``change`` only."""

    def call():
        x, b, b_scale, _ = _good()
        a, a_scale = fp8gemm.quantize_activation(x)
        experts, experts_scale = torch.stack([b, b]), torch.stack([b_scale, b_scale])
        if op == "grouped_gemm":
            args = {"a": a, "b": experts, "a_scale": a_scale, "b_scale": experts_scale, "offs": _i32([3, 4])}
        else:
            args = {"a": a.view(2, 2, -1), "b": experts, "a_scale": a_scale.view(2, 2, -1),
                    "b_scale": experts_scale, "masked_m": _i32([2, 1])}  # fmt: skip
        args.update({key: make(args.get(key)) for key, make in change.items()})
        return getattr(fp8gemm, op)(**args)

    return call


def _fused(device=None, **change):
    """A fused_experts call (T = 4, H = 256, E = 2, I = 128, k = 2) whose arguments differ from a good call in
    ``change`` only."""

    def call():
        x, _, _, _ = _good()
        gen = torch.Generator().manual_seed(SEED)
        w13, s13 = quantize_experts(torch.randn(2, 256, 256, generator=gen) / 16, torch.float8_e4m3fn)
        w2, s2 = quantize_experts(torch.randn(2, 256, 128, generator=gen) / 16, torch.float8_e4m3fn)
        args = {"x": x, "topk_ids": _i32([[0, 1], [1, 0], [1, -1], [0, 1]]), "topk_weights": torch.full((4, 2), 0.5),
                "w13": w13, "w13_scale": s13, "w2": w2, "w2_scale": s2}  # fmt: skip
        args = {key: t.to(device or DEVICE) for key, t in args.items()}
        args.update({key: make(args.get(key)) for key, make in change.items()})
        return fp8gemm.fused_experts(**args)

    return call


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _other_device(t):
    return t.to("meta") if t.device.type != "meta" else t


BAD = [
    # linear: each argument under its own name
    ("linear-x-list", _linear(x=lambda t: t.tolist()), TypeError, ["x must be a torch.Tensor"]),
    ("linear-x-int", _linear(x=lambda t: t.int()), TypeError, ["x must be a bfloat16/float16/float32"]),
    ("linear-x-k", _linear(x=lambda t: t[:, :128]), ValueError, ["x's last dim must equal weight's in_features"]),
    ("linear-x-0d", _linear(x=lambda t: t[0, 0]), ValueError, ["x's last dim"]),
    ("linear-weight-bf16", _linear(weight=lambda t: t.bfloat16()), TypeError, ["weight must be FP8", "quantize_weight"]),
    ("linear-weight-3d", _linear(weight=lambda t: t[None]), ValueError, ["weight must be 2-D"]),
    ("linear-weight-none", _linear(weight=lambda t: None), TypeError, ["weight must be a torch.Tensor"]),
    ("linear-weight-n40", _linear(weight=lambda t: t[:40]), ValueError, ["N = 40 (weight.shape[0])", "multiple of 16"]),
    ("linear-weight_scale-shape", _linear(weight_scale=lambda t: t[:, :1]), ValueError, ["weight_scale must be [ceil(N/128), K/128]"]),
    ("linear-weight_scale-bf16", _linear(weight_scale=lambda t: t.bfloat16()), TypeError, ["weight_scale must be torch.float32", "weight_scale.float()"]),
    ("linear-weight_scale-none", _linear(weight_scale=lambda t: None), TypeError, ["weight_scale must be a torch.Tensor"]),
    ("linear-weight_scale-device", _linear(weight_scale=_other_device), ValueError, ["weight_scale is on meta", "move all inputs"]),
    ("linear-bias-shape", _linear(bias=lambda t: t[:64]), ValueError, ["bias must be [N] = [128]"]),
    ("linear-bias-int", _linear(bias=lambda t: t.int()), TypeError, ["bias must be a floating-point tensor"]),
    ("linear-bias-list", _linear(bias=lambda t: t.tolist()), TypeError, ["bias must be a floating-point tensor"]),
    # Fp8Linear: its constructor's arguments, then forward's x
    ("Fp8Linear-in_features", lambda: Fp8Linear(200, 128), ValueError, ["in_features (K = 200)", "nn.Linear"]),
    ("Fp8Linear-out_features", lambda: Fp8Linear(256, 40), ValueError, ["out_features (N = 40)"]),
    ("Fp8Linear-dtype", lambda: Fp8Linear(256, 128, dtype=torch.int32), TypeError, ["dtype (the bias dtype)"]),
    ("Fp8Linear-fp8_dtype", lambda: Fp8Linear(256, 128, fp8_dtype=torch.bfloat16), TypeError, ["fp8_dtype must be one of"]),
    ("Fp8Linear-x-k", lambda: Fp8Linear(256, 128, device=DEVICE)(torch.randn(4, 512, device=DEVICE)), ValueError, ["x's last dim"]),
    ("Fp8Linear-x-int", lambda: Fp8Linear(256, 128, device=DEVICE)(torch.ones(4, 256, dtype=torch.int32, device=DEVICE)), TypeError, ["x must be a bfloat16"]),
    # quantizers
    ("quantize_activation-x-list", lambda: fp8gemm.quantize_activation([[1.0]]), TypeError, ["x must be a torch.Tensor"]),
    ("quantize_activation-x-k", lambda: fp8gemm.quantize_activation(torch.randn(4, 200)), ValueError, ["x's last dim (K = 200)", "pad it with zeros"]),
    ("quantize_activation-fp8_dtype", lambda: fp8gemm.quantize_activation(torch.randn(4, 128), fp8_dtype=torch.float16), TypeError, ["fp8_dtype must be one of"]),
    ("quantize_weight-w-3d", lambda: fp8gemm.quantize_weight(torch.randn(2, 4, 128)), ValueError, ["w must be 2-D"]),
    ("quantize_weight-w-int", lambda: fp8gemm.quantize_weight(torch.ones(4, 128, dtype=torch.int32)), TypeError, ["w must be a bfloat16/float16/float32"]),
    ("prepare_weight_scale-4d", lambda: fp8gemm.prepare_weight_scale(torch.ones(1, 1, 1, 2)), ValueError, ["b_scale must be 2-D", "or 3-D [G, ceil(N/128), K/128]"]),
    ("prepare_weight_scale-bf16", lambda: fp8gemm.prepare_weight_scale(torch.ones(1, 2, dtype=torch.bfloat16)), TypeError, ["b_scale must be a torch.float32"]),
    # gemm under its own names (its full table: conformance.BAD_INPUTS)
    ("gemm-b-bf16", _gemm(b=lambda t: t.bfloat16()), TypeError, ["b has dtype torch.bfloat16 but a has"]),
    ("gemm-b_scale-shape", _gemm(b_scale=lambda t: t[:, :1]), ValueError, ["b_scale must be [ceil(N/128), K/128]"]),
    ("gemm-backend", _gemm(), None, []),  # the good call runs: the table's inputs differ from it in one thing only
    ("backend-unknown", lambda: fp8gemm.linear(*_good(), backend="no-such"), RuntimeError, ["'no-such' is not installed"]),
    # grouped ops under their own names (their full table: conformance_grouped.BAD_INPUTS)
    ("grouped_gemm-good", _grouped(), None, []),
    ("grouped_gemm_masked-good", _grouped("grouped_gemm_masked"), None, []),
    ("grouped_gemm-b-2d", _grouped(b=lambda t: t[0]), ValueError, ["b must be 3-D [G, N, K]", "torch.stack"]),
    ("grouped_gemm-offs-int64", _grouped(offs=lambda t: t.long()), TypeError, ["offs must be torch.int32", "offs.to(torch.int32)"]),
    ("grouped_gemm-offs-decreasing", _grouped(offs=lambda t: _i32([3, 2])), ValueError, ["offs must be non-decreasing", "torch.cumsum"]),
    ("grouped_gemm-offs-past-m", _grouped(offs=lambda t: _i32([3, 5])), ValueError, ["offs[-1] = 5 is past M = 4"]),
    ("grouped_gemm-offs-and-m_indices", _grouped(m_indices=lambda t: _i32([0, 0, 0, 1])), ValueError, ["pass exactly one of offs", "m_indices"]),
    ("grouped_gemm-b_scale-2d", _grouped(b_scale=lambda t: t[0]), ValueError, ["b_scale must be 3-D [G, ceil(N/128), K/128]"]),
    ("grouped_gemm-b_scale-device", _grouped(b_scale=_other_device), ValueError, ["b_scale is on meta", "move all inputs"]),
    ("grouped_gemm_masked-a-2d", _grouped("grouped_gemm_masked", a=lambda t: t[0]), ValueError, ["a must be 3-D [G, M_max, K]", "fp8gemm.grouped_gemm"]),
    ("grouped_gemm_masked-masked_m-length", _grouped("grouped_gemm_masked", masked_m=lambda t: t[:1]), ValueError, ["masked_m must have G = 2 entries"]),
    ("grouped_gemm_masked-masked_m-device", _grouped("grouped_gemm_masked", masked_m=_other_device), ValueError, ["masked_m is on meta"]),
    ("grouped_gemm_masked-expected_m", _grouped("grouped_gemm_masked", expected_m=lambda t: -1), ValueError, ["expected_m must be >= 0"]),
    # fused_experts: each argument under its own name
    ("fused_experts-good", _fused(), None, []),
    ("fused_experts-x-3d", _fused(x=lambda t: t[None]), ValueError, ["x must be 2-D [T, H]", "x.reshape(-1, H)"]),
    ("fused_experts-x-int", _fused(x=lambda t: t.int()), TypeError, ["x must be a bfloat16/float16/float32"]),
    ("fused_experts-x-h", _fused(x=lambda t: t[:, :128]), ValueError, ["w13 is [E, 2I, H] = (2, 256, 256) but x has H = 128"]),
    ("fused_experts-w13-bf16", _fused(w13=lambda t: t.bfloat16()), TypeError, ["w13 must be FP8", "fp8gemm.nn.Fp8Experts"]),
    ("fused_experts-w13-2d", _fused(w13=lambda t: t[0]), ValueError, ["w13 must be 3-D [E, 2I, H]"]),
    ("fused_experts-w13-odd-i", _fused(w13=lambda t: t[:, :192].contiguous()), ValueError, ["2I = 192", "multiple of 128"]),
    ("fused_experts-w13_scale-none", _fused(w13_scale=lambda t: None), TypeError, ["w13_scale is None", "weight_scale_inv"]),
    ("fused_experts-w13_scale-shape", _fused(w13_scale=lambda t: t[:, :1]), ValueError, ["w13_scale must be [E, 2I/128, H/128]"]),
    ("fused_experts-w2-shape", _fused(w2=lambda t: t[:1]), ValueError, ["w2 must be [E, H, I] = [2, 256, 128]"]),
    ("fused_experts-w2-dtype", _fused(w2=lambda t: t.view(torch.float8_e4m3fnuz)), TypeError, ["w2 has dtype torch.float8_e4m3fnuz but w13 has"]),
    ("fused_experts-w2_scale-none", _fused(w2_scale=lambda t: None), TypeError, ["w2_scale is None"]),
    ("fused_experts-w2_scale-bf16", _fused(w2_scale=lambda t: t.bfloat16()), TypeError, ["w2_scale must be torch.float32"]),
    ("fused_experts-topk_ids-float", _fused(topk_ids=lambda t: t.float()), TypeError, ["topk_ids must be torch.int32 or torch.int64"]),
    ("fused_experts-topk_ids-rows", _fused(topk_ids=lambda t: t[:3]), ValueError, ["topk_ids must be [T, k] with T = 4"]),
    ("fused_experts-topk_ids-range", _fused("cpu", topk_ids=lambda t: t + 1), ValueError, ["topk_ids holds 2, outside [-1, E = 2)"]),
    ("fused_experts-topk_ids-device", _fused(topk_ids=_other_device), ValueError, ["topk_ids is on meta", "move all inputs"]),
    ("fused_experts-topk_weights-shape", _fused(topk_weights=lambda t: t[:, :1]), ValueError, ["topk_weights must be [T, k] = [4, 2] like topk_ids"]),
    ("fused_experts-topk_weights-int", _fused(topk_weights=lambda t: t.int()), TypeError, ["topk_weights must be a float32/bfloat16/float16"]),
    ("fused_experts-activation", _fused(activation=lambda t: "gelu"), ValueError, ["activation must be one of ('silu',)"]),
    ("fused_experts-layout", _fused(layout=lambda t: "padded"), ValueError, ["layout must be one of ('contiguous',)"]),
    ("fused_experts-masked", _fused(layout=lambda t: "masked"), ValueError, ["layout='masked' is no longer", "pass layout=None"]),
    # Fp8Experts: its constructor's arguments
    ("Fp8Experts-hidden_size", lambda: Fp8Experts(2, 200, 128), ValueError, ["hidden size (H = 200)", "keep such experts in bf16"]),
    ("Fp8Experts-intermediate_size", lambda: Fp8Experts(2, 256, 100), ValueError, ["intermediate size (I = 100)"]),
    ("Fp8Experts-fp8_dtype", lambda: Fp8Experts(2, 256, 128, fp8_dtype=torch.bfloat16), TypeError, ["fp8_dtype must be one of"]),
    ("Fp8Experts-activation", lambda: Fp8Experts(2, 256, 128, activation="relu"), ValueError, ["activation must be one of"]),
]  # fmt: skip


@pytest.mark.parametrize("call, error, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument_and_the_fix(call, error, words):
    if error is None:
        with torch.no_grad():
            call()
        return
    with torch.no_grad(), pytest.raises(error) as raised:
        call()
    for word in words:
        assert word in str(raised.value), f"{word!r} not in: {raised.value}"
