"""The grouped-GEMM paths ``fp8gemm bench --grouped`` times: ours (contiguous and masked), DeepGEMM's, a loop of our
dense GEMM over experts, and bf16 ``torch._grouped_mm``.

A path is ``prepare(problem, b, b_scale) -> (run, rows)``: ``prepare`` does what a serving engine does once (weight
scales converted, buffers allocated), ``run()`` is what one MoE layer call costs and returns the path's output, and
``rows(out, idx)`` reads packed rows ``idx`` (rows grouped by expert, no padding) of that output for the check.

DeepGEMM's grouped API, as read in github.com/deepseek-ai/DeepGEMM at commit 54e22612409371d6364144b69086735beb54e98b
(csrc/apis/gemm.hpp, csrc/apis/layout.hpp, deep_gemm/utils/layout.py, tests/generators.py):
``m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout, ..., disable_ue8m0_cast=False)`` with
``grouped_layout`` the per-row expert ids (int32 [M], -1 for padding rows) and every group padded to
``get_mk_alignment_for_contiguous_layout()`` rows (128 on sm90; older releases call it
``get_m_alignment_for_contiguous_layout``); ``m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m,
expected_m, ...)`` on [G, M_max, K]. On sm90 the activation scales are fp32 [M, K/128] MN-major and TMA-aligned
(``get_mn_major_tma_aligned_tensor``); any other layout is converted inside every call, so it is converted once here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from fp8gemm import gemm, grouped_gemm, grouped_gemm_masked, prepare_weight_scale
from fp8gemm.reference import expand_scales

from .peers import deepgemm_mn_major

OURS_CONTIGUOUS = "fp8gemm.grouped_gemm (offs)"
OURS_MASKED = "fp8gemm.grouped_gemm_masked"
OURS_ROW_IDS = "fp8gemm.grouped_gemm (m_indices)"
OURS_ROW_IDS_PADDED = "fp8gemm.grouped_gemm (m_indices, DeepGEMM's padded rows)"
DG_CONTIGUOUS = "DeepGEMM contiguous + padding"
DG_CONTIGUOUS_GEMM = "DeepGEMM contiguous, pre-padded"
DG_PADDING = "DeepGEMM padding copy alone"
DG_MASKED = "DeepGEMM masked"
DENSE_LOOP = "fp8gemm.gemm loop over experts"
BF16 = "bf16 torch._grouped_mm"
CONTIGUOUS_PATHS = (OURS_CONTIGUOUS, OURS_ROW_IDS, OURS_ROW_IDS_PADDED, DG_CONTIGUOUS, DG_CONTIGUOUS_GEMM, DG_PADDING)
MASKED_PATHS = (OURS_MASKED, DG_MASKED)
LAYOUT_FREE_PATHS = (DENSE_LOOP, BF16)  # packed rows, whatever layout the case is about
DEEPGEMM_PATHS = (DG_CONTIGUOUS, DG_CONTIGUOUS_GEMM, DG_PADDING, DG_MASKED)
DEFAULT_M_ALIGNMENT = 128  # DeepGEMM's contiguous-layout alignment on sm90 (kLegacyMKAlignmentForContiguousLayout)

Run = Callable[[], torch.Tensor]
Rows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Problem:
    """One case's activations, shared by every path: ``counts[g]`` rows of expert g, packed in group order."""

    counts: list[int]
    a: torch.Tensor  # FP8 [M, K]
    a_scale: torch.Tensor  # fp32 [M, K/128]
    n: int
    m_max: int | None = None  # rows per group of the masked layout; None: the case has none
    expected_m: int = 1
    backend: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def starts(self) -> list[int]:
        return [0, *itertools.accumulate(self.counts)][:-1]

    @property
    def offs(self) -> torch.Tensor:
        if "offs" not in self._cache:
            ends = list(itertools.accumulate(self.counts))
            self._cache["offs"] = torch.tensor(ends, dtype=torch.int32, device=self.a.device)
        return self._cache["offs"]

    def masked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a [G, M_max, K], a_scale [G, M_max, K/128], masked_m int32 [G]): the packed rows scattered once, as a
        low-latency dispatch delivers them; rows past ``counts[g]`` are zero."""
        if "masked" not in self._cache:
            g, k = len(self.counts), self.a.shape[1]
            slot = torch.tensor(masked_slots(self.counts, self.m_max), dtype=torch.long, device=self.a.device)
            a3 = torch.zeros(g * self.m_max, k, dtype=self.a.dtype, device=self.a.device)
            a3.view(torch.uint8).index_copy_(0, slot, self.a.view(torch.uint8))
            s3 = torch.zeros(g * self.m_max, k // 128, dtype=torch.float32, device=self.a.device)
            s3.index_copy_(0, slot, self.a_scale.float())
            masked_m = torch.tensor(self.counts, dtype=torch.int32, device=self.a.device)
            self._cache["masked"] = (a3.view(g, self.m_max, k), s3.view(g, self.m_max, -1), masked_m)
        return self._cache["masked"]

    def masked_rows(self, out3: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        slot = torch.tensor(masked_slots(self.counts, self.m_max), dtype=torch.long, device=out3.device)
        return out3.reshape(-1, out3.shape[-1])[slot[idx.to(out3.device)]]


def masked_slots(counts: list[int], m_max: int) -> list[int]:
    """Each packed row's row in the flattened [G * M_max] masked layout."""
    return [g * m_max + i for g, c in enumerate(counts) for i in range(c)]


def deepgemm_padding(counts: list[int], alignment: int) -> tuple[list[int], list[int], list[int]]:
    """What DeepGEMM's caller must build for the contiguous layout: every group padded to ``alignment`` rows.

    Returns ``(padded_counts, dest, m_indices)``: ``dest[r]`` is packed row r's row in the padded buffer, and
    ``m_indices`` (one per padded row) is the row's expert, -1 for the padding rows DeepGEMM skips.
    """
    padded = [math.ceil(c / alignment) * alignment for c in counts]
    dest, m_indices, start = [], [], 0
    for g, (c, p) in enumerate(zip(counts, padded, strict=True)):
        dest.extend(range(start, start + c))
        m_indices.extend([g] * c + [-1] * (p - c))
        start += p
    return padded, dest, m_indices


def _packed(out: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return out[idx.to(out.device)]


def ours_contiguous(p: Problem, b, b_scale):
    b_scale = prepare_weight_scale(b_scale, backend=p.backend)
    out = torch.empty(p.a.shape[0], p.n, dtype=torch.bfloat16, device=p.a.device)
    offs = p.offs
    return (lambda: grouped_gemm(p.a, b, p.a_scale, b_scale, offs, out=out, backend=p.backend)), _packed


def ours_row_ids(p: Problem, b, b_scale):
    """The packed rows with ``m_indices`` (each row's expert, DeepGEMM's convention) instead of ``offs``."""
    b_scale = prepare_weight_scale(b_scale, backend=p.backend)
    ids = torch.tensor([g for g, c in enumerate(p.counts) for _ in range(c)], dtype=torch.int32, device=p.a.device)
    out = torch.empty(p.a.shape[0], p.n, dtype=torch.bfloat16, device=p.a.device)
    return (lambda: grouped_gemm(p.a, b, p.a_scale, b_scale, m_indices=ids, out=out, backend=p.backend)), _packed


def _mn_major_zeros(rows: int, blocks: int, device) -> torch.Tensor:
    """fp32 zeros [rows, blocks] MN-major with 16-byte columns (the layout DeepGEMM's contiguous GEMM reads)."""
    return torch.zeros(blocks, -(-rows // 4) * 4, dtype=torch.float32, device=device).t()[:rows]


def ours_row_ids_padded(p: Problem, b, b_scale):
    """What an engine written for DeepGEMM hands over, already padded: every group in 128-row slots, -1 ids on the
    padding rows, the scales MN-major with 16-byte columns (as DeepGEMM's contiguous GEMM gets them)."""
    pad, a_pad, s_pad, ids, dest = _padded(p, DEFAULT_M_ALIGNMENT, _mn_major_zeros)
    pad()
    b_scale = prepare_weight_scale(b_scale, backend=p.backend)
    out = torch.empty(a_pad.shape[0], p.n, dtype=torch.bfloat16, device=p.a.device)

    def run():
        return grouped_gemm(a_pad, b, s_pad, b_scale, m_indices=ids, out=out, backend=p.backend)

    return run, lambda o, idx: o[dest[idx.to(o.device)]]


def ours_masked(p: Problem, b, b_scale):
    a3, s3, masked_m = p.masked()
    b_scale = prepare_weight_scale(b_scale, backend=p.backend)
    out = torch.zeros(len(p.counts), p.m_max, p.n, dtype=torch.bfloat16, device=p.a.device)

    def run():
        return grouped_gemm_masked(a3, b, s3, b_scale, masked_m, expected_m=p.expected_m, out=out, backend=p.backend)

    return run, p.masked_rows


def dense_loop(p: Problem, b, b_scale):
    """The host knows every group's size: one ``fp8gemm.gemm`` per non-empty expert, into row slices of one out."""
    scales = [prepare_weight_scale(b_scale[g].contiguous(), backend=p.backend) for g in range(len(p.counts))]
    out = torch.empty(p.a.shape[0], p.n, dtype=torch.bfloat16, device=p.a.device)
    groups = [(g, s, s + c) for g, (s, c) in enumerate(zip(p.starts, p.counts, strict=True)) if c]

    def run():
        for g, s, e in groups:
            gemm(p.a[s:e], b[g], p.a_scale[s:e], scales[g], out=out[s:e], backend=p.backend)
        return out

    return run, _packed


def dequantized_bf16(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor):
    """The same numbers in bf16: what a bf16 user multiplies (a [M, K], b [G, N, K])."""
    n, a16 = b.shape[1], torch.empty(a.shape, dtype=torch.bfloat16, device=a.device)
    for s in range(0, a.shape[0], 16384):  # in row chunks: the fp32 temporaries of 262144 rows x 7168 are 7.5 GB each
        rows = slice(s, s + 16384)
        a16[rows] = a[rows].float() * expand_scales(a_scale[rows].float(), b_scale[0].float(), n)[0]
    b16 = [(b[g].float() * expand_scales(a_scale[:1].float(), b_scale[g].float(), n)[1]).bfloat16()
           for g in range(b.shape[0])]  # fmt: skip
    return a16, torch.stack(b16)


def bf16_grouped_mm(p: Problem, b, b_scale):
    a16, b16 = dequantized_bf16(p.a, p.a_scale, b, b_scale)
    bt, offs = b16.transpose(-2, -1), p.offs  # [G, K, N] column-major, as _grouped_mm wants its second operand
    run = lambda: torch._grouped_mm(a16, bt, offs=offs)  # noqa: E731
    run.operands = (a16, b16)  # the check compares this path with the float64 product of its own bf16 inputs
    return run, _packed


def deep_gemm_module():
    """DeepGEMM where it is installed; an ImportError otherwise (its paths are then reported missing)."""
    import deep_gemm  # optional; a missing install is reported, not fatal

    return deep_gemm


def deepgemm_alignment(dg=None) -> int:
    dg = dg or deep_gemm_module()
    get = getattr(dg, "get_mk_alignment_for_contiguous_layout", None) or dg.get_m_alignment_for_contiguous_layout
    return int(get())


def dg_contiguous_fn(dg):
    """DeepGEMM's contiguous grouped GEMM as one call ``(a, b, d, ids)``, before and after its API rename."""
    fn = getattr(dg, "m_grouped_fp8_gemm_nt_contiguous", None)
    if fn is not None:
        return lambda a, b, d, ids: fn(a, b, d, ids, disable_ue8m0_cast=True)
    return dg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous  # releases before the fp8_fp4 API (same positional call)


def _dg_masked_fn(dg):
    fn = getattr(dg, "m_grouped_fp8_gemm_nt_masked", None)
    if fn is not None:
        return lambda a, b, d, mm, em: fn(a, b, d, mm, em, disable_ue8m0_cast=True)
    return dg.m_grouped_gemm_fp8_fp8_bf16_nt_masked


def _padded(p: Problem, alignment: int, zero_scales):
    """The padded buffers (zeroed once: padding rows stay zero; the scales from ``zero_scales(rows, blocks, device)``),
    the scatter that fills them, and m_indices."""
    padded, dest, m_indices = deepgemm_padding(p.counts, alignment)
    m_pad, k, device = sum(padded), p.a.shape[1], p.a.device
    dest_t = torch.tensor(dest, dtype=torch.long, device=device)
    a_pad = torch.zeros(m_pad, k, dtype=p.a.dtype, device=device)
    s_pad = zero_scales(m_pad, k // 128, device)
    a_src, s_src = p.a.view(torch.uint8), p.a_scale.float()

    def pad():  # the caller's copy of each group's rows into its aligned slot (fp8 scattered as bytes)
        a_pad.view(torch.uint8).index_copy_(0, dest_t, a_src)
        s_pad.index_copy_(0, dest_t, s_src)
        return a_pad

    ids = torch.tensor(m_indices, dtype=torch.int32, device=device)
    return pad, a_pad, s_pad, ids, dest_t


def _dg_padded(p: Problem, dg):
    """DeepGEMM's padded layout: its M alignment, its scale layout."""

    def zeros(rows: int, blocks: int, device) -> torch.Tensor:
        return deepgemm_mn_major(dg, torch.zeros(rows, blocks, dtype=torch.float32, device=device))

    return _padded(p, deepgemm_alignment(dg), zeros)


def deepgemm_contiguous(p: Problem, b, b_scale, with_padding: bool = True):
    dg = deep_gemm_module()
    call = dg_contiguous_fn(dg)
    pad, a_pad, s_pad, ids, dest = _dg_padded(p, dg)
    out = torch.empty(a_pad.shape[0], p.n, dtype=torch.bfloat16, device=p.a.device)
    pad()

    def run():
        if with_padding:
            pad()
        call((a_pad, s_pad), (b, b_scale), out, ids)
        return out

    return run, lambda o, idx: o[dest[idx.to(o.device)]]


def deepgemm_contiguous_gemm(p: Problem, b, b_scale):
    return deepgemm_contiguous(p, b, b_scale, with_padding=False)


def deepgemm_padding_alone(p: Problem, b, b_scale):
    """Only the copy into the padded layout; its output is no GEMM, so the check reads the padded activations."""
    pad, _, _, _, dest = _dg_padded(p, deep_gemm_module())
    return pad, lambda o, idx: o[dest[idx.to(o.device)]]


def deepgemm_masked(p: Problem, b, b_scale):
    dg = deep_gemm_module()
    call = _dg_masked_fn(dg)
    a3, s3, masked_m = p.masked()
    s3 = deepgemm_mn_major(dg, s3)
    out = torch.zeros(len(p.counts), p.m_max, p.n, dtype=torch.bfloat16, device=p.a.device)
    expected = max(1, p.expected_m)  # DeepGEMM asserts expected_m > 0

    def run():
        call((a3, s3), (b, b_scale), out, masked_m, expected)
        return out

    return run, p.masked_rows


PATHS: dict[str, Callable] = {
    OURS_CONTIGUOUS: ours_contiguous,
    OURS_MASKED: ours_masked,
    OURS_ROW_IDS: ours_row_ids,
    OURS_ROW_IDS_PADDED: ours_row_ids_padded,
    DG_CONTIGUOUS: deepgemm_contiguous,
    DG_CONTIGUOUS_GEMM: deepgemm_contiguous_gemm,
    DG_PADDING: deepgemm_padding_alone,
    DG_MASKED: deepgemm_masked,
    DENSE_LOOP: dense_loop,
    BF16: bf16_grouped_mm,
}


def missing_paths(device: torch.device) -> dict[str, str]:
    """Paths that cannot run here, each with why (a peer not installed, or one that needs a CUDA GPU)."""
    missing = {}
    try:
        deep_gemm_module()
        if device.type != "cuda":
            raise RuntimeError("DeepGEMM runs on CUDA GPUs only")
    except Exception as exc:
        why = "deep_gemm is not installed" if isinstance(exc, ImportError) else str(exc)
        missing.update(dict.fromkeys(DEEPGEMM_PATHS, f"missing: {why}"))
    if not hasattr(torch, "_grouped_mm"):
        missing[BF16] = f"missing: torch {torch.__version__} has no torch._grouped_mm"
    return missing
