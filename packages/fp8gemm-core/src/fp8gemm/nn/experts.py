"""``Fp8Experts``: the routed experts of a mixture-of-experts block, FP8 with 128x128 block scales."""

from __future__ import annotations

import torch
from torch import nn

from ..moe import ACTIVATIONS, fused_experts
from ..quantize import quantize_weight
from ..reference import BLOCK, FP8_DTYPES
from .layer import prepared_scale, required_fp8_dtype, resolve_fp8_dtype, to_fp8_dtype

_SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # the per-expert names of checkpoints
# transformers' fused 3-D parameters (and its FP8 experts' scales) -> these buffers, accepted by load_state_dict
ALIASES = {"gate_up_proj": "w13", "down_proj": "w2"}


def check_experts_shape(num_experts: int, hidden_size: int, intermediate_size: int) -> str | None:
    """Why experts of this shape cannot run on fp8gemm, or None when they can."""
    if num_experts <= 0:
        return f"num_experts (E = {num_experts}) is not positive"
    if hidden_size <= 0 or hidden_size % BLOCK:
        return f"hidden size (H = {hidden_size}) is not a positive multiple of {BLOCK}"
    if intermediate_size <= 0 or intermediate_size % BLOCK:
        return f"intermediate size (I = {intermediate_size}) is not a positive multiple of {BLOCK}"
    return None


def quantize_experts(w: torch.Tensor, fp8_dtype: torch.dtype, pow2_scales: bool = False):
    """[E, N, K] float -> (FP8 [E, N, K], fp32 [E, ceil(N/128), K/128]): ``quantize_weight`` per expert."""
    pairs = [quantize_weight(w[e], fp8_dtype=fp8_dtype, pow2_scales=pow2_scales) for e in range(w.shape[0])]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


class Fp8Experts(nn.Module):
    """E experts ``down(act(gate(x)) * up(x))`` with FP8 weights; ``forward(x, topk_ids, topk_weights)`` is one
    ``fp8gemm.fused_experts`` call. Inference only. Buffers, named as FP8 checkpoints name scales:

    * ``w13``: FP8 [E, 2I, H], each expert's gate (first I rows) then up projection;
      ``w13_scale_inv``: fp32 [E, 2I/128, H/128], the dequantization multiplier per 128x128 block.
    * ``w2``: FP8 [E, H, I], the down projections; ``w2_scale_inv``: fp32 [E, H/128, I/128].

    Scales are kept in the layout the backend reads (``prepare_weight_scale``); ``state_dict`` saves them
    row-major. ``load_state_dict`` also takes transformers' fused names (``gate_up_proj``, ``down_proj`` and their
    ``_scale_inv``), converts e4m3fn to this module's FP8 dtype, and quantizes float weights that come without scales;
    ``fp8gemm.nn.load_fp8_checkpoint`` stacks per-expert checkpoint tensors into the buffers.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 device: torch.device | str | None = None, fp8_dtype: torch.dtype | None = None,
                 activation: str = "silu", pow2_scales: bool = False):  # fmt: skip
        super().__init__()
        problem = check_experts_shape(num_experts, hidden_size, intermediate_size)
        if problem:
            raise ValueError(f"Fp8Experts: {problem}; keep such experts in bf16 (fp8gemm.nn.convert does)")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        device, fp8_dtype = resolve_fp8_dtype(device, fp8_dtype)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.activation, self.pow2_scales = activation, bool(pow2_scales)
        e, h, i = num_experts, hidden_size, intermediate_size
        self.register_buffer("w13", torch.zeros(e, 2 * i, h, dtype=fp8_dtype, device=device))
        self.register_buffer("w13_scale_inv", prepared_scale(torch.ones(e, 2 * i // BLOCK, h // BLOCK, device=device)))
        self.register_buffer("w2", torch.zeros(e, h, i, dtype=fp8_dtype, device=device))
        self.register_buffer("w2_scale_inv", prepared_scale(torch.ones(e, h // BLOCK, i // BLOCK, device=device)))

    @classmethod
    def from_weights(cls, gate_up: torch.Tensor, down: torch.Tensor, *, fp8_dtype: torch.dtype | None = None,
                     activation: str = "silu", pow2_scales: bool = False) -> Fp8Experts:  # fmt: skip
        """Quantize float ``gate_up`` [E, 2I, H] and ``down`` [E, H, I] (transformers' fused expert parameters) into
        a new module on their device; on the meta device, an empty module ready for a checkpoint."""
        e, two_i, h = gate_up.shape
        if tuple(down.shape) != (e, h, two_i // 2):
            raise ValueError(f"down must be [E, H, I] = {[e, h, two_i // 2]} to match gate_up {tuple(gate_up.shape)}")
        module = cls(e, h, two_i // 2, device=gate_up.device, fp8_dtype=fp8_dtype, activation=activation,
                     pow2_scales=pow2_scales)  # fmt: skip
        if gate_up.device.type != "meta":
            dtype = module.w13.dtype
            module.w13, scale = quantize_experts(gate_up.detach(), dtype, pow2_scales)
            module.w13_scale_inv = prepared_scale(scale)
            module.w2, scale = quantize_experts(down.detach(), dtype, pow2_scales)
            module.w2_scale_inv = prepared_scale(scale)
        return module

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H] in x's dtype (or [..., H] with ids and weights [..., k])."""
        if x.dim() != 2 and x.dim() == topk_ids.dim() == topk_weights.dim():
            flat = (t.reshape(-1, t.shape[-1]) for t in (x, topk_ids, topk_weights))
            return self.forward(*flat).view(x.shape)
        return fused_experts(x, topk_ids, topk_weights, self.w13, self.w13_scale_inv, self.w2, self.w2_scale_inv,
                             activation=self.activation, pow2_scales=self.pow2_scales)  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, activation={self.activation!r}, fp8_dtype={self.w13.dtype}, "
            f"weight_block=({BLOCK}, {BLOCK})" + (", pow2_scales=True" if self.pow2_scales else "")
        )

    # --- one expert's projection, from a checkpoint --------------------------------------------------------------

    def load_expert(self, expert: int, projection: str, weight: torch.Tensor, scale: torch.Tensor | None) -> None:
        """Copy one expert's ``gate_proj`` / ``up_proj`` / ``down_proj`` weight (FP8 [N, K] with its
        ``weight_scale_inv``, or a float weight, quantized here) into its rows of ``w13`` or ``w2``."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is outside [0, E = {self.num_experts})")
        i = self.intermediate_size
        if projection == "down_proj":
            target, target_scale, rows = self.w2[expert], self.w2_scale_inv[expert], slice(None)
        elif projection in ("gate_proj", "up_proj"):
            first = projection == "gate_proj"
            rows = slice(0, i) if first else slice(i, 2 * i)
            target, target_scale = self.w13[expert, rows], self.w13_scale_inv[expert, rows.start // BLOCK : rows.stop // BLOCK]  # fmt: skip
        else:
            raise ValueError(f"unknown projection {projection!r}; expected one of {PROJECTIONS}")
        weight, scale = self._incoming(weight, scale, tuple(target.shape), tuple(target_scale.shape))
        target.copy_(weight)
        target_scale.copy_(scale)

    def _incoming(self, weight, scale, shape, scale_shape):
        """A checkpoint's (weight, scale) of ``shape`` validated and in this module's FP8 dtype."""
        if tuple(weight.shape) != shape:
            raise ValueError(f"shape {tuple(weight.shape)} in the checkpoint, the experts take {list(shape)}")
        if weight.dtype not in FP8_DTYPES:
            if scale is not None:
                raise TypeError(f"a scale comes with a {weight.dtype} weight; a scaled weight must be FP8")
            if weight.dim() == 3:
                return quantize_experts(weight, self.w13.dtype, self.pow2_scales)
            return quantize_weight(weight, fp8_dtype=self.w13.dtype, pow2_scales=self.pow2_scales)
        if scale is None:
            raise ValueError("an FP8 weight without its scale (weight_scale_inv); load both tensors together")
        if tuple(scale.shape) != scale_shape or scale.dtype != torch.float32:
            raise ValueError(
                f"the scale must be float32 {list(scale_shape)} (one per 128x128 block), got {scale.dtype} "
                f"{list(scale.shape)}; only 128x128 weight blocks are supported"
            )
        return to_fp8_dtype(weight, scale, self.w13.dtype)

    # --- device moves and state dicts ----------------------------------------------------------------------------

    def _adapt_to_device(self) -> None:
        required = required_fp8_dtype(self.w13.device)
        if required is not None and self.w13.dtype != required:
            self.w13, self.w13_scale_inv = to_fp8_dtype(self.w13, self.w13_scale_inv, required)
            self.w2, self.w2_scale_inv = to_fp8_dtype(self.w2, self.w2_scale_inv, required)
        self.w13_scale_inv, self.w2_scale_inv = prepared_scale(self.w13_scale_inv), prepared_scale(self.w2_scale_inv)

    def _apply(self, fn, recurse=True):
        before = {name: getattr(self, name) for name in ("w13", "w13_scale_inv", "w2", "w2_scale_inv")}
        super()._apply(fn, recurse)
        # Module.to(dtype) casts every floating buffer, and FP8 counts as floating: undo that
        for name, old in before.items():
            now = getattr(self, name)
            if now.dtype != old.dtype:
                setattr(self, name, old.to(now.device))
        self._adapt_to_device()
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("w13_scale_inv", "w2_scale_inv"):
            destination[prefix + name] = destination[prefix + name].contiguous()  # row-major, as checkpoints

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # fmt: skip
        for alias, name in ALIASES.items():
            if prefix + alias in state_dict:
                state_dict[prefix + name] = state_dict.pop(prefix + alias)
                if prefix + alias + "_scale_inv" in state_dict:
                    state_dict[prefix + name + "_scale_inv"] = state_dict.pop(prefix + alias + "_scale_inv")
        for name in ("w13", "w2"):
            key, scale_key = prefix + name, prefix + name + "_scale_inv"
            if key not in state_dict:
                continue
            target, target_scale = getattr(self, name), getattr(self, name + "_scale_inv")
            try:
                weight, scale = self._incoming(state_dict[key], state_dict.get(scale_key), tuple(target.shape),
                                               tuple(target_scale.shape))  # fmt: skip
            except (TypeError, ValueError) as exc:
                error_msgs.append(f"{prefix or 'Fp8Experts.'}{name}: {exc}")
                return
            if not weight.is_contiguous() or weight.data_ptr() % 16:  # safetensors may hand out unaligned views
                weight = weight.clone(memory_format=torch.contiguous_format)
            state_dict[key], state_dict[scale_key] = weight, scale
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)  # fmt: skip
        self._adapt_to_device()
