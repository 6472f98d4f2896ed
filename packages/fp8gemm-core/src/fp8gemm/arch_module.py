"""An arch package's compiled module (fp8gemm/backend_module.hpp) as a `Backend`: what every backend.py shares."""

from __future__ import annotations

from types import ModuleType

from .native import load_native_ops
from .protocol import MIRRORS, MN_MAJOR, PROTOCOL_VERSION, Backend, ScaleLayout


def check_protocol(module: ModuleType, package: str) -> None:
    """Refuse a binary built for another protocol version, or whose argument structs differ from the core's mirrors."""
    found = module.protocol_version() if hasattr(module, "protocol_version") else 0
    if found != PROTOCOL_VERSION:
        raise RuntimeError(
            f"{package} was built for fp8gemm backend protocol {found or 'before versions'}, and this fp8gemm-core "
            f"speaks protocol {PROTOCOL_VERSION}: install {package} and fp8gemm-core from the same release (or rebuild "
            f"{package} from source against this core)"
        )
    sizes = dict(module.args_sizes())
    for mirror in MIRRORS:
        if mirror.entry in sizes and sizes[mirror.entry] != mirror.size:
            raise RuntimeError(
                f"{package}: its {mirror.entry} arguments are {sizes[mirror.entry]} bytes, the core's mirror "
                f"{mirror.size}; the two were built from different fp8gemm/backend.hpp headers"
            )


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
    grouped_layouts: tuple[int, ...] = (),
    wgrad_b_scale_layout: ScaleLayout | None = None,
) -> Backend:
    """The Backend of `module`, an arch package's `_C`: its launch, workspace_bytes and optional quantize, linear,
    grouped (``grouped_layouts``: the layouts its grouped kernel takes), moe step and weight-gradient entries
    (``wgrad_b_scale_layout``: the layout of the B scales its wgrad_launch reads; by default MN-major with the
    module's ``wgrad_b_scale_ld_multiple()`` where it has one), its
    build_info, and the platform and targets that build_info states (the targets a build was compiled for). A binary
    of another protocol is refused."""
    check_protocol(module, package)
    if wgrad_b_scale_layout is None and hasattr(module, "wgrad_b_scale_ld_multiple"):
        wgrad_b_scale_layout = ScaleLayout(MN_MAJOR, module.wgrad_b_scale_ld_multiple())
    info = dict(module.build_info())
    native, info["native_ops"] = load_native_ops(module, fp8_dtype, a_scale_layout, b_scale_layout)
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
        grouped_launch=getattr(module, "grouped_launch", None),
        grouped_layouts=grouped_layouts if hasattr(module, "grouped_launch") else (),
        grouped_workspace_bytes=getattr(module, "grouped_workspace_bytes", None),
        moe_route=getattr(module, "moe_route", None),
        moe_activation=getattr(module, "moe_activation", None),
        moe_combine=getattr(module, "moe_combine", None),
        moe_workspace_bytes=getattr(module, "moe_workspace_bytes", None),
        native=native,
        priority=priority,
        wgrad_launch=getattr(module, "wgrad_launch", None),
        wgrad_workspace_bytes=getattr(module, "wgrad_workspace_bytes", None),
        wgrad_b_scale_layout=wgrad_b_scale_layout if hasattr(module, "wgrad_launch") else None,
        quantize_transposed=getattr(module, "quantize_transposed", None),
        quantize_grouped_transposed=getattr(module, "quantize_grouped_transposed", None),
        kgrouped_wgrad_launch=getattr(module, "kgrouped_wgrad_launch", None),
        kgrouped_max_experts=module.kgrouped_max_experts() if hasattr(module, "kgrouped_wgrad_launch") else 0,
    )
