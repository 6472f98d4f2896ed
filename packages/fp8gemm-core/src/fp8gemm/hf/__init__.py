"""fp8gemm for Hugging Face transformers: the interface of its fine-grained FP8 kernel (``matmul_2d``,
``matmul_batched``, ``matmul_grouped``, as ``kernels-community/finegrained-fp8`` exports them) on fp8gemm's ops,
``use_in_transformers()``, which makes transformers load it, and the experts implementation ``"fp8gemm"``
(``register_experts_implementation()``): transformers' FP8 experts as one ``fp8gemm.fused_experts`` call.
docs/transformers.md."""

from .experts import ExpertsFallbackWarning, fp8_experts_forward, register_experts_implementation
from .finegrained_fp8 import matmul_2d, matmul_batched, matmul_grouped
from .local_kernel import use_in_transformers

__all__ = ["ExpertsFallbackWarning", "fp8_experts_forward", "matmul_2d", "matmul_batched", "matmul_grouped",
           "register_experts_implementation", "use_in_transformers"]  # fmt: skip
