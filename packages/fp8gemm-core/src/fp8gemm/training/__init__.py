"""FP8 training: the quantizers with transposes and ``linear``, a differentiable FP8 linear layer
(docs/training.md). Every GEMM goes through ``fp8gemm.gemm``; the weight-gradient form runs the backend's
``wgrad_launch`` where it has one, else the pure-torch reference."""

from .linear import linear
from .quantize import Transposed, quantize_weight_with_transpose, quantize_with_transpose

__all__ = ["Transposed", "linear", "quantize_weight_with_transpose", "quantize_with_transpose"]
