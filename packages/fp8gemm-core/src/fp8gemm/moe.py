"""``fp8gemm.fused_experts``: a mixture-of-experts layer on routed tokens, built from the grouped GEMM ops.

``out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = topk_ids[t, j]``, every
product block-scaled FP8 as ``fp8gemm.gemm``. No value is read on the host (a decode step captures in one CUDA graph);
ids only the device sees that fall outside [0, E) select nothing. The steps and the limits:
docs/moe.md.
"""

from __future__ import annotations

import torch

from . import moe_steps, registry, runtime
from .grouped_checks import check_dims, check_rows, check_scale_shape, has_storage
from .moe_pipeline import MoePlan, MoeShape, MoeSteps
from .moe_torch import TorchSteps
from .native import reraise_unless_miss
from .protocol import MOE_MAX_EXPERTS, MOE_MAX_TOP_K
from .reference import BLOCK, REFERENCE
from .runtime import IN_KINDS, LIBRARY
from .validation import ceil_div, check_fp8, check_same_device

ACTIVATIONS = ("silu",)
LAYOUTS = ("contiguous",)
MOE_NAMES = ("x", "topk_ids", "topk_weights", "w13", "w13_scale", "w2", "w2_scale")
ID_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The padded pipeline (T rows per expert on the masked grouped GEMM), removed: no measured case picked it.
MASKED_REMOVED = (
    "layout='masked' is no longer a fused_experts pipeline: on an H100 it ran at 0.10-0.87x the contiguous one at "
    "every T measured (docs/decisions.md); pass layout=None or 'contiguous' (fp8gemm.grouped_gemm_masked still runs "
    "a padded batch of your own)"
)


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
    if layout == "masked":
        raise ValueError(MASKED_REMOVED)
    if layout not in LAYOUTS and layout not in (None, ""):
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
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


# --- the plan: one backend, one set of checks, one implementation of the seam -----------------------------------


def plan_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation: str, pow2: bool,
                       layout: str | None, backend_name: str | None) -> MoePlan:  # fmt: skip
    """Every check of one call, on metadata (and CPU ids), and its backend, resolved once."""
    shape = check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, layout)
    backend = registry.select(x.device, runtime.requested_backend(backend_name)).backend
    if backend is not REFERENCE:
        check_backend_dtype(w13, backend, x.device)
    check_topk_id_values(topk_ids, shape.experts)
    y_dtype = torch.bfloat16 if x.dtype is torch.bfloat16 else torch.float32
    return MoePlan(shape, backend, w13.dtype, pow2, y_dtype, x.dtype)


def steps_for(plan: MoePlan) -> MoeSteps:
    """The backend's step kernels where it has them (moe_steps.py), else the torch steps (moe_torch.py)."""
    return moe_steps.KernelSteps(plan) if moe_steps.step_backend(plan.backend) else TorchSteps(plan)


def run_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation: str, pow2: bool,
                      layout: str | None, backend_name: str | None) -> torch.Tensor:  # fmt: skip
    """Plan, then prepare -> experts -> finalize on x's device (docs/moe.md, "Steps")."""
    plan = plan_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2, layout,
                              backend_name)  # fmt: skip
    if plan.shape.tokens == 0:
        return x.new_empty((0, plan.shape.hidden))
    return steps_for(plan).run(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale)


# --- the torch.library op: what torch.compile and graph capture see ----------------------------------------------


@runtime.op("fused_experts", "fused_experts", MOE_NAMES)
def _fused_experts_op(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
                      w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, activation: str,
                      pow2_scales: bool, layout: str, backend: str) -> torch.Tensor:  # fmt: skip
    return eager_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                               layout or None, backend or None)  # fmt: skip


@_fused_experts_op.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales, layout, backend):
    shape = check_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, layout)
    return x.new_empty((shape.tokens, shape.hidden))


_ops = getattr(torch.ops, LIBRARY)


def native_experts(x, w13, activation: str, layout: str | None, backend: str | None):
    """The native ops of x's backend when the call is one its ``fused_experts`` op may take, else None."""
    if (
        not x.is_cuda
        or activation != "silu"
        or layout not in (None, "", "contiguous")
        or not moe_steps.USE_STEP_KERNELS
    ):
        return None
    return runtime.native_ops(x, w13, backend)


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
    activation: ``"silu"``. layout: ``"contiguous"`` or None, the same pipeline (``"masked"``, removed, raises).

    No value is read on the host on a GPU, so a decode step captures in one CUDA graph; ids outside [0, E) that
    only the device sees select nothing (on the CPU they raise). A ``torch.library`` op: traces under
    ``torch.compile(fullgraph=True)``. Inference only. See docs/moe.md.
    """
    if torch.is_grad_enabled():  # refuse_grad's first test, sparing inference a call; a guard when compiling
        runtime.refuse_grad("fused_experts", MOE_NAMES, (x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale))
    _require_scale("w13_scale", w13_scale, "[E, 2I/128, H/128]")
    _require_scale("w2_scale", w2_scale, "[E, ceil(H/128), I/128]")
    if torch.compiler.is_compiling():
        return _ops.fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                                  layout or "", backend or "")  # fmt: skip
    return eager_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2_scales,
                               layout, backend)  # fmt: skip


def eager_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation: str, pow2: bool,
                        layout: str | None, backend: str | None) -> torch.Tensor:  # fmt: skip
    """One call, eager or in a compiled graph's op: the backend's native op where it takes the call (the step
    kernels' pipeline in one C++ call), else the planner."""
    native = native_experts(x, w13, activation, layout, backend)
    if native is not None:
        try:
            return native.fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, pow2)
        except RuntimeError as error:
            reraise_unless_miss(error)
    return run_fused_experts(x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, activation, pow2, layout,
                             backend)  # fmt: skip
