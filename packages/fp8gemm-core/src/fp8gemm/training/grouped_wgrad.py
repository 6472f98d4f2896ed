"""``kgrouped_wgrad``: the weight gradient of every expert, dW_e = dY_e^T @ X_e, from the per-expert 128-aligned
transposed operands ``quantize_grouped_with_transpose`` gives (training/grouped_quantize.py).

``out[e, n, k] = sum over expert e's column blocks b of sum_{c in b} a_t[n, c] b_t[k, c] a_scale_t[n, b]
b_scale_t[k, b]``: the contraction runs over expert e's own tokens only, in whole 128-column blocks (a partial last
block is padded with zero codes, which add exactly zero), fp32 accumulation with both scales applied once per block,
as the dense weight-gradient GEMM (docs/training.md). An expert with no token gets zeros (``accumulate=True``: its
slice of ``out`` is left untouched). The column blocks of each expert come from ``offs`` on the device, so no value is
read on the host on a GPU.

:func:`run_kgrouped_wgrad` launches the backend's ``kgrouped_wgrad_launch`` entry where it has one (one launch for
every expert, fp8gemm/backend.hpp KGroupedWgradArgs), else the pure-torch reference below.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import registry, runtime
from ..autograd import refuse_grad
from ..grouped_checks import check_dims, check_rows, check_scale_shape
from ..protocol import KGROUPED_WGRAD_ARGS
from ..reference import BLOCK
from ..validation import check_fp8, check_same_device, conform_scale
from .grouped_quantize import block_experts, check_offs_tensor, check_offs_values, expert_columns

NAMES = ("a_t", "b_t", "a_scale_t", "b_scale_t", "offs", "out")
OUT_DTYPES = (torch.float32, torch.bfloat16)
CHUNK_BYTES = 64 << 20  # the fp32 per-block products the reference holds at once


class KGroupedShape(NamedTuple):
    experts: int  # E
    n: int  # a_t's rows: out's second dim
    k: int  # b_t's rows: out's last dim
    blocks: int  # column blocks of 128


def rows_bound(blocks: int, experts: int) -> int:
    """The most tokens a layout of ``blocks`` column blocks over ``experts`` experts holds: the largest M with
    E + M // 128 + 1 == blocks."""
    return BLOCK * (blocks - experts) - 1


def _check_operands(a_t, b_t, a_scale_t, b_scale_t, offs) -> KGroupedShape:
    for name, t in (("a_t", a_t), ("b_t", b_t)):
        what = "[N, cols] (dY^T)" if name == "a_t" else "[K, cols] (X^T)"
        check_dims(name, t, 2, f"FP8 {what}, from fp8gemm.training.quantize_grouped_with_transpose")
        check_fp8(name, t, "quantize it with fp8gemm.training.quantize_grouped_with_transpose")
        check_rows(name, t)
    if a_t.dtype != b_t.dtype:
        raise TypeError(f"a_t is {a_t.dtype} but b_t is {b_t.dtype}; quantize both to the same FP8 dtype")
    (n, cols), k = a_t.shape, b_t.shape[0]
    if b_t.shape[1] != cols or cols == 0 or cols % BLOCK:
        raise ValueError(
            f"a_t {tuple(a_t.shape)} and b_t {tuple(b_t.shape)} must have the same column count, a positive multiple "
            f"of {BLOCK} (the per-expert aligned layout of quantize_grouped_with_transpose)"
        )
    for name, size in (("a_t.shape[0] (N", n), ("b_t.shape[0] (K", k)):
        if size == 0 or size % 16:
            raise ValueError(f"{name} = {size}) must be a positive multiple of 16 (a row of out is a multiple of 16)")
    blocks = cols // BLOCK
    check_scale_shape("a_scale_t", a_scale_t, (n, blocks), "[N, cols/128] (one scale per 128 tokens of a_t's rows)")
    check_scale_shape("b_scale_t", b_scale_t, (k, blocks), "[K, cols/128] (one scale per 128 tokens of b_t's rows)")
    check_offs_tensor(offs)
    experts = offs.shape[0]
    if blocks < experts + 1:
        raise ValueError(
            f"a_t has {blocks} column blocks, fewer than E + 1 = {experts + 1} for E = {experts} experts (offs); the "
            f"layout of M tokens has E + M // 128 + 1 blocks: pass quantize_grouped_with_transpose's q_t"
        )
    check_same_device("a_t", a_t, b_t=b_t, a_scale_t=a_scale_t, b_scale_t=b_scale_t, offs=offs)
    rows_name = f"the most tokens {blocks} column blocks hold for E = {experts} (128 * (blocks - E) - 1)"
    check_offs_values(offs, rows_bound(blocks, experts), rows_name)
    return KGroupedShape(experts, n, k, blocks)


def _check_out(out, out_dtype, accumulate: bool, shape: KGroupedShape, device) -> torch.dtype:
    if out_dtype is not None and out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True adds into out=, a float32 [E, N, K] tensor; pass out=")
        return out_dtype or torch.float32
    want = (shape.experts, shape.n, shape.k)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype not in OUT_DTYPES:
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"out must be a float32 or bfloat16 tensor [E, N, K] = {list(want)}, got {got}")
    if out_dtype is not None and out_dtype != out.dtype:
        raise ValueError(f"out_dtype={out_dtype} disagrees with out's dtype {out.dtype}; pass one of them")
    if accumulate and out.dtype != torch.float32:
        raise TypeError(
            f"accumulate=True adds into out, which must be float32 (a main gradient), got {out.dtype}; bf16 output "
            f"is written, never added into"
        )
    if out.device != device:
        raise ValueError(f"out is on {out.device} but a_t is on {device}; move all inputs to one device")
    return out.dtype


def check_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, out, out_dtype, accumulate: bool):
    """Every argument on metadata (and CPU offs values): ``(shape, out dtype)``."""
    shape = _check_operands(a_t, b_t, a_scale_t, b_scale_t, offs)
    return shape, _check_out(out, out_dtype, bool(accumulate), shape, a_t.device)


# --- the reference and the seam ------------------------------------------------------------------------------------


def reference_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs) -> torch.Tensor:
    """fp32 [E, N, K]: each column block's product of codes in fp32 times its two scales, summed into the expert
    that owns the block (gap blocks go to a row that is dropped). On a GPU the adds into one expert may come in any
    order (``index_add_``); a kernel fixes it."""
    experts = offs.shape[0]
    (n, cols), k = a_t.shape, b_t.shape[0]
    blocks = cols // BLOCK
    owner = block_experts(expert_columns(offs, rows_bound(blocks, experts)), blocks)
    result = torch.zeros((experts + 1, n, k), dtype=torch.float32, device=a_t.device)
    step = max(1, CHUNK_BYTES // (n * k * 4))
    for first in range(0, blocks, step):
        last = min(first + step, blocks)
        columns = slice(first * BLOCK, last * BLOCK)
        a = a_t[:, columns].float().view(n, last - first, BLOCK).transpose(0, 1)  # [blocks, N, 128]
        b = b_t[:, columns].float().view(k, last - first, BLOCK).permute(1, 2, 0)  # [blocks, 128, K]
        scales = a_scale_t[:, first:last].t()[:, :, None] * b_scale_t[:, first:last].t()[:, None, :]
        result.index_add_(0, owner[first:last], torch.bmm(a, b) * scales)
    return result[:experts]


def _kernel_takes(backend, a_t, b_t, offs, out) -> bool:
    """Whether ``backend``'s k-grouped entry takes the call: its FP8 dtype, at most its experts, rows it can read in
    place and an out whose rows are contiguous and 16-byte aligned."""
    if getattr(backend, "kgrouped_wgrad_launch", None) is None or offs.shape[0] > backend.kgrouped_max_experts:
        return False
    if a_t.dtype != getattr(torch, backend.fp8_dtype) or offs.device != a_t.device:
        return False
    aligned = all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 for t in (a_t, b_t, out))
    return aligned and a_t.stride(0) % 16 == 0 and b_t.stride(0) % 16 == 0 and out.stride(1) % 8 == 0


def _launch(backend, a_t, b_t, a_scale_t, b_scale_t, offs, out: torch.Tensor, accumulate: bool) -> None:
    """One launch of the backend's k-grouped entry on its device's current stream (scales conformed to its layouts:
    no copy for those of quantize_grouped_with_transpose)."""
    a_scale, a_ld = conform_scale(a_scale_t, backend.a_scale_layout)
    b_scale, b_ld = conform_scale(b_scale_t, backend.wgrad_b_scale_layout)
    offs = offs.contiguous()  # int32, checked by the caller
    dev = runtime.device_index(a_t)
    (n, cols), k = a_t.shape, b_t.shape[0]
    address = KGROUPED_WGRAD_ARGS.pack(a_t.data_ptr(), b_t.data_ptr(), a_scale.data_ptr(), b_scale.data_ptr(),
                                       out.data_ptr(), offs.data_ptr(), n, k, cols, offs.shape[0], a_t.stride(0),
                                       b_t.stride(0), out.stride(1), out.stride(0), a_ld, b_ld, int(accumulate),
                                       runtime.out_kind(out.dtype), runtime.raw_stream(dev))  # fmt: skip
    if runtime.switch_needed(dev):
        runtime.call_on_device(backend.kgrouped_wgrad_launch, address, dev)
    else:
        backend.kgrouped_wgrad_launch(address)


def run_kgrouped_wgrad(backend, a_t, b_t, a_scale_t, b_scale_t, offs, out: torch.Tensor, accumulate: bool) -> None:
    """``out`` <- (or +=) every expert's product, on checked operands: the k-grouped kernel of ``backend`` (the one
    for a_t's device) where it takes the call, else the reference."""
    if _kernel_takes(backend, a_t, b_t, offs, out):
        _launch(backend, a_t, b_t, a_scale_t, b_scale_t, offs, out, accumulate)
        return
    product = reference_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs)
    if not accumulate:
        out.copy_(product)
        return
    columns = expert_columns(offs, rows_bound(a_t.shape[1] // BLOCK, offs.shape[0]))
    has_tokens = (columns.ends > columns.starts)[:, None, None]
    out.copy_(torch.where(has_tokens, out + product, out))  # an expert without tokens keeps its bits (even -0.0)


# --- the public call and its torch.library ops -------------------------------------------------------------------


def _run(a_t, b_t, a_scale_t, b_scale_t, offs, out, out_dtype, accumulate: bool, backend: str | None):
    shape, dtype = check_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, out, out_dtype, accumulate)
    chosen = registry.select(a_t.device, runtime.requested_backend(backend)).backend
    if out is None:
        out = torch.empty((shape.experts, shape.n, shape.k), dtype=dtype, device=a_t.device)
    run_kgrouped_wgrad(chosen, a_t, b_t, a_scale_t, b_scale_t, offs, out, accumulate)
    return out


@runtime.op("kgrouped_wgrad", "training.kgrouped_wgrad", NAMES)
def _kgrouped_op(a_t: torch.Tensor, b_t: torch.Tensor, a_scale_t: torch.Tensor, b_scale_t: torch.Tensor,
                 offs: torch.Tensor, out_dtype: torch.dtype, backend: str) -> torch.Tensor:  # fmt: skip
    return _run(a_t, b_t, a_scale_t, b_scale_t, offs, None, out_dtype, False, backend or None)


@_kgrouped_op.register_fake
def _(a_t, b_t, a_scale_t, b_scale_t, offs, out_dtype, backend):
    shape, dtype = check_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, None, out_dtype, False)
    return a_t.new_empty((shape.experts, shape.n, shape.k), dtype=dtype)


@runtime.op("kgrouped_wgrad_out", "training.kgrouped_wgrad", NAMES, mutates_args=("out",))
def _kgrouped_out_op(a_t: torch.Tensor, b_t: torch.Tensor, a_scale_t: torch.Tensor, b_scale_t: torch.Tensor,
                     offs: torch.Tensor, out: torch.Tensor, accumulate: bool, backend: str) -> None:  # fmt: skip
    _run(a_t, b_t, a_scale_t, b_scale_t, offs, out, None, accumulate, backend or None)


@_kgrouped_out_op.register_fake
def _(a_t, b_t, a_scale_t, b_scale_t, offs, out, accumulate, backend):
    check_kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, out, None, accumulate)


_ops = getattr(torch.ops, runtime.LIBRARY)


def kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, *, out=None, accumulate: bool = False,
                   out_dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:  # fmt: skip
    """Every expert's weight gradient ``dW_e = dY_e^T @ X_e`` in one call: ``out [E, N, K]``.

    a_t: FP8 dY^T [N, cols] and b_t: FP8 X^T [K, cols] (same FP8 dtype), with fp32 scales a_scale_t [N, cols/128] and
    b_scale_t [K, cols/128]: the ``q_t``, ``scale_t`` of ``fp8gemm.training.quantize_grouped_with_transpose`` for the
    same ``offs`` (int32 [E], cumulative row ends of the sorted rows). N and K multiples of 16.

    out_dtype: torch.float32 (default) or torch.bfloat16 (the fp32 sum rounded once); ``out=``: written in place, its
    dtype the output's (out_dtype, if given, must agree). ``accumulate=True`` adds the product into a float32 ``out``
    (main gradients kept across micro-batches); experts with no token leave their slice untouched, and get zeros
    without it. CPU ``offs`` values are checked; a GPU's are never read on the host (clamped to the layout).
    """
    refuse_grad("training.kgrouped_wgrad", NAMES, (a_t, b_t, a_scale_t, b_scale_t, offs, out))
    if torch.compiler.is_compiling():  # the ops' fake implementations check the arguments
        if out is not None:
            _ops.kgrouped_wgrad_out(a_t, b_t, a_scale_t, b_scale_t, offs, out, bool(accumulate), backend or "")
            return out
        if accumulate:  # the functional op has no out to add into; its fake checks the rest
            raise ValueError("accumulate=True adds into out=, a float32 [E, N, K] tensor; pass out=")
        return _ops.kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, out_dtype or torch.float32, backend or "")
    return _run(a_t, b_t, a_scale_t, b_scale_t, offs, out, out_dtype, bool(accumulate), backend)
