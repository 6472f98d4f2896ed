"""``fp8gemm.fused_experts``: a mixture-of-experts layer on routed tokens, built from the grouped GEMM ops.

``out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = topk_ids[t, j]``, every
product block-scaled FP8 as ``fp8gemm.gemm``. No value is read on the host (a decode step captures in one CUDA graph);
ids only the device sees that fall outside [0, E) select nothing. The steps, the layout policy and the limits:
docs/moe.md.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import moe_steps, registry, runtime
from .grouped import run_grouped
from .grouped_checks import check_dims, check_rows, check_scale_shape, has_storage
from .protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED, MOE_MAX_EXPERTS, MOE_MAX_TOP_K
from .quantize import quantize_rows
from .reference import BLOCK, REFERENCE
from .runtime import IN_KINDS, LIBRARY
from .validation import ceil_div, check_fp8, check_same_device

ACTIVATIONS = ("silu",)
LAYOUTS = ("contiguous", "masked")
MOE_NAMES = ("x", "topk_ids", "topk_weights", "w13", "w13_scale", "w2", "w2_scale")
ID_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# The masked layout is used for T <= MASKED_MAX_TOKENS when the backend runs it as a kernel. 0: the contiguous
# layout everywhere; on an H100 the masked one was slower at every T measured (docs/moe.md, "Layout").
MASKED_MAX_TOKENS = 0
COMBINE_CHUNK_BYTES = 64 << 20  # the fp32 weighted rows the combine holds at once


class MoeShape(NamedTuple):
    tokens: int  # T
    top_k: int  # k
    experts: int  # E
    hidden: int  # H
    intermediate: int  # I


# --- checks: metadata only, so they also run on fake tensors at trace time ---------------------------------------


def _require_scale(name: str, scale, shape: str) -> None:
    if scale is None:
        raise TypeError(
            f"{name} is None: FP8 weights need their block scales, fp32 {shape} (one per 128x128 block; a "
            f"checkpoint's weight_scale_inv). Quantize float weights with fp8gemm.quantize_weight, or use "
            f"fp8gemm.nn.Fp8Experts"
        )


def check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, layout) -> MoeShape:
    """Every argument of ``fused_experts`` on metadata alone, each error under the caller's name."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [T, H] (tokens x hidden size), got {type(x).__name__}")
    if x.dtype not in IN_KINDS:
        raise TypeError(f"x must be a bfloat16/float16/float32 tensor [T, H], got {x.dtype}")
    check_dims("x", x, 2, "[T, H] (tokens x hidden size)", "; flatten leading dims with x.reshape(-1, H)")
    tokens, hidden = x.shape
    if hidden == 0 or hidden % BLOCK:
        raise ValueError(f"x's last dim (H = {hidden}) must be a positive multiple of {BLOCK}; pad it with zeros")
    check_dims("w13", w13, 3, "[E, 2I, H] (each expert's gate and up projections, stacked)")
    check_fp8("w13", w13, "quantize it with fp8gemm.quantize_weight per expert, or use fp8gemm.nn.Fp8Experts")
    experts, two_i, w13_h = w13.shape
    if w13_h != hidden:
        raise ValueError(f"w13 is [E, 2I, H] = {tuple(w13.shape)} but x has H = {hidden}: H differs")
    if experts == 0:
        raise ValueError("w13 holds no expert (w13.shape[0] = E = 0); pass at least one expert's weights")
    if experts > MOE_MAX_EXPERTS:
        raise ValueError(
            f"w13 holds E = {experts} experts (w13.shape[0]); fused_experts takes at most {MOE_MAX_EXPERTS} "
            f"(fp8gemm.protocol.MOE_MAX_EXPERTS: one route block scans every expert's count); split the experts over "
            f"several calls, passing -1 for the ids of experts held elsewhere"
        )
    inter = two_i // 2
    if two_i % 2 or inter == 0 or inter % BLOCK:
        raise ValueError(
            f"w13.shape[1] = 2I = {two_i}: the intermediate size I must be a positive multiple of {BLOCK} (it is the "
            f"down projection's K); pad each expert's gate and up rows, and w2's columns, with zeros"
        )
    check_dims("w2", w2, 3, "[E, H, I] (each expert's down projection)")
    check_fp8("w2", w2, "quantize it with fp8gemm.quantize_weight per expert, or use fp8gemm.nn.Fp8Experts")
    if w2.dtype != w13.dtype:
        raise TypeError(f"w2 has dtype {w2.dtype} but w13 has {w13.dtype}; quantize both to the same FP8 dtype")
    if tuple(w2.shape) != (experts, hidden, inter):
        raise ValueError(f"w2 must be [E, H, I] = {[experts, hidden, inter]} (from w13 and x), got {tuple(w2.shape)}")
    _require_scale("w13_scale", w13_scale, "[E, 2I/128, H/128]")
    _require_scale("w2_scale", w2_scale, "[E, ceil(H/128), I/128]")
    block = "(one scale per 128x128 block)"
    check_scale_shape("w13_scale", w13_scale, (experts, two_i // BLOCK, hidden // BLOCK), f"[E, 2I/128, H/128] {block}")
    check_scale_shape("w2_scale", w2_scale, (experts, ceil_div(hidden, BLOCK), inter // BLOCK),
                      f"[E, ceil(H/128), I/128] {block}")  # fmt: skip
    check_dims("topk_ids", topk_ids, 2, "[T, k] (each token's experts)")
    if topk_ids.dtype not in ID_DTYPES:
        raise TypeError(f"topk_ids must be torch.int32 or torch.int64 (expert ids, as torch.topk gives), got "
                        f"{topk_ids.dtype}; pass topk_ids.to(torch.int32)")  # fmt: skip
    if topk_ids.shape[0] != tokens or not 0 < topk_ids.shape[1] <= MOE_MAX_TOP_K:
        raise ValueError(f"topk_ids must be [T, k] with T = {tokens} (x.shape[0]) and 1 <= k <= {MOE_MAX_TOP_K} "
                         f"(a route block holds whole tokens), got {tuple(topk_ids.shape)}")  # fmt: skip
    check_dims("topk_weights", topk_weights, 2, "[T, k] (each token's routing weights)")
    if topk_weights.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"topk_weights must be a float32/bfloat16/float16 tensor [T, k], got {topk_weights.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights must be [T, k] = {list(topk_ids.shape)} like topk_ids, got "
                         f"{tuple(topk_weights.shape)}")  # fmt: skip
    check_same_device("x", x, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w13_scale=w13_scale, w2=w2,
                      w2_scale=w2_scale)  # fmt: skip
    check_rows("w13", w13)
    check_rows("w2", w2)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS} (act(gate) * up), got {activation!r}")
    if layout not in LAYOUTS and layout not in (None, ""):
        raise ValueError(f"layout must be one of {LAYOUTS} or None (the policy's choice), got {layout!r}")
    return MoeShape(tokens, topk_ids.shape[1], experts, hidden, inter)


def check_backend_dtype(w13: torch.Tensor, backend, device) -> None:
    if backend.fp8_dtype and w13.dtype != getattr(torch, backend.fp8_dtype):
        raise TypeError(
            f"w13 and w2 are {w13.dtype}, but the backend for {device} ({backend.name}) takes "
            f"torch.{backend.fp8_dtype}; convert each with fp8gemm.nn.to_fp8_dtype(weight, scale, "
            f"torch.{backend.fp8_dtype}), or load the experts through fp8gemm.nn.Fp8Experts, which converts on load"
        )


def check_topk_id_values(topk_ids: torch.Tensor, experts: int) -> None:
    """CPU ids only: reading them waits on nothing. On a GPU they are never read (out-of-range ids select nothing)."""
    if topk_ids.device.type != "cpu" or not has_storage(topk_ids) or not topk_ids.numel():
        return
    bad = topk_ids[(topk_ids < -1) | (topk_ids >= experts)]
    if bad.numel():
        raise ValueError(
            f"topk_ids holds {int(bad[0])}, outside [-1, E = {experts}): each entry is an expert id in [0, E) "
            f"(w13.shape[0]), or -1 for a slot to skip"
        )


# --- the layout policy -----------------------------------------------------------------------------------------


def kernel_layouts(backend) -> tuple[int, ...]:
    """The grouped layouts ``backend`` runs as one launch (none: the grouped reference runs)."""
    return tuple(backend.grouped_layouts) if getattr(backend, "grouped_launch", None) is not None else ()


def choose_layout(tokens: int, layouts: tuple[int, ...]) -> str:
    """``"masked"`` for ``tokens <= MASKED_MAX_TOKENS`` where the backend has a masked kernel, else
    ``"contiguous"``. The contiguous path handles T * k rows; the masked one E * T (T rows for each expert)."""
    return "masked" if tokens <= MASKED_MAX_TOKENS and GROUPED_MASKED in layouts else "contiguous"


# --- the pipeline ------------------------------------------------------------------------------------------------


def _take_rows(q: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """FP8 rows gathered by ``index`` (as bytes: every device gathers uint8)."""
    return q.view(torch.uint8).index_select(0, index).view(q.dtype)


def _sort_by_expert(topk_ids: torch.Tensor, experts: int):
    """Flat (token, choice) slots in expert order. An id outside [0, E) becomes E: its slots sort last, past every
    group, and select nothing. Returns (valid [T*k], sorted expert ids, order: the flat slot of each sorted row)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    valid = (flat >= 0) & (flat < experts)
    expert = torch.where(valid, flat, experts)
    sorted_expert, order = torch.sort(expert, stable=True)
    return valid, sorted_expert, order


def _group_ends(sorted_expert: torch.Tensor, groups: int, right: bool) -> torch.Tensor:
    ids = torch.arange(groups, device=sorted_expert.device)
    return torch.searchsorted(sorted_expert, ids, right=right)


def _activation(h: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up in fp32 from the fp32 gate/up product (its first I columns the gate, the next I the up)."""
    return torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]


def _combine(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * y[rows[t, j]]``: each token's k rows gathered, weighted and summed in fp32
    over j, no atomics (the same bits on every run), in chunks of tokens whose fp32 products fit COMBINE_CHUNK_BYTES
    (one chunk for a decode step)."""
    tokens, k = rows.shape
    hidden = y.shape[1]
    out = torch.empty((tokens, hidden), dtype=dtype, device=y.device)
    step = max(1, COMBINE_CHUNK_BYTES // (k * hidden * 4))
    for start in range(0, tokens, step):
        part = slice(start, start + step)
        picked = y.index_select(0, rows[part].reshape(-1)).view(-1, k, hidden)
        out[part] = (picked * weights[part, :, None]).sum(1)
    return out


def _contiguous(shape: MoeShape, xq, xs, topk_ids, weights, w13, w13_scale, w2, w2_scale, pow2, backend_name, y_dtype):
    """Rows sorted by expert, ``offs`` their cumulative ends: two contiguous grouped GEMMs over T * k rows."""
    tokens, k, experts, _, inter = shape
    rows = tokens * k
    valid, sorted_expert, order = _sort_by_expert(topk_ids, experts)
    offs = _group_ends(sorted_expert, experts, right=True).to(torch.int32)
    token = order // k
    a, a_scale = _take_rows(xq, token), xs.index_select(0, token)  # the FP8 rows, not a bf16 copy
    h = run_grouped(backend_name, GROUPED_CONTIGUOUS, a, w13, a_scale, w13_scale, offs, None, torch.float32)
    aq, a_scale = quantize_rows(_activation(h, inter), w13.dtype, pow2, backend_name, "the activation")
    y = run_grouped(backend_name, GROUPED_CONTIGUOUS, aq, w2, a_scale, w2_scale, offs, None, y_dtype)
    position = torch.empty_like(order).scatter_(0, order, torch.arange(rows, device=order.device))
    return y, position.view(tokens, k), torch.where(valid.view(tokens, k), weights, 0.0)


def _masked(shape: MoeShape, xq, xs, topk_ids, weights, w13, w13_scale, w2, w2_scale, pow2, backend_name, y_dtype):
    """A batch of T rows per expert, ``masked_m`` of them real: two masked grouped GEMMs over E * T rows. A slot past
    its expert's T rows (a token naming one expert twice) and an id outside [0, E) land in a spare row that no GEMM
    reads and whose output stays 0."""
    tokens, k, experts, hidden, inter = shape
    m_max, rows = tokens, tokens * k
    spare = experts * m_max
    valid, sorted_expert, order = _sort_by_expert(topk_ids, experts)
    starts = _group_ends(sorted_expert, experts + 1, right=False)
    position = torch.arange(rows, device=order.device) - starts[sorted_expert]
    kept = valid[order] & (position < m_max)
    slot = torch.empty_like(order).scatter_(0, order, torch.where(kept, sorted_expert * m_max + position, spare))
    masked_m = (starts[1:] - starts[:-1]).clamp(max=m_max).to(torch.int32)
    token = torch.arange(rows, device=order.device) // k
    a = torch.empty((spare + 1, hidden), dtype=torch.uint8, device=xq.device)
    a.index_copy_(0, slot, _take_rows(xq, token).view(torch.uint8))
    a_scale = torch.empty((spare + 1, xs.shape[1]), dtype=torch.float32, device=xs.device)
    a_scale.index_copy_(0, slot, xs.index_select(0, token))
    a = a[:spare].view(xq.dtype).view(experts, m_max, hidden)
    hint = ceil_div(rows, experts)
    h = run_grouped(backend_name, GROUPED_MASKED, a, w13, a_scale[:spare].view(experts, m_max, -1), w13_scale, masked_m,
                    None, torch.float32, hint)  # fmt: skip
    aq, a_scale = quantize_rows(_activation(h, inter), w13.dtype, pow2, backend_name, "the activation")
    y = torch.zeros((spare + 1, hidden), dtype=y_dtype, device=xq.device)  # the spare row reads 0
    run_grouped(backend_name, GROUPED_MASKED, aq.view(experts, m_max, inter), w2, a_scale.view(experts, m_max, -1),
                w2_scale, masked_m, y[:spare].view(experts, m_max, hidden), None, hint)  # fmt: skip
    slot = slot.view(tokens, k)
    return y, slot, torch.where(slot < spare, weights, 0.0)


def run_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation: str, pow2: bool,
                      layout: str | None, backend_name: str | None) -> torch.Tensor:  # fmt: skip
    """Check, pick the backend and layout, run the pipeline on x's device (docs/moe.md, "Steps"): the backend's step
    kernels for the contiguous layout where it has them (moe_steps.py), else the torch steps below."""
    shape = check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, layout)
    backend_name = runtime.requested_backend(backend_name)
    backend = registry.select(x.device, backend_name).backend
    if backend is not REFERENCE:
        check_backend_dtype(w13, backend, x.device)
    check_topk_id_values(topk_ids, shape.experts)
    if shape.tokens == 0:
        return x.new_empty((0, shape.hidden))
    layout = layout or choose_layout(shape.tokens, kernel_layouts(backend))
    y_dtype = torch.bfloat16 if x.dtype is torch.bfloat16 else torch.float32
    steps = moe_steps.step_backend(backend) if layout == "contiguous" else None
    if steps is not None:  # the backend's step kernels: six launches
        return moe_steps.fused_contiguous(shape, steps, x, topk_ids, topk_weights, w13, w13_scale, w2,
                                          w2_scale, pow2, y_dtype)  # fmt: skip
    xq, xs = quantize_rows(x, w13.dtype, pow2, backend_name)  # once per token: rows are gathered in FP8
    run = _masked if layout == "masked" else _contiguous
    y, rows, weights = run(shape, xq, xs, topk_ids, topk_weights.float(), w13, w13_scale, w2, w2_scale, pow2,
                           backend_name, y_dtype)  # fmt: skip
    return _combine(y, rows, weights, x.dtype)


# --- the torch.library op: what torch.compile and graph capture see ----------------------------------------------


@runtime.op("fused_experts", "fused_experts", MOE_NAMES)
def _fused_experts_op(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                      w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, activation: str,
                      pow2_scales: bool, layout: str, backend: str) -> torch.Tensor:  # fmt: skip
    return run_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                             layout or None, backend or None)  # fmt: skip


@_fused_experts_op.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales, layout, backend):
    shape = check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, layout)
    return x.new_empty((shape.tokens, shape.hidden))


_ops = getattr(torch.ops, LIBRARY)


def fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, *, activation: str = "silu",
                  pow2_scales: bool = False, layout: str | None = None, backend: str | None = None) -> torch.Tensor:  # fmt: skip
    """The experts of a mixture-of-experts layer on routed tokens: ``x [T, H]`` -> ``[T, H]`` in x's dtype.

    ``out[t] = sum_j topk_weights[t, j] * (act(x[t] @ gate_e.T) * (x[t] @ up_e.T)) @ down_e.T`` for
    ``e = topk_ids[t, j]``, each product an FP8 GEMM with one scale per token per 128 of K for the activations
    (quantized here; ``pow2_scales``: powers of two) and one per 128x128 block for the weights.

    x: bf16 (fp16, fp32) [T, H]. topk_ids: int32/int64 [T, k], each token's experts in [0, E), or -1 for a slot to
    skip. topk_weights: float [T, k]. Routing (softmax, top-k, grouped top-k, normalisation) is the caller's.
    w13: FP8 [E, 2I, H], each expert's gate (first I rows) and up projections stacked, as vLLM and transformers
    store them; w13_scale: fp32 [E, 2I/128, H/128]. w2: FP8 [E, H, I]; w2_scale: fp32 [E, ceil(H/128), I/128].
    I and H are multiples of 128. Pass the scales once through ``fp8gemm.prepare_weight_scale``.
    activation: ``"silu"``. layout: ``"contiguous"``, ``"masked"`` or None (:func:`choose_layout`).

    No value is read on the host on a GPU, so a decode step captures in one CUDA graph; ids outside [0, E) that
    only the device sees select nothing (on the CPU they raise). A ``torch.library`` op: traces under
    ``torch.compile(fullgraph=True)``. Inference only. See docs/moe.md.
    """
    runtime.refuse_grad("fused_experts", MOE_NAMES, (x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale))
    _require_scale("w13_scale", w13_scale, "[E, 2I/128, H/128]")
    _require_scale("w2_scale", w2_scale, "[E, ceil(H/128), I/128]")
    if torch.compiler.is_compiling():
        return _ops.fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                                  layout or "", backend or "")  # fmt: skip
    return run_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                             layout, backend)  # fmt: skip
