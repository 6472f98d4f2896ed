"""FP8 layers for PyTorch models: ``Fp8Linear``, ``Fp8Experts``, ``convert`` and FP8 checkpoint loading.

See docs/layer.md and docs/moe.md. Both layers are inference only; ``Fp8Linear.forward`` is one ``fp8gemm.linear``
call, ``Fp8Experts.forward`` one ``fp8gemm.fused_experts`` call.
"""

from .checkpoint import checkpoint_files, load_fp8_checkpoint
from .convert import DEFAULT_SKIP, ConversionReport, ReferenceOnCpuWarning, convert, is_fused_experts
from .experts import Fp8Experts
from .layer import Fp8Linear, to_fp8_dtype

__all__ = [
    "DEFAULT_SKIP",
    "ConversionReport",
    "Fp8Experts",
    "Fp8Linear",
    "ReferenceOnCpuWarning",
    "checkpoint_files",
    "convert",
    "is_fused_experts",
    "load_fp8_checkpoint",
    "to_fp8_dtype",
]
