"""The backend descriptor the core loads through the ``fp8gemm.backends`` entry point."""

from fp8gemm.arch_module import backend_from_module
from fp8gemm.protocol import ALL_GROUPED_LAYOUTS, K_MAJOR, MN_MAJOR, Backend, ScaleLayout

from . import __version__


def load() -> Backend:
    from . import _C  # an ImportError here is reported by `fp8gemm info`, not swallowed

    # FP8 e4m3fnuz: MI300X's FP8 (max 240), what its MFMA FP8 instructions read. A's scales: MN-major, leading
    # dimension a multiple of the module's a_scale_ld_multiple() (csrc/module.cpp). Grouped GEMMs: contiguous, masked
    # and row-id layouts, one launch each (csrc/grouped.hip). The weight-gradient entries' B scales (wgrad_launch and
    # kgrouped_wgrad_launch): MN-major, the multiple from the module (backend_from_module's default).
    return backend_from_module(_C, name="gfx942", package="fp8gemm-rocm-gfx942", version=__version__,
                               fp8_dtype="float8_e4m3fnuz", a_scale_layout=ScaleLayout(MN_MAJOR, _C.a_scale_ld_multiple()),
                               b_scale_layout=ScaleLayout(K_MAJOR, 1),
                               grouped_layouts=ALL_GROUPED_LAYOUTS)  # fmt: skip
