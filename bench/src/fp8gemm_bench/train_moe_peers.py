"""What ``fp8gemm bench --train --moe`` times: the experts layer's forward and backward, and the k-grouped weight
gradient alone.

Layer paths are ``layer(x, topk_ids, topk_weights, w13, w2) -> out [T, H]``, differentiable in x, topk_weights and the
high-precision expert weights w13 [E, 2I, H] and w2 [E, H, I]. Ours is ``fp8gemm.training.fused_experts``; the peers
are one reference layer (sort the routed rows by expert, gate/up GEMM, SiLU-and-mul, down GEMM, weighted combine)
whose two grouped GEMMs are ``torch._grouped_mm`` (bf16), a per-expert loop where the device lacks it, or torchao's
FP8 blockwise grouped GEMM (quantizes A 1x128 and B 128x128 per call; pads every expert to 128 tokens itself).

K-grouped paths are ``prepare(ops) -> run``: ``ops`` the FP8 operands of dW_e = dY_e^T X_e for every expert
(``KGroupedOperands``: ``quantize_grouped_with_transpose``'s codes and scales), ``run()`` returns dW [E, N, K] float32
(bf16 for the bf16-out path).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from fp8gemm.training import fused_experts, kgrouped_wgrad, quantize_grouped_with_transpose
from fp8gemm.training.grouped_quantize import expert_columns

from .train_peers import deep_gemm_module, needs_sm90, why_not

OURS = "fp8gemm.training.fused_experts"
BF16 = "bf16 layer on torch._grouped_mm"
TORCHAO = "torchao FP8 blockwise grouped_mm layer"
LAYER_PATHS = (OURS, BF16, TORCHAO)

K_OURS = "fp8gemm.training.kgrouped_wgrad"
K_OURS_BF16 = "fp8gemm.training.kgrouped_wgrad, bf16 out"
K_DEEPGEMM = "DeepGEMM k_grouped_fp8_gemm_nt_contiguous + padding to 128"
K_DEEPGEMM_GEMM = "DeepGEMM k_grouped_fp8_gemm_nt_contiguous, pre-padded"
KGROUPED_PATHS = (K_OURS, K_OURS_BF16, K_DEEPGEMM, K_DEEPGEMM_GEMM)
BLOCK = 128


# --- the reference layer and its grouped GEMMs -------------------------------------------------------------------


def loop_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(a [M, K], b [E, K, N], offs)`` as one torch.mm per expert (any dtype, float64 included)."""
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, ends, strict=True))])


def torch_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def grouped_mm_for(device) -> tuple[object, str | None]:
    """``torch._grouped_mm`` where it runs forward and backward on ``device``, else the loop and why."""
    try:
        a = torch.randn(4, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(2, 16, 16, device=device, dtype=torch.bfloat16).transpose(-2, -1).requires_grad_()
        out = torch_grouped_mm(a, b, torch.tensor([1, 4], dtype=torch.int32, device=device))
        out.backward(torch.ones_like(out))  # a dense gradient, as a layer's: sum()'s expanded one is refused
    except Exception as exc:  # an older torch or a device without the op
        return loop_grouped_mm, f"torch._grouped_mm unavailable here ({type(exc).__name__}): a per-expert loop"
    return torch_grouped_mm, None


def sort_rows(topk_ids: torch.Tensor, experts: int):
    """(token of each routed row, its slot in topk, offs int32 [E]) with rows sorted by expert."""
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    counts = torch.bincount(topk_ids.reshape(-1), minlength=experts)
    return order // topk_ids.shape[1], order, torch.cumsum(counts, 0).to(torch.int32)


def reference_layer(grouped_mm):
    """The experts layer on ``grouped_mm(a [M, K], b [E, K, N], offs)``, autograd through every step."""

    def layer(x, topk_ids, topk_weights, w13, w2):
        token, slot, offs = sort_rows(topk_ids, w13.shape[0])
        h = grouped_mm(x[token], w13.transpose(-2, -1), offs)
        inter = w2.shape[2]
        y = grouped_mm(F.silu(h[:, :inter]) * h[:, inter:], w2.transpose(-2, -1), offs)
        weighted = y * topk_weights.reshape(-1)[slot].to(y.dtype)[:, None]
        return torch.zeros_like(x, dtype=y.dtype).index_add(0, token, weighted).to(x.dtype)

    return layer


def torchao_grouped_mm():
    """torchao's differentiable FP8 blockwise grouped GEMM (1x128 activations, 128x128 weights); ImportError else."""
    try:  # torchao 0.18
        from torchao.prototype.moe_training.blockwise_fp8.grouped_mm import (
            _to_fp8_blockwise_then_scaled_grouped_mm as mm,
        )
    except ImportError:  # torchao releases before the blockwise_fp8 package
        from torchao.prototype.moe_training.blockwise_fp8_grouped_mm import (
            _to_fp8_blockwise_then_scaled_grouped_mm as mm,
        )
    return lambda a, b, offs: mm(a, b, offs, out_dtype=torch.bfloat16)


def layer_paths(device) -> tuple[dict, dict[str, str]]:
    """Each layer path that can run on ``device``, and notes on how the bf16 one runs here."""
    grouped_mm, note = grouped_mm_for(device)
    paths = {OURS: fused_experts, BF16: reference_layer(grouped_mm)}
    if why_not(torchao_grouped_mm) is None:
        paths[TORCHAO] = reference_layer(torchao_grouped_mm())
    return paths, ({BF16: note} if note else {})


def float64_layer():
    return reference_layer(loop_grouped_mm)


# --- the k-grouped weight gradient alone -------------------------------------------------------------------------


class KGroupedOperands(NamedTuple):
    """dW [E, N, K] = dY_e^T X_e per expert: dY [R, N] and X [R, K] rows sorted by expert (offs), quantized."""

    a_t: torch.Tensor  # FP8 [N, cols]: dY^T in the per-expert 128-aligned layout
    a_scale_t: torch.Tensor  # fp32 [N, cols/128]
    b_t: torch.Tensor  # FP8 [K, cols]: X^T
    b_scale_t: torch.Tensor
    offs: torch.Tensor  # int32 [E]
    counts: list[int]  # tokens of each expert, on the host


def kgrouped_operands(dy: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> KGroupedOperands:
    a, b = quantize_grouped_with_transpose(dy, offs), quantize_grouped_with_transpose(x, offs)
    ends = offs.tolist()
    counts = [e - s for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    return KGroupedOperands(a.q_t, a.scale_t, b.q_t, b.scale_t, offs, counts)


def expert_blocks(ops: KGroupedOperands) -> list[tuple[int, int]]:
    """(first column block, blocks) of each expert in the layout: its tokens rounded up to 128, what DeepGEMM reads."""
    base = expert_columns(ops.offs, sum(ops.counts)).base.tolist()
    return [(b, -(-n // BLOCK)) for b, n in zip(base, ops.counts, strict=True)]


def _k_ours(ops: KGroupedOperands, dtype: torch.dtype = torch.float32):
    out = torch.empty(len(ops.counts), ops.a_t.shape[0], ops.b_t.shape[0], device=ops.a_t.device, dtype=dtype)
    return lambda: kgrouped_wgrad(ops.a_t, ops.b_t, ops.a_scale_t, ops.b_scale_t, ops.offs, out=out)


def _pack_k_major(q_t: torch.Tensor, scale_t: torch.Tensor, blocks: list[tuple[int, int]]):
    """DeepGEMM sm90's k-grouped operand as its own test lays it out (DeepGEMM 54e2261, tests/generators.py:459-473):
    each expert's padded [rows, k_e] codes K-major, flattened one after another, and the fp32 scales [rows, sum k_e /
    128] as the transpose of a contiguous [sum k_e / 128, rows], i.e. MN-major, which DeepGEMM reads in place. Scales
    in any other layout it transposes inside every call with a kernel built for sum k_e / 128 (its shared memory grows
    with it: past ~907 blocks the launch fails). The experts' 128-token padding is what its caller lays out."""
    data = torch.cat([q_t[:, BLOCK * b : BLOCK * (b + n)].reshape(-1) for b, n in blocks if n])
    scales = torch.cat([scale_t[:, b : b + n].t() for b, n in blocks if n]).t()
    return data, scales


def _deepgemm(ops: KGroupedOperands, pad_in_time: bool):
    """``k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, ks_tensor, c=d, recipe=(1, 1, 128))`` as
    DeepGEMM's test_k_grouped_gemm_contiguous calls it on sm90: ks the per-expert K (multiples of 128, 0 for an empty
    expert) on the host, ks_tensor the same as int32 on the device (what its scheduler reads), float32 D = C + A B^T."""
    dg = deep_gemm_module()
    if not hasattr(dg, "k_grouped_fp8_gemm_nt_contiguous"):
        raise ImportError("this deep_gemm has no k_grouped_fp8_gemm_nt_contiguous")
    if ops.a_t.dtype != torch.float8_e4m3fn or ops.b_t.dtype != torch.float8_e4m3fn:  # it reads e4m3, checks none
        raise TypeError(f"DeepGEMM's sm90 k-grouped kernel reads float8_e4m3fn codes, these are {ops.a_t.dtype}")
    blocks = expert_blocks(ops)
    ks = [BLOCK * n for _, n in blocks]
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device=ops.a_t.device)
    d = torch.zeros(len(ks), ops.a_t.shape[0], ops.b_t.shape[0], device=ops.a_t.device)
    packed = [_pack_k_major(ops.a_t, ops.a_scale_t, blocks), _pack_k_major(ops.b_t, ops.b_scale_t, blocks)]

    def gemm():
        d.zero_()  # it computes D = C + A B^T with C = D: the zeroing is part of a written gradient
        dg.k_grouped_fp8_gemm_nt_contiguous(packed[0], packed[1], d, ks, ks_tensor, d, recipe=(1, 1, 128))
        return d

    def padded_then_gemm():
        packed[:] = [_pack_k_major(ops.a_t, ops.a_scale_t, blocks), _pack_k_major(ops.b_t, ops.b_scale_t, blocks)]
        return gemm()

    return padded_then_gemm if pad_in_time else gemm


KGROUPED_PREPARE = {
    K_OURS: _k_ours,
    K_OURS_BF16: lambda ops: _k_ours(ops, torch.bfloat16),
    K_DEEPGEMM: lambda ops: _deepgemm(ops, True),
    K_DEEPGEMM_GEMM: lambda ops: _deepgemm(ops, False),
}


def kgrouped_bytes(ops: KGroupedOperands, out_bytes: int = 4) -> int:
    """Bytes read and written by one k-grouped call: both FP8 operands with their scales, and the output."""
    tensors = (ops.a_t, ops.a_scale_t, ops.b_t, ops.b_scale_t)
    out = len(ops.counts) * ops.a_t.shape[0] * ops.b_t.shape[0] * out_bytes
    return sum(t.numel() * t.element_size() for t in tensors) + out


def missing_paths(device: torch.device) -> dict[str, str]:
    """Every path that cannot run on ``device`` here, with the reason."""
    device = torch.device(device)
    missing = {}
    ao = why_not(torchao_grouped_mm)
    if ao or device.type != "cuda":
        missing[TORCHAO] = ao or f"not run: torchao's FP8 grouped GEMM needs a GPU, the device is {device.type}"
    dg = why_not(deep_gemm_module) or needs_sm90(device)  # its k-grouped nt kernel is sm90's
    if dg:
        missing.update(dict.fromkeys((K_DEEPGEMM, K_DEEPGEMM_GEMM), dg))
    return missing
