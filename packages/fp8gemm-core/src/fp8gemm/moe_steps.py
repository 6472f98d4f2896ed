"""``fused_experts``' contiguous pipeline on a backend's step kernels (``Backend.moe_step``, fp8gemm/moe_steps.cuh).

Six launches around nothing else (seven when the tokens span more than one route block of 1024 slots): route,
quantize-scatter, the gate/up grouped GEMM, SiLU-and-mul + quantize, the down grouped GEMM, combine. Their FP8 codes
and scales are ``quantize_activation``'s, the routing is the stable sort's of the torch path (fp8gemm/moe.py), which
stays the reference and the CPU path. No value is read on the host. docs/moe.md, "Steps".
"""

from __future__ import annotations

import torch

from . import runtime
from .grouped import run_checked_grouped
from .grouped_checks import GroupedShape
from .protocol import (
    GROUPED_CONTIGUOUS,
    MN_MAJOR,
    MOE_ACTIVATION,
    MOE_ARGS,
    MOE_COMBINE,
    MOE_ROUTE,
    OUT_BF16,
    OUT_FP32,
)
from .quantize import empty_scale
from .reference import BLOCK
from .runtime import IN_KINDS

USE_STEP_KERNELS = True  # False: the torch steps on every backend (tests compare the two on one backend)
ID_KINDS = {torch.int32: 0, torch.int64: 1}


def step_backend(backend):
    """``backend`` if its ``moe_step`` entry can run the steps (the kernels write MN-major scales), else None."""
    if not USE_STEP_KERNELS or getattr(backend, "moe_step", None) is None:
        return None
    return backend if backend.a_scale_layout.order == MN_MAJOR else None


_UNSET = dict.fromkeys(MOE_ARGS.fields, 0)


def _launch(backend, step: int, device: torch.device, **fields) -> None:
    with runtime.on_device(device):
        values = {**_UNSET, **fields, "step": step, "stream": runtime.raw_stream(device.index)}
        backend.moe_step(MOE_ARGS.pack(*values.values()))


def route(backend, x: torch.Tensor, topk_ids: torch.Tensor, experts: int, pow2: bool):
    """Route and quantize-scatter, two launches (three past 1024 slots): (offs int32 [E], position int32 [T, k], FP8
    [T * k, H], scales [T * k, H/128] in the backend's layout). Row ``position[t, j]`` holds token t's codes and
    scales; -1: an id outside [0, E)."""
    tokens, k = topk_ids.shape
    hidden, rows, device = x.shape[1], tokens * k, x.device
    x, ids = runtime.kernel_rows(x), topk_ids.contiguous()
    offs = torch.empty(experts, dtype=torch.int32, device=device)
    position = torch.empty((tokens, k), dtype=torch.int32, device=device)
    q = torch.empty((rows, hidden), dtype=getattr(torch, backend.fp8_dtype), device=device)
    scale, scale_ld = empty_scale(rows, hidden // BLOCK, backend.a_scale_layout, device)
    workspace_bytes = backend.moe_workspace_bytes(tokens, k, experts)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device) if workspace_bytes else None
    _launch(backend, MOE_ROUTE, device, ids=ids.data_ptr(), x=x.data_ptr(), q=q.data_ptr(), scale=scale.data_ptr(),
            offs=offs.data_ptr(), position=position.data_ptr(), workspace=workspace.data_ptr() if workspace_bytes else 0,
            tokens=tokens, top_k=k, experts=experts, hidden=hidden, ldx=x.stride(0), scale_ld=scale_ld,
            id_kind=ID_KINDS[ids.dtype], in_kind=IN_KINDS[x.dtype], pow2=int(pow2))  # fmt: skip
    return offs, position, q, scale


def activation(backend, h: torch.Tensor, offs: torch.Tensor, pow2: bool):
    """One launch: silu(gate) * up of the fp32 gate/up product h [rows, 2I], quantized: (FP8 [rows, I], scales in the
    backend's layout). Rows at or past offs[-1] (read on the device) are left unwritten."""
    rows, inter = h.shape[0], h.shape[1] // 2
    q = torch.empty((rows, inter), dtype=getattr(torch, backend.fp8_dtype), device=h.device)
    scale, scale_ld = empty_scale(rows, inter // BLOCK, backend.a_scale_layout, h.device)
    _launch(backend, MOE_ACTIVATION, h.device, h=h.data_ptr(), q=q.data_ptr(), scale=scale.data_ptr(),
            offs=offs.data_ptr(), top_k=1, experts=offs.shape[0], inter=inter, rows=rows, ldh=h.stride(0),
            scale_ld=scale_ld, pow2=int(pow2))  # fmt: skip
    return q, scale


def combine(backend, y: torch.Tensor, position: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype):
    """One launch: ``out[t] = sum_j weights[t, j] * y[position[t, j]]`` in fp32, j in order, -1 skipped; in dtype."""
    tokens, k = position.shape
    hidden = y.shape[1]
    weights = weights.contiguous()
    out = torch.empty((tokens, hidden), dtype=dtype, device=y.device)
    _launch(backend, MOE_COMBINE, y.device, weights=weights.data_ptr(), position=position.data_ptr(), y=y.data_ptr(),
            out=out.data_ptr(), tokens=tokens, top_k=k, experts=1, hidden=hidden, rows=y.shape[0], ldy=y.stride(0),
            ldo=out.stride(0), in_kind=IN_KINDS[dtype], weight_kind=IN_KINDS[weights.dtype],
            y_kind=OUT_FP32 if y.dtype is torch.float32 else OUT_BF16)  # fmt: skip
    return out


def _grouped(backend, a, b, a_scale, b_scale, offs, out) -> None:
    """One contiguous grouped GEMM on operands fused_experts made or checked: not checked again."""
    if a.shape[0]:
        shape = GroupedShape(b.shape[0], a.shape[0], b.shape[1], a.shape[1])
        run_checked_grouped(backend, GROUPED_CONTIGUOUS, shape, a, b, a_scale, b_scale, offs, out)


def fused_contiguous(shape, backend, x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale,
                     pow2: bool, y_dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The contiguous pipeline: route, gate/up GEMM, activation, down GEMM, combine. Rows past offs[-1] are neither
    computed nor read, so h and y need no zero fill."""
    tokens, k, experts, hidden, inter = shape
    offs, position, xq, xs = route(backend, x, topk_ids, experts, pow2)
    h = torch.empty((tokens * k, 2 * inter), dtype=torch.float32, device=x.device)
    _grouped(backend, xq, w13, xs, w13_scale, offs, h)
    aq, a_scale = activation(backend, h, offs, pow2)
    y = torch.empty((tokens * k, hidden), dtype=y_dtype, device=x.device)
    _grouped(backend, aq, w2, a_scale, w2_scale, offs, y)
    return combine(backend, y, position, topk_weights, x.dtype)
