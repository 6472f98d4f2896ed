"""The arch package's `_C` in a kernel-builder build of fp8gemm (ci/build_hub.py copies this file into
fp8gemm/_bundled/<arch>/): the same names as the pybind11 module (fp8gemm/backend_module.hpp), each calling the op
`<arch>__<name>` that the op library's Torch binding registered (ci/hub/torch_binding.cpp, hub_shim/pybind11). An op
library built without this arch (another backend's build) makes this import fail, which the core's registry reports."""

import json as _json

from ...._ops import ops as _ops  # the variant's generated _ops.py (kernel-builder): torch.ops.<extension>

_ARCH = __package__.rsplit(".", 1)[-1]

try:
    _ENTRIES = _json.loads(getattr(_ops, f"{_ARCH}__entries")())
except (AttributeError, RuntimeError) as error:
    raise ImportError(f"this build of fp8gemm's op library holds no {_ARCH} (it holds {_ops.arches()})") from error


def _entry(name: str, kind: str):
    op = getattr(_ops, f"{_ARCH}__{name}")
    if kind != "json":
        return op

    def call(*args):
        return _json.loads(op(*args))

    call.__name__ = name
    return call


globals().update({name: _entry(name, kind) for name, kind in _ENTRIES.items()})
