"""``fp8gemm.training.fused_experts``: the routed experts of a mixture-of-experts layer with every GEMM in FP8
(DeepSeek-V3 recipe), differentiable in x, topk_weights and both high-precision expert weights.

Forward: w13 [E, 2I, H] and w2 [E, H, I] quantized per 128x128 block on every call (with their transposes), then
``fp8gemm.fused_experts``' pipeline on them (the same bits). Backward, with R = T*k rows sorted by expert:

* dY_r = w_r dOut[t_r] per routed row, and d topk_weights[t, j] = <dOut[t], Y[position[t, j]]>;
* dW2_e = dY_e^T act_e: ``kgrouped_wgrad`` on dY^T and act^T (per-expert 128-token blocks, no padding);
* dAct = dY W2: the grouped GEMM on W2^T; dH = the SiLU-and-mul backward in fp32 at the saved gate/up product;
* dW13_e = dH_e^T X_e: ``kgrouped_wgrad`` on dH^T and the routed x^T kept from the forward;
* dX_r = dH W13: the grouped GEMM on W13^T, each token's rows summed back onto it (a gather, no atomics).

Each step is the seam a kernel plugs into (training/experts_steps.py); the forward and the backward are one
torch.library op each (fake implementations), so ``torch.compile(fullgraph=True)`` traces the layer. docs/training.md.
"""

from __future__ import annotations

import torch

from .. import registry, runtime
from ..moe import check_fused_experts, plan_fused_experts
from ..moe import fused_experts as fp8_fused_experts
from ..moe_pipeline import MoePlan, MoeShape
from ..ops import prepare_weight_scale
from ..protocol import MOE_MAX_EXPERTS
from ..reference import BLOCK, FP8_DTYPES
from ..validation import IN_DTYPES
from .experts_steps import GradDtypes, Needs, Saved, backward_steps, forward_steps, saved_h_dtype
from .grouped_quantize import empty_scale_t, grouped_blocks, quantize_experts_with_transpose
from .weight_reuse import quantized_once

NAMES = ("x", "topk_ids", "topk_weights", "w13", "w13_scale", "w2", "w2_scale")


def _check_weight(name: str, w, shape_what: str) -> None:
    if not isinstance(w, torch.Tensor) or w.dtype not in IN_DTYPES or w.dim() != 3:
        got = f"{w.dtype} {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        fp8 = isinstance(w, torch.Tensor) and w.dtype in FP8_DTYPES
        fix = (
            "FP8 weights have no gradient: use fp8gemm.fused_experts for inference"
            if fp8
            else "pass the 3-D float tensor"
        )
        raise TypeError(
            f"{name} must be the high-precision master weights, a bfloat16/float16/float32 {shape_what} tensor "
            f"(quantized on every call), got {got}; {fix}"
        )


def check_training_experts(x, w13, w2) -> None:
    """x, w13 and w2 of :func:`fused_experts` on metadata alone (topk_ids and topk_weights: ``fused_experts``'
    checks, under the same names), each error naming the argument and the fix."""
    if not isinstance(x, torch.Tensor) or x.dtype not in IN_DTYPES or x.dim() != 2:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [T, H], got {got}; flatten with x.reshape(-1, H)")
    _check_weight("w13", w13, "[E, 2I, H] (each expert's gate then up projection)")
    _check_weight("w2", w2, "[E, H, I] (each expert's down projection)")
    experts, two_i, hidden = w13.shape
    if hidden != x.shape[1] or hidden % BLOCK or not hidden:
        raise ValueError(f"w13 is [E, 2I, H] = {tuple(w13.shape)} and x is {tuple(x.shape)}: H must agree and be a "
                         f"positive multiple of {BLOCK}")  # fmt: skip
    if not 0 < experts <= MOE_MAX_EXPERTS:
        raise ValueError(f"w13 holds E = {experts} experts; fused_experts takes 1 to {MOE_MAX_EXPERTS}")
    if two_i % 2 or not two_i or (two_i // 2) % BLOCK:
        raise ValueError(
            f"w13.shape[1] = 2I = {two_i}: I must be a positive multiple of {BLOCK} (the down projection and the "
            f"weight gradients contract over it); keep these experts in high precision"
        )
    if tuple(w2.shape) != (experts, hidden, two_i // 2):
        raise ValueError(f"w2 must be [E, H, I] = {[experts, hidden, two_i // 2]} (from w13), got {tuple(w2.shape)}")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.device != x.device:
            raise ValueError(f"{name} is on {w.device} but x is on {x.device}; move all inputs to one device")


# --- the two ops: what torch.compile sees --------------------------------------------------------------------------


def _forward(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, pow2: bool, keep_y: bool, backend: str):
    plan = plan_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, "silu", pow2, None,
                              backend or None)  # fmt: skip
    out, saved = forward_steps(plan, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, keep_y)
    return [out, *saved]


@runtime.op("training_experts_forward", "training.fused_experts", NAMES)
def _forward_op(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, pow2: bool, keep_y: bool,
                backend: str) -> list[torch.Tensor]:  # fmt: skip
    return _forward(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, pow2, keep_y, backend)


def _saved_like(x, shape: MoeShape, fp8_dtype: torch.dtype, keep_y: bool, backend: str) -> Saved:
    """Empty tensors shaped and strided as the forward's ``Saved`` (the fake implementation's)."""
    rows, hidden, inter = shape.tokens * shape.top_k, shape.hidden, shape.intermediate
    scale_t = lambda k: empty_scale_t(x.device, rows, k, shape.experts, fp8_dtype, backend or None)  # noqa: E731
    blocks = grouped_blocks(rows, shape.experts)
    y_dtype = torch.bfloat16 if x.dtype is torch.bfloat16 else torch.float32
    empty = lambda *size, dtype=torch.float32: x.new_empty(size, dtype=dtype)  # noqa: E731
    return Saved(
        offs=empty(shape.experts, dtype=torch.int32),
        position=empty(shape.tokens, shape.top_k, dtype=torch.int64),
        token=empty(rows, dtype=torch.int64),
        row_weight=empty(rows),
        x_t=empty(hidden, blocks * BLOCK, dtype=fp8_dtype),
        x_scale_t=scale_t(hidden),  # the grouped quantizer's layout: MN-major where its kernel writes it
        h=empty(rows, 2 * inter, dtype=saved_h_dtype(x.dtype)),
        act_t=empty(inter, blocks * BLOCK, dtype=fp8_dtype),
        act_scale_t=scale_t(inter),
        y=empty(rows, hidden, dtype=y_dtype) if keep_y else empty(0, dtype=y_dtype),
    )


@_forward_op.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, pow2, keep_y, backend):
    shape = check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, "silu", None)
    return [x.new_empty((shape.tokens, shape.hidden)), *_saved_like(x, shape, w13.dtype, keep_y, backend)]


def _backward_plan(dout, saved: Saved, w13_t, dtypes: GradDtypes, pow2: bool, backend: str) -> MoePlan:
    tokens, k = saved.position.shape
    shape = MoeShape(tokens, k, saved.offs.shape[0], dout.shape[1], saved.h.shape[1] // 2)
    chosen = registry.select(dout.device, runtime.requested_backend(backend or None)).backend
    return MoePlan(shape, chosen, w13_t.dtype, pow2, dtypes.x, dtypes.x)


def _backward(dout, saved: Saved, w13_t, w13_scale_t, w2_t, w2_scale_t, needs: Needs, dtypes: GradDtypes,
              pow2: bool, backend: str) -> list:  # fmt: skip
    plan = _backward_plan(dout, saved, w13_t, dtypes, pow2, backend)
    return backward_steps(plan, dout, saved, w13_t, w13_scale_t, w2_t, w2_scale_t, needs, dtypes)


@runtime.op("training_experts_backward", "training.fused_experts", ("dout",))
def _backward_op(dout: torch.Tensor, saved: list[torch.Tensor], w13_t: torch.Tensor, w13_scale_t: torch.Tensor,
                 w2_t: torch.Tensor, w2_scale_t: torch.Tensor, needs: list[bool], x_dtype: torch.dtype,
                 weights_dtype: torch.dtype, w13_dtype: torch.dtype, w2_dtype: torch.dtype, pow2: bool,
                 backend: str) -> list[torch.Tensor]:  # fmt: skip
    dtypes = GradDtypes(x_dtype, weights_dtype, w13_dtype, w2_dtype)
    grads = _backward(dout, Saved(*saved), w13_t, w13_scale_t, w2_t, w2_scale_t, Needs(*needs), dtypes, pow2, backend)
    # an op returns tensors: [0] in the gradient's dtype for "not needed"
    return [dout.new_empty(0, dtype=d) if g is None else g for g, d in zip(grads, dtypes, strict=True)]


@_backward_op.register_fake
def _(dout, saved, w13_t, w13_scale_t, w2_t, w2_scale_t, needs, *dtypes_pow2_backend):
    saved, dtypes = Saved(*saved), dtypes_pow2_backend[:4]
    experts, hidden, two_i = w13_t.shape
    shapes = (dout.shape, saved.position.shape, (experts, two_i, hidden), (experts, hidden, two_i // 2))
    return [dout.new_empty(s if need else (0,), dtype=d) for s, need, d in zip(shapes, needs, dtypes, strict=True)]


_ops = getattr(torch.ops, runtime.LIBRARY)


# --- autograd -----------------------------------------------------------------------------------------------------


def _quantized_experts(w, fp8_dtype, pow2: bool, backend: str):
    """w [E, N, K] in FP8 with its transpose; inside ``reuse_quantized_weights()`` once for the block."""
    return quantized_once(
        w,
        ("experts", fp8_dtype, pow2, backend),
        lambda: quantize_experts_with_transpose(w, fp8_dtype=fp8_dtype, pow2_scales=pow2, backend=backend or None),
    )


class _Fp8ExpertsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_ids, topk_weights, w13, w2, keep_y: bool, pow2: bool, backend: str):
        w13q = _quantized_experts(w13, None, pow2, backend)
        w2q = _quantized_experts(w2, w13q.q.dtype, pow2, backend)
        args = (x, topk_ids, topk_weights, w13q.q, w13q.scale, w2q.q, w2q.scale, pow2, keep_y, backend)
        out, *saved = _ops.training_experts_forward(*args) if torch.compiler.is_compiling() else _forward(*args)
        ctx.save_for_backward(*saved, w13q.q_t, w13q.scale_t, w2q.q_t, w2q.scale_t)
        ctx.dtypes = GradDtypes(x.dtype, topk_weights.dtype, w13.dtype, w2.dtype)
        ctx.pow2, ctx.backend = pow2, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        *saved, w13_t, w13_scale_t, w2_t, w2_scale_t = ctx.saved_tensors
        need = ctx.needs_input_grad
        needs = Needs(need[0], need[2], need[3], need[4])
        if torch.compiler.is_compiling():
            grads = _ops.training_experts_backward(dout, saved, w13_t, w13_scale_t, w2_t, w2_scale_t, list(needs),
                                                   *ctx.dtypes, ctx.pow2, ctx.backend)  # fmt: skip
            grads = [g if n else None for g, n in zip(grads, needs, strict=True)]
        else:
            grads = _backward(dout, Saved(*saved), w13_t, w13_scale_t, w2_t, w2_scale_t, needs, ctx.dtypes, ctx.pow2,
                              ctx.backend)  # fmt: skip
        dx, d_weights, dw13, dw2 = grads
        return dx, None, d_weights, dw13, dw2, None, None, None


def _inference(x, topk_ids, topk_weights, w13, w2, pow2: bool, backend: str | None) -> torch.Tensor:
    """No gradient needed: the weights quantized (no transposes), then ``fp8gemm.fused_experts``."""
    w13q = quantize_experts_with_transpose(w13, pow2_scales=pow2, transpose=False, backend=backend)
    w2q = quantize_experts_with_transpose(w2, fp8_dtype=w13q.q.dtype, pow2_scales=pow2, transpose=False,
                                          backend=backend)  # fmt: skip
    s13, s2 = w13q.scale, w2q.scale
    if not torch.compiler.is_compiling():  # the layout the backend reads (the op conforms them when compiled)
        s13, s2 = prepare_weight_scale(s13, backend=backend), prepare_weight_scale(s2, backend=backend)
    return fp8_fused_experts(x, topk_ids, topk_weights, w13q.q, s13, w2q.q, s2, pow2_scales=pow2, backend=backend)


def fused_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    pow2_scales: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """The routed experts, trainable, every GEMM in FP8: ``x [T, H]`` -> ``[T, H]`` in x's dtype.

    ``out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` for ``e = topk_ids[t, j]``, as
    ``fp8gemm.fused_experts`` (same arguments for x, topk_ids, topk_weights), but w13 [E, 2I, H] (each expert's gate
    then up rows) and w2 [E, H, I] are the high-precision master weights (bf16/fp16/fp32, typically Parameters),
    quantized per 128x128 block on every call; H and I multiples of 128. The forward has the bits of
    ``fp8gemm.fused_experts`` on those quantized weights; gradients flow to x, topk_weights, w13 and w2 (module
    docstring), each in its tensor's dtype. Where nothing needs a gradient it is that inference call.
    """
    check_training_experts(x, w13, w2)
    trained = (x, topk_weights, w13, w2)
    if not (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in trained)):
        return _inference(x, topk_ids, topk_weights, w13, w2, pow2_scales, backend)
    keep_y = isinstance(topk_weights, torch.Tensor) and topk_weights.requires_grad
    return _Fp8ExpertsFunction.apply(x, topk_ids, topk_weights, w13, w2, keep_y, pow2_scales, backend or "")
