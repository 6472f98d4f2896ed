"""The Linear-layer paths ``fp8gemm bench --layer`` times: ours and what a user would pick instead.

Each path is ``prepare(w) -> forward`` where ``w`` is the bf16 weight [N, K] and ``forward(x)`` maps a
bf16 [M, K] activation to bf16 [M, N]. Weight preparation happens once, outside the timed region.
Peers are listed only where importable; one that fails on a shape is reported for that shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from fp8gemm import gemm, linear, prepare_weight_scale, quantize_activation, quantize_weight

Forward = Callable[[torch.Tensor], torch.Tensor]
Prepare = Callable[[torch.Tensor], Forward]
OURS = "fp8gemm.linear"
BF16 = "bf16 F.linear"
GEMM_ALONE = "fp8gemm.gemm alone (input pre-quantized)"


def _ours(w: torch.Tensor) -> Forward:
    qw, scale = quantize_weight(w)
    scale = prepare_weight_scale(scale)
    return lambda x: linear(x, qw, scale)


def _bf16(w: torch.Tensor) -> Forward:
    return lambda x: F.linear(x, w)


def gemm_alone(w: torch.Tensor, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The ceiling of any layer: our GEMM on an input quantized beforehand (not a layer by itself)."""
    qw, scale = quantize_weight(w)
    scale = prepare_weight_scale(scale)
    qx, x_scale = quantize_activation(x)
    return lambda: gemm(qx, qw, x_scale, scale)


def _hf_kernels():
    from transformers.integrations import finegrained_fp8 as hf  # Triton kernels in transformers < 5

    return hf.act_quant, hf.w8a8_block_fp8_matmul_triton


def _hf_forward(w: torch.Tensor) -> Forward:
    act_quant, matmul = _hf_kernels()
    qw, scale = quantize_weight(w, fp8_dtype=torch.float8_e4m3fn)

    def forward(x):
        qx, x_scale = act_quant(x, 128)
        return matmul(qx, qw, x_scale, scale, [128, 128], torch.bfloat16)

    return forward


def _torchao(w: torch.Tensor) -> Forward:
    from torchao.kernel.blockwise_quantization import blockwise_fp8_gemm, fp8_blockwise_act_quant

    qw, scale = quantize_weight(w, fp8_dtype=torch.float8_e4m3fn)

    def forward(x):
        qx, x_scale = fp8_blockwise_act_quant(x, 128, torch.float8_e4m3fn)
        return blockwise_fp8_gemm(qx, x_scale, qw, scale, 128)

    return forward


def _deep_gemm(w: torch.Tensor) -> Forward:
    import deep_gemm

    act_quant = _hf_kernels()[0]  # DeepSeek-V3's own per-token-group Triton kernel
    qw, scale = quantize_weight(w, fp8_dtype=torch.float8_e4m3fn)

    def forward(x):
        qx, x_scale = act_quant(x, 128)
        out = torch.empty(x.shape[0], qw.shape[0], dtype=torch.bfloat16, device=x.device)
        deep_gemm.fp8_gemm_nt((qx, x_scale), (qw, scale), out, disable_ue8m0_cast=True)
        return out

    return forward


def _importable(check: Callable[[], object]) -> bool:
    try:
        check()
    except Exception:
        return False
    return True


def layer_paths(device: torch.device) -> dict[str, Prepare]:
    """Our layer, bf16, and every peer layer path importable here."""
    paths: dict[str, Prepare] = {OURS: _ours, BF16: _bf16}
    if device.type != "cuda":
        return paths
    if _importable(_hf_kernels):
        paths["transformers FP8 (Triton)"] = _hf_forward
    if _importable(lambda: __import__("torchao.kernel.blockwise_quantization")):
        paths["torchao blockwise FP8 (Triton)"] = _torchao
    if _importable(_hf_kernels) and _importable(lambda: __import__("deep_gemm")):
        paths["DeepGEMM + Triton act. quant"] = _deep_gemm
    return paths
