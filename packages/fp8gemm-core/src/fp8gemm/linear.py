"""``fp8gemm.linear``: bf16/fp16/fp32 activations in, the same dtype out, FP8 GEMM inside.

``y = x @ dequant(weight).T + bias`` with x quantized per token per 128 of K and the weight in FP8 with one
scale per 128x128 block. A backend with a ``linear`` entry takes both steps in one call from Python; else
its quantize kernel runs, then the GEMM.
"""

from __future__ import annotations

import torch

from . import ops, registry, runtime
from .protocol import LINEAR_ARGS
from .quantize import kernel_quantize, quantize_rows
from .reference import BLOCK
from .runtime import IN_KINDS, LIBRARY
from .validation import check_fp8, check_same_device, check_tensor, check_weight

LINEAR_NAMES = ("x", "weight", "weight_scale", "bias")
_pack_linear = LINEAR_ARGS.pack
_GEMM_NAMES = ("x (quantized)", "weight", "the scales of x", "weight_scale")


def check_linear(x, weight, weight_scale, bias) -> None:
    """Every argument of ``linear`` checked on metadata alone, each error under the caller's name."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [..., K], got {type(x).__name__}")
    if x.dtype not in IN_KINDS:
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [..., K], got {x.dtype}")
    check_tensor("weight", weight)
    check_fp8("weight", weight, "quantize it with fp8gemm.quantize_weight or use fp8gemm.nn.Fp8Linear")
    n, k = weight.shape
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(
            f"x's last dim must equal weight's in_features: x is {tuple(x.shape)}, weight is [N, K] = {(n, k)}"
        )
    if k == 0 or k % BLOCK:
        raise ValueError(f"K = {k} (weight.shape[1]) must be a positive multiple of {BLOCK}; pad K with zeros")
    check_weight(weight, weight_scale, k, ("weight", "weight_scale"))
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
            got = bias.dtype if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point tensor [N] = [{n}] or None, got {got}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be [N] = [{n}], got {tuple(bias.shape)}")
    check_same_device("x", x, weight=weight, weight_scale=weight_scale, bias=bias)


def _gemm_dtype(x_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if x_dtype is torch.bfloat16 else torch.float32  # fp16 goes through fp32


def _finish(y: torch.Tensor, x: torch.Tensor, bias) -> torch.Tensor:
    if bias is not None:
        y.add_(bias)
    if y.dtype is not x.dtype:
        y = y.to(x.dtype)
    return y if len(x.shape) == 2 else y.view(*x.shape[:-1], y.shape[1])


def _try_fast(x, weight, weight_scale, bias, pow2: bool, backend_name):
    """The steady-state eager call (CUDA input on the current device, a backend with a quantize kernel,
    plain tensors), with the fewest checks; None sends anything else to the fully checked path."""
    tensor = torch.Tensor
    if type(x) is not tensor or type(weight) is not tensor or len(weight.shape) != 2:
        return None
    if x.requires_grad and runtime.grad_enabled():  # the checked path refuses it
        return None
    in_kind, dev = IN_KINDS.get(x.dtype), runtime.device_index(x)
    if in_kind is None or dev < 0 or dev != runtime.current_device():
        return None
    found = runtime.fast_backend(dev, runtime.requested_backend(backend_name))
    if found is None or weight.dtype is not found.fp8_dtype or found.backend.quantize is None:
        return None
    shape, (n, k) = x.shape, weight.shape
    if not shape or shape[-1] != k or not k or k & 127:
        return None
    if bias is not None and (
        type(bias) is not tensor or bias.dtype is not x.dtype or bias.shape != (n,) or runtime.device_index(bias) != dev
    ):
        return None
    if bias is not None and bias.requires_grad and runtime.grad_enabled():
        return None
    weight_lds = runtime.weight_lds(found, weight, weight_scale, k, dev)
    if weight_lds is None:
        return None
    x2d = x if len(shape) == 2 else x.reshape(-1, k)
    if not x2d.shape[0]:
        return None
    out_dtype = _gemm_dtype(x.dtype)
    if found.backend.linear is not None:
        x2d = runtime.kernel_rows(x2d)
        y = _launch_linear(found.backend, x2d, in_kind, weight, weight_scale, weight_lds, out_dtype, pow2, dev)
    else:
        q, scale = kernel_quantize(found.backend, x2d, pow2)  # reads x2d in place where it can
        y = ops.try_fast_gemm(backend_name, q, weight, scale, weight_scale, None, out_dtype)
    return _finish(y, x, bias)


def _launch_linear(backend, x2d, in_kind: int, weight, weight_scale, weight_lds, out_dtype, pow2: bool, dev: int):
    """One call of the backend's linear entry (quantization, then GEMM) on operands the fast path checked."""
    m, k = x2d.shape
    n = weight.shape[0]
    ldb, b_scale_ld = weight_lds
    out = torch.empty((m, n), dtype=out_dtype, device=x2d.device)
    stream = runtime.raw_stream(dev)
    workspace = runtime.scratch(backend.linear_workspace_bytes(m, n, k, in_kind), x2d.device, stream)
    backend.linear(_pack_linear(x2d.data_ptr(), weight.data_ptr(), weight_scale.data_ptr(), out.data_ptr(), workspace, m, n, k,
                   x2d.stride(0), ldb, n, b_scale_ld, runtime.out_kind(out_dtype), in_kind, int(pow2), stream))  # fmt: skip
    return out


def _check_backend_dtype(weight, device, backend_name) -> None:
    chosen = registry.select(device, backend_name).backend
    if chosen.fp8_dtype and weight.dtype != getattr(torch, chosen.fp8_dtype):
        raise TypeError(
            f"weight is {weight.dtype}, but the backend for {device} ({chosen.name}) takes torch.{chosen.fp8_dtype}; "
            f"convert it with fp8gemm.nn.to_fp8_dtype(weight, weight_scale, torch.{chosen.fp8_dtype}), or load the "
            f"layer through fp8gemm.nn.Fp8Linear, which converts on load"
        )


def _linear(x, weight, weight_scale, bias, pow2: bool, backend_name):
    y = _try_fast(x, weight, weight_scale, bias, pow2, backend_name)
    return y if y is not None else _checked_linear(x, weight, weight_scale, bias, pow2, backend_name)


def _checked_linear(x, weight, weight_scale, bias, pow2: bool, backend_name):
    runtime.refuse_grad("linear", LINEAR_NAMES, (x, weight, weight_scale, bias))
    check_linear(x, weight, weight_scale, bias)
    backend_name = runtime.requested_backend(backend_name)
    _check_backend_dtype(weight, x.device, backend_name)
    q, scale = quantize_rows(x, weight.dtype, pow2, backend_name)
    y = ops.run_gemm(backend_name, q, weight, scale, weight_scale, None, _gemm_dtype(x.dtype), _GEMM_NAMES)
    return _finish(y, x, bias)


@runtime.op("linear", "linear", LINEAR_NAMES)
def _linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
               pow2_scales: bool, backend: str) -> torch.Tensor:  # fmt: skip
    return _linear(x, weight, weight_scale, bias, pow2_scales, backend or None)


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
    if torch.compiler.is_compiling():
        runtime.refuse_grad("linear", LINEAR_NAMES, (x, weight, weight_scale, bias))  # traced as a guard
        return _ops.linear(x, weight, weight_scale, bias, pow2_scales, backend or "")
    return _linear(x, weight, weight_scale, bias, pow2_scales, backend)
