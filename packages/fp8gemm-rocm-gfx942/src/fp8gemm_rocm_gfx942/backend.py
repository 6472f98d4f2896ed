"""The backend descriptor the core loads through the ``fp8gemm.backends`` entry point."""

from fp8gemm.protocol import K_MAJOR, MN_MAJOR, Backend, ScaleLayout

from . import __version__


def load() -> Backend:
    from . import _C  # an ImportError here is reported by `fp8gemm info`, not swallowed

    info = dict(_C.build_info())
    return Backend(
        name="gfx942",
        platform="rocm",
        targets=("gfx942",),
        fp8_dtype="float8_e4m3fnuz",  # MI300X's FP8 (max 240), what its MFMA FP8 instructions read
        version=__version__,
        launch=_C.launch,
        package="fp8gemm-rocm-gfx942",
        build_info=info,
        a_scale_layout=ScaleLayout(MN_MAJOR, 4),  # a tile's row scales are contiguous per K block
        b_scale_layout=ScaleLayout(K_MAJOR, 1),
        workspace_bytes=_C.workspace_bytes,
    )
