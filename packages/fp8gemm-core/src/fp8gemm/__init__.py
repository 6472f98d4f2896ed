"""fp8gemm: FP8 block-scaled GEMM (DeepSeek-V3 recipe), one binary package per GPU architecture.

``fp8gemm.gemm(a, b, a_scale, b_scale)`` runs the installed backend that fits the tensors' device
(see ``fp8gemm info``), or the pure-torch reference on CPU. Contract: docs/architecture.md.
"""

__version__ = "0.1.0"


def get_include() -> str:
    """The folder holding ``fp8gemm/backend.hpp``: the protocol's C++ side, for arch-package builds."""
    import os

    return os.path.join(os.path.dirname(__file__), "include")


from .layouts import from_kxm_layout  # noqa: E402
from .linear import linear  # noqa: E402
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
    "gemm",
    "get_include",
    "installed_backends",
    "linear",
    "preferred_fp8_dtype",
    "prepare_weight_scale",
    "quantize_activation",
    "quantize_weight",
    "select",
]
