"""An arch package's native ops: its ``_native_ops`` library (``fp8gemm/csrc/native_ops.cpp``, built where the
build had torch >= 2.10) registers ``torch.ops.<package>.linear``, ``gemm``, ``gemm_out``, ``quantize_activation``,
``fused_experts``, ``grouped_gemm``, ``grouped_gemm_out``, ``grouped_gemm_row_ids``, ``grouped_gemm_row_ids_out``,
``grouped_gemm_masked``, ``grouped_gemm_masked_out`` and
the training ops ``quantize_transposed``, ``wgrad``, ``wgrad_out``, ``linear_forward`` and ``linear_backward`` in C++
on PyTorch's stable ABI. They take the steady-state call in one C++ call (checks, allocation, stream, launches) and
raise an error starting with :data:`NATIVE_MISS` on anything else; the public ops then run their Python planner,
which handles the call or raises the precise error.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch

from .protocol import K_MAJOR, MN_MAJOR, ScaleLayout

NATIVE_MISS = "fp8gemm native path: "  # native_ops.cpp's kMiss
MIN_TORCH = (2, 10)  # the library's TORCH_TARGET_VERSION
LIBRARY_NAME = "_native_ops.so"


class NativeOps(NamedTuple):
    """The bound ops of one arch package (``torch.ops.<package>.<name>.default``)."""

    linear: object  # (x, weight, weight_scale, pow2_scales) -> y
    gemm: object  # (a, b, a_scale, b_scale, fp32_out) -> out
    gemm_out: object  # (a, b, a_scale, b_scale, out) -> None
    quantize_activation: object  # (x, pow2_scales) -> (q, scale)
    fused_experts: object  # (x, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, pow2_scales) -> out
    grouped_gemm_masked: object  # (a, b, a_scale, b_scale, masked_m, expected_m, fp32_out) -> out
    grouped_gemm_masked_out: object  # (a, b, a_scale, b_scale, masked_m, expected_m, out) -> None
    grouped_gemm: object  # (a, b, a_scale, b_scale, offs, check_offs, fp32_out) -> out
    grouped_gemm_out: object  # (a, b, a_scale, b_scale, offs, check_offs, out) -> None
    grouped_gemm_row_ids: object  # (a, b, a_scale, b_scale, m_indices, fp32_out) -> out
    grouped_gemm_row_ids_out: object  # (a, b, a_scale, b_scale, m_indices, out) -> None
    quantize_transposed: object  # (x, pow2_scales, blocks) -> (q, scale, q_t, scale_t)
    wgrad: object  # (a, b, a_scale, b_scale per row, fp32_out) -> out
    wgrad_out: object  # (a, b, a_scale, b_scale per row, out, accumulate) -> None
    linear_forward: object  # (x, weight, pow2_scales) -> (y, x_q_t, x_scale_t, w_q_t, w_scale_t)
    linear_backward: object  # (dy, x_q_t, x_scale_t, w_q_t, w_scale_t, pow2_scales, dw_fp32) -> (dx, dw)


_loaded: dict[str, Path] = {}  # namespace -> the library that registered it (one per process)


def torch_version() -> tuple[int, int]:
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def load_native_ops(module: ModuleType, fp8_dtype: str, a_scale_layout: ScaleLayout,
                    b_scale_layout: ScaleLayout) -> tuple[NativeOps | None, str]:  # fmt: skip
    """The native ops of the arch module ``module`` (its package's ``_C``) bound to its entries, and a status line for
    ``fp8gemm info``; (None, why) where there are none to use."""
    if not hasattr(module, "native_entries") or not getattr(module, "__file__", None):
        return None, "no (an arch module without native entries)"
    package = module.__name__.rpartition(".")[0]
    library = Path(module.__file__).with_name(LIBRARY_NAME)
    if not library.exists():
        return None, "no (built without torch >= 2.10)"
    if torch_version() < MIN_TORCH or not torch.cuda.is_available():
        return None, f"no (needs a GPU build of torch >= {'.'.join(map(str, MIN_TORCH))})"
    if (a_scale_layout.order, b_scale_layout.order) != (MN_MAJOR, K_MAJOR) or (
        a_scale_layout.ld_multiple != module.a_scale_ld_multiple()
    ):
        return None, "no (the backend's scale layouts are not the ones native_ops.cpp reads)"
    holder = _loaded.get(package)
    if holder is not None and holder != library:
        return None, f"no (another build of {package} registered them in this process: {holder})"
    try:
        if holder is None:
            torch.ops.load_library(str(library))
            _loaded[package] = library
        ops = getattr(torch.ops, package)
        ops.bind(module.native_entries(), int(fp8_dtype == "float8_e4m3fnuz"), b_scale_layout.ld_multiple)
        if hasattr(module, "native_training_entries"):  # else the training ops decline every call
            ops.bind_training(module.native_training_entries())
    except (OSError, RuntimeError) as error:
        return None, f"no ({library.name} did not load: {error})"
    bound = NativeOps(*(getattr(ops, name).default for name in NativeOps._fields))
    return bound, f"yes (torch.ops.{package})"


# The dispatcher's words when no kernel of the op takes the arguments' devices: a CPU tensor (its message's start), a
# meta one (after the op's name).
COULD_NOT_RUN, META_MISS = "Could not run", "attempted to run this operator with Meta tensors"


def reraise_unless_miss(error: RuntimeError) -> None:
    """Re-raise ``error`` unless a native op declined the call (the Python planner then takes it). A
    NotImplementedError is the dispatcher's: an argument on another device (meta, CPU) sent the call past the op's
    CUDA kernel, and the planner's checks name that argument."""
    text = str(error)
    dispatched_away = isinstance(error, NotImplementedError) and (text.startswith(COULD_NOT_RUN) or META_MISS in text)
    if not dispatched_away and not str(error).startswith(NATIVE_MISS):
        raise error
