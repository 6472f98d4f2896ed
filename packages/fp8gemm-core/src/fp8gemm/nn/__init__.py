"""FP8 layers for PyTorch models: ``Fp8Linear``, ``Fp8Experts``, ``convert`` and FP8 checkpoint loading.

See docs/layer.md, docs/moe.md and docs/training.md. ``Fp8Linear`` and ``Fp8Experts`` are inference only
(``Fp8TrainingLinear`` and ``Fp8TrainingExperts`` train); ``Fp8Linear.forward`` is one ``fp8gemm.linear``
call, ``Fp8Experts.forward`` one ``fp8gemm.fused_experts`` call.
"""

from .checkpoint import checkpoint_files, load_fp8_checkpoint
from .convert import DEFAULT_SKIP, ConversionReport, ReferenceOnCpuWarning, convert, is_fused_experts
from .experts import Fp8Experts
from .layer import Fp8Linear, to_fp8_dtype
from .training import Fp8TrainingLinear
from .training_experts import Fp8TrainingExperts

__all__ = [
    "DEFAULT_SKIP",
    "ConversionReport",
    "Fp8Experts",
    "Fp8Linear",
    "Fp8TrainingExperts",
    "Fp8TrainingLinear",
    "ReferenceOnCpuWarning",
    "checkpoint_files",
    "convert",
    "is_fused_experts",
    "load_fp8_checkpoint",
    "to_fp8_dtype",
]
