"""FP8 layers for PyTorch models: ``Fp8Linear``, ``convert`` and FP8 checkpoint loading.

See docs/layer.md. ``Fp8Linear`` is inference only; its ``forward`` is one ``fp8gemm.linear`` call.
"""

from .checkpoint import checkpoint_files, load_fp8_checkpoint
from .convert import DEFAULT_SKIP, ConversionReport, ReferenceOnCpuWarning, convert
from .layer import Fp8Linear, to_fp8_dtype

__all__ = [
    "DEFAULT_SKIP",
    "ConversionReport",
    "Fp8Linear",
    "ReferenceOnCpuWarning",
    "checkpoint_files",
    "convert",
    "load_fp8_checkpoint",
    "to_fp8_dtype",
]
