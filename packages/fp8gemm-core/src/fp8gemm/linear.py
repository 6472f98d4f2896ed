"""``fp8gemm.linear``: bf16/fp16/fp32 activations in, the same dtype out, FP8 GEMM inside.

``y = x @ dequant(weight).T + bias`` with x quantized per token per 128 of K and the weight in FP8 with one
scale per 128x128 block. A backend with a ``linear`` entry takes both steps in one call from Python; else
its quantize kernel runs, then the GEMM.
"""

from __future__ import annotations

import os

import torch

from . import ops, registry
from .protocol import OUT_BF16, OUT_FP32
from .quantize import _IN_KINDS, _kernel_input, _quantize_activation, kernel_quantize


def _check_linear(x, weight, bias) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in _IN_KINDS:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [..., K], got {got}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError("weight must be a 2-D FP8 tensor [N, K] (the nn.Linear weight layout); quantize it with "
                        "fp8gemm.quantize_weight or use fp8gemm.nn.Fp8Linear")  # fmt: skip
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x's last dim must equal weight's in_features: x is {tuple(x.shape)}, weight is [N, K] = {tuple(weight.shape)}"
        )
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"bias must be a tensor [N] = [{weight.shape[0]}], got {got}")


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
    in_kind, dev = _IN_KINDS.get(x.dtype), ops._device_index(x)
    if in_kind is None or dev < 0 or dev != ops._current_device():
        return None
    found = ops._fast_backend(dev, backend_name or os.environ.get(registry.ENV_VAR) or None)
    if found is None or weight.dtype is not found[1] or found[0].quantize is None:
        return None
    shape, (n, k) = x.shape, weight.shape
    if not shape or shape[-1] != k or not k or k & 127:
        return None
    if bias is not None and (type(bias) is not tensor or bias.shape != (n,)):
        return None
    x2d = x if len(shape) == 2 else x.reshape(-1, k)
    if not x2d.shape[0]:
        return None
    x2d = _kernel_input(x2d)
    out_dtype = _gemm_dtype(x.dtype)
    if found[0].linear is not None:
        y = _launch_linear(found, x2d, in_kind, weight, weight_scale, out_dtype, pow2, dev)
        if y is not None:
            return _finish(y, x, bias)
    q, scale = kernel_quantize(found[0], x2d, pow2)
    y = ops._try_fast(backend_name, q, weight, scale, weight_scale, None, out_dtype)
    if y is None:  # an unusual weight or scale: the general path checks and raises
        y = ops._run(backend_name or "", q, weight, scale, weight_scale, None, out_dtype)
    return _finish(y, x, bias)


def _launch_linear(found, x2d, in_kind: int, weight, weight_scale, out_dtype, pow2: bool, dev: int):
    """One call of the backend's linear entry (quantization, then GEMM), or None for a weight or scale the
    general path must check."""
    backend, _, _, read_b_scale_ld = found
    m, k = x2d.shape
    weight_lds = ops._fast_weight(read_b_scale_ld, weight, weight_scale, k, dev)
    if weight_lds is None:
        return None
    ldb, b_scale_ld = weight_lds
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x2d.device)
    stream = ops._raw_stream(dev)
    workspace = ops._scratch(backend.linear_workspace_bytes(m, n, k, in_kind), stream, x2d.device)
    backend.linear(x2d.data_ptr(), weight.data_ptr(), weight_scale.data_ptr(), out.data_ptr(), workspace, m, n, k,
                   x2d.stride(0), ldb, n, b_scale_ld, OUT_FP32 if out_dtype is torch.float32 else OUT_BF16, in_kind,
                   int(pow2), stream)  # fmt: skip
    return out


def _linear(x, weight, weight_scale, bias, pow2: bool, backend_name):
    y = _try_fast(x, weight, weight_scale, bias, pow2, backend_name)
    return y if y is not None else _checked_linear(x, weight, weight_scale, bias, pow2, backend_name)


def _checked_linear(x, weight, weight_scale, bias, pow2: bool, backend_name):
    _check_linear(x, weight, bias)
    q, scale = _quantize_activation(x, weight.dtype, pow2, backend_name)
    y = ops.gemm(q, weight, scale, weight_scale, out_dtype=_gemm_dtype(x.dtype), backend=backend_name)
    return _finish(y, x, bias)


@torch.library.custom_op("fp8gemm::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
               pow2_scales: bool, backend: str) -> torch.Tensor:  # fmt: skip
    return _linear(x, weight, weight_scale, bias, pow2_scales, backend or None)


@_linear_op.register_fake
def _(x, weight, weight_scale, bias, pow2_scales, backend):
    _check_linear(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


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
        return torch.ops.fp8gemm.linear(x, weight, weight_scale, bias, pow2_scales, backend or "")
    return _linear(x, weight, weight_scale, bias, pow2_scales, backend)
