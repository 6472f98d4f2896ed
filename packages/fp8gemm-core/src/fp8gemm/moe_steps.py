"""``fused_experts``' pipeline on a backend's step kernels (``Backend.moe_route`` / ``moe_activation`` /
``moe_combine``, fp8gemm/moe_steps.cuh): the moe_pipeline.py seam in six launches (seven when the tokens span more
than one route block of 1024 slots): route, quantize-scatter, the gate/up grouped GEMM, SiLU-and-mul + quantize, the
down grouped GEMM, combine. Their FP8 codes and scales are ``quantize_activation``'s, the routing is the torch
steps' stable sort (moe_torch.py). No value is read on the host. docs/moe.md, "Steps".
"""

from __future__ import annotations

import torch

from . import runtime
from .moe_pipeline import MoeSteps, Routed
from .protocol import MN_MAJOR, MOE_ACTIVATION_ARGS, MOE_COMBINE_ARGS, MOE_ROUTE_ARGS, OUT_BF16, OUT_FP32
from .quantize import empty_scale
from .reference import BLOCK
from .runtime import IN_KINDS

USE_STEP_KERNELS = True  # False: the torch steps on every backend (tests compare the two on one backend)
ID_KINDS = {torch.int32: 0, torch.int64: 1}


def step_backend(backend):
    """``backend`` if its step entries can run the steps (the kernels write MN-major scales), else None."""
    if not USE_STEP_KERNELS or getattr(backend, "moe_route", None) is None:
        return None
    return backend if backend.a_scale_layout.order == MN_MAJOR else None


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
    with runtime.on_device(device):
        backend.moe_route(MOE_ROUTE_ARGS.pack(
            ids.data_ptr(), x.data_ptr(), q.data_ptr(), scale.data_ptr(), offs.data_ptr(), position.data_ptr(),
            workspace.data_ptr() if workspace_bytes else 0, tokens, k, experts, hidden, x.stride(0), scale_ld,
            ID_KINDS[ids.dtype], IN_KINDS[x.dtype], int(pow2), runtime.raw_stream(device.index),
        ))  # fmt: skip
    return offs, position, q, scale


def activation(backend, h: torch.Tensor, offs: torch.Tensor, pow2: bool):
    """One launch: silu(gate) * up of the fp32 gate/up product h [rows, 2I], quantized: (FP8 [rows, I], scales in the
    backend's layout). Rows at or past offs[-1] (read on the device) are left unwritten."""
    rows, inter, device = h.shape[0], h.shape[1] // 2, h.device
    q = torch.empty((rows, inter), dtype=getattr(torch, backend.fp8_dtype), device=device)
    scale, scale_ld = empty_scale(rows, inter // BLOCK, backend.a_scale_layout, device)
    with runtime.on_device(device):
        backend.moe_activation(MOE_ACTIVATION_ARGS.pack(
            h.data_ptr(), q.data_ptr(), scale.data_ptr(), offs.data_ptr(), offs.shape[0], inter, rows, h.stride(0),
            scale_ld, int(pow2), runtime.raw_stream(device.index),
        ))  # fmt: skip
    return q, scale


def combine(backend, y: torch.Tensor, position: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype):
    """One launch: ``out[t] = sum_j weights[t, j] * y[position[t, j]]`` in fp32, j in order, -1 skipped; in dtype."""
    tokens, k = position.shape
    hidden, device = y.shape[1], y.device
    weights = weights.contiguous()
    out = torch.empty((tokens, hidden), dtype=dtype, device=device)
    with runtime.on_device(device):
        backend.moe_combine(MOE_COMBINE_ARGS.pack(
            weights.data_ptr(), position.data_ptr(), y.data_ptr(), out.data_ptr(), tokens, k, hidden, y.shape[0],
            y.stride(0), out.stride(0), IN_KINDS[dtype], IN_KINDS[weights.dtype],
            OUT_FP32 if y.dtype is torch.float32 else OUT_BF16, runtime.raw_stream(device.index),
        ))  # fmt: skip
    return out


class KernelSteps(MoeSteps):
    """The seam on the backend's step kernels. Rows past offs[-1] are neither computed nor read, so the GEMMs'
    outputs need no zero fill."""

    def prepare(self, x, topk_ids, topk_weights) -> Routed:
        plan = self.plan
        offs, position, q, scale = route(plan.backend, x, topk_ids, plan.shape.experts, plan.pow2)
        return Routed(offs, position, q, scale, topk_weights)

    def activation(self, h, offs):
        return activation(self.plan.backend, h, offs, self.plan.pow2)

    def finalize(self, y, routed: Routed):
        return combine(self.plan.backend, y, routed.position, routed.weights, self.plan.out_dtype)

    def buffer(self, rows, cols, dtype, device):
        return torch.empty((rows, cols), dtype=dtype, device=device)
