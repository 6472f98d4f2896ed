"""Quantizers for training: each operand in FP8 together with its transpose, as the backward GEMMs read them.

``quantize_with_transpose`` gives an activation (or output gradient) x [M, K] with 1x128 scales along K, exactly
``fp8gemm.quantize_activation``'s, and x^T [K, M_pad] with 1x128 scales along M (the operand of the weight-gradient
GEMM, which contracts over tokens). ``quantize_weight_with_transpose`` gives ``quantize_weight``'s W and W^T, whose
128x128 blocks are W's transposed. The numerics are ``fp8gemm.reference``'s (docs/quantization.md). On a GPU whose
backend has the ``quantize_transposed`` entry each is one launch reading the source once, bit-identical to the
reference, and the scales come in the layouts the GEMMs read (no conversion per call).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import registry, runtime
from ..autograd import refuse_grad
from ..native import reraise_unless_miss
from ..protocol import MN_MAJOR, ScaleLayout
from ..quantize import quantize_activation, quantize_weight
from ..reference import BLOCK, reference_quantize
from ..validation import check_fp8_dtype, check_source


class Transposed(NamedTuple):
    """An operand in FP8 and its transpose, each with its scales."""

    q: torch.Tensor  # FP8 [M, K]
    scale: torch.Tensor  # fp32, [M, K/128] (activations) or [ceil(M/128), K/128] (weights)
    q_t: torch.Tensor  # FP8 [K, M_pad] (activations) or [K, M] (weights)
    scale_t: torch.Tensor  # fp32, [K, M_pad/128] (activations) or [K/128, ceil(M/128)] (weights)


def padded_rows(m: int) -> int:
    """M rounded up to a whole 128-row block: the transposed operand's row length."""
    return -(-m // BLOCK) * BLOCK


def quantize_with_transpose(
    x: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False, backend: str | None = None
) -> Transposed:
    """x [..., K] (bf16/fp16/fp32; leading dims flattened into M) -> ``Transposed``:

    * ``q``, ``scale``: FP8 [M, K] with fp32 [M, K/128], exactly ``fp8gemm.quantize_activation(x)``'s codes and
      scales, in the layout it returns (the backend's);
    * ``q_t``, ``scale_t``: x^T as FP8 [K, M_pad] with fp32 [K, M_pad/128], one scale per 128 tokens of each column
      of x; M_pad is M rounded up to 128 and its pad columns hold zero codes (a partial last block is quantized over
      its real tokens). The scales are MN-major on a backend whose GEMMs read them so (row-major on the reference).
    """
    check_source("x", x)
    refuse_grad("training.quantize_with_transpose", ("x",), (x,))
    if torch.compiler.is_compiling():
        return Transposed(*_ops.quantize_transposed(x, fp8_dtype, pow2_scales, False, backend or ""))
    return Transposed(*eager_quantize_transposed(x, fp8_dtype, pow2_scales, False, backend))


def quantize_weight_with_transpose(
    w: torch.Tensor, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
) -> Transposed:
    """W [N, K] float -> ``Transposed``: ``q``, ``scale`` exactly ``fp8gemm.quantize_weight(w)``'s (FP8 [N, K], fp32
    [ceil(N/128), K/128]), and W^T as FP8 [K, N] with fp32 [K/128, ceil(N/128)]: the same 128x128 blocks transposed
    (codes and scale matrix), which is the quantization of W^T itself where N is a multiple of 128."""
    check_source("w", w)
    refuse_grad("training.quantize_weight_with_transpose", ("w",), (w,))
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if torch.compiler.is_compiling():
        return Transposed(*_ops.quantize_transposed(w, fp8_dtype, pow2_scales, True, ""))
    return Transposed(*eager_quantize_transposed(w, fp8_dtype, pow2_scales, True, None))


def scale_t_layout(backend) -> ScaleLayout:
    """The layout of a transposed activation's scales: MN-major with a leading dimension both of its consumers read
    in place (the weight-gradient GEMM's A and B scales)."""
    b_layout = backend.wgrad_b_scale_layout
    if backend.a_scale_layout.order != MN_MAJOR or b_layout is None or b_layout.order != MN_MAJOR:
        return backend.a_scale_layout
    return ScaleLayout(MN_MAJOR, math.lcm(backend.a_scale_layout.ld_multiple, b_layout.ld_multiple))


class _Plan(NamedTuple):
    """What one (device, backend, FP8 dtype, form) decides, looked up once: the FP8 dtype, the two scale layouts (None:
    row-major) and the backend whose transposing kernel runs (None: the reference)."""

    fp8_dtype: torch.dtype
    layouts: tuple
    kernel: object


_plans: dict[tuple, _Plan] = {}
registry.on_refresh(_plans.clear)


def _plan(device: torch.device, fp8_dtype: torch.dtype | None, blocks: bool, backend: str | None) -> _Plan:
    key = (device, fp8_dtype, blocks, runtime.requested_backend(backend))
    found = _plans.get(key)
    if found is None:
        chosen, default_dtype, _ = registry.backend_defaults(device, key[3])
        dtype = fp8_dtype or default_dtype
        check_fp8_dtype(dtype)
        if chosen is None:
            layouts = (None, None)
        elif blocks:
            layouts = (chosen.b_scale_layout, chosen.b_scale_layout)
        else:
            layouts = (chosen.a_scale_layout, scale_t_layout(chosen))
        takes = chosen is not None and chosen.quantize_transposed is not None
        found = _plans[key] = _Plan(
            dtype, layouts, chosen if takes and dtype is getattr(torch, chosen.fp8_dtype) else None
        )
    return found


def transposed_kernel(device: torch.device, fp8_dtype: torch.dtype | None, backend: str | None):
    """The backend whose weight-form transposing kernel runs on ``device`` for ``fp8_dtype``, or None (the reference)."""
    return _plan(device, fp8_dtype, True, backend).kernel


def _outputs(x: torch.Tensor, fp8_dtype: torch.dtype | None, blocks: bool, backend: str | None, plan=None):
    """Empty outputs of one call on ``x`` (q, scale, q_t, scale_t, in the layouts of the backend for x's device) and
    that backend when its transposing kernel takes the call (else None)."""
    plan = plan or _plan(x.device, fp8_dtype, blocks, backend)
    k = x.shape[-1]
    m = x.numel() // k
    m_t = m if blocks else padded_rows(m)
    rows = -(-m_t // BLOCK)
    scale, _ = runtime.empty_scale(rows if blocks else m, k // BLOCK, plan.layouts[0], x.device)
    scale_t, _ = runtime.empty_scale(k // BLOCK if blocks else k, rows, plan.layouts[1], x.device)
    q = x.new_empty((m, k), dtype=plan.fp8_dtype)
    q_t = x.new_empty((k, m_t), dtype=plan.fp8_dtype)
    usable = plan.kernel is not None and m and m_t % 16 == 0
    return (q, scale, q_t, scale_t), plan.kernel if usable else None


def eager_quantize_transposed(x, fp8_dtype, pow2: bool, blocks: bool, backend: str | None):
    """Both quantizations of x (the op's eager body): the backend's one launch where it takes the call, else the
    reference written into the same layouts; the backend's native op (checks, outputs and launch in C++) where it
    takes the call."""
    plan = _plan(x.device, fp8_dtype, blocks, backend)
    if plan.kernel is not None:
        native = runtime.native_ops(x, x, backend)
        if native is not None:
            try:
                return native.quantize_transposed(x, pow2, blocks)
            except RuntimeError as error:
                reraise_unless_miss(error)
    out, kernel = _outputs(x, fp8_dtype, blocks, backend, plan)
    q, scale, q_t, scale_t = out
    x2d = x.reshape(-1, x.shape[-1])
    if kernel is not None:
        runtime.call_quantize_transposed(kernel, runtime.kernel_rows(x2d), q, scale, q_t, scale_t, pow2, blocks)
        return out
    if blocks:
        ref_q, ref_scale = quantize_weight(x2d, fp8_dtype=q.dtype, pow2_scales=pow2)
        ref_q_t, ref_scale_t = ref_q.t(), ref_scale.t()
    else:
        ref_q, ref_scale = quantize_activation(x2d, fp8_dtype=q.dtype, pow2_scales=pow2, backend=backend)
        # zero rows quantize to zero codes and leave each block's amax (so its scale) as the real tokens make it
        x_t = torch.nn.functional.pad(x2d.float(), (0, 0, 0, q_t.shape[1] - x2d.shape[0])).t()
        ref_q_t, ref_scale_t = reference_quantize(x_t, q.dtype, pow2)
    for dst, src in zip(out, (ref_q, ref_scale, ref_q_t, ref_scale_t), strict=True):
        dst.copy_(src)
    return out


@runtime.op("quantize_transposed", "training.quantize_with_transpose", ("x",))
def _transposed_op(x: torch.Tensor, fp8_dtype: torch.dtype | None, pow2: bool, blocks: bool,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return eager_quantize_transposed(x, fp8_dtype, pow2, blocks, backend or None)


@_transposed_op.register_fake
def _(x, fp8_dtype, pow2, blocks, backend):
    return _outputs(x, fp8_dtype, blocks, backend or None)[0]


_ops = getattr(torch.ops, runtime.LIBRARY)
