"""The backend descriptor the core loads through the ``fp8gemm.backends`` entry point."""

from fp8gemm.protocol import K_MAJOR, MN_MAJOR, Backend, ScaleLayout

from . import __version__


def load() -> Backend:
    from . import _C  # an ImportError here is reported by `fp8gemm info`, not swallowed

    info = dict(_C.build_info())
    return Backend(
        name="sm120",
        platform="cuda",
        targets=tuple(info["targets"].split(",")),
        fp8_dtype="float8_e4m3fn",
        version=__version__,
        launch=_C.launch,
        package="fp8gemm-cuda-sm120",
        build_info=info,
        # The kernel copies a tile's A scales with 16-byte cp.async: MN-major, columns 16-byte aligned.
        a_scale_layout=ScaleLayout(MN_MAJOR, 4),
        b_scale_layout=ScaleLayout(K_MAJOR, 1),
        workspace_bytes=_C.workspace_bytes,
        quantize=_C.quantize,
    )
