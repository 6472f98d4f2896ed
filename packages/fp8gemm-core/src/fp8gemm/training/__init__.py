"""FP8 training: the quantizers with transposes and ``linear``, a differentiable FP8 linear layer; for mixtures of
experts the grouped quantizers (also of gathered rows and of SiLU-and-mul and its gradient, computed as they are
read), the k-grouped weight gradient ``kgrouped_wgrad`` and ``fused_experts``, a differentiable experts layer
(docs/training.md). Every dense GEMM goes through ``fp8gemm.gemm``; the weight-gradient form runs the backend's
``wgrad_launch`` where it has one, else the pure-torch reference. The experts' GEMMs go through the grouped GEMM and
``kgrouped_wgrad``, each the backend's kernel where it has one. ``reuse_quantized_weights()`` quantizes each master
weight once for the micro-batches of one optimizer step."""

from .experts import fused_experts
from .grouped_quantize import quantize_experts_with_transpose, quantize_grouped_with_transpose
from .grouped_sources import (
    quantize_gathered_with_transpose,
    quantize_swiglu_backward_with_transpose,
    quantize_swiglu_with_transpose,
)
from .grouped_wgrad import kgrouped_wgrad
from .linear import linear
from .quantize import Transposed, quantize_weight_with_transpose, quantize_with_transpose
from .weight_reuse import reuse_quantized_weights

__all__ = [
    "Transposed",
    "fused_experts",
    "kgrouped_wgrad",
    "linear",
    "quantize_experts_with_transpose",
    "quantize_gathered_with_transpose",
    "quantize_grouped_with_transpose",
    "quantize_swiglu_backward_with_transpose",
    "quantize_swiglu_with_transpose",
    "quantize_weight_with_transpose",
    "quantize_with_transpose",
    "reuse_quantized_weights",
]
