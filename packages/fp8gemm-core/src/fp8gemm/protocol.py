"""The backend protocol: the one contract between fp8gemm-core and an arch package.

An arch package (``fp8gemm-cuda-sm90a``, ``fp8gemm-rocm-gfx942``, ...) registers an entry point in
the group ``fp8gemm.backends`` whose value is a :class:`Backend`, or a zero-argument callable that
returns one. The core never imports an arch package by name; it only loads entry points.

The compiled code behind ``Backend.launch`` takes raw device pointers, so arch binaries do not link
libtorch and one build works with any torch >= 2.4. Each entry takes one integer: the address of its argument
struct (``fp8gemm/backend.hpp``), packed through the struct's mirror below behind a {version, size} header; the
core refuses a binary of another :data:`PROTOCOL_VERSION` when it loads it. See docs/architecture.md.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
from collections.abc import Callable, Mapping

ENTRY_POINT_GROUP = "fp8gemm.backends"
PROTOCOL_VERSION = 3  # fp8gemm/backend.hpp's kProtocolVersion


class ArgsMirror:
    """The Python side of one argument struct of ``fp8gemm/backend.hpp`` (C layout, natural alignment), behind the
    header ``{uint32 version, uint32 size}``: ``pack(*fields)`` writes it into a buffer this thread owns and returns
    the address an entry takes. Codes: ``Q`` uintptr_t, ``q`` int64_t, ``i`` int."""

    def __init__(self, entry: str, fields: str):
        names, codes = zip(*(field.split(":") for field in fields.split()), strict=True)
        self.entry, self.fields = entry, names
        self._struct = struct.Struct("@II" + "".join(codes))
        self.size = self._struct.size
        self._local = threading.local()

    def pack(self, *values: int) -> int:
        """The address of this thread's copy of the struct holding ``values`` (every field, in order); valid until
        this thread packs this struct again. Entries read it during the call, so one buffer per thread suffices."""
        try:
            buffer, address = self._local.buffer
        except AttributeError:
            buffer = ctypes.create_string_buffer(self.size)
            address = ctypes.addressof(buffer)
            self._local.buffer = (buffer, address)
        self._struct.pack_into(buffer, 0, PROTOCOL_VERSION, self.size, *values)
        return address

    def unpack(self, address: int) -> dict[str, int]:
        """The fields behind ``address`` by name, header included (for backends written in Python, and tests)."""
        values = self._struct.unpack(ctypes.string_at(address, self.size))
        return dict(zip(("version", "size", *self.fields), values, strict=True))


LAUNCH_ARGS = ArgsMirror(
    "launch",
    "a:Q b:Q a_scale:Q b_scale:Q out:Q workspace:Q m:q n:q k:q lda:q ldb:q ldo:q a_scale_ld:q b_scale_ld:q "
    "out_kind:i stream:Q",
)
QUANTIZE_ARGS = ArgsMirror("quantize", "x:Q q:Q scale:Q m:q k:q ldx:q scale_ld:q in_kind:i pow2:i stream:Q")
LINEAR_ARGS = ArgsMirror(
    "linear",
    "x:Q b:Q b_scale:Q out:Q workspace:Q m:q n:q k:q ldx:q ldb:q ldo:q b_scale_ld:q out_kind:i in_kind:i pow2:i "
    "stream:Q",
)
GROUPED_ARGS = ArgsMirror(
    "grouped_launch",
    "a:Q b:Q a_scale:Q b_scale:Q out:Q workspace:Q group_rows:Q m:q n:q k:q groups:q lda:q ldb:q ldo:q a_scale_ld:q "
    "b_scale_ld:q a_group_stride:q b_group_stride:q out_group_stride:q a_scale_group_stride:q b_scale_group_stride:q "
    "expected_m:q layout:i out_kind:i stream:Q",
)
MOE_ROUTE_ARGS = ArgsMirror(
    "moe_route",
    "ids:Q x:Q q:Q scale:Q offs:Q position:Q workspace:Q tokens:q top_k:q experts:q hidden:q ldx:q scale_ld:q "
    "id_kind:i in_kind:i pow2:i stream:Q",
)
MOE_ACTIVATION_ARGS = ArgsMirror(
    "moe_activation", "h:Q q:Q scale:Q offs:Q experts:q inter:q rows:q ldh:q scale_ld:q pow2:i stream:Q"
)
MOE_COMBINE_ARGS = ArgsMirror(
    "moe_combine",
    "weights:Q position:Q y:Q out:Q tokens:q top_k:q hidden:q rows:q ldy:q ldo:q out_kind:i weight_kind:i y_kind:i "
    "stream:Q",
)
MOE_MIRRORS = (MOE_ROUTE_ARGS, MOE_ACTIVATION_ARGS, MOE_COMBINE_ARGS)
WGRAD_ARGS = ArgsMirror(
    "wgrad_launch",
    "a:Q b:Q a_scale:Q b_scale:Q out:Q workspace:Q m:q n:q k:q lda:q ldb:q ldo:q a_scale_ld:q b_scale_ld:q "
    "accumulate:i out_kind:i stream:Q",
)
QUANTIZE_TRANSPOSED_ARGS = ArgsMirror(
    "quantize_transposed",
    "x:Q q:Q scale:Q q_t:Q scale_t:Q m:q k:q m_t:q ldx:q scale_s0:q scale_s1:q scale_t_s0:q scale_t_s1:q in_kind:i "
    "pow2:i blocks:i q_t_group:q stream:Q",
)
QUANTIZE_GROUPED_TRANSPOSED_ARGS = ArgsMirror(
    "quantize_grouped_transposed",
    "x:Q q:Q scale:Q q_t:Q scale_t:Q offs:Q m:q k:q experts:q columns:q ldx:q scale_s0:q scale_s1:q scale_t_s0:q "
    "scale_t_s1:q in_kind:i pow2:i index:Q row_weight:Q gate_up:Q source_rows:q ld_gate_up:q source:i gate_up_kind:i "
    "stream:Q",
)
KGROUPED_WGRAD_ARGS = ArgsMirror(
    "kgrouped_wgrad_launch",
    "a:Q b:Q a_scale:Q b_scale:Q out:Q offs:Q m:q n:q k:q experts:q lda:q ldb:q ldo:q out_es:q a_scale_ld:q "
    "b_scale_ld:q accumulate:i out_kind:i stream:Q",
)
TRAINING_MIRRORS = (WGRAD_ARGS, QUANTIZE_TRANSPOSED_ARGS, QUANTIZE_GROUPED_TRANSPOSED_ARGS, KGROUPED_WGRAD_ARGS)
MIRRORS = (LAUNCH_ARGS, QUANTIZE_ARGS, LINEAR_ARGS, GROUPED_ARGS, *MOE_MIRRORS, *TRAINING_MIRRORS)

# Grouped layouts (fp8gemm/backend.hpp GroupedLayout).
GROUPED_CONTIGUOUS = 0  # rows grouped by expert; group_rows: int32 [groups] cumulative row ends
GROUPED_MASKED = 1  # [groups, m, k]; group_rows: int32 [groups] rows computed per group
GROUPED_ROW_IDS = 2  # group_rows: int32 [m] each row's group, -1 for a row not written
ALL_GROUPED_LAYOUTS = (GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS)  # what a complete grouped kernel takes

# What fused_experts' step kernels take (fp8gemm/moe_steps.cuh).
MOE_MAX_EXPERTS = 1024  # kMoeMaxExperts
MOE_MAX_TOP_K = 1024  # kMoeChunkSlots: a route block holds whole tokens

# Layouts a kernel may ask for. The core converts caller scales into them (once, for weights,
# through fp8gemm.prepare_weight_scale).
K_MAJOR = "k_major"  # scale[row, kb] at row * ld + kb   (row-major [rows, K/128])
MN_MAJOR = "mn_major"  # scale[row, kb] at kb * ld + row  (column-major [rows, K/128])
SCALE_LAYOUTS = (K_MAJOR, MN_MAJOR)

# What the grouped transposing quantizer's rows are (fp8gemm/backend.hpp RowSourceKind).
SOURCE_ROWS = 0  # x's rows
SOURCE_GATHER = 1  # x[index[r]] (times row_weight[r])
SOURCE_SWIGLU = 2  # silu(h[r, :k]) * h[r, k:]
SOURCE_SWIGLU_BACKWARD = 3  # that product's gradient from d [m, k/2] and h [m, k]

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


LaunchFn = Callable[[int], None]
"""``launch(LAUNCH_ARGS.pack(a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldout, a_scale_ld,
b_scale_ld, out_kind, stream))``: the fields are integers.

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


QuantizeFn = Callable[[int], None]
"""``quantize(QUANTIZE_ARGS.pack(x, q, scale, m, k, ldx, scale_ld, in_kind, pow2, stream))``.

One launch turns ``x`` ([m, k], row stride ``ldx`` elements, ``in_kind`` ``IN_BF16``/``IN_FP16``/``IN_FP32``)
into ``q`` (FP8 [m, k] contiguous, the backend's ``fp8_dtype``) and ``scale`` (fp32 [m, k/128] in the
backend's ``a_scale_layout``, leading dimension ``scale_ld``), bit-identical to
``fp8gemm.quantize_activation``'s reference. ``pow2`` (0/1) rounds scales up to powers of two. The core
guarantees m >= 1, k % 128 == 0, 16-byte aligned pointers and row stride; asynchronous like ``launch``.
"""


LinearFn = Callable[[int], None]
"""``linear(LINEAR_ARGS.pack(x, b, b_scale, out, workspace, m, n, k, ldx, ldb, ldout, b_scale_ld, out_kind, in_kind,
pow2, stream))``.

One Linear layer: ``x`` as for :data:`QuantizeFn`, quantized exactly as ``quantize`` would, then the GEMM
with ``b``/``b_scale`` into ``out`` as for :data:`LaunchFn`; ``workspace`` holds
``linear_workspace_bytes(m, n, k, in_kind)`` bytes. The result is bit for bit that of ``quantize`` then
``launch`` (fp8gemm/backend_module.hpp ``define_two_step_linear_entry`` builds the entry from those two).
Guarantees as for ``launch`` and ``quantize``; asynchronous like them.
"""


GroupedFn = Callable[[int], None]
"""``grouped_launch(GROUPED_ARGS.pack(...))``: ``groups`` GEMMs in one launch, in one of the grouped layouts the
backend declares in ``grouped_layouts`` (``fp8gemm/backend.hpp`` GroupedArgs gives every field). Values in
``group_rows`` are read by the device alone; a kernel clamps them and never reads or writes outside the tensors.
"""


MoeStepFn = Callable[[int], None]
"""The step kernels of ``fused_experts``' pipeline (``fp8gemm/moe_steps.cuh``), one entry and struct each:
``moe_route(MOE_ROUTE_ARGS.pack(...))`` (route + quantize-scatter; two launches, three when the tokens span more than
one block of 1024 slots), ``moe_activation(MOE_ACTIVATION_ARGS.pack(...))`` (SiLU-and-mul + quantize) and
``moe_combine(MOE_COMBINE_ARGS.pack(...))``; ``fp8gemm/backend.hpp`` MoeRouteArgs, MoeActivationArgs and MoeCombineArgs
give every field. FP8 codes and scales equal ``quantize_activation``'s; values the device reads (ids, offs, positions)
are clamped, never read or written outside the tensors.
"""


WgradFn = Callable[[int], None]
"""``wgrad_launch(WGRAD_ARGS.pack(a, b, a_scale, b_scale, out, workspace, m, n, k, lda, ldb, ldout, a_scale_ld,
b_scale_ld, accumulate, out_kind, stream))``: the weight-gradient GEMM, both operands with 1x128 scales along the contracted K
(the tokens), ``out[m, n] (+)= sum_k a[m, k] b[n, k] a_scale[m, k // 128] b_scale[n, k // 128]``.

* ``a``, ``b``, ``workspace``, ``stream``: as for :data:`LaunchFn` (``workspace``: ``wgrad_workspace_bytes(m, n, k)``).
* ``a_scale``: fp32 [m, k/128] in the backend's ``a_scale_layout``; ``b_scale``: fp32 [n, k/128], one per row of
  ``b``, in its ``wgrad_b_scale_layout``; leading dimensions ``a_scale_ld`` / ``b_scale_ld``.
* ``out``: [m, n], ``out_kind`` ``OUT_FP32`` or ``OUT_BF16`` (the fp32 product rounded once), element (i, j) at
  ``out + (i * ldout + j) * itemsize``. ``accumulate`` 0 writes it, 1 adds the product (computed in fp32 first) into
  what it holds (``OUT_FP32`` only).

Guarantees as for ``launch`` (k a multiple of 128: the training quantizers zero-pad a token count that is not);
asynchronous like it. Optional: without it (or for operands outside its layouts) the core runs the reference.
"""


QuantizeTransposedFn = Callable[[int], None]
"""``quantize_transposed(QUANTIZE_TRANSPOSED_ARGS.pack(x, q, scale, q_t, scale_t, m, k, m_t, ldx, scale_s0, scale_s1,
scale_t_s0, scale_t_s1, in_kind, pow2, blocks, q_t_group, stream))``: one read of ``x`` ([m, k] as for :data:`QuantizeFn`)
writes it in FP8 twice, ``q`` [m, k] and its transpose ``q_t`` [k, m_t] (both contiguous; m <= m_t, m_t % 16 == 0,
columns past m quantized from zeros), bit-identical to ``fp8gemm.training``'s reference. With ``q_t_group`` (a
multiple of 128 dividing m_t; 0: one matrix) ``q_t`` is m_t / q_t_group matrices [k, q_t_group] one after another.

* ``blocks`` 0 (activations, output gradients): ``q`` with 1x128 scales along k, exactly ``quantize``'s codes and
  scales, scale (row, k block) at ``scale + (row * scale_s0 + kb * scale_s1) * 4``; ``q_t`` with 1x128 scales along m,
  (column, row block) at ``scale_t + (c * scale_t_s0 + rb * scale_t_s1) * 4``.
* ``blocks`` 1 (weights, m_t = m): one scale per 128x128 tile, ``quantize_weight``'s, (row block, k block) in
  ``scale`` and (k block, row block) in ``scale_t``; ``q_t`` is ``q`` transposed.

Guarantees as for ``quantize``; asynchronous like it. Optional: without it the core runs the reference.
"""


QuantizeGroupedTransposedFn = Callable[[int], None]
"""``quantize_grouped_transposed(QUANTIZE_GROUPED_TRANSPOSED_ARGS.pack(x, q, scale, q_t, scale_t, offs, m, k,
experts, columns, ldx, scale_s0, scale_s1, scale_t_s0, scale_t_s1, in_kind, pow2, index, row_weight, gate_up, source_rows,
ld_gate_up, source, gate_up_kind, stream))``: one read of ``x`` ([m, k]
as for :data:`QuantizeFn`, rows sorted by expert; ``offs`` int32 [experts] cumulative row ends, read on the device and
each clamped to [previous end, m]) writes ``q`` [m, k] with 1x128 scales along k, exactly ``quantize``'s codes for
every row, scale (row, k block) at ``scale + (row * scale_s0 + kb * scale_s1) * 4``, and x^T ``q_t`` [k, columns]
(contiguous, columns = 128 * (experts + m // 128 + 1)) in the per-expert 128-aligned layout of
``fp8gemm.training.quantize_grouped_with_transpose``, (column, column block) at ``scale_t + (c * scale_t_s0 + b *
scale_t_s1) * 4``, bit-identical to its reference. Guarantees as for ``quantize`` and 1 <= experts < 2**31;
asynchronous like it. With ``source`` other than :data:`SOURCE_ROWS` the rows are computed in fp32 as they are read
(:data:`SOURCE_GATHER`, :data:`SOURCE_SWIGLU`, :data:`SOURCE_SWIGLU_BACKWARD`; fp8gemm/backend.hpp RowSourceKind
defines each). Optional: without it the core runs the reference.
"""


KGroupedWgradFn = Callable[[int], None]
"""``kgrouped_wgrad_launch(KGROUPED_WGRAD_ARGS.pack(a, b, a_scale, b_scale, out, offs, m, n, k, experts, lda, ldb, ldo,
out_es, a_scale_ld, b_scale_ld, accumulate, out_kind, stream))``: every expert's weight gradient in one launch, on the
per-expert 128-aligned layout of ``fp8gemm.training.quantize_grouped_with_transpose`` (k = 128 * (experts + tokens //
128 + 1) columns). Expert e's product is :data:`WgradFn`'s over its own K blocks only, ``[e + start_e // 128, ... +
ceil((end_e - start_e) / 128))``, with ``offs`` int32 [experts] the cumulative token ends, read on the device and each
clamped to [previous end, k - 128 * experts - 1]; it goes to ``out + e * out_es`` elements ([m, n], rows ``ldo``
apart). An expert without tokens gets zeros, or with ``accumulate`` keeps its slice untouched. Operands, scales,
``out_kind`` as for :data:`WgradFn`; the core guarantees 1 <= experts <= the module's ``kgrouped_max_experts()``.
Optional: without it the core runs the reference.
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
    grouped_launch: GroupedFn | None = None  # optional: grouped GEMMs (mixture of experts) in one launch
    grouped_layouts: tuple[int, ...] = ()  # the GROUPED_* layouts grouped_launch takes
    grouped_workspace_bytes: Callable[[int, int, int, int, int], int] | None = None  # (layout, m, n, k, groups)
    moe_route: MoeStepFn | None = None  # optional, the three together: fused_experts' step kernels
    moe_activation: MoeStepFn | None = None
    moe_combine: MoeStepFn | None = None
    moe_workspace_bytes: Callable[[int, int, int], int] | None = None  # moe_route's, for (tokens, top_k, experts)
    native: object = None  # optional: fp8gemm.native.NativeOps, the steady-state calls as C++ dispatcher ops
    wgrad_launch: WgradFn | None = None  # optional: the weight-gradient ("1D1D", per-row b_scale) GEMM
    wgrad_workspace_bytes: Callable[[int, int, int], int] | None = None  # wgrad_launch's, for (m, n, k)
    wgrad_b_scale_layout: ScaleLayout | None = None  # the layout of the per-row B scales wgrad_launch reads
    quantize_transposed: QuantizeTransposedFn | None = None  # optional: an operand and its transpose in one read
    quantize_grouped_transposed: QuantizeGroupedTransposedFn | None = None  # optional: the same, x^T per expert
    kgrouped_wgrad_launch: KGroupedWgradFn | None = None  # optional: every expert's weight gradient in one launch
    kgrouped_max_experts: int = 0  # the most experts kgrouped_wgrad_launch takes

    def __post_init__(self):
        if self.platform not in ("cuda", "rocm"):
            raise ValueError(f"Backend.platform must be 'cuda' or 'rocm', got {self.platform!r}")
        if not self.targets:
            raise ValueError(f"Backend {self.name!r} declares no targets")
        if not callable(self.launch):
            raise TypeError(f"Backend {self.name!r}: launch must be callable")
        if self.linear is not None and (self.quantize is None or not callable(self.linear_workspace_bytes)):
            raise TypeError(f"Backend {self.name!r}: a linear entry needs quantize and linear_workspace_bytes")
        if self.grouped_launch is not None and (not self.grouped_layouts or not callable(self.grouped_workspace_bytes)):
            raise TypeError(
                f"Backend {self.name!r}: a grouped_launch entry needs grouped_layouts and grouped_workspace_bytes"
            )
        if self.wgrad_launch is not None and (
            not callable(self.wgrad_workspace_bytes) or not isinstance(self.wgrad_b_scale_layout, ScaleLayout)
        ):
            raise TypeError(
                f"Backend {self.name!r}: a wgrad_launch entry needs wgrad_workspace_bytes and wgrad_b_scale_layout (the "
                f"ScaleLayout of the per-row B scales it reads)"
            )
        steps = (self.moe_route, self.moe_activation, self.moe_combine, self.moe_workspace_bytes)
        if any(step is not None for step in steps[:3]) and not all(map(callable, steps)):
            raise TypeError(
                f"Backend {self.name!r}: the moe step entries come together: moe_route, moe_activation, moe_combine "
                f"and moe_workspace_bytes"
            )
