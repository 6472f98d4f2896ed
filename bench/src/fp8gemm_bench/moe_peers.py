"""The experts-layer paths ``fp8gemm bench --moe`` times: ``fp8gemm.fused_experts``, our two grouped GEMMs
alone, bf16 experts as transformers runs them (its eager loop and its ``grouped_mm`` forward),
DeepGEMM's pipeline (a Triton per-token-group quantizer, a padded permutation, two
``m_grouped_fp8_gemm_nt_contiguous`` and a combine), and transformers' own ``FP8Experts`` driven through
``fp8gemm.hf`` (our kernel under transformers' module: the only way it runs offline).

A path is ``prepare(inputs, weights) -> (run, tokens)``: ``prepare`` does what a serving engine does once (buffers,
modules, scales in the layout each reads), ``run()`` is one MoE experts call on ``inputs`` (x, topk_ids,
topk_weights, fixed per case) and returns the path's output, and ``tokens(out)`` turns that output into ``[T, H]``
for the check (the identity but for the grouped-GEMMs-alone line, whose output is the permuted rows).

transformers' forwards as read in transformers 5.22.2 (the calls are the same in 5.24):
``Qwen3MoeExperts.forward`` (models/qwen3_moe/modeling_qwen3_moe.py; ``DeepseekV3Experts`` is the same code) loops in
Python over the experts hit, ``F.linear`` on each expert's rows; it finds them with ``nonzero`` / ``torch.where``,
which read values on the host, so it cannot be captured in a CUDA graph. ``BF16_LOOP`` runs that loop with the
routing resolved on the host once (the same ops in the same order, bit for bit on the CPU,
tests/test_moe_bench.py), a lower bound of the eager forward. ``grouped_mm_experts_forward``
(integrations/moe.py, transformers' default for bf16 models) and ``fp8_grouped_mm_experts_forward``
(integrations/finegrained_fp8.py) read nothing on the host and run as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fp8gemm import fused_experts, grouped_gemm, quantize_activation

from .grouped_peers import deep_gemm_module, deepgemm_alignment, dg_contiguous_fn

OURS_CONTIGUOUS = "fp8gemm.fused_experts contiguous"
GROUPED_ALONE = "our 2 grouped GEMMs alone (pre-permuted, pre-quantized)"
STEP_FLOOR = "our 2 grouped GEMMs + 4 one-element launches (the step launches' floor)"
STEP_FLOOR_FUSED_COMBINE = "our 2 grouped GEMMs + 3 one-element launches (the floor with the combine in the GEMM)"
STEP_FLOORS = {STEP_FLOOR: (2, 1, 1), STEP_FLOOR_FUSED_COMBINE: (2, 1, 0)}  # launches before, between, after the GEMMs
BF16_LOOP = "bf16 transformers eager loop (F.linear per expert)"
BF16_GROUPED = "bf16 transformers grouped_mm (torch._grouped_mm)"
DG_PIPELINE = "DeepGEMM pipeline (device-side padded M bound)"
DG_PIPELINE_EXACT = "DeepGEMM pipeline (padded M from host counts)"
HF_FP8 = "transformers FP8Experts grouped_mm on fp8gemm.hf"
BF16_PATHS = (BF16_LOOP, BF16_GROUPED)
DEEPGEMM_PATHS = (DG_PIPELINE, DG_PIPELINE_EXACT)
PATH_ORDER = (OURS_CONTIGUOUS, GROUPED_ALONE, *STEP_FLOORS, BF16_LOOP, BF16_GROUPED, DG_PIPELINE,
              DG_PIPELINE_EXACT, HF_FP8)  # fmt: skip
NOTES = {
    OURS_CONTIGUOUS: "fp8gemm.fused_experts(..., layout='contiguous'): T*k rows sorted by expert, two grouped GEMMs",
    GROUPED_ALONE: "fp8gemm.grouped_gemm twice (offs; gate/up fp32 out, down bf16 out) on rows permuted and "
    "quantized beforehand: the bound of the layer's GEMMs, no quantization, routing or combine",
    STEP_FLOOR: "the same two grouped GEMMs with a one-element torch launch wherever fused_experts launches a step "
    "kernel (route, quantize-scatter, activation, combine): what four launches cost in the same graph, the floor of a "
    "pipeline of separate step kernels; decode cases only",
    STEP_FLOOR_FUSED_COMBINE: "the same without the combine's launch: the floor if the weighted combine ran in the "
    "down GEMM's epilogue; decode cases only",
    BF16_LOOP: "transformers' eager experts forward (Qwen3MoeExperts / DeepseekV3Experts): a Python loop over the "
    "experts hit, F.linear on each one's rows, index_add_; the routing is resolved on the host once (its nonzero / "
    "where host reads removed so it captures in a CUDA graph): a lower bound of the eager forward",
    BF16_GROUPED: "transformers' grouped_mm experts forward (its default for bf16 models) on Qwen3MoeExperts: "
    "torch.sort, histc, two torch._grouped_mm / F.grouped_mm, combine",
    DG_PIPELINE: "per-token-group FP8 quantizer (Triton, as vLLM's/SGLang's per_token_group_quant_fp8) -> rows "
    "scattered to slots padded to DeepGEMM's M alignment, computed on the device, buffers sized by the bound "
    "T*k + E*(alignment-1) as vLLM sizes them under CUDA graphs -> m_grouped_fp8_gemm_nt_contiguous -> fused "
    "SiLU-and-mul + quantizer (Triton, as vLLM's silu_mul_fp8_quant_deep_gemm) -> m_grouped_fp8_gemm_nt_contiguous "
    "-> gather-and-sum combine",
    DG_PIPELINE_EXACT: "the same pipeline with buffers sized by the padded row count the host knows from the routing "
    "(no padding blocks past the last expert)",
    HF_FP8: "transformers' FP8Experts (integrations/finegrained_fp8.py, experts_implementation='grouped_mm') whose "
    "kernels-community/finegrained-fp8 functions are fp8gemm.hf's (use_in_transformers): our kernel under "
    "transformers' module; gate/up written in bf16 before the activation, as that module does",
}


@dataclass
class Inputs:
    """One case's routed tokens, shared by every path."""

    x: torch.Tensor  # bf16 [T, H]
    topk_ids: torch.Tensor  # int64 [T, k] on x's device
    topk_weights: torch.Tensor  # fp32 [T, k]
    experts: int
    ids_cpu: torch.Tensor  # the same ids on the CPU (what the host knows: the eager loop's plan, exact padding)
    backend: str | None = None

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    @property
    def top_k(self) -> int:
        return self.topk_ids.shape[1]


@dataclass
class Fp8Weights:
    """One copy of the experts' FP8 weights: ``scale`` row-major as checkpoints hold them, ``prepared`` in the layout
    our backend reads (``prepare_weight_scale``)."""

    w13: torch.Tensor  # FP8 [E, 2I, H]
    w13_scale: torch.Tensor  # fp32 [E, 2I/128, H/128]
    w2: torch.Tensor  # FP8 [E, H, I]
    w2_scale: torch.Tensor
    w13_prepared: torch.Tensor
    w2_prepared: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False)


@dataclass
class Bf16Weights:
    w13: torch.Tensor  # bf16 [E, 2I, H]
    w2: torch.Tensor  # bf16 [E, H, I]


Run = Callable[[], torch.Tensor]
Tokens = Callable[[torch.Tensor], torch.Tensor]


def _same(out: torch.Tensor) -> torch.Tensor:
    return out


# --- ours --------------------------------------------------------------------------------------------------------


def ours(inp: Inputs, w: Fp8Weights):
    def run():
        return fused_experts(inp.x, inp.topk_ids, inp.topk_weights, w.w13, w.w13_prepared, w.w2, w.w2_prepared,
                             layout="contiguous", backend=inp.backend)  # fmt: skip

    return run, _same


def sort_by_expert(topk_ids: torch.Tensor, experts: int):
    """(sorted expert per row, order: the flat (token, choice) slot of each sorted row, offs int32 [E] row ends)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    sorted_expert, order = torch.sort(flat, stable=True)
    ends = torch.searchsorted(sorted_expert, torch.arange(experts, device=flat.device), right=True)
    return sorted_expert, order, ends.to(torch.int32)


def grouped_operands(inp: Inputs, w: Fp8Weights) -> tuple[torch.Tensor, ...]:
    """(order, offs, a1, s1, h, a2, s2), made once in torch: rows sorted by expert (sort_by_expert), x quantized and
    gathered, the fp32 gate/up product and its quantized activation: the two grouped GEMMs' inputs."""
    _, order, offs = sort_by_expert(inp.topk_ids, inp.experts)
    inter = w.w2.shape[2]
    xq, xs = quantize_activation(inp.x, fp8_dtype=w.w13.dtype)
    a1, s1 = (
        xq.view(torch.uint8).index_select(0, order // inp.top_k).view(xq.dtype),
        xs.index_select(0, order // inp.top_k),
    )
    h = grouped_gemm(a1, w.w13, s1, w.w13_prepared, offs, out_dtype=torch.float32, backend=inp.backend)
    a2, s2 = quantize_activation(F.silu(h[:, :inter]) * h[:, inter:], fp8_dtype=w.w13.dtype)
    return order, offs, a1, s1, h, a2, s2


def grouped_alone(inp: Inputs, w: Fp8Weights, step_launches: tuple[int, int, int] = (0, 0, 0)):
    """Our two grouped GEMMs on rows already sorted, permuted and quantized (both inputs made once, here); with
    step_launches, that many one-element launches before, between and after them (where the step kernels run)."""
    order, offs, a1, s1, h, a2, s2 = grouped_operands(inp, w)
    h_out = torch.zeros_like(h)
    y = torch.zeros(a1.shape[0], w.w2.shape[1], dtype=torch.bfloat16, device=a1.device)

    tick = torch.zeros(1, dtype=torch.int32, device=a1.device)

    def steps(where: int) -> None:  # 0: route and quantize-scatter, 1: activation, 2: combine
        for _ in range(step_launches[where]):
            tick.add_(1)

    def run():
        steps(0)
        grouped_gemm(a1, w.w13, s1, w.w13_prepared, offs, out=h_out, backend=inp.backend)
        steps(1)
        grouped_gemm(a2, w.w2, s2, w.w2_prepared, offs, out=y, backend=inp.backend)
        steps(2)
        return y

    position = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    weights = inp.topk_weights.float()

    def tokens(out):  # each token's k rows back in place, weighted and summed (the check only; not timed)
        return (out.float()[position].view(inp.tokens, inp.top_k, -1) * weights[..., None]).sum(1)

    return run, tokens


# --- bf16, as transformers runs it -----------------------------------------------------------------------------------


def eager_plan(ids_cpu: torch.Tensor, experts: int, device) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """What transformers' eager loop finds on the host: each expert hit, its (top_k_pos, token_idx)."""
    mask = F.one_hot(ids_cpu, num_classes=experts + 1).permute(2, 1, 0)
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().view(-1).tolist()
    plan = []
    for e in hit:
        if e == experts:
            continue
        top_k_pos, token_idx = torch.where(mask[e])
        plan.append((e, top_k_pos.to(device), token_idx.to(device)))
    return plan


def eager_loop_forward(x, topk_weights, w13, w2, plan) -> torch.Tensor:
    """transformers' ``Qwen3MoeExperts.forward`` (eager) statement by statement, over a host-resolved plan."""
    final = torch.zeros_like(x)
    for e, top_k_pos, token_idx in plan:
        current_state = x[token_idx]
        gate, up = F.linear(current_state, w13[e]).chunk(2, dim=-1)
        current = F.silu(gate) * up
        current = F.linear(current, w2[e])
        current = current * topk_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, current.to(final.dtype))
    return final


def bf16_loop(inp: Inputs, w: Bf16Weights):
    plan = eager_plan(inp.ids_cpu, inp.experts, inp.x.device)
    return (lambda: eager_loop_forward(inp.x, inp.topk_weights, w.w13, w.w2, plan)), _same


def _moe_config(experts: int, hidden: int, inter: int, top_k: int, implementation: str):
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                            num_experts_per_tok=top_k, hidden_act="silu")  # fmt: skip
    config._experts_implementation = implementation
    return config


def _set_parameters(module: torch.nn.Module, tensors: dict) -> None:
    for name, value in tensors.items():
        setattr(module, name, torch.nn.Parameter(value, requires_grad=False))


def transformers_bf16_experts(w: Bf16Weights, top_k: int, implementation: str = "grouped_mm"):
    """transformers' own ``Qwen3MoeExperts`` holding ``w`` (no copy), dispatching to ``implementation``."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    e, two_i, h = w.w13.shape
    with torch.device("meta"):
        experts = Qwen3MoeExperts(_moe_config(e, h, two_i // 2, top_k, implementation))
    _set_parameters(experts, {"gate_up_proj": w.w13, "down_proj": w.w2})
    return experts


def bf16_grouped(inp: Inputs, w: Bf16Weights):
    experts = transformers_bf16_experts(w, inp.top_k, "grouped_mm")
    return (lambda: experts(inp.x, inp.topk_ids, inp.topk_weights)), _same


# --- transformers' FP8Experts on fp8gemm.hf --------------------------------------------------------------------------


def transformers_fp8_experts(w: Fp8Weights, top_k: int, implementation: str = "grouped_mm"):
    """transformers' ``FP8Experts`` holding ``w`` (no copy), its finegrained-fp8 kernel fp8gemm.hf's."""
    from fp8gemm.hf import use_in_transformers
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    from transformers.integrations.moe import use_experts_implementation

    use_in_transformers()  # once per process; refuses if transformers already holds another kernel
    e, two_i, h = w.w13.shape
    cls = FP8Experts if hasattr(FP8Experts, "_is_wrapped") else use_experts_implementation(
        experts_class=FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS, has_gate=True)  # fmt: skip
    cls._is_wrapped = True  # replace_with_fp8_linear wraps the class in place too; once is enough
    with torch.device("meta"):
        experts = cls(_moe_config(e, h, two_i // 2, top_k, implementation), block_size=(128, 128))
    _set_parameters(experts, {"gate_up_proj": w.w13, "gate_up_proj_scale_inv": w.w13_scale, "down_proj": w.w2,
                              "down_proj_scale_inv": w.w2_scale})  # fmt: skip
    experts._is_expert_parallel = False
    return experts


def hf_fp8(inp: Inputs, w: Fp8Weights):
    experts = transformers_fp8_experts(w, inp.top_k)
    return (lambda: experts(inp.x, inp.topk_ids, inp.topk_weights)), _same


# --- DeepGEMM's pipeline -------------------------------------------------------------------------------------------

GROUP = 128
_TRITON: dict = {}


def _triton_kernel():
    """vLLM's ``_per_token_group_quant_fp8`` (one program per row and 128-column group; scale = amax / fp8 max),
    with SILU_MUL: vLLM's ``silu_mul_fp8_quant_deep_gemm`` (silu(gate) * up in fp32 from the bf16 gate/up rows,
    then the same quantization), scales written through two strides (MN-major for DeepGEMM)."""
    if "quant" not in _TRITON:
        import triton
        import triton.language as tl

        @triton.jit
        def per_token_group_quant_fp8(x_ptr, q_ptr, s_ptr, groups_per_row, x_row_stride, up_offset, q_row_stride,
                                      s_row_stride, s_col_stride, eps, fp8_min, fp8_max, GROUP: tl.constexpr,
                                      SILU_MUL: tl.constexpr):  # fmt: skip
            g = tl.program_id(0)
            row = g // groups_per_row
            col = g % groups_per_row
            offs = tl.arange(0, GROUP)
            src = x_ptr + row.to(tl.int64) * x_row_stride + col * GROUP + offs
            x = tl.load(src).to(tl.float32)
            if SILU_MUL:
                up = tl.load(src + up_offset).to(tl.float32)
                x = x / (1.0 + tl.exp(-x)) * up
            scale = tl.maximum(tl.max(tl.abs(x)), eps) / fp8_max
            q = tl.clamp(x / scale, fp8_min, fp8_max).to(q_ptr.dtype.element_ty)
            tl.store(q_ptr + row.to(tl.int64) * q_row_stride + col * GROUP + offs, q)
            tl.store(s_ptr + row.to(tl.int64) * s_row_stride + col * s_col_stride, scale)

        _TRITON["quant"] = per_token_group_quant_fp8
    return _TRITON["quant"]


def mn_major_scales(rows: int, groups: int, device) -> torch.Tensor:
    """fp32 [rows, groups] with strides (1, rows rounded up to 4): DeepGEMM's MN-major TMA-aligned scale layout on
    sm90 (``get_mn_major_tma_aligned_tensor``), so it converts nothing inside its calls."""
    aligned = -(-rows // 4) * 4
    return torch.zeros(groups, aligned, dtype=torch.float32, device=device).t()[:rows]


def per_token_group_quant_fp8(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, silu_mul: bool = False) -> None:
    """Quantize x [M, K] (or silu(x[:, :K]) * x[:, K:] of x [M, 2K]) per row per 128 columns into q [M, K] (FP8,
    row-major) and s [M, K/128] (fp32, any strides): Triton on a GPU, the same arithmetic in torch elsewhere."""
    m, k = q.shape
    fp8 = torch.finfo(q.dtype)
    if m == 0:
        return
    if x.is_cuda:
        kernel = _triton_kernel()
        kernel[(m * (k // GROUP),)](x, q, s, k // GROUP, x.stride(0), k, q.stride(0), s.stride(0), s.stride(1), 1e-10,
                                    fp8.min, fp8.max, GROUP=GROUP, SILU_MUL=silu_mul, num_warps=1, num_stages=1)  # fmt: skip
        return
    v = x.float()
    if silu_mul:
        v = v[:, :k] / (1.0 + torch.exp(-v[:, :k])) * v[:, k:]
    groups = v.view(m, k // GROUP, GROUP)
    scale = groups.abs().amax(-1).clamp(min=1e-10) / fp8.max
    q.copy_((groups / scale[..., None]).clamp(fp8.min, fp8.max).view(m, k).to(q.dtype))
    s.copy_(scale)


def padded_rows(ids_cpu: torch.Tensor, experts: int, alignment: int) -> int:
    """Rows of DeepGEMM's contiguous layout for this routing: each expert's rows padded to ``alignment``."""
    counts = torch.bincount(ids_cpu.reshape(-1), minlength=experts).tolist()
    return max(alignment, sum(-(-c // alignment) * alignment for c in counts))


def padded_rows_bound(rows: int, experts: int, alignment: int) -> int:
    """The most rows any routing of ``rows`` slots can pad to, as vLLM sizes DeepGEMM's buffers without host counts."""
    return -(-(rows + experts * (alignment - 1)) // alignment) * alignment


def deepgemm_pipeline(inp: Inputs, w: Fp8Weights, exact_m: bool = False, dg=None):
    """DeepGEMM's MoE experts as vLLM's and SGLang's DeepGEMM paths run them; nothing read on the host per call."""
    dg = dg or deep_gemm_module()
    gemm_call = dg_contiguous_fn(dg)
    align = deepgemm_alignment(dg)
    (experts, two_i, hidden), inter = w.w13.shape, w.w2.shape[2]
    tokens, k, device = inp.tokens, inp.top_k, inp.x.device
    rows = tokens * k
    m_pad = padded_rows(inp.ids_cpu, experts, align) if exact_m else padded_rows_bound(rows, experts, align)
    fp8 = w.w13.dtype
    xq = torch.empty(tokens, hidden, dtype=fp8, device=device)
    xs = torch.empty(tokens, hidden // GROUP, dtype=torch.float32, device=device)
    a_pad = torch.zeros(m_pad, hidden, dtype=fp8, device=device)
    s_pad = mn_major_scales(m_pad, hidden // GROUP, device)
    h = torch.zeros(m_pad, two_i, dtype=torch.bfloat16, device=device)
    aq = torch.zeros(m_pad, inter, dtype=fp8, device=device)
    as_ = mn_major_scales(m_pad, inter // GROUP, device)
    y = torch.zeros(m_pad, hidden, dtype=torch.bfloat16, device=device)
    m_indices = torch.full((m_pad,), -1, dtype=torch.int32, device=device)
    arange_rows, arange_e = torch.arange(rows, device=device), torch.arange(experts, device=device)

    def run():
        per_token_group_quant_fp8(inp.x, xq, xs)
        flat = inp.topk_ids.reshape(-1).to(torch.int64)
        sorted_e, order = torch.sort(flat, stable=True)
        ends = torch.searchsorted(sorted_e, arange_e, right=True)
        counts = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
        padded = (counts + align - 1) // align * align
        pad_start = torch.cumsum(padded, 0) - padded
        dest = pad_start[sorted_e] + arange_rows - (ends - counts)[sorted_e]  # each sorted row's padded slot
        token = order // k
        a_pad.view(torch.uint8).index_copy_(0, dest, xq.view(torch.uint8).index_select(0, token))
        s_pad.index_copy_(0, dest, xs.index_select(0, token))
        m_indices.fill_(-1)
        m_indices.index_copy_(0, dest, sorted_e.to(torch.int32))
        gemm_call((a_pad, s_pad), (w.w13, w.w13_scale), h, m_indices)
        per_token_group_quant_fp8(h, aq, as_, silu_mul=True)
        gemm_call((aq, as_), (w.w2, w.w2_scale), y, m_indices)
        slot = torch.empty_like(dest).scatter_(0, order, dest)  # each (token, choice)'s padded row
        picked = y.index_select(0, slot).view(tokens, k, hidden).float()
        return (picked * inp.topk_weights[..., None]).sum(1).to(inp.x.dtype)

    return run, _same


def deepgemm_pipeline_exact(inp: Inputs, w: Fp8Weights):
    return deepgemm_pipeline(inp, w, exact_m=True)


PATHS: dict[str, Callable] = {
    OURS_CONTIGUOUS: ours,
    GROUPED_ALONE: grouped_alone,
    **{name: functools.partial(grouped_alone, step_launches=launches) for name, launches in STEP_FLOORS.items()},
    BF16_LOOP: bf16_loop,
    BF16_GROUPED: bf16_grouped,
    DG_PIPELINE: deepgemm_pipeline,
    DG_PIPELINE_EXACT: deepgemm_pipeline_exact,
    HF_FP8: hf_fp8,
}
WEIGHT_KIND = {name: "bf16" if name in BF16_PATHS else "fp8" for name in PATHS}


def _importable(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def missing_paths(device: torch.device) -> dict[str, str]:
    """Paths that cannot run here, each with why (a peer not installed, or one that needs a CUDA GPU)."""
    missing = {}
    why = _importable("deep_gemm") or _importable("triton")
    if why is None and device.type != "cuda":
        why = "DeepGEMM runs on CUDA GPUs only"
    if why:
        missing.update(dict.fromkeys(DEEPGEMM_PATHS, f"missing: {why}"))
    why = _importable("transformers.models.qwen3_moe.modeling_qwen3_moe")
    if why:
        missing.update(dict.fromkeys(BF16_PATHS, f"missing: transformers ({why})"))
    why = _importable("transformers.integrations.finegrained_fp8") or _importable("kernels")
    if why:
        missing[HF_FP8] = f"missing: transformers' FP8Experts or kernels ({why})"
    return missing


def distinct_experts(ids_cpu: torch.Tensor) -> int:
    return int(torch.unique(ids_cpu).numel())
