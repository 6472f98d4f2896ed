"""fp8gemm: FP8 block-scaled GEMM (DeepSeek-V3 recipe), one binary package per GPU architecture.

``fp8gemm.gemm(a, b, a_scale, b_scale)`` runs the installed backend that fits the tensors' device
(see ``fp8gemm info``), or the pure-torch reference on CPU. Contract: docs/architecture.md.
"""

__version__ = "0.1.0"
TORCH_FLOOR = (2, 4)  # as the package metadata requires (torch>=2.4)
TORCH_HINT = (
    "fp8gemm needs torch >= 2.4. CUDA or CPU: `pip install torch` or `conda install -c conda-forge pytorch`. "
    "ROCm: `pip install torch --index-url https://download.pytorch.org/whl/rocm6.3` (conda-forge has no ROCm torch)."
)


def _require_torch() -> None:
    """Say what to install when torch is missing or too old: conda's fp8gemm-core constrains torch without
    installing it, since the ROCm build comes from PyTorch's own index."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(TORCH_HINT) from exc
    found = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if found < TORCH_FLOOR:
        raise ImportError(f"{TORCH_HINT} Found torch {torch.__version__}.")


_require_torch()


def get_cmake_dir() -> str:
    """The folder holding ``fp8gemm_arch_module.cmake``, the build every arch package's CMakeLists.txt includes."""
    import os

    return os.path.join(os.path.dirname(__file__), "cmake")


def get_include() -> str:
    """The folder holding ``fp8gemm/backend.hpp``: the protocol's C++ side, for arch-package builds."""
    import os

    return os.path.join(os.path.dirname(__file__), "include")


from . import nn as nn  # noqa: E402  (fp8gemm.nn: Fp8Linear, convert, checkpoints)
from . import training as training  # noqa: E402  (fp8gemm.training: quantizers with transposes, linear)
from .grouped import grouped_gemm, grouped_gemm_masked  # noqa: E402
from .layouts import from_kxm_layout  # noqa: E402
from .linear import linear  # noqa: E402
from .moe import fused_experts  # noqa: E402
from .ops import gemm, preferred_fp8_dtype, prepare_weight_scale  # noqa: E402
from .protocol import Backend, ScaleLayout  # noqa: E402
from .quantize import dequantize, quantize_activation, quantize_weight  # noqa: E402
from .registry import describe_device, installed_backends, select  # noqa: E402

__all__ = [
    "Backend",
    "ScaleLayout",
    "dequantize",
    "describe_device",
    "from_kxm_layout",
    "fused_experts",
    "gemm",
    "get_cmake_dir",
    "get_include",
    "grouped_gemm",
    "grouped_gemm_masked",
    "installed_backends",
    "linear",
    "preferred_fp8_dtype",
    "prepare_weight_scale",
    "quantize_activation",
    "quantize_weight",
    "select",
]
