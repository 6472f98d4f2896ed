"""``fp8gemm.linear``: bf16/fp16/fp32 activations in, the same dtype out, FP8 GEMM inside.

``y = x @ dequant(weight).T + bias`` with x quantized per token per 128 of K and the weight in FP8 with one
scale per 128x128 block. Each call is planned once (``plans``) and run by ``launch.run_linear``: a
backend with a ``linear`` entry takes both steps in one call from Python; else its quantize kernel runs, then the
GEMM.
"""

from __future__ import annotations

import torch

from . import runtime
from .autograd import refuse_grad
from .launch import run_linear
from .native import reraise_unless_miss
from .plans import checked_linear_plan, fast_linear_plan
from .runtime import LIBRARY
from .validation import check_linear

LINEAR_NAMES = ("x", "weight", "weight_scale", "bias")


@runtime.op("linear", "linear", LINEAR_NAMES)
def _linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
               pow2_scales: bool, backend: str) -> torch.Tensor:  # fmt: skip
    return eager_linear(x, weight, weight_scale, bias, pow2_scales, backend)


@_linear_op.register_fake
def _(x, weight, weight_scale, bias, pow2_scales, backend):
    check_linear(x, weight, weight_scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_ops = getattr(torch.ops, LIBRARY)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pow2_scales: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """``x [..., K]`` (bf16/fp16/fp32) -> ``[..., N]`` in x's dtype: ``x @ dequant(weight).T + bias``.

    weight: FP8 [N, K] in the backend's FP8 dtype (``fp8gemm.preferred_fp8_dtype``); weight_scale: fp32
    [ceil(N/128), K/128], ideally passed once through ``fp8gemm.prepare_weight_scale``. x is quantized
    per token per 128 of K (``pow2_scales``: power-of-two scales) by the backend's kernel, then one FP8
    GEMM runs. A ``torch.library`` op: traces under ``torch.compile(fullgraph=True)`` and is captured by
    CUDA graphs. On CPU it runs the pure-torch reference.
    """
    if torch.is_grad_enabled():  # refuse_grad's first test, sparing inference a call; a guard when compiling
        refuse_grad("linear", LINEAR_NAMES, (x, weight, weight_scale, bias))
    if torch.compiler.is_compiling():
        return _ops.linear(x, weight, weight_scale, bias, pow2_scales, backend or "")
    return eager_linear(x, weight, weight_scale, bias, pow2_scales, backend)


def eager_linear(x, weight, weight_scale, bias, pow2_scales: bool, backend: str | None) -> torch.Tensor:
    """One call: the backend's native op where it takes it (one C++ call), else the planned call."""
    # bf16 x, no bias: what the native op takes (a declined call costs an exception before the planner)
    native = runtime.native_ops(x, weight, backend) if bias is None and x.dtype is torch.bfloat16 else None
    if native is not None:
        try:
            return native.linear(x, weight, weight_scale, pow2_scales)
        except RuntimeError as error:
            reraise_unless_miss(error)
    plan = fast_linear_plan(x, weight, weight_scale, bias, backend)
    plan = plan or checked_linear_plan(x, weight, weight_scale, bias, backend)
    return run_linear(plan, x, weight, bias, pow2_scales)
