"""``fp8gemm.training.linear``: a linear layer whose three GEMMs run in FP8 (DeepSeek-V3 recipe), differentiable.

Forward ``y = x @ W^T + bias``: x quantized per token per 128 of K, W (the high-precision master weight) per 128x128
block, one ``fp8gemm.gemm``: the bits of ``fp8gemm.linear(x, *quantize_weight(W), bias)``. Saved for the backward:
the FP8 x^T and W^T with their scales, not the high-precision x. Backward, with dY quantized with its transpose:

* dX = dY @ W: ``gemm(dY [M, N], W^T [K, N])``, 1x128 by 128x128 scales (the inference form), contracting over N;
* dW = dY^T @ X: ``gemm(dY^T [N, M_pad], X^T [K, M_pad])``, 1x128 scales on both (the per-row "1D1D" form),
  contracting over the tokens, in the weight's dtype (bf16 from the GEMM itself; float32 cast to fp16);
* dbias = dY summed over the tokens.
"""

from __future__ import annotations

import torch

from .. import runtime
from ..linear import linear as fp8_linear
from ..native import reraise_unless_miss
from ..ops import gemm
from ..plans import gemm_dtype
from ..quantize import quantize_weight
from ..reference import BLOCK
from ..validation import IN_DTYPES
from .quantize import quantize_weight_with_transpose, quantize_with_transpose
from .weight_reuse import quantized_once, reusing


def check_training_linear(x, weight, bias) -> None:
    """Every argument of :func:`linear` on metadata alone, each error naming the argument and the fix."""
    if not isinstance(x, torch.Tensor) or x.dtype not in IN_DTYPES or x.dim() == 0:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [..., K], got {got}")
    if not isinstance(weight, torch.Tensor) or weight.dtype not in IN_DTYPES or weight.dim() != 2:
        got = f"{weight.dtype} {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(
            f"weight must be the high-precision master weight, a bfloat16/float16/float32 [N, K] tensor, got {got}; "
            f"it is quantized on every call (an FP8 weight has no gradient: use fp8gemm.linear for inference)"
        )
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dim must equal weight's in_features: x is {tuple(x.shape)}, weight is {(n, k)}")
    for name, size, why in (("in_features (K", k, "forward"), ("out_features (N", n, "input gradient dX = dY @ W")):
        if size == 0 or size % BLOCK:
            raise ValueError(
                f"{name} = {size}) must be a positive multiple of {BLOCK}: the {why} contracts over it in {BLOCK}-wide "
                f"blocks; keep this layer in high precision (fp8gemm.nn.convert(model, training=True) does)"
            )
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point or tuple(bias.shape) != (n,)
    ):
        got = f"{bias.dtype} {tuple(bias.shape)}" if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise TypeError(f"bias must be a floating-point tensor [N] = [{n}] or None, got {got}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; move all inputs to one device")


def _forward_gemm(q, scale, w_q, w_scale, bias, x_dtype, backend) -> torch.Tensor:
    """The forward output as ``fp8gemm.linear`` computes it: the GEMM in its output dtype, the bias, x's dtype."""
    y = gemm(q, w_q, scale, w_scale, out_dtype=gemm_dtype(x_dtype), backend=backend)
    if bias is not None:
        y.add_(bias)
    return y if y.dtype is x_dtype else y.to(x_dtype)


def _native_forward(x, weight, pow2_scales: bool, backend: str | None):
    """The backend's native forward (quantizers and GEMM in one C++ call) on a bf16 x, or None where it declines."""
    # fp16/fp32 x: an fp32 GEMM and a conversion, the Python path's; compiled: the ops with fake implementations
    if x.dtype is not torch.bfloat16 or torch.compiler.is_compiling():
        return None
    native = runtime.native_ops(x, weight, backend)
    if native is None:
        return None
    try:
        return native.linear_forward(x, weight, pow2_scales)
    except RuntimeError as error:
        reraise_unless_miss(error)
    return None


def _native_backward(ctx, dy2d, saved):
    """The backend's native backward (dY's quantizer, dX and dW) where x and the weight both need gradients, bf16 dY
    and a bf16 or float32 weight; None where it declines."""
    if dy2d.dtype is not torch.bfloat16 or ctx.weight_dtype not in (torch.bfloat16, torch.float32) or not dy2d.shape[0]:
        return None
    if torch.compiler.is_compiling():
        return None
    native = runtime.native_ops(dy2d, saved[0], ctx.backend)
    if native is None:
        return None
    try:
        return native.linear_backward(dy2d, *saved, ctx.pow2_scales, ctx.weight_dtype is torch.float32)
    except RuntimeError as error:
        reraise_unless_miss(error)
    return None


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, pow2_scales: bool, backend: str | None):
        n, k = weight.shape
        # reused weights: the Python path, whose weight quantizer is apart from x's (the native op quantizes both)
        native = None if reusing(weight) else _native_forward(x, weight, pow2_scales, backend)
        if native is not None:
            y, *saved = native
            if bias is not None:
                y.add_(bias)
        else:
            xq = quantize_with_transpose(x, pow2_scales=pow2_scales, backend=backend)
            wq = quantized_once(
                weight,
                ("linear", xq.q.dtype, pow2_scales),
                lambda: quantize_weight_with_transpose(weight, fp8_dtype=xq.q.dtype, pow2_scales=pow2_scales),
            )
            y = _forward_gemm(xq.q, xq.scale, wq.q, wq.scale, bias, x.dtype, backend)
            saved = (xq.q_t, xq.scale_t, wq.q_t, wq.scale_t)
        ctx.save_for_backward(*saved)
        ctx.x_shape, ctx.x_dtype, ctx.weight_dtype = x.shape, x.dtype, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.pow2_scales, ctx.backend = pow2_scales, backend
        return y if x.dim() == 2 else y.view(*x.shape[:-1], n)  # a view costs host time the 2-D call need not pay

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        x_q_t, x_scale_t, w_q_t, w_scale_t = saved
        k, n = w_q_t.shape
        dy2d = dy if dy.dim() == 2 else dy.reshape(-1, n)
        dx = dw = dbias = None
        need_x, need_w, need_bias = ctx.needs_input_grad[:3]
        native = _native_backward(ctx, dy2d, saved) if need_x and need_w else None
        if native is not None:
            dx, dw = native
            dx = dx if dy.dim() == 2 else dx.view(ctx.x_shape)
            need_x = need_w = False
        if need_x or need_w:  # the Python path
            dq = quantize_with_transpose(dy2d, fp8_dtype=x_q_t.dtype, pow2_scales=ctx.pow2_scales, backend=ctx.backend)
        if need_x:
            dx = gemm(dq.q, w_q_t, dq.scale, w_scale_t, out_dtype=gemm_dtype(ctx.x_dtype), backend=ctx.backend)
            dx = dx.to(ctx.x_dtype).view(ctx.x_shape)
        if need_w:
            if dy2d.shape[0]:
                # a bf16 weight's gradient straight from the GEMM (the float32 product rounded once), else float32
                wgrad_dtype = torch.bfloat16 if ctx.weight_dtype is torch.bfloat16 else torch.float32
                dw = gemm(dq.q_t, x_q_t, dq.scale_t, x_scale_t, out_dtype=wgrad_dtype, backend=ctx.backend)
                dw = dw if dw.dtype is ctx.weight_dtype else dw.to(ctx.weight_dtype)
            else:  # no tokens: nothing to contract (the GEMM needs K > 0)
                dw = dy2d.new_zeros((n, k), dtype=ctx.weight_dtype)
        if need_bias:
            dbias = dy2d.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, dbias, None, None


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pow2_scales: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """``x [..., K]`` (bf16/fp16/fp32) -> ``[..., N]`` in x's dtype, ``x @ W^T + bias`` with all three GEMMs in FP8.

    weight: the high-precision master weight [N, K] (bf16/fp16/fp32, typically an ``nn.Parameter``), quantized per
    128x128 block on every call; K and N multiples of 128. The forward output has the bits of
    ``fp8gemm.linear(x, *fp8gemm.quantize_weight(weight), bias)``; gradients flow to x, weight and bias (module
    docstring). Where nothing needs a gradient it is that inference call, with no transposes made or saved.
    """
    check_training_linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if not needs_grad:
        w_q, w_scale = quantize_weight(weight, pow2_scales=pow2_scales)
        return fp8_linear(x, w_q, w_scale, bias, pow2_scales=pow2_scales, backend=backend)
    return _Fp8LinearFunction.apply(x, weight, bias, pow2_scales, backend)
