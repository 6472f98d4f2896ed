"""An arch package's compiled module (fp8gemm/backend_module.hpp) as a `Backend`: what every backend.py shares."""

from __future__ import annotations

from types import ModuleType

from .protocol import Backend, ScaleLayout


def backend_from_module(
    module: ModuleType,
    *,
    name: str,
    package: str,
    version: str,
    fp8_dtype: str,
    a_scale_layout: ScaleLayout,
    b_scale_layout: ScaleLayout,
    priority: int = 0,
) -> Backend:
    """The Backend of `module`, an arch package's `_C`: its launch, workspace_bytes and optional quantize and linear entries, its
    build_info, and the platform and targets that build_info states (the targets a build was compiled for)."""
    info = dict(module.build_info())
    targets = tuple(t for t in info.get("targets", "").split(",") if t)
    if not targets:
        raise RuntimeError(f"{package}: its module's build_info() names no targets; rebuild the package")
    return Backend(
        name=name,
        platform="rocm" if targets[0].startswith("gfx") else "cuda",
        targets=targets,
        fp8_dtype=fp8_dtype,
        version=version,
        launch=module.launch,
        package=package,
        build_info=info,
        a_scale_layout=a_scale_layout,
        b_scale_layout=b_scale_layout,
        workspace_bytes=module.workspace_bytes,
        quantize=getattr(module, "quantize", None),
        linear=getattr(module, "linear", None),
        linear_workspace_bytes=getattr(module, "linear_workspace_bytes", None),
        priority=priority,
    )
