"""``Fp8Linear``: an inference ``nn.Linear`` with block-scaled FP8 weights, and FP8-format conversion."""

from __future__ import annotations

import torch
from torch import nn

from .. import registry
from ..linear import linear
from ..ops import prepare_weight_scale
from ..quantize import quantize_weight
from ..reference import BLOCK, FP8_DTYPES
from ..validation import ceil_div

_FN, _FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
_SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_linear_shape(in_features: int, out_features: int) -> str | None:
    """Why a layer of this shape cannot run on fp8gemm, or None when it can."""
    if in_features <= 0 or in_features % BLOCK:
        return f"in_features (K = {in_features}) is not a positive multiple of {BLOCK}"
    if out_features <= 0 or out_features % 16:
        return f"out_features (N = {out_features}) is not a positive multiple of 16"
    return None


def required_fp8_dtype(device: torch.device) -> torch.dtype | None:
    """The FP8 dtype the backend for ``device`` insists on; None when any works (CPU reference, meta)."""
    if device.type == "meta":
        return None
    try:
        backend = registry.select(device).backend
    except RuntimeError:  # no backend for this GPU: keep the weights as they are; forward() says what is missing
        return None
    return getattr(torch, backend.fp8_dtype) if backend.fp8_dtype else None


def resolve_fp8_dtype(device, fp8_dtype: torch.dtype | None) -> tuple[torch.device, torch.dtype]:
    """The module's device (a ``with torch.device(...)`` context honoured) and its FP8 dtype: the one asked for, else
    the one the backend for that device insists on, else e4m3fn."""
    device = torch.empty(0, device=device).device
    required = required_fp8_dtype(device)
    fp8_dtype = fp8_dtype or required or _FN
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    if required is not None and fp8_dtype != required:
        raise ValueError(f"fp8_dtype={fp8_dtype}, but the backend for {device} takes {required}; omit fp8_dtype")
    return device, fp8_dtype


def prepared_scale(scale: torch.Tensor) -> torch.Tensor:
    """A weight scale ([ceil(N/128), K/128], or [E, ...] per expert) in the layout the backend for its device reads;
    unchanged where none applies (meta, or no backend for this GPU: the op names the package to install)."""
    if scale.device.type == "meta":
        return scale
    try:
        return prepare_weight_scale(scale)
    except RuntimeError:
        return scale


def to_fp8_dtype(
    weight: torch.Tensor, weight_scale: torch.Tensor, fp8_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-express block-scaled FP8 weights in ``fp8_dtype`` with the same dequantized values.

    e4m3fn -> e4m3fnuz (an e4m3fn checkpoint on gfx942) is exact: a bit pattern means half the value
    in e4m3fnuz (exponent bias 8, not 7), so the bits are kept and the scales doubled; 0x80 (-0 in
    e4m3fn, NaN in e4m3fnuz) becomes 0x00. vLLM's ``normalize_e4m3fn_to_e4m3fnuz`` does the same.
    e4m3fnuz -> e4m3fn converts values and keeps the scales: e4m3fnuz's range (240) fits, but below
    2^-6 e4m3fn's grid is twice as coarse, so those codes round to it (error <= 2^-10 * scale).
    """
    if weight.dtype not in FP8_DTYPES or fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"weight and fp8_dtype must be one of {FP8_DTYPES}, got {weight.dtype} and {fp8_dtype}")
    if weight.dtype == fp8_dtype:
        return weight, weight_scale
    bits = weight.view(torch.uint8)
    if weight.dtype == _FN:
        if bool(((bits & 0x7F) == 0x7F).any()):
            raise ValueError("weight holds NaN (e4m3fn 0x7F/0xFF); a quantized checkpoint never should")
        bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
        return bits.view(_FNUZ), weight_scale * 2
    if bool((bits == 0x80).any()):
        raise ValueError("weight holds NaN (e4m3fnuz 0x80); a quantized checkpoint never should")
    return weight.float().to(_FN), weight_scale


class Fp8Linear(nn.Module):
    """``y = x @ W^T + bias`` with ``W`` stored as FP8 [N, K] plus one fp32 scale per 128x128 block.

    Inference only (no gradients). ``forward`` is one ``fp8gemm.linear`` call: the activation is
    quantized per token per 128 of K (``pow2_scales``: power-of-two scales, the UE8M0 recipe) and
    multiplied on the backend for its device; the output has ``x``'s dtype. Buffers, named as in
    DeepSeek-V3 / Qwen3-FP8 checkpoints:

    * ``weight``: FP8 [out_features, in_features] (``fp8_dtype``, default: what the backend for
      ``device`` takes; e4m3fn on CPU and CUDA, e4m3fnuz on gfx942).
    * ``weight_scale_inv``: fp32 [ceil(N/128), K/128], the dequantization multiplier
      (``W ~= weight * scale``; "inv" because it is 1/quantization scale). Held in the layout the
      backend reads (``fp8gemm.prepare_weight_scale``); ``state_dict`` saves it row-major.
    * ``bias``: [out_features] in ``dtype``, or None.

    Loading a state dict converts e4m3fn weights to this layer's FP8 dtype (``to_fp8_dtype``) and
    quantizes floating-point weights that come without a scale. Moving the layer to another device
    re-prepares the scale layout for that device's backend (and converts to its FP8 dtype).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
        fp8_dtype: torch.dtype | None = None,
        pow2_scales: bool = False,
    ):
        super().__init__()
        problem = check_linear_shape(in_features, out_features)
        if problem:
            raise ValueError(f"Fp8Linear: {problem}; keep such layers as nn.Linear (fp8gemm.nn.convert does)")
        if dtype not in _SOURCE_DTYPES:
            raise TypeError(f"dtype (the bias dtype) must be one of {_SOURCE_DTYPES}, got {dtype}")
        device, fp8_dtype = resolve_fp8_dtype(device, fp8_dtype)
        self.in_features, self.out_features, self.pow2_scales = in_features, out_features, bool(pow2_scales)
        scale_shape = (ceil_div(out_features, BLOCK), in_features // BLOCK)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=fp8_dtype, device=device))
        self.register_buffer("weight_scale_inv", prepared_scale(torch.ones(scale_shape, device=device)))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, *, fp8_dtype: torch.dtype | None = None, pow2_scales: bool = False
    ) -> Fp8Linear:
        """Quantize ``linear``'s weight (``fp8gemm.quantize_weight``) into a new layer on its device.

        ``pow2_scales`` rounds every weight and activation scale up to a power of two (UE8M0, the
        DeepSeek-V3.1 recipe). A ``linear`` on the meta device gives an empty layer, ready for
        ``load_state_dict``.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        dtype = weight.dtype if weight.dtype in _SOURCE_DTYPES else torch.bfloat16
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    device=weight.device, dtype=dtype, fp8_dtype=fp8_dtype, pow2_scales=pow2_scales)  # fmt: skip
        if weight.device.type != "meta":
            q, scale = quantize_weight(weight, fp8_dtype=layer.weight.dtype, pow2_scales=pow2_scales)
            layer.weight, layer.weight_scale_inv = q, prepared_scale(scale)
            if linear.bias is not None:
                layer.bias = linear.bias.detach().to(dtype, copy=True)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the buffers from their dict: Module.__getattr__ costs ~1.5 us per name on a slow host, per call
        buffers = self._buffers
        try:
            weight, scale, bias = buffers["weight"], buffers["weight_scale_inv"], buffers["bias"]
        except KeyError:  # one made a Parameter (or a plain attribute) since: wherever it is now
            weight, scale, bias = self.weight, self.weight_scale_inv, self.bias
        return linear(x, weight, scale, bias, pow2_scales=self.pow2_scales)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"fp8_dtype={self.weight.dtype}, weight_block=({BLOCK}, {BLOCK})"
            + (", pow2_scales=True" if self.pow2_scales else "")
        )

    # --- device moves and state dicts ---------------------------------------------------------------

    def _adapt_to_device(self) -> None:
        """FP8 dtype and scale layout the backend for the weight's device wants."""
        required = required_fp8_dtype(self.weight.device)
        if required is not None and self.weight.dtype != required:
            self.weight, self.weight_scale_inv = to_fp8_dtype(self.weight, self.weight_scale_inv, required)
        self.weight_scale_inv = prepared_scale(self.weight_scale_inv)

    def _apply(self, fn, recurse=True):
        weight, scale = self.weight, self.weight_scale_inv
        super()._apply(fn, recurse)
        # Module.to(dtype) / .half() cast every floating buffer, and FP8 counts as floating: undo that
        if self.weight.dtype != weight.dtype:
            self.weight = weight.to(self.weight.device)
        if self.weight_scale_inv.dtype != torch.float32:
            self.weight_scale_inv = scale.to(self.weight_scale_inv.device)
        self._adapt_to_device()
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight_scale_inv"
        destination[key] = destination[key].contiguous()  # canonical row-major, as checkpoints store it

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # fmt: skip
        weight_key, scale_key = prefix + "weight", prefix + "weight_scale_inv"
        if weight_key in state_dict:
            try:
                weight, scale = self._incoming(state_dict[weight_key], state_dict.get(scale_key))
            except (TypeError, ValueError) as exc:
                error_msgs.append(f"{prefix or 'Fp8Linear.'}weight: {exc}")
                return
            # load_state_dict works on its own copy of the dict: replacing entries is how a load hook adapts them
            state_dict[weight_key], state_dict[scale_key] = weight, scale
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)  # fmt: skip
        self._adapt_to_device()

    def _incoming(self, weight: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A checkpoint's (weight, scale) validated and in this layer's FP8 dtype."""
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"shape {tuple(weight.shape)} in the checkpoint, the layer is [N, K] = {list(expected)}")
        if weight.dtype not in FP8_DTYPES:
            if scale is not None:
                raise TypeError(f"weight_scale_inv comes with a {weight.dtype} weight; a scaled weight must be FP8")
            return quantize_weight(weight, fp8_dtype=self.weight.dtype)
        if scale is None:
            raise ValueError("an FP8 weight without its weight_scale_inv; load both tensors together")
        scale_shape = tuple(self.weight_scale_inv.shape)
        if tuple(scale.shape) != scale_shape or scale.dtype != torch.float32:
            raise ValueError(
                f"weight_scale_inv must be float32 {list(scale_shape)} (one scale per 128x128 block), got "
                f"{scale.dtype} {list(scale.shape)}; only 128x128 weight blocks are supported"
            )
        weight, scale = to_fp8_dtype(weight, scale, self.weight.dtype)
        if not weight.is_contiguous() or weight.data_ptr() % 16:  # safetensors may hand out unaligned views
            weight = weight.clone(memory_format=torch.contiguous_format)
        return weight, scale
