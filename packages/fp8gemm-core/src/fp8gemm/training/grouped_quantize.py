"""Quantizers for training mixtures of experts: rows sorted by expert in FP8 together with their per-expert transpose,
and every expert's weight with its transpose.

``quantize_grouped_with_transpose(x, offs)`` takes x [M, K] whose rows are sorted by expert (expert e holds rows
``[offs[e-1], offs[e])``, e = 0 starting at row 0; rows past ``offs[-1]`` belong to no expert) and gives

* ``q``, ``scale``: exactly ``fp8gemm.quantize_activation(x)``'s codes and 1x128 scales along K;
* ``q_t``, ``scale_t``: x^T in FP8 in the per-expert 128-aligned column layout. Expert e's tokens go, in order, to
  the columns starting at ``128 * block_base[e]`` with ``block_base[e] = e + start_e // 128`` (start_e = offs[e-1]);
  its j-th block of 128 tokens is column block ``block_base[e] + j``, scaled by that block's amax of each column of x
  (scale_t [K, blocks]). Blocks restart at each expert's first row, the last one may be partial (quantized over its
  real tokens, padded with zero codes) and no block spans two experts. Gap columns hold zero codes and the scale an
  all-zero block gets, ``fp8gemm.reference.SCALE_FLOOR`` (finite: 0 times it is 0).

Why this layout: the weight gradient dW_e = dY_e^T @ X_e contracts over expert e's own tokens, with 128-token scale
blocks that restart at its first row. With every expert starting on a 128-column boundary, each of its scale blocks
is one whole 128-column block of the transposed operands, so the k-grouped GEMM contracts whole K blocks per expert
exactly as the dense weight-gradient GEMM does, and no caller pads token counts to 128. ``block_base`` needs only
``offs`` on the device (no host synchronisation), and it keeps the layout within ``E + M // 128`` blocks whatever the
counts: an expert's ceil(n_e / 128) blocks end at most at ``e + 1 + end_e // 128``, where the next expert starts.
The shape is fixed by M, K and E alone: ``[K, 128 * (E + M // 128 + 1)]`` (one block more than the bound: the last
block is always a gap), so torch.compile and CUDA graphs see one shape per call site.

``quantize_experts_with_transpose(w)`` takes every expert's weight W [E, N, K] and gives ``quantize_weight``'s codes
and 128x128 scales per expert, and W^T [E, K, N] with the same blocks transposed (the grouped input gradient's
operand). The numerics are ``fp8gemm.reference``'s (docs/quantization.md); neither reads a value on the host on a GPU.
The first is one launch of the backend's ``quantize_grouped_transposed`` entry where the backend has it (the core's
fp8gemm/quantize_grouped_tiles.cuh, bit-identical to the reference here), else torch operations; the second is the
dense transposing kernel (``quantize_transposed``) on a few experts at a time where N is a multiple of 128 and the
backend has it, its W^T copied into the per-expert layout, else torch operations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import registry, runtime
from ..autograd import refuse_grad
from ..quantize import quantize_activation
from ..reference import BLOCK, reciprocal, reference_quantize, scale_from_amax
from ..validation import check_fp8_dtype, check_source
from .quantize import Transposed, scale_t_layout, transposed_kernel


def grouped_blocks(rows: int, experts: int) -> int:
    """Column blocks of the transposed operand of ``rows`` tokens over ``experts`` experts: E + M // 128 + 1."""
    return experts + rows // BLOCK + 1


class ExpertColumns(NamedTuple):
    """Where each expert's tokens sit, on the device: offs as the kernels read it (each end clamped to [previous
    end, M]: experts never overlap and nothing reaches past row M whatever values arrive)."""

    starts: torch.Tensor  # int64 [E]: first row
    ends: torch.Tensor  # int64 [E]: row end
    base: torch.Tensor  # int64 [E]: first column block, e + starts // 128 (strictly increasing)


def expert_columns(offs: torch.Tensor, rows: int) -> ExpertColumns:
    ends = torch.cummax(offs.to(torch.int64).clamp(0, rows), dim=0).values
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    base = torch.arange(offs.shape[0], device=offs.device) + starts // BLOCK
    return ExpertColumns(starts, ends, base)


def row_columns(columns: ExpertColumns, rows: int, dump: int) -> torch.Tensor:
    """int64 [M]: each row's column in the transposed operand; ``dump`` for a row past the last expert's end."""
    row = torch.arange(rows, device=columns.ends.device)
    expert = torch.searchsorted(columns.ends, row, right=True)  # the first expert whose end is past the row
    inside = expert < columns.ends.shape[0]
    expert = expert.clamp(max=columns.ends.shape[0] - 1)
    return torch.where(inside, BLOCK * columns.base[expert] + row - columns.starts[expert], dump)


def block_experts(columns: ExpertColumns, blocks: int) -> torch.Tensor:
    """int64 [blocks]: the expert whose tokens each column block holds, E for a gap block."""
    experts = columns.base.shape[0]
    block = torch.arange(blocks, device=columns.base.device)
    expert = torch.searchsorted(columns.base, block, right=True) - 1  # base[0] = 0: always a valid expert
    used = -(-(columns.ends - columns.starts) // BLOCK)  # ceil(n_e / 128) blocks
    return torch.where(block < columns.base[expert] + used[expert], expert, experts)


def check_offs_tensor(offs) -> None:
    """offs: an int32 tensor [E], E >= 1."""
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or offs.dtype != torch.int32 or not offs.shape[0]:
        got = f"{offs.dtype} {tuple(offs.shape)}" if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise TypeError(
            f"offs must be an int32 tensor [E] (E >= 1) of cumulative row ends per expert, got {got}; pass "
            f"torch.cumsum(rows_per_expert, 0).to(torch.int32)"
        )


def check_offs_values(offs: torch.Tensor, rows: int, rows_name: str) -> None:
    """CPU values (free to read): non-decreasing, in [0, rows]. A GPU's are never read on the host: they are clamped
    as :func:`expert_columns` says."""
    if offs.device.type != "cpu" or isinstance(offs, torch._subclasses.FakeTensor) or torch.compiler.is_compiling():
        return  # traced calls check when they run: the op's body checks again
    ends = offs.tolist()
    if ends[0] < 0:
        raise ValueError(f"offs[0] = {ends[0]} is negative; offs holds cumulative row ends, each in [0, {rows_name}]")
    for e in range(1, len(ends)):
        if ends[e] < ends[e - 1]:
            raise ValueError(
                f"offs must be non-decreasing (expert e holds rows [offs[e-1], offs[e])), got offs[{e}] = {ends[e]} < "
                f"offs[{e - 1}] = {ends[e - 1]}; pass torch.cumsum(rows_per_expert, 0)"
            )
    if ends[-1] > rows:
        raise ValueError(f"offs[-1] = {ends[-1]} is past {rows_name} = {rows}; rows past offs[-1] belong to no expert")


def check_grouped_source(x, offs) -> None:
    check_source("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K] (rows sorted by expert), got shape {tuple(x.shape)}")
    check_offs_tensor(offs)
    if offs.device != x.device:
        raise ValueError(f"offs is on {offs.device} but x is on {x.device}; move both to one device")


def quantize_grouped_with_transpose(
    x: torch.Tensor,
    offs: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    pow2_scales: bool = False,
    backend: str | None = None,
) -> Transposed:
    """x [M, K] (bf16/fp16/fp32, rows sorted by expert), offs int32 [E] -> ``Transposed(q, scale, q_t, scale_t)``:
    ``quantize_activation(x)``'s codes and scales (its layout), and x^T as FP8 [K, 128 * (E + M // 128 + 1)] with
    row-major fp32 [K, E + M // 128 + 1] in the per-expert 128-aligned layout (module docstring)."""
    check_grouped_source(x, offs)
    refuse_grad("training.quantize_grouped_with_transpose", ("x",), (x,))
    if torch.compiler.is_compiling():
        return Transposed(*_ops.quantize_grouped_transposed(x, offs, fp8_dtype, pow2_scales, backend or ""))
    return Transposed(*_quantize_grouped(x, offs, fp8_dtype, pow2_scales, backend))


def _quantize_grouped(x, offs, fp8_dtype, pow2: bool, backend: str | None):
    """The op's eager body: the backend's kernel where it takes the call, else the reference."""
    check_offs_values(offs, x.shape[0], "M (x.shape[0])")
    kernel = grouped_kernel(x.device, *x.shape, fp8_dtype, backend)
    if kernel is not None:
        return kernel_grouped(kernel, x, offs, pow2)
    return _reference_grouped(x, offs, fp8_dtype, pow2, backend)


def grouped_kernel(device: torch.device, rows: int, k: int, fp8_dtype, backend: str | None):
    """The backend for ``device`` if its ``quantize_grouped_transposed`` entry takes a call on x [rows, k] (its own
    FP8 dtype, at least one row, whole K blocks), else None."""
    chosen, dtype, _ = registry.backend_defaults(device, runtime.requested_backend(backend))
    if chosen is None or getattr(chosen, "quantize_grouped_transposed", None) is None:
        return None
    takes = fp8_dtype in (None, dtype) and rows > 0 and k % BLOCK == 0
    return chosen if takes else None


def empty_scale_t(device: torch.device, rows: int, k: int, experts: int, fp8_dtype, backend: str | None):
    """An uninitialised ``scale_t`` [K, E + M // 128 + 1] with the strides a call on x [rows, k] gives it: the
    kernel's layout where the backend's kernel takes the call, else the reference's row-major (for the fakes)."""
    kernel = grouped_kernel(device, rows, k, fp8_dtype, backend)
    layout = None if kernel is None else scale_t_layout(kernel)
    return runtime.empty_scale(k, grouped_blocks(rows, experts), layout, device)[0]


def kernel_grouped(
    kernel,
    x: torch.Tensor,
    offs: torch.Tensor,
    pow2: bool,
    shape=None,
    source: runtime.RowSourceArgs = runtime.PLAIN_ROWS,
):
    """One launch into outputs in the reference's layouts (q's scales in the backend's a_scale_layout): of x's rows, or
    of the [rows, k] rows ``source`` computes from x (training/grouped_sources.py)."""
    rows, k = x.shape if shape is None else shape
    blocks = grouped_blocks(rows, offs.shape[0])
    dtype = getattr(torch, kernel.fp8_dtype)
    q = x.new_empty((rows, k), dtype=dtype)
    scale, _ = runtime.empty_scale(rows, k // BLOCK, kernel.a_scale_layout, x.device)
    q_t = x.new_empty((k, blocks * BLOCK), dtype=dtype)
    scale_t, _ = runtime.empty_scale(k, blocks, scale_t_layout(kernel), x.device)  # read in place by kgrouped_wgrad
    runtime.call_quantize_grouped_transposed(kernel, runtime.kernel_rows(x), offs.contiguous(), q, scale, q_t,
                                             scale_t, pow2, source)  # fmt: skip
    return q, scale, q_t, scale_t


def _reference_grouped(x, offs, fp8_dtype, pow2: bool, backend: str | None):
    """The reference in torch operations (offs clamped as :func:`expert_columns` says, never checked here)."""
    q, scale = quantize_activation(x, fp8_dtype=fp8_dtype, pow2_scales=pow2, backend=backend)
    rows, k = x.shape
    blocks = grouped_blocks(rows, offs.shape[0])
    column = row_columns(expert_columns(offs, rows), rows, dump=blocks * BLOCK)
    # each expert's rows at its aligned columns, zero rows elsewhere: zeros leave every block's amax as its tokens
    # make it and quantize to zero codes; the extra last row takes the rows of no expert and is dropped
    spread = x.new_zeros((blocks * BLOCK + 1, k)).index_copy_(0, column, x)
    q_t, scale_t = reference_quantize(spread[:-1].t(), q.dtype, pow2)
    return q, scale, q_t, scale_t


@runtime.op("quantize_grouped_transposed", "training.quantize_grouped_with_transpose", ("x", "offs"))
def _grouped_op(x: torch.Tensor, offs: torch.Tensor, fp8_dtype: torch.dtype | None, pow2: bool,
                backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return _quantize_grouped(x, offs, fp8_dtype, pow2, backend or None)


@_grouped_op.register_fake
def _(x, offs, fp8_dtype, pow2, backend):
    q, scale = _ops.quantize_activation(x, fp8_dtype, pow2, backend)
    (rows, k), experts = x.shape, offs.shape[0]
    q_t = x.new_empty((k, grouped_blocks(rows, experts) * BLOCK), dtype=q.dtype)
    return q, scale, q_t, empty_scale_t(x.device, rows, k, experts, fp8_dtype, backend or None)


# --- every expert's weight with its transpose --------------------------------------------------------------------


def experts_fp8_dtype(device: torch.device, fp8_dtype: torch.dtype | None, backend: str | None) -> torch.dtype:
    """``fp8_dtype``, else the FP8 dtype of the backend that runs on ``device``."""
    return fp8_dtype or registry.backend_defaults(device, runtime.requested_backend(backend))[1]


def quantize_experts_with_transpose(
    w: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    pow2_scales: bool = False,
    transpose: bool = True,
    backend: str | None = None,
) -> Transposed:
    """W [E, N, K] float -> ``Transposed``: ``q`` FP8 [E, N, K] and ``scale`` fp32 [E, ceil(N/128), K/128], exactly
    ``quantize_weight(w[e])``'s for every expert, and W^T ``q_t`` FP8 [E, K, N] with ``scale_t`` [E, K/128,
    ceil(N/128)], the same blocks transposed (empty [0] tensors with ``transpose=False``). fp8_dtype defaults to
    the dtype of the backend for w's device (``backend``: a name, as for ``gemm``)."""
    check_source("w", w)
    refuse_grad("training.quantize_experts_with_transpose", ("w",), (w,))
    if w.dim() != 3:
        raise ValueError(f"w must be 3-D [E, N, K] (one weight per expert), got shape {tuple(w.shape)}")
    if torch.compiler.is_compiling():
        return Transposed(*_ops.quantize_experts_transposed(w, fp8_dtype, pow2_scales, transpose, backend or ""))
    return Transposed(*_quantize_experts(w, fp8_dtype, pow2_scales, transpose, backend))


EXPERTS_CHUNK_BYTES = 1 << 30  # the float32 temporaries of the weight quantizer at once (a few experts at a time)


def _quantize_experts(w, fp8_dtype, pow2: bool, transpose: bool, backend: str | None):
    """``quantize_weight`` for every expert: the backend's transposing kernel where it takes the call, else
    :func:`_reference_experts`."""
    dtype = experts_fp8_dtype(w.device, fp8_dtype, backend)
    experts, n, k = w.shape
    if n % BLOCK == 0 and w.numel() and transposed_kernel(w.device, dtype, backend) is not None:
        return _kernel_experts(w, dtype, pow2, transpose, backend)
    return _reference_experts(w, dtype, pow2, transpose)


def _kernel_experts(w, dtype, pow2: bool, transpose: bool, backend: str | None):
    """Every expert's weight through the dense transposing kernel, a few experts at a time as one [e N, K] matrix: N a
    multiple of 128, so no 128 x 128 block spans two experts and the codes and scales are each expert's own. The
    kernel writes q into place and the transpose of each expert's N rows as its own [K, N] matrix (``q_t_group``
    N), W^T [E, K, N] as it is kept; only the small scales are copied."""
    experts, n, k = w.shape
    nb, kb = n // BLOCK, k // BLOCK
    kernel = transposed_kernel(w.device, dtype, backend)
    layout = kernel.b_scale_layout
    step = max(1, EXPERTS_CHUNK_BYTES // (n * k))
    q = w.new_empty((experts, n, k), dtype=dtype)
    scale = w.new_empty((experts, nb, kb), dtype=torch.float32)
    q_t = w.new_empty((experts, k, n) if transpose else (0,), dtype=dtype)
    scale_t = w.new_empty((experts, kb, nb) if transpose else (0,), dtype=torch.float32)
    scratch = None if transpose else w.new_empty((min(step, experts), k, n), dtype=dtype)  # the kernel writes W^T
    for first in range(0, experts, step):
        part = slice(first, min(first + step, experts))
        count = part.stop - first
        rows = runtime.kernel_rows(w[part].reshape(count * n, k))
        part_scale, _ = runtime.empty_scale(count * nb, kb, layout, w.device)
        part_scale_t, _ = runtime.empty_scale(kb, count * nb, layout, w.device)
        part_q_t = q_t[part] if transpose else scratch[:count]
        runtime.call_quantize_transposed(kernel, rows, q[part].view(count * n, k), part_scale, part_q_t,
                                         part_scale_t, pow2, True, q_t_group=n)  # fmt: skip
        scale[part] = part_scale.reshape(count, nb, kb)
        if transpose:
            scale_t[part] = part_scale_t.reshape(kb, count, nb).transpose(0, 1)
    return q, scale, q_t, scale_t


def _reference_experts(w, dtype, pow2: bool, transpose: bool):
    """``quantize_weight`` vectorized over experts (the same elementwise operations and block maxima), a few experts
    at a time: DeepSeek-V3's 256 w13 would otherwise take 28 GiB of float32 temporaries per step."""
    fp8_max = check_fp8_dtype(dtype)
    experts, n, k = w.shape
    n_pad = -(-n // BLOCK) * BLOCK
    q = w.new_empty((experts, n, k), dtype=dtype)
    scale = w.new_empty((experts, n_pad // BLOCK, k // BLOCK), dtype=torch.float32)
    q_t = w.new_empty((experts, k, n) if transpose else (0,), dtype=dtype)
    scale_t = w.new_empty((experts, k // BLOCK, n_pad // BLOCK) if transpose else (0,), dtype=torch.float32)
    step = max(1, EXPERTS_CHUNK_BYTES // max(1, n_pad * k * 4))
    for first in range(0, experts, step):
        part = slice(first, min(first + step, experts))
        chunk = w[part]
        blocks = F.pad(chunk.float(), (0, 0, 0, n_pad - n)).reshape(-1, n_pad // BLOCK, BLOCK, k // BLOCK, BLOCK)
        scale[part] = scale_from_amax(blocks.abs().amax(dim=(2, 4)), fp8_max, pow2)
        codes = (blocks * reciprocal(scale[part])[:, :, None, :, None]).clamp(-fp8_max, fp8_max).to(dtype)
        q[part] = codes.reshape(-1, n_pad, k)[:, :n]
        if transpose:
            q_t[part] = q[part].transpose(1, 2)
            scale_t[part] = scale[part].transpose(1, 2)
    return q, scale, q_t, scale_t


@runtime.op("quantize_experts_transposed", "training.quantize_experts_with_transpose", ("w",))
def _experts_op(w: torch.Tensor, fp8_dtype: torch.dtype | None, pow2: bool, transpose: bool,
                backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return _quantize_experts(w, fp8_dtype, pow2, transpose, backend or None)


@_experts_op.register_fake
def _(w, fp8_dtype, pow2, transpose, backend):
    dtype = experts_fp8_dtype(w.device, fp8_dtype, backend or None)
    experts, n, k = w.shape
    nb, kb = -(-n // BLOCK), k // BLOCK
    q = w.new_empty((experts, n, k), dtype=dtype)
    scale = w.new_empty((experts, nb, kb), dtype=torch.float32)
    if not transpose:
        return q, scale, w.new_empty(0, dtype=dtype), w.new_empty(0, dtype=torch.float32)
    return q, scale, w.new_empty((experts, k, n), dtype=dtype), w.new_empty((experts, kb, nb), dtype=torch.float32)


_ops = getattr(torch.ops, runtime.LIBRARY)
