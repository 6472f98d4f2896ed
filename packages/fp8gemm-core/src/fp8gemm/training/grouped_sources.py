"""The grouped transposing quantizer on rows it computes as it reads them: ``quantize_grouped_with_transpose`` of a
gather, of SiLU-and-mul, or of SiLU-and-mul's gradient, without writing that intermediate. The training experts'
forward and backward quantize exactly these (training/experts_steps.py).

Each function's result is ``quantize_grouped_with_transpose(rows, offs)`` of the torch composition its docstring
gives, computed in fp32 as that composition computes it on the device (fp8gemm/quantize_sources.cuh has the kernel's
arithmetic). The backend's ``quantize_grouped_transposed`` entry runs it in one launch where it takes the call (a row
source, protocol.SOURCE_*); elsewhere the composition runs, then the grouped quantizer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import runtime
from ..autograd import refuse_grad
from ..moe_torch import silu_and_mul
from ..protocol import SOURCE_GATHER, SOURCE_SWIGLU, SOURCE_SWIGLU_BACKWARD
from ..reference import BLOCK
from ..validation import check_source, check_tensor
from .grouped_quantize import (
    check_offs_tensor,
    check_offs_values,
    empty_scale_t,
    grouped_blocks,
    grouped_kernel,
    kernel_grouped,
    quantize_grouped_with_transpose,
)
from .quantize import Transposed


def quantize_gathered_with_transpose(x: torch.Tensor, index: torch.Tensor, offs: torch.Tensor, *,
                                     row_weight: torch.Tensor | None = None, fp8_dtype: torch.dtype | None = None,
                                     pow2_scales: bool = False, backend: str | None = None) -> Transposed:  # fmt: skip
    """``quantize_grouped_with_transpose(rows, offs)`` of ``rows = x[index]`` (x [T, K] bf16/fp16/fp32, index int64
    [M] of rows sorted by expert), or of ``rows = x[index] * row_weight[:, None]`` in fp32 with ``row_weight`` fp32 [M].
    On the device an index outside [0, T) reads a zero row (it is not checked on the host)."""
    check_source("x", x)
    check_tensor("x", x)
    _check_vector("index", index, torch.int64, x)
    if row_weight is not None:
        _check_vector("row_weight", row_weight, torch.float32, x)
        if row_weight.shape != index.shape:
            raise ValueError(f"row_weight must have index's shape {tuple(index.shape)}, got {tuple(row_weight.shape)}")
    refuse_grad("training.quantize_gathered_with_transpose", ("x", "row_weight"), (x, row_weight))
    return _call(SOURCE_GATHER, x, offs, index.shape[0], x.shape[1], index, row_weight, None, fp8_dtype, pow2_scales,
                 backend)  # fmt: skip


def quantize_swiglu_with_transpose(h: torch.Tensor, offs: torch.Tensor, *, fp8_dtype: torch.dtype | None = None,
                                   pow2_scales: bool = False, backend: str | None = None) -> Transposed:  # fmt: skip
    """``quantize_grouped_with_transpose(F.silu(h[:, :I]) * h[:, I:], offs)`` of the fp32 gate/up product h [M, 2I]
    (rows sorted by expert, I a multiple of 128)."""
    check_tensor("h", h)
    if h.dtype != torch.float32:
        raise TypeError(f"h must be float32 (the gate/up GEMM's fp32 product), got {h.dtype}")
    if h.shape[1] % (2 * BLOCK) or not h.shape[1]:
        raise ValueError(f"h must be [M, 2I] with I a positive multiple of 128, got shape {tuple(h.shape)}")
    refuse_grad("training.quantize_swiglu_with_transpose", ("h",), (h,))
    return _call(SOURCE_SWIGLU, h, offs, h.shape[0], h.shape[1] // 2, None, None, None, fp8_dtype, pow2_scales, backend)


def quantize_swiglu_backward_with_transpose(d: torch.Tensor, h: torch.Tensor, offs: torch.Tensor, *,
                                            fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False,
                                            backend: str | None = None) -> Transposed:  # fmt: skip
    """``quantize_grouped_with_transpose(swiglu_backward(d, h), offs)``: the gradient [M, 2I] of
    ``F.silu(gate) * up`` at h = [gate | up] (bf16/fp16/fp32 [M, 2I], rows sorted by expert) for the output gradient
    d fp32 [M, I], I a multiple of 128: :func:`swiglu_backward`."""
    check_tensor("d", d)
    check_tensor("h", h)
    check_source("h", h)
    if d.dtype != torch.float32:
        raise TypeError(f"d must be float32 (the down GEMM's input gradient), got {d.dtype}")
    if h.device != d.device or h.shape != (d.shape[0], 2 * d.shape[1]) or d.shape[1] % BLOCK or not d.shape[1]:
        raise ValueError(f"h must be [M, 2I] beside d [M, I] on d's device, I a positive multiple of 128; got h "
                         f"{tuple(h.shape)} on {h.device}, d {tuple(d.shape)} on {d.device}")  # fmt: skip
    refuse_grad("training.quantize_swiglu_backward_with_transpose", ("d", "h"), (d, h))
    return _call(SOURCE_SWIGLU_BACKWARD, d, offs, d.shape[0], h.shape[1], None, None, h, fp8_dtype, pow2_scales,
                 backend)  # fmt: skip


def swiglu_backward(d: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """fp32 [M, 2I]: [silu'(gate) * (d * up) | silu(gate) * d], torch's silu backward for silu', every step in fp32."""
    inter = h.shape[1] // 2
    gate, up = h[:, :inter].float(), h[:, inter:]  # up widened inside the product (the same fp32 values)
    out = torch.empty((h.shape[0], 2 * inter), dtype=torch.float32, device=h.device)
    d_gate, d_up = out[:, :inter], out[:, inter:]
    torch.mul(d, up, out=d_gate)
    torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)
    torch.mul(F.silu(gate), d, out=d_up)
    return out


def _check_vector(name: str, t, dtype: torch.dtype, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != dtype:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a 1-D {dtype} tensor, got {got}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}; move both to one device")


def _call(source, x, offs, rows, k, index, row_weight, gate_up, fp8_dtype, pow2, backend) -> Transposed:
    check_offs_tensor(offs)
    if offs.device != x.device:
        raise ValueError(f"offs is on {offs.device} but the rows' source is on {x.device}; move both to one device")
    if k % BLOCK:
        raise ValueError(f"the rows' width must be a multiple of 128, got {k}")
    if torch.compiler.is_compiling():
        return Transposed(*_ops.quantize_grouped_source(x, offs, index, row_weight, gate_up, source, rows, k,
                                                        fp8_dtype, pow2, backend or ""))  # fmt: skip
    return Transposed(*_quantize_source(x, offs, index, row_weight, gate_up, source, rows, k, fp8_dtype, pow2,
                                        backend))  # fmt: skip


def _quantize_source(x, offs, index, row_weight, gate_up, source: int, rows: int, k: int, fp8_dtype, pow2: bool,
                     backend: str | None):  # fmt: skip
    """The op's eager body: the backend's kernel on the source where it takes the call, else the composition."""
    check_offs_values(offs, rows, "M (the rows)")
    kernel = grouped_kernel(x.device, rows, k, fp8_dtype, backend)
    if kernel is None or not rows:
        composed = _compose(source, x, index, row_weight, gate_up)
        return quantize_grouped_with_transpose(composed, offs, fp8_dtype=fp8_dtype, pow2_scales=pow2, backend=backend)
    args = runtime.RowSourceArgs(source, None if index is None else index.contiguous(),
                                 None if row_weight is None else row_weight.contiguous(),
                                 None if gate_up is None else _whole_rows(gate_up), x.shape[0])  # fmt: skip
    return kernel_grouped(kernel, _whole_rows(x), offs, pow2, (rows, k), args)


def _whole_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a kernel reads rows: in place where its rows are aligned and apart (not broadcast), else a copy."""
    return runtime.kernel_rows(t if t.stride(0) >= t.shape[1] else t.contiguous())


def _compose(source: int, x, index, row_weight, gate_up) -> torch.Tensor:
    """The rows as torch operations compute them (the reference of each source)."""
    if source == SOURCE_GATHER:  # an index outside [0, T) reads a zero row, unweighted, as on the device
        if not x.shape[0]:
            return x.new_zeros((index.shape[0], x.shape[1]), dtype=torch.float32 if row_weight is not None else x.dtype)
        rows = x.index_select(0, index.clamp(0, x.shape[0] - 1))
        rows = rows if row_weight is None else torch.mul(rows, row_weight[:, None])
        return torch.where(((index >= 0) & (index < x.shape[0]))[:, None], rows, 0)
    if source == SOURCE_SWIGLU:
        return silu_and_mul(x, x.shape[1] // 2)
    return swiglu_backward(x, gate_up)


@runtime.op("quantize_grouped_source", "training.quantize_grouped_with_transpose", ("x", "offs"))
def _source_op(x: torch.Tensor, offs: torch.Tensor, index: torch.Tensor | None, row_weight: torch.Tensor | None,
               gate_up: torch.Tensor | None, source: int, rows: int, k: int, fp8_dtype: torch.dtype | None, pow2: bool,
               backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return _quantize_source(x, offs, index, row_weight, gate_up, source, rows, k, fp8_dtype, pow2, backend or None)


@_source_op.register_fake
def _(x, offs, index, row_weight, gate_up, source, rows, k, fp8_dtype, pow2, backend):
    q, scale = _ops.quantize_activation(x.new_empty((rows, k)), fp8_dtype, pow2, backend)
    q_t = x.new_empty((k, grouped_blocks(rows, offs.shape[0]) * BLOCK), dtype=q.dtype)
    return q, scale, q_t, empty_scale_t(x.device, rows, k, offs.shape[0], fp8_dtype, backend or None)


_ops = getattr(torch.ops, runtime.LIBRARY)
