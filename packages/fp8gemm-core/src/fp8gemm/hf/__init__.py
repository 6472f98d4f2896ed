"""fp8gemm for Hugging Face transformers: the interface of its fine-grained FP8 kernel (``matmul_2d``,
``matmul_batched``, ``matmul_grouped``, as ``kernels-community/finegrained-fp8`` exports them) on fp8gemm's ops, and
``use_in_transformers()``, which makes transformers load it. docs/transformers.md."""

from .finegrained_fp8 import matmul_2d, matmul_batched, matmul_grouped
from .local_kernel import use_in_transformers

__all__ = ["matmul_2d", "matmul_batched", "matmul_grouped", "use_in_transformers"]
