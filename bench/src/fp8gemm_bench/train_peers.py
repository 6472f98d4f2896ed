"""What ``fp8gemm bench --train`` times: the layer's forward and backward, and the weight-gradient GEMM alone.

Layer paths are ``prepare(w) -> module``: ``w`` the bf16 weight [N, K], the module an ``nn.Linear`` (no bias: torchao's
layer has none) holding a copy of it as its Parameter; the bench runs ``module(x).backward(dy)``.

Weight-gradient paths are ``prepare(ops) -> run``: ``ops`` the FP8 operands of dW = dY^T X, both with 1x128 scales
along the tokens (``WgradOperands``, fp8gemm's quantizer's codes and scales, fed to every path), ``run()`` returns
dW [N, K] (float32 where the path can write it). Layouts are converted in ``prepare``, outside the timed region.

A path that cannot run here is listed by ``missing_paths`` with the reason (not installed, no GPU, an API this version
lacks); one that fails on a case is reported for that case.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from fp8gemm import gemm, prepare_weight_scale, quantize_weight
from fp8gemm.nn import Fp8TrainingLinear
from fp8gemm.reference import reference_quantize
from fp8gemm.registry import backend_defaults
from fp8gemm.runtime import empty_scale
from fp8gemm.training.quantize import scale_t_layout
from torch import nn

from .peers import deepgemm_mn_major


def padded_rows(m: int) -> int:
    """Tokens rounded up to whole 128-token blocks: the row length of the quantizer's transposed operands."""
    return -(-m // 128) * 128


BF16 = "bf16 nn.Linear"
OURS = "fp8gemm Fp8TrainingLinear"
AO_CUBLAS = "torchao Float8BlockwiseLinear (cuBLAS scaled_mm)"
AO_TRITON = "torchao Float8BlockwiseLinear (Triton)"
TORCHAO = (AO_CUBLAS, AO_TRITON)
LAYER_PATHS = (BF16, OURS, AO_CUBLAS, AO_TRITON)

W_OURS = "fp8gemm.gemm 1D1D (per-row b_scale)"
W_OURS_ACC = "fp8gemm.gemm 1D1D, accumulate=True"
W_FORWARD_FORM = "fp8gemm.gemm forward form (128x128 b_scale), same sizes"
W_DEEPGEMM = "DeepGEMM fp8_gemm_nt 1D1D (sm90, accumulates into C)"
W_DEEPGEMM_FORWARD = "DeepGEMM fp8_gemm_nt forward form (1x128 x 128x128), same sizes"
W_SCALED_MM = "torch scaled_mm 1x128 x 1x128 (cuBLASLt)"
W_BF16 = "bf16 dY^T X (torch.mm)"
WGRAD_PATHS = (W_OURS, W_OURS_ACC, W_FORWARD_FORM, W_DEEPGEMM, W_DEEPGEMM_FORWARD, W_SCALED_MM, W_BF16)
FORWARD_FORMS = (W_FORWARD_FORM, W_DEEPGEMM_FORWARD)  # X^T in 128x128 blocks: rates, not the weight gradient
WGRAD_FP8 = (W_OURS, W_OURS_ACC, W_DEEPGEMM, W_SCALED_MM)  # the 1D1D product of the same FP8 operands

Prepare = Callable


# --- the layer: forward and backward ------------------------------------------------------------------------------


def _linear(w: torch.Tensor) -> nn.Linear:
    n, k = w.shape
    layer = nn.Linear(k, n, bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    return layer


def _bf16(w: torch.Tensor) -> nn.Module:
    return _linear(w)


def _ours(w: torch.Tensor) -> nn.Module:
    return Fp8TrainingLinear.from_linear(_linear(w))


def torchao_layer_class():
    """torchao's blockwise FP8 training layer (torchao >= 0.15: ``use_triton`` picks its GEMMs); ImportError else."""
    from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear

    if "use_triton" not in inspect.signature(Float8BlockwiseLinear.__init__).parameters:
        raise ImportError("this torchao's Float8BlockwiseLinear has no use_triton switch (torchao >= 0.15 has)")
    return Float8BlockwiseLinear


def _torchao(use_triton: bool) -> Prepare:
    def prepare(w: torch.Tensor) -> nn.Module:
        # from_float keeps the Parameter and sets use_triton=False (F.scaled_mm / torch._scaled_mm, cuBLASLt's
        # blockwise kernels); use_triton=True runs torchao's Triton GEMMs instead. Its quantizers are Triton in both.
        layer = torchao_layer_class().from_float(_linear(w))
        layer.use_triton = use_triton
        return layer

    return prepare


LAYER_PREPARE: dict[str, Prepare] = {BF16: _bf16, OURS: _ours, AO_CUBLAS: _torchao(False), AO_TRITON: _torchao(True)}


# --- the weight-gradient GEMM alone -------------------------------------------------------------------------------


class WgradOperands(NamedTuple):
    """dW [N, K] = dY^T [N, M] @ X [M, K], M the tokens: both operands FP8 with 1x128 scales along M."""

    dy_t: torch.Tensor  # FP8 [N, M_pad]
    dy_t_scale: torch.Tensor  # fp32 [N, M_pad/128], in the transposing quantizer's layout
    x_t: torch.Tensor  # FP8 [K, M_pad]
    x_t_scale: torch.Tensor  # fp32 [K, M_pad/128], in the transposing quantizer's layout
    dy: torch.Tensor  # the bf16 source [M, N]
    x: torch.Tensor  # the bf16 source [M, K]


def transposed_1x128(x: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, C] -> x^T in FP8 [C, M_pad] with fp32 [C, M_pad/128]: the bits of
    ``fp8gemm.training.quantize_with_transpose(x)``'s ``q_t, scale_t``, for any C (the untransposed half, which the
    weight gradient does not read, needs C a multiple of 128)."""
    m = x.shape[0]
    x_t = F.pad(x.float(), (0, 0, 0, padded_rows(m) - m)).t()
    q_t, scale_t = reference_quantize(x_t, fp8_dtype, False)
    return q_t, _in_quantizer_layout(scale_t)


def _in_quantizer_layout(scale_t: torch.Tensor) -> torch.Tensor:
    """``scale_t`` in the layout the backend's transposing quantizer writes (the one its weight-gradient GEMM reads in
    place, e.g. MN-major on sm90a), so the timed call is the call a training step makes, with no per-call scale copy."""
    backend, _, _ = backend_defaults(scale_t.device, None)
    if backend is None:
        return scale_t
    out, _ = empty_scale(*scale_t.shape, scale_t_layout(backend), scale_t.device)
    return out.copy_(scale_t)


def wgrad_operands(dy: torch.Tensor, x: torch.Tensor, fp8_dtype: torch.dtype) -> WgradOperands:
    """dY^T and X^T as ``fp8gemm.training.linear``'s backward makes them."""
    return WgradOperands(*transposed_1x128(dy, fp8_dtype), *transposed_1x128(x, fp8_dtype), dy, x)


def _w_ours(ops: WgradOperands):
    out = torch.empty(ops.dy_t.shape[0], ops.x_t.shape[0], dtype=torch.float32, device=ops.x.device)
    return lambda: gemm(ops.dy_t, ops.x_t, ops.dy_t_scale, ops.x_t_scale, out=out)


def _w_ours_acc(ops: WgradOperands):
    out = torch.zeros(ops.dy_t.shape[0], ops.x_t.shape[0], dtype=torch.float32, device=ops.x.device)

    def run():
        out.zero_()  # the check reads one product; the timing adds into a buffer that grows, as a main grad does
        gemm(ops.dy_t, ops.x_t, ops.dy_t_scale, ops.x_t_scale, out=out, accumulate=True)
        return out

    run.timed = lambda: gemm(ops.dy_t, ops.x_t, ops.dy_t_scale, ops.x_t_scale, out=out, accumulate=True)
    return run


def _x_t_in_blocks(ops: WgradOperands):
    """X^T [K, M] quantized in 128x128 blocks (the forward form's B), or a ValueError where M is not whole blocks."""
    if ops.x.shape[0] != ops.x_t.shape[1]:
        raise ValueError(f"the forward form contracts whole 128-token blocks; M = {ops.x.shape[0]} is not a multiple")
    return quantize_weight(ops.x.t().contiguous(), fp8_dtype=ops.x_t.dtype)


def _w_forward_form(ops: WgradOperands):
    """The forward's GEMM form on the same sizes: 1x128 scales on dY^T, X^T quantized in 128x128 blocks, bf16 out.
    Not the weight gradient (its numbers differ): the TFLOP/s the 1D1D form is held against."""
    b, b_scale = _x_t_in_blocks(ops)
    b_scale = prepare_weight_scale(b_scale)
    a_scale = ops.dy_t_scale.t().contiguous().t()  # MN-major, as quantize_activation returns it: no per-call copy
    out = torch.empty(ops.dy_t.shape[0], b.shape[0], dtype=torch.bfloat16, device=ops.x.device)
    return lambda: gemm(ops.dy_t, b, a_scale, b_scale, out=out)


def deep_gemm_module():
    import deep_gemm  # optional; a missing install is reported, not fatal

    if not hasattr(deep_gemm, "fp8_gemm_nt"):
        raise ImportError(f"this deep_gemm ({getattr(deep_gemm, '__version__', '?')}) has no fp8_gemm_nt")
    return deep_gemm


def _w_deepgemm(ops: WgradOperands):
    """DeepGEMM's sm90 1D1D kernel: ``fp8_gemm_nt((a, sfa), (b, sfb), d, c=d, recipe=(1, 1, 128))`` computes
    D = C + A B^T with float32 C and D (it asserts C is given), scales MN-major and TMA-aligned (converted here)."""
    dg = deep_gemm_module()
    sfa, sfb = deepgemm_mn_major(dg, ops.dy_t_scale), deepgemm_mn_major(dg, ops.x_t_scale)
    d = torch.zeros(ops.dy_t.shape[0], ops.x_t.shape[0], dtype=torch.float32, device=ops.x.device)

    def call():
        dg.fp8_gemm_nt((ops.dy_t, sfa), (ops.x_t, sfb), d, c=d, recipe=(1, 1, 128), disable_ue8m0_cast=True)
        return d

    def run():
        d.zero_()
        return call()

    run.timed = call
    return run


def _w_deepgemm_forward(ops: WgradOperands):
    """DeepGEMM's forward GEMM on the same sizes (its sm90 recipe (1, 128, 128): 1x128 scales on dY^T, X^T in 128x128
    blocks), bf16 out: the rate its own 1D1D kernel is held against, as our forward form is for ours."""
    dg = deep_gemm_module()
    b, b_scale = _x_t_in_blocks(ops)
    sfa = deepgemm_mn_major(dg, ops.dy_t_scale)
    out = torch.empty(ops.dy_t.shape[0], b.shape[0], dtype=torch.bfloat16, device=ops.x.device)

    def run():
        dg.fp8_gemm_nt((ops.dy_t, sfa), (b, b_scale), out, disable_ue8m0_cast=True)
        return out

    return run


def scaled_mm_1x128(a, b, a_scale, b_scale, out_dtype):
    """torch's cuBLASLt blockwise GEMM with 1x128 scales on both operands: ``a`` [M, K] row-major with ``a_scale``
    [M, K/128] M-major, ``b`` [K, N] column-major with ``b_scale`` [N, K/128] N-major. ``F.scaled_mm`` with
    ``ScalingType.BlockWise1x128`` (torch >= 2.10), else ``torch._scaled_mm``, which reads 1x128 from the scale shapes
    (``b``'s as [K/128, N])."""
    scaling = getattr(F, "ScalingType", None)
    if hasattr(F, "scaled_mm") and scaling is not None and hasattr(scaling, "BlockWise1x128"):
        kind = scaling.BlockWise1x128
        return F.scaled_mm(a, b, a_scale, kind, b_scale, kind, output_dtype=out_dtype)
    return torch._scaled_mm(a, b, a_scale, b_scale.t(), out_dtype=out_dtype)


def _w_scaled_mm(ops: WgradOperands):
    a, b = ops.dy_t, ops.x_t.t()  # [N, M] row-major, [M, K] column-major
    sa = ops.dy_t_scale.t().contiguous().t()  # [N, M/128], N-major
    sb = ops.x_t_scale.t().contiguous().t()  # [K, M/128], K-major
    out_dtype = torch.float32
    try:
        scaled_mm_1x128(a, b, sa, sb, out_dtype)
    except RuntimeError as exc:  # some builds take bf16 output only for blockwise scales
        if "output" not in str(exc).lower() and "dtype" not in str(exc).lower():
            raise
        out_dtype = torch.bfloat16
    run = lambda: scaled_mm_1x128(a, b, sa, sb, out_dtype)  # noqa: E731
    run.out_dtype = out_dtype
    return run


def _w_bf16(ops: WgradOperands):
    dy_t = ops.dy.t()  # the transpose read by cuBLAS, as autograd's mm backward does
    return lambda: torch.mm(dy_t, ops.x)


WGRAD_PREPARE: dict[str, Prepare] = {
    W_OURS: _w_ours,
    W_OURS_ACC: _w_ours_acc,
    W_FORWARD_FORM: _w_forward_form,
    W_DEEPGEMM: _w_deepgemm,
    W_DEEPGEMM_FORWARD: _w_deepgemm_forward,
    W_SCALED_MM: _w_scaled_mm,
    W_BF16: _w_bf16,
}


def why_not(check: Callable[[], object]) -> str | None:
    try:
        check()
    except Exception as exc:
        name = getattr(exc, "name", None)
        if isinstance(exc, ImportError) and name:
            return f"missing: {name.split('.')[0]} is not installed"
        return f"missing: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
    return None


def needs_sm90(device: torch.device) -> str | None:
    if device.type != "cuda":
        return f"not run: needs an sm_90 GPU, the device is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"not run: needs sm_90 (Hopper), this GPU is sm_{major}{minor}"
    return None


def missing_paths(device: torch.device) -> dict[str, str]:
    """Every path that cannot run on ``device`` here, with the reason; the rest are timed."""
    device = torch.device(device)
    missing: dict[str, str] = {}
    gpu = needs_sm90(device)
    ao = why_not(torchao_layer_class)
    for name in TORCHAO:
        if ao or gpu:
            missing[name] = ao or gpu
    dg = why_not(deep_gemm_module)
    if dg or gpu:
        missing[W_DEEPGEMM] = missing[W_DEEPGEMM_FORWARD] = dg or gpu
    if device.type != "cuda":
        missing[W_SCALED_MM] = "not run: cuBLASLt's blockwise scaled_mm needs an sm_90 GPU"
    elif gpu:
        missing[W_SCALED_MM] = gpu
    return missing
