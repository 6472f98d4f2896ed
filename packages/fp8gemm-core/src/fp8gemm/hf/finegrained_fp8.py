"""transformers' fine-grained FP8 kernel interface (the Hub kernel ``kernels-community/finegrained-fp8``) on fp8gemm.

transformers 5.x takes three functions from that kernel (``transformers/integrations/finegrained_fp8.py``,
``_load_finegrained_fp8_kernel``, read in 5.22.2 and 5.24.0) and calls them as::

    matmul_2d(input, weight, weight_scale_inv, block_size, input.dtype, activation_scale=activation_scale)
    matmul_batched(x, weight, weight_scale_inv, block_size=..., expert_ids=...)
    matmul_grouped(x, weight, weight_scale_inv, offsets=..., tokens_per_expert=..., block_size=...)

``matmul_2d`` serves ``FP8Linear`` and the eager loop of ``FP8Experts``; ``matmul_batched`` and ``matmul_grouped``
serve the ``batched_mm`` and ``grouped_mm`` expert forwards (and ``FP8GroupedLinear``). Each is a composition of
fp8gemm's torch.library ops (``linear``, ``quantize_activation``, ``gemm``, ``grouped_gemm``) and plain torch ops,
with no host synchronisation: torch.compile traces them and CUDA graphs capture them. What they accept and what
they refuse: docs/transformers.md.
"""

from __future__ import annotations

import torch

from .. import grouped, runtime  # noqa: F401  (grouped registers the op read below)
from ..linear import linear
from ..nn.from_transformers import FP8_WEIGHTS, SUPPORTED_BLOCK, UE8M0
from ..ops import gemm
from ..quantize import quantize_activation
from ..reference import BLOCK
from .operands import backend_scale, keep, kept_operands

# The op itself, not fp8gemm.grouped_gemm: that eager wrapper copies offs to the host to check it, a synchronisation
# on a GPU. The op reads no value on the host (kernels clamp group bounds to the rows that exist).
_grouped_gemm_op = getattr(torch.ops, runtime.LIBRARY).grouped_gemm


def _refuse(message: str) -> NotImplementedError:
    return NotImplementedError(f"{message}; fp8gemm runs FP8 (e4m3) weights with one scale per 128x128 block")


def check_weight(weight, weight_scale_inv, block_size, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, fp32 scale)`` detached (transformers' FP8 weights are frozen), or the error transformers' callers
    treat as "this kernel declines": NotImplementedError for a format fp8gemm does not run, ValueError for shapes."""
    what = "[N, K]" if dims == 2 else "[E, N, K]"
    if not isinstance(weight, torch.Tensor) or not isinstance(weight_scale_inv, torch.Tensor):
        raise TypeError(f"weight and weight_scale_inv must be tensors, got {type(weight).__name__} and "
                        f"{type(weight_scale_inv).__name__}")  # fmt: skip
    if weight.dtype not in FP8_WEIGHTS:
        packed = " (FP4 weights come packed in int8)" if weight.dtype == torch.int8 else ""
        raise _refuse(f"weight is {weight.dtype}{packed}")
    if weight.dim() != dims:
        raise ValueError(f"weight must be {what}, got shape {tuple(weight.shape)}")
    block = tuple(block_size) if isinstance(block_size, (list, tuple)) else block_size
    if block != SUPPORTED_BLOCK:
        kind = "per-tensor scales" if block is None or block == tuple(weight.shape[-2:]) else "another block size"
        raise _refuse(f"block_size = {block_size} ({kind})")
    scale = weight_scale_inv.detach()
    if scale.dtype != torch.float32:
        if UE8M0 is None or scale.dtype != UE8M0:
            raise _refuse(f"weight_scale_inv is {scale.dtype} (fp8gemm reads float32 or float8_e8m0fnu scales)")
        scale = scale.float()  # powers of two: exact, and [.., N/128, K/128] is small
    n, k = weight.shape[-2:]
    expected = (*weight.shape[:-2], -(-n // BLOCK), -(-k // BLOCK))
    if tuple(scale.shape) != expected:
        raise ValueError(
            f"weight_scale_inv must hold one scale per 128x128 block of weight {what} = {tuple(weight.shape)}, "
            f"i.e. {list(expected)}; got {list(scale.shape)}"
        )
    _check_device_dtype(weight)
    return weight.detach(), scale


def checked_operands(weight, weight_scale_inv, block_size, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, scale)`` as fp8gemm reads them: :func:`check_weight`'s, the scale in the backend's layout, on a
    weight's first call; kept for the next calls until the weight or its scale changes (operands.py). A compiled
    graph checks them once, when traced."""
    if torch.compiler.is_compiling():
        return check_weight(weight, weight_scale_inv, block_size, dims)
    found = kept_operands(weight, weight_scale_inv, (dims, block_size))
    if found is not None:
        return found
    checked, scale = check_weight(weight, weight_scale_inv, block_size, dims)
    operands = checked, backend_scale(scale)
    keep(weight, weight_scale_inv, (dims, block_size), operands)
    return operands


def _check_device_dtype(weight: torch.Tensor) -> None:
    """An e4m3fn checkpoint on a backend that takes e4m3fnuz (gfx942) needs its weights converted once, at load."""
    if weight.device.type != "cuda" or torch.compiler.is_compiling():
        return  # the CPU reference takes both FP8 dtypes; a compiled graph meets fp8gemm's own TypeError instead
    found = runtime.fast_backend(runtime.device_index(weight), runtime.requested_backend(None))
    if found is not None and weight.dtype is not found.fp8_dtype:
        raise _refuse(
            f"weight is {weight.dtype} but the {found.backend.name} backend takes {found.fp8_dtype}; convert the "
            f"model once with fp8gemm.nn.convert (or fp8gemm.nn.to_fp8_dtype per weight)"
        )


def _gemm_dtype(output_dtype: torch.dtype) -> torch.dtype:
    """What fp8gemm writes on the way to ``output_dtype``: bf16 directly, anything else through fp32."""
    return torch.bfloat16 if output_dtype == torch.bfloat16 else torch.float32


def matmul_2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    block_size,
    output_dtype: torch.dtype | None = None,
    activation_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``input [..., K] @ dequant(weight [N, K]).T`` -> ``[..., N]`` in ``output_dtype`` (default: input's), no bias
    (transformers adds it). Activations are quantized per token per 128 of K, as fp8gemm.linear does; with
    ``activation_scale`` (one fp32 value: static per-tensor quantization) every element is ``x / activation_scale``
    saturated to the FP8 range instead, and that scale multiplies the product.
    """
    weight, scale = checked_operands(weight, weight_scale_inv, block_size, dims=2)
    output_dtype = output_dtype or input.dtype
    if activation_scale is not None:
        return _static_2d(input, weight, scale, activation_scale, output_dtype)
    if output_dtype == input.dtype:
        return linear(input, weight, scale)
    q, a_scale = quantize_activation(input, fp8_dtype=weight.dtype)
    y = gemm(q, weight, a_scale, scale, out_dtype=_gemm_dtype(output_dtype))
    return y.to(output_dtype).view(*input.shape[:-1], weight.shape[0])


def _static_2d(x, weight, scale, activation_scale, output_dtype):
    if not isinstance(activation_scale, torch.Tensor) or activation_scale.numel() != 1:
        got = tuple(activation_scale.shape) if isinstance(activation_scale, torch.Tensor) else activation_scale
        raise ValueError(f"activation_scale must be one value (static per-tensor quantization), got {got}")
    k = x.shape[-1]
    if x.dim() == 0 or k % BLOCK:
        raise ValueError(f"input's last dim (K = {k}) must be a multiple of {BLOCK}")
    x2d = x.reshape(-1, k)
    s = activation_scale.detach().float().reshape(1, 1)
    fp8_max = torch.finfo(weight.dtype).max
    q = (x2d.float() / s).clamp(-fp8_max, fp8_max).to(weight.dtype)
    a_scale = s.expand(x2d.shape[0], k // BLOCK).contiguous()
    y = gemm(q, weight, a_scale, scale, out_dtype=_gemm_dtype(output_dtype))
    return y.to(output_dtype).view(*x.shape[:-1], weight.shape[0])


def _grouped(x: torch.Tensor, weight, scale, offsets: torch.Tensor, output_dtype) -> torch.Tensor:
    """Rows of ``x`` grouped by expert (``offsets``: int32 cumulative ends) -> [S, N]; rows past ``offsets[-1]`` are
    neither computed nor written and read 0."""
    if x.dim() != 2:
        raise ValueError(f"x must be [S, K] (one row per token-expert pair), got shape {tuple(x.shape)}")
    output_dtype = output_dtype or x.dtype
    q, a_scale = quantize_activation(x, fp8_dtype=weight.dtype)
    y = _grouped_gemm_op(q, weight, a_scale, scale, offsets, None, _gemm_dtype(output_dtype), "")
    return y if y.dtype == output_dtype else y.to(output_dtype)


def matmul_grouped(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    offsets: torch.Tensor | None = None,
    tokens_per_expert: torch.Tensor | None = None,
    block_size=None,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Rows of ``x [S, K]`` sorted by expert, ``offsets [E]`` their cumulative ends (expert e is rows
    ``[offsets[e-1], offsets[e])``): ``out[s] = x[s] @ dequant(weight[e]).T``, ``[S, N]`` in ``output_dtype``
    (default: x's). Rows past ``offsets[-1]`` (expert-parallel sentinels) are not written: they read 0.
    ``tokens_per_expert`` repeats what ``offsets`` says and is not read.
    """
    weight, scale = checked_operands(weight, weight_scale_inv, block_size, dims=3)
    if not isinstance(offsets, torch.Tensor):
        raise ValueError("offsets (int32 [E], cumulative row ends per expert) is required")
    return _grouped(x, weight, scale, offsets.to(device=x.device, dtype=torch.int32), output_dtype)


def matmul_batched(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    block_size=None,
    expert_ids: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Rows of ``x [S, K]`` in any order, row s for expert ``expert_ids[s]``: ``out[s] = x[s] @
    dequant(weight[expert_ids[s]]).T``, ``[S, N]`` in ``output_dtype`` (default: x's). A row whose id is outside
    ``[0, E)`` (an expert-parallel sentinel, ``>= E``) is not computed: it reads 0.

    The rows are sorted by expert on the device (``torch.sort``, counts by ``torch.searchsorted``), run as one grouped
    GEMM and put back in place: no value is read on the host.
    """
    weight, scale = checked_operands(weight, weight_scale_inv, block_size, dims=3)
    if not isinstance(expert_ids, torch.Tensor):
        raise ValueError("expert_ids (one expert id per row of x) is required")
    ids = expert_ids.reshape(-1)
    if x.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"x must be [S, K] with one expert id per row: x is {tuple(x.shape)}, expert_ids holds {ids.shape[0]}"
        )
    experts = weight.shape[0]
    ids = ids.to(device=x.device, dtype=torch.int64)
    key = torch.where((ids >= 0) & (ids < experts), ids, experts)  # ids outside [0, E) sort last, in no group
    sorted_key, order = torch.sort(key, stable=True)
    ends = torch.arange(1, experts + 1, device=x.device, dtype=torch.int64)
    offsets = torch.searchsorted(sorted_key, ends).to(torch.int32)  # rows with key < e + 1: expert e's end
    y_sorted = _grouped(x.index_select(0, order), weight, scale, offsets, output_dtype)
    return torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
