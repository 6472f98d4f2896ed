"""Backend discovery (entry points) and selection (device target matching).

The core knows no arch by name: a device is described by the targets it can run (``sm_90a``,
``sm_90``; ``gfx942``) and a backend by the targets it was built for. Selection intersects the two.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os

import torch

from .protocol import ENTRY_POINT_GROUP, Backend
from .reference import REFERENCE, ReferenceBackend

ENV_VAR = "FP8GEMM_BACKEND"
# os.environ's own dict, which its setters keep current: read per call in one lookup, not os.environ.get's
# encoding of the key (1.5 us on a slow host, once per layer call)
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(ENV_VAR) if hasattr(os.environ, "encodekey") else ENV_VAR


def env_backend() -> str | None:
    """``$FP8GEMM_BACKEND``, or None where it is unset or empty."""
    if _ENVIRON_DATA is None:
        return os.environ.get(ENV_VAR) or None
    value = _ENVIRON_DATA.get(_ENV_KEY)
    return os.environ.decodevalue(value) or None if value else None


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the core needs to know of a device to pick a backend."""

    platform: str  # "cpu", "cuda" or "rocm"
    name: str
    targets: tuple[str, ...]  # best first
    arch: str = ""  # compute capability "9.0" or gcnArchName

    def describe(self) -> str:
        if self.platform == "cpu":
            return "CPU"
        return f"{self.name} ({self.platform}, arch {self.arch}, targets {'/'.join(self.targets)})"


@dataclasses.dataclass(frozen=True)
class InstalledBackend:
    """One entry point of the group, loaded or not."""

    entry_point: str  # "name = value"
    distribution: str
    backend: Backend | None
    error: str | None  # the loader's error when the binary or module failed to load

    @property
    def name(self) -> str:
        return self.backend.name if self.backend else self.entry_point.split("=")[0].strip()


def describe_device(device: torch.device | str) -> DeviceInfo:
    device = torch.device(device)
    if device.type == "cpu":
        return DeviceInfo("cpu", "CPU", ())
    if device.type != "cuda":
        raise RuntimeError(f"fp8gemm runs on CPU, CUDA and ROCm devices, not on {device.type!r}")
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        gcn = getattr(props, "gcnArchName", "") or ""
        return DeviceInfo("rocm", props.name, (gcn.split(":")[0],), gcn)
    cc = f"{props.major}{props.minor}"
    # Arch-specific ("a") code runs only on exactly this capability, so it is preferred when present.
    return DeviceInfo("cuda", props.name, (f"sm_{cc}a", f"sm_{cc}"), f"{props.major}.{props.minor}")


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> InstalledBackend:
    dist = ep.dist.name if getattr(ep, "dist", None) is not None else "?"
    label = f"{ep.name} = {ep.value}"
    try:
        obj = ep.load()
        backend = obj if isinstance(obj, Backend) else obj()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point gave {type(backend).__name__}, expected fp8gemm.protocol.Backend")
        if backend.name != ep.name:
            raise ValueError(f"entry point is named {ep.name!r} but its backend calls itself {backend.name!r}")
    except Exception as exc:  # any failure to load is reported, never silently skipped
        return InstalledBackend(label, dist, None, f"{type(exc).__name__}: {exc}")
    return InstalledBackend(label, dist, backend, None)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


@functools.lru_cache(maxsize=1)
def _discover() -> tuple[InstalledBackend, ...]:
    return tuple(_load_entry_point(ep) for ep in sorted(_entry_points(), key=lambda e: e.name))


_refresh_hooks: list = []


def on_refresh(hook) -> None:
    """Register a cache that must be dropped when the set of backends is re-read."""
    _refresh_hooks.append(hook)


def clear_caches() -> None:
    _discover.cache_clear()
    _select_cached.cache_clear()
    for hook in _refresh_hooks:
        hook()


def installed_backends(refresh: bool = False) -> tuple[InstalledBackend, ...]:
    """Every registered backend, including those whose binary failed to load (with the error)."""
    if refresh:
        clear_caches()
    return _discover()


def _installed_summary() -> str:
    rows = [
        f"{ib.name} ({'/'.join(ib.backend.targets)}, from {ib.distribution})"
        if ib.backend
        else f"{ib.name} (BROKEN, from {ib.distribution}: {ib.error})"
        for ib in installed_backends()
    ]
    return ", ".join(rows) if rows else "no arch package (they bring the GPU backends: docs/install.md)"


def _suggested_packages(info: DeviceInfo) -> str:
    # Package naming convention (docs/architecture.md): fp8gemm-<platform>-<target without '_'>.
    return " or ".join(f"fp8gemm-{info.platform}-{t.replace('_', '')}" for t in info.targets)


def _fits(backend: Backend, info: DeviceInfo) -> bool:
    return backend.platform == info.platform and bool(set(backend.targets) & set(info.targets))


def _rank(backend: Backend, info: DeviceInfo) -> tuple[int, int]:
    best_target = min(info.targets.index(t) for t in backend.targets if t in info.targets)
    return (best_target, -backend.priority)


@dataclasses.dataclass(frozen=True)
class Selection:
    backend: Backend | ReferenceBackend
    reason: str


def _select(info: DeviceInfo, requested: str | None) -> Selection:
    if requested == "reference":
        return Selection(REFERENCE, "requested by name")
    if requested:
        matches = [ib for ib in installed_backends() if ib.name == requested]
        if not matches:
            raise RuntimeError(
                f"fp8gemm backend {requested!r} is not installed. Installed: {_installed_summary()}, and 'reference' "
                f"(pure torch, any device). Pass one of those as backend= or ${ENV_VAR}, or leave both unset to "
                f"pick the best fit for the device"
            )
        ib = matches[0]
        if ib.backend is None:
            raise RuntimeError(f"fp8gemm backend {requested!r} is installed but failed to load: {ib.error}")
        if not _fits(ib.backend, info):
            raise RuntimeError(
                f"fp8gemm backend {requested!r} is built for {ib.backend.platform} "
                f"{'/'.join(ib.backend.targets)}, but the tensors are on {info.describe()}; "
                f"pick a backend for this device or move the tensors"
            )
        return Selection(ib.backend, "requested by name")
    if info.platform == "cpu":
        return Selection(REFERENCE, "CPU tensors run on the pure-torch reference")
    fitting = [ib.backend for ib in installed_backends() if ib.backend and _fits(ib.backend, info)]
    if not fitting:
        raise RuntimeError(
            f"No installed fp8gemm backend supports this device: {info.describe()}. "
            f"Installed backends: {_installed_summary()}. Install the package built for it "
            f"(conda install {_suggested_packages(info)}), or pass backend='reference' "
            f"(slow, pure torch)."
        )
    best = min(fitting, key=lambda b: _rank(b, info))
    return Selection(best, f"best match for {'/'.join(info.targets)} among {[b.name for b in fitting]}")


@functools.lru_cache(maxsize=64)
def _select_cached(device: torch.device, requested: str | None) -> Selection:
    return _select(describe_device(device), requested)


def select(device: torch.device | str, backend: str | None = None) -> Selection:
    """The backend that runs on ``device``: ``backend=``, then ``$FP8GEMM_BACKEND``, then the best fit."""
    requested = backend or env_backend()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _select_cached(device, requested)


def backend_defaults(device: torch.device, backend: str | None):
    """The backend that would run on ``device`` (None for the reference), its FP8 dtype and scale layout: what
    ``quantize_activation`` and ``quantize_weight`` default to."""
    try:
        chosen = select(device, backend).backend
    except RuntimeError:  # no backend for this GPU: plain defaults; gemm() will say what is missing
        return None, torch.float8_e4m3fn, None
    if chosen is REFERENCE:
        return None, torch.float8_e4m3fn, None
    return chosen, getattr(torch, chosen.fp8_dtype), chosen.a_scale_layout
