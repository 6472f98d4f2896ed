"""The backend protocol: the one contract between fp8gemm-core and an arch package.

An arch package (``fp8gemm-cuda-sm90a``, ``fp8gemm-rocm-gfx942``, ...) registers an entry point in
the group ``fp8gemm.backends`` whose value is a :class:`Backend`, or a zero-argument callable that
returns one. The core never imports an arch package by name; it only loads entry points.

The compiled code behind ``Backend.launch`` takes raw device pointers, so arch binaries do not link
libtorch and one build works with any torch >= 2.4. See docs/architecture.md for the full contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

ENTRY_POINT_GROUP = "fp8gemm.backends"

# Layouts a kernel may ask for. The core converts caller scales into them (once, for weights,
# through fp8gemm.prepare_weight_scale).
K_MAJOR = "k_major"  # scale[row, kb] at row * ld + kb   (row-major [rows, K/128])
MN_MAJOR = "mn_major"  # scale[row, kb] at kb * ld + row  (column-major [rows, K/128])
SCALE_LAYOUTS = (K_MAJOR, MN_MAJOR)

OUT_BF16 = 0
OUT_FP32 = 1
IN_BF16 = 0
IN_FP16 = 1
IN_FP32 = 2


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
    """How a kernel wants one scale tensor laid out in memory.

    ``ld_multiple``: the leading dimension (elements) must be a multiple of this, e.g. 4 so that a
    column of an MN-major fp32 scale tensor is 16-byte aligned for TMA.
    """

    order: str = K_MAJOR
    ld_multiple: int = 1

    def __post_init__(self):
        if self.order not in SCALE_LAYOUTS:
            raise ValueError(f"ScaleLayout.order must be one of {SCALE_LAYOUTS}, got {self.order!r}")
        if self.ld_multiple < 1:
            raise ValueError(f"ScaleLayout.ld_multiple must be >= 1, got {self.ld_multiple}")


LaunchFn = Callable[..., None]
"""``launch(a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldout,
a_scale_ld, b_scale_ld, out_kind, stream)``; all ints, all positional.

* ``a``: FP8 [m, k], element (i, j) at ``a + i * lda + j``; ``b``: FP8 [n, k] likewise with ``ldb``.
* ``a_scale`` / ``b_scale``: fp32, in the backend's declared :class:`ScaleLayout` with leading
  dimension ``a_scale_ld`` / ``b_scale_ld`` (elements). ``b_scale`` has ``ceil(n/128)`` rows.
* ``out``: [m, n], element (i, j) at ``out + (i * ldout + j) * itemsize``; ``out_kind`` is
  ``OUT_BF16`` or ``OUT_FP32``.
* ``workspace``: ``workspace_bytes(m, n, k)`` bytes of device memory (0 when none was asked for),
  uninitialised; the backend owns its content for the duration of the launch.
* ``stream``: the ``cudaStream_t`` / ``hipStream_t`` to enqueue on (the caller's current stream).

The core guarantees before calling: m >= 1, n % 16 == 0, k % 128 == 0, every pointer 16-byte
aligned, ``lda``, ``ldb``, ``ldout`` are multiples of 16 bytes, and the scale layouts match. The
launch must be asynchronous, must not allocate, and must raise (not abort) on a launch error.
"""


QuantizeFn = Callable[..., None]
"""``quantize(x, q, scale, m, k, ldx, scale_ld, in_kind, pow2, stream)``; all ints, all positional.

One launch turns ``x`` ([m, k], row stride ``ldx`` elements, ``in_kind`` ``IN_BF16``/``IN_FP16``/``IN_FP32``)
into ``q`` (FP8 [m, k] contiguous, the backend's ``fp8_dtype``) and ``scale`` (fp32 [m, k/128] in the
backend's ``a_scale_layout``, leading dimension ``scale_ld``), bit-identical to
``fp8gemm.quantize_activation``'s reference. ``pow2`` (0/1) rounds scales up to powers of two. The core
guarantees m >= 1, k % 128 == 0, 16-byte aligned pointers and row stride; asynchronous like ``launch``.
"""


LinearFn = Callable[..., None]
"""``linear(x, b, b_scale, out, workspace, m, n, k, ldx, ldb, ldout, b_scale_ld, out_kind, in_kind, pow2, stream)``;
all ints, all positional.

One Linear layer: ``x`` as for :data:`QuantizeFn`, quantized exactly as ``quantize`` would, then the GEMM
with ``b``/``b_scale`` into ``out`` as for :data:`LaunchFn`; ``workspace`` holds
``linear_workspace_bytes(m, n, k, in_kind)`` bytes. The result is bit for bit that of ``quantize`` then
``launch`` (fp8gemm/backend_module.hpp ``define_two_step_linear_entry`` builds the entry from those two).
Guarantees as for ``launch`` and ``quantize``; asynchronous like them.
"""


def _no_workspace(m: int, n: int, k: int) -> int:
    return 0


@dataclasses.dataclass(frozen=True)
class Backend:
    """A kernel package as the core sees it."""

    name: str  # short, unique, used by FP8GEMM_BACKEND / backend=: "sm90a", "gfx942"
    platform: str  # "cuda" or "rocm"
    targets: tuple[str, ...]  # device targets the binary runs on: ("sm_90a",), ("gfx942",)
    fp8_dtype: str  # torch dtype name of the operands: "float8_e4m3fn" / "float8_e4m3fnuz"
    version: str
    launch: LaunchFn
    package: str = ""  # distribution that provides it, for messages
    build_info: Mapping[str, str] = dataclasses.field(default_factory=dict)
    a_scale_layout: ScaleLayout = ScaleLayout()
    b_scale_layout: ScaleLayout = ScaleLayout()
    workspace_bytes: Callable[[int, int, int], int] = _no_workspace
    priority: int = 0  # higher wins when several installed backends fit one device
    quantize: QuantizeFn | None = None  # optional activation-quantization kernel; else the reference runs
    linear: LinearFn | None = None  # optional: quantization + GEMM in one call (needs quantize)
    linear_workspace_bytes: Callable[[int, int, int, int], int] | None = None

    def __post_init__(self):
        if self.platform not in ("cuda", "rocm"):
            raise ValueError(f"Backend.platform must be 'cuda' or 'rocm', got {self.platform!r}")
        if not self.targets:
            raise ValueError(f"Backend {self.name!r} declares no targets")
        if not callable(self.launch):
            raise TypeError(f"Backend {self.name!r}: launch must be callable")
        if self.linear is not None and (self.quantize is None or not callable(self.linear_workspace_bytes)):
            raise TypeError(f"Backend {self.name!r}: a linear entry needs quantize and linear_workspace_bytes")
