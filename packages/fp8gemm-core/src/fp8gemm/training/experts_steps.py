"""The steps of ``fp8gemm.training.fused_experts``: its forward (the pipeline of ``fp8gemm.fused_experts`` that also
keeps what the backward needs) and its backward, on checked inputs. training/experts.py wraps each in one
torch.library op and the pair in an ``autograd.Function``.

Rows are the T*k (token, choice) slots sorted by expert, as the torch steps sort them (moe_torch.py): the same
``offs``, positions, codes and grouped GEMMs, so the forward has the bits of ``fp8gemm.fused_experts`` on the
quantized weights. What the backward keeps: the FP8 transposes (per-expert aligned layout) of the routed x rows and of
the activation (the weight gradients' right operands), the gate/up product (the SiLU-and-mul backward; bf16, fp32
for fp32 x), each row's token and routing weight, and the down GEMM's rows where topk_weights needs a gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..grouped import run_checked_grouped
from ..grouped_checks import GroupedShape
from ..moe_pipeline import MoePlan
from ..moe_steps import combine as kernel_combine
from ..moe_steps import step_backend
from ..moe_torch import COMBINE_CHUNK_BYTES, group_ends, sort_by_expert
from ..moe_torch import combine as torch_combine
from ..protocol import GROUPED_CONTIGUOUS
from .grouped_sources import (
    quantize_gathered_with_transpose,
    quantize_swiglu_backward_with_transpose,
    quantize_swiglu_with_transpose,
)
from .grouped_wgrad import kgrouped_wgrad


class Saved(NamedTuple):
    """What the forward keeps for the backward, beside the weights' FP8 transposes."""

    offs: torch.Tensor  # int32 [E]: cumulative row ends of the sorted rows
    position: torch.Tensor  # int64 [T, k]: each slot's sorted row (an unrouted slot's lies past offs[-1])
    token: torch.Tensor  # int64 [R]: each sorted row's token
    row_weight: torch.Tensor  # fp32 [R]: each sorted row's routing weight (0 for a slot that selects nothing)
    x_t: torch.Tensor  # FP8 [H, cols]: the routed x rows, transposed per expert
    x_scale_t: torch.Tensor  # fp32 [H, cols/128]
    h: torch.Tensor  # [R, 2I]: the gate/up product, bf16 (fp32 for fp32 x)
    act_t: torch.Tensor  # FP8 [I, cols]: silu(gate) * up, transposed per expert
    act_scale_t: torch.Tensor  # fp32 [I, cols/128]
    y: torch.Tensor  # [R, H]: the down GEMM's rows (empty [0] unless topk_weights needs a gradient)


def saved_h_dtype(x_dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if x_dtype is torch.float32 else torch.bfloat16


def grouped_product(
    plan: MoePlan, a, a_scale, b, b_scale, offs, dtype: torch.dtype, zeros: bool = True
) -> torch.Tensor:
    """``out[r] = a[r] @ b[e].T`` for the rows of each expert (contiguous layout) on the plan's backend; rows past
    offs[-1] are zeros (left unwritten with ``zeros=False``, for a reader that skips them)."""
    rows = a.shape[0]
    out = (torch.zeros if zeros else torch.empty)((rows, b.shape[1]), dtype=dtype, device=a.device)
    if rows:
        shape = GroupedShape(b.shape[0], rows, b.shape[1], a.shape[1])
        run_checked_grouped(plan.backend, GROUPED_CONTIGUOUS, shape, a, b, a_scale, b_scale, offs, out)
    return out


def combine(plan: MoePlan, rows, position, valid, weights, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * rows[position[t, j]]`` over the valid slots, in fp32, in ``dtype``: the
    backend's combine kernel (one launch, the slots that select nothing skipped) or torch's chunks (their rows past
    offs[-1] are zeros, their weights 0)."""
    backend = step_backend(plan.backend)  # its combine kernel takes int32 rows, -1 skipped
    if backend is None:
        return torch_combine(rows, position, weights, dtype)
    slot_rows = torch.where(valid, position, -1).to(torch.int32)
    return kernel_combine(backend, rows, slot_rows, weights.float(), dtype)


def _quantize(plan: MoePlan, source, *args, **kwargs):
    """Sorted rows, computed by ``source`` (training/grouped_sources.py) from ``args``, in FP8 with their per-expert
    aligned transpose, on the plan's backend and FP8 dtype."""
    return source(*args, fp8_dtype=plan.fp8_dtype, pow2_scales=plan.pow2, backend=plan.backend.name, **kwargs)


def forward_steps(plan: MoePlan, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, keep_y: bool):
    """(out [T, H] in x's dtype, Saved): route, quantize the routed rows with their transposes, gate/up GEMM (fp32),
    silu(gate) * up quantized with its transpose, down GEMM, weighted combine."""
    tokens, k = topk_ids.shape
    experts = plan.shape.experts
    valid, sorted_expert, order = sort_by_expert(topk_ids, experts)  # the routing of TorchSteps.prepare
    token = order // k
    offs = group_ends(sorted_expert, experts)
    position = torch.empty_like(order).scatter_(0, order, torch.arange(tokens * k, device=order.device))
    weights = torch.where(valid.view(tokens, k), topk_weights.float(), 0.0)
    xq = _quantize(plan, quantize_gathered_with_transpose, x, token, offs)  # each row: x's own codes, gathered
    # h's and d_act's rows past offs[-1] only reach q rows no GEMM reads: left unwritten
    h = grouped_product(plan, xq.q, xq.scale, w13, w13_scale, offs, torch.float32, zeros=False)
    aq = _quantize(plan, quantize_swiglu_with_transpose, h, offs)
    y = grouped_product(plan, aq.q, aq.scale, w2, w2_scale, offs, plan.y_dtype)
    out = combine(plan, y, position.view(tokens, k), valid.view(tokens, k), weights, plan.out_dtype)
    saved = Saved(
        offs=offs,
        position=position.view(tokens, k),
        token=token,
        row_weight=weights.reshape(-1).index_select(0, order),
        x_t=xq.q_t,
        x_scale_t=xq.scale_t,
        h=h.to(saved_h_dtype(x.dtype)),
        act_t=aq.q_t,
        act_scale_t=aq.scale_t,
        y=y if keep_y else y.new_empty(0),
    )
    return out, saved


# --- backward -----------------------------------------------------------------------------------------------------


class Needs(NamedTuple):
    """Which gradients the backward computes."""

    x: bool
    topk_weights: bool
    w13: bool
    w2: bool


class GradDtypes(NamedTuple):
    x: torch.dtype
    topk_weights: torch.dtype
    w13: torch.dtype
    w2: torch.dtype


# bmm with an fp32 out_dtype for 16-bit inputs: CUDA torch >= 2.8
BMM_OUT_DTYPE = torch.version.hip is None and hasattr(torch.ops.aten.bmm, "dtype")


def slot_dots(y: torch.Tensor, position: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """fp32 [T, k]: ``<dout[t], y[position[t, j]]>``, the routing weights' gradient, in chunks of tokens: on CUDA
    for 16-bit rows one batched product with fp32 accumulation and output (the products are exact in fp32), else
    fp32 elementwise products summed."""
    tokens, k = position.shape
    hidden = y.shape[1]
    out = torch.empty((tokens, k), dtype=torch.float32, device=y.device)
    step = max(1, COMBINE_CHUNK_BYTES // (k * hidden * 4))
    batched = BMM_OUT_DTYPE and y.is_cuda and y.dtype == dout.dtype and y.element_size() == 2
    for start in range(0, tokens, step):
        part = slice(start, start + step)
        picked = y.index_select(0, position[part].reshape(-1)).view(-1, k, hidden)
        if batched:  # a broadcast fp32 product read and wrote 4 bytes a value three times over
            out[part] = torch.bmm(picked, dout[part, :, None], out_dtype=torch.float32)[..., 0]
        else:
            out[part] = (picked.float() * dout[part, None, :].float()).sum(-1)
    return out


def _weight_grad(a_t, a_scale_t, b_t, b_scale_t, offs, dtype: torch.dtype, backend: str) -> torch.Tensor:
    """A weight gradient in the weight's dtype: bf16 straight from the k-grouped GEMM, else fp32 cast."""
    out_dtype = torch.bfloat16 if dtype is torch.bfloat16 else torch.float32
    grad = kgrouped_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, out_dtype=out_dtype, backend=backend)
    return grad if grad.dtype is dtype else grad.to(dtype)


def backward_steps(plan: MoePlan, dout, saved: Saved, w13_t, w13_scale_t, w2_t, w2_scale_t, needs: Needs,
                   dtypes: GradDtypes) -> list:  # fmt: skip
    """[dx, d topk_weights, dw13, dw2] (None where not needed): dY per sorted row (weighted), dW2 = dY^T act,
    dAct = dY W2, SiLU-and-mul backward, dW13 = dH^T x, dX = dH W13 summed back onto the tokens."""
    grads = [None] * 4
    valid = saved.position < saved.offs[-1].to(torch.int64)  # unrouted slots' rows lie past offs[-1]
    if needs.topk_weights:
        grads[1] = torch.where(valid, slot_dots(saved.y, saved.position, dout), 0.0).to(dtypes.topk_weights)
    if not (needs.x or needs.w13 or needs.w2):
        return grads
    backend = plan.backend.name
    # fp32 rows float(dOut[t_r]) * w_r, computed as the quantizer reads them (zero rows for unrouted slots)
    dyq = _quantize(plan, quantize_gathered_with_transpose, dout, saved.token, saved.offs, row_weight=saved.row_weight)
    if needs.w2:
        grads[3] = _weight_grad(dyq.q_t, dyq.scale_t, saved.act_t, saved.act_scale_t, saved.offs, dtypes.w2, backend)
    if not (needs.x or needs.w13):
        return grads
    d_act = grouped_product(plan, dyq.q, dyq.scale, w2_t, w2_scale_t, saved.offs, torch.float32, zeros=False)
    dhq = _quantize(plan, quantize_swiglu_backward_with_transpose, d_act, saved.h, saved.offs)
    if needs.w13:
        grads[2] = _weight_grad(dhq.q_t, dhq.scale_t, saved.x_t, saved.x_scale_t, saved.offs, dtypes.w13, backend)
    if needs.x:
        summed = step_backend(plan.backend) is not None  # its combine kernel reads no row past offs[-1]
        dx_rows = grouped_product(
            plan, dhq.q, dhq.scale, w13_t, w13_scale_t, saved.offs, torch.float32, zeros=not summed
        )
        grads[0] = combine(plan, dx_rows, saved.position, valid, valid.float(), dtypes.x)
    return grads
