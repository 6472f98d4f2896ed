"""The backend descriptor the core loads through the ``fp8gemm.backends`` entry point."""

from fp8gemm.arch_module import backend_from_module
from fp8gemm.protocol import ALL_GROUPED_LAYOUTS, K_MAJOR, MN_MAJOR, Backend, ScaleLayout

from . import __version__


def load() -> Backend:
    from . import _C  # an ImportError here is reported by `fp8gemm info`, not swallowed

    # A's scales: MN-major, leading dimension a multiple of the module's a_scale_ld_multiple() (csrc/module.cpp).
    # Grouped GEMMs: contiguous, masked and row-id layouts, one persistent launch each (csrc/grouped.cu; row ids: the
    # runs of m_indices found on the device, csrc/run_ring.cuh). The weight-gradient
    # entry's per-row B scales: MN-major like A's (csrc/wgrad_launch.cuh), multiple from wgrad_b_scale_ld_multiple().
    return backend_from_module(_C, name="sm90a", package="fp8gemm-cuda-sm90a", version=__version__,
                               fp8_dtype="float8_e4m3fn", a_scale_layout=ScaleLayout(MN_MAJOR, _C.a_scale_ld_multiple()),
                               b_scale_layout=ScaleLayout(K_MAJOR, 1), priority=10,
                               grouped_layouts=ALL_GROUPED_LAYOUTS)  # fmt: skip
