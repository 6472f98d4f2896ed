"""``Fp8TrainingLinear``: an ``nn.Linear`` trained with its three GEMMs in FP8 (``fp8gemm.training.linear``)."""

from __future__ import annotations

import torch
from torch import nn

from ..reference import BLOCK
from ..training.linear import linear as training_linear


def check_training_shape(in_features: int, out_features: int) -> str | None:
    """Why a layer of this shape cannot train on fp8gemm, or None when it can: the forward contracts over K and the
    input gradient over N, each in 128-wide blocks."""
    for name, size in (("in_features (K", in_features), ("out_features (N", out_features)):
        if size <= 0 or size % BLOCK:
            return f"{name} = {size}) is not a positive multiple of {BLOCK}"
    return None


class Fp8TrainingLinear(nn.Linear):
    """``nn.Linear`` whose forward and backward GEMMs run in FP8 (DeepSeek-V3 recipe, docs/training.md).

    It holds the high-precision master ``weight`` and ``bias`` Parameters as ``nn.Linear`` does (so optimizers,
    state dicts and weight decay see an ordinary layer) and quantizes the weight on every forward:
    ``forward(x) = fp8gemm.training.linear(x, weight, bias)``. ``pow2_scales``: power-of-two scales (UE8M0).
    in_features and out_features must be multiples of 128.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        pow2_scales: bool = False,
    ):
        problem = check_training_shape(in_features, out_features)
        if problem:
            raise ValueError(
                f"Fp8TrainingLinear: {problem}; keep such layers as nn.Linear (fp8gemm.nn.convert(model, "
                f"training=True) does)"
            )
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.pow2_scales = bool(pow2_scales)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, pow2_scales: bool = False) -> Fp8TrainingLinear:
        """A layer holding ``linear``'s own ``weight`` and ``bias`` Parameters (not copies): an optimizer built on the
        model before the swap keeps training them."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        weight = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta",
                    dtype=weight.dtype, pow2_scales=pow2_scales)  # fmt: skip
        layer.weight, layer.bias = weight, linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return training_linear(x, self.weight, self.bias, pow2_scales=self.pow2_scales)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + ", fp8=(1x128 activations, 128x128 weights)"
            + (", pow2_scales=True" if self.pow2_scales else "")
        )
