"""What every op needs at run time, in one place: the tensors' device and its current stream, scratch memory kept
per (device, stream), the backend that runs on a device, the operand layouts kernels read and write, one call of
a backend entry, and the registration of the ops with torch.library.

The planners (``plans``, ``grouped_checks``) and the launches (``launch``) use these public names; nothing else in
the core reaches into another module's private helpers.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from . import registry
from .autograd import refuse_grad
from .protocol import (
    IN_BF16,
    IN_FP16,
    IN_FP32,
    K_MAJOR,
    LAUNCH_ARGS,
    OUT_BF16,
    OUT_FP32,
    QUANTIZE_ARGS,
    QUANTIZE_GROUPED_TRANSPOSED_ARGS,
    QUANTIZE_TRANSPOSED_ARGS,
    SOURCE_ROWS,
    ScaleLayout,
)
from .reference import REFERENCE
from .validation import IN_DTYPES, ld_reader

LIBRARY = "fp8gemm"  # the torch.library namespace of every op; a vendored copy of the core renames it
IN_KINDS = dict(zip(IN_DTYPES, (IN_BF16, IN_FP16, IN_FP32), strict=True))  # the kernels' code of each input dtype

_pack_gemm = LAUNCH_ARGS.pack
_pack_quantize = QUANTIZE_ARGS.pack
_pack_quantize_transposed = QUANTIZE_TRANSPOSED_ARGS.pack
_pack_quantize_grouped = QUANTIZE_GROUPED_TRANSPOSED_ARGS.pack

device_index = torch.Tensor.get_device  # -1 on CPU; the unbound method: no wrapper call per tensor
capturing = torch.cuda.is_current_stream_capturing
# The current device's index, and raw_stream(index): the current cudaStream_t (a hipStream_t under ROCm torch) of a
# device; torch's C functions themselves where it has CUDA or ROCm, a Python call less per launch.
current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda i: torch.cuda.current_stream(i).cuda_stream
)


def switch_needed(index: int) -> bool:
    """Whether kernels for tensors on device ``index`` must make it current (it is another than the current one).
    Refused during a CUDA-graph capture: a launch on the tensors' device would run now, outside the graph."""
    here = current_device()
    if index == here:
        return False
    if capturing():
        raise RuntimeError(
            f"a CUDA graph is being captured on cuda:{here}, but the tensors are on cuda:{index}: their kernels would "
            f"run outside the graph. Capture on the tensors' device: torch.cuda.graph(g, "
            f"stream=torch.cuda.Stream('cuda:{index}'))"
        )
    return True


def on_device(device: torch.device):
    """Kernels launch on the current device: switch to the tensors' device only when it is another one."""
    return torch.cuda.device(device) if switch_needed(device.index) else contextlib.nullcontext()


def call_on_device(entry, address: int, index: int) -> None:
    """``entry(address)`` with device ``index`` current: a backend entry launches on the current device, and the
    plan found the tensors on another one (:func:`switch_needed`)."""
    with torch.cuda.device(index):
        entry(address)


def call_gemm(plan, a, b, out) -> None:
    """The backend's GEMM entry on a ``plans.GemmPlan`` of M > 0 rows: ``out`` <- ``a`` times ``b`` (the GEMM of a
    linear layer quantized from Python; ``launch.run_gemm`` writes the same launch out)."""
    backend, m, n, k, dev = plan.backend, plan.m, plan.n, plan.k, plan.device
    stream = raw_stream(dev)
    workspace = scratch(backend.workspace_bytes(m, n, k), out.device, stream)
    address = _pack_gemm(a.data_ptr(), b.data_ptr(), plan.a_scale.data_ptr(), plan.b_scale.data_ptr(), out.data_ptr(),
                         workspace, m, n, k, plan.lda, plan.ldb, out.stride(0), plan.a_scale_ld, plan.b_scale_ld,
                         out_kind(out.dtype), stream)  # fmt: skip
    if plan.elsewhere:
        call_on_device(backend.launch, address, dev)
    else:
        backend.launch(address)


def call_quantize(backend, x2d: torch.Tensor, pow2: bool, dev: int, switch: bool):
    """The backend's quantization entry on x2d [M >= 1, K] of device ``dev``: (FP8 codes, scales in the backend's
    layout, their leading dimension)."""
    x2d = kernel_rows(x2d)
    m, k = x2d.shape
    q = torch.empty((m, k), dtype=getattr(torch, backend.fp8_dtype), device=x2d.device)
    scale, ld = empty_scale(m, k >> 7, backend.a_scale_layout, x2d.device)
    stream = raw_stream(dev)
    address = _pack_quantize(x2d.data_ptr(), q.data_ptr(), scale.data_ptr(), m, k, x2d.stride(0), ld,
                             IN_KINDS[x2d.dtype], int(pow2), stream)  # fmt: skip
    if switch:
        call_on_device(backend.quantize, address, dev)
    else:
        backend.quantize(address)
    return q, scale, ld


def call_quantize_transposed(backend, x2d: torch.Tensor, q, scale, q_t, scale_t, pow2: bool, blocks: bool,
                             q_t_group: int = 0) -> None:  # fmt: skip
    """The backend's ``quantize_transposed`` entry on x2d [M >= 1, K] (rows kernel-readable) into the given outputs
    (``q`` [M, K], ``q_t`` [K, M_t] contiguous, or with ``q_t_group`` M_t / q_t_group matrices [K, q_t_group] one after
    another; scales as strided tensors), on x2d's device and its current stream."""
    dev = device_index(x2d)
    m, k = x2d.shape
    m_t = q_t.numel() // k
    address = _pack_quantize_transposed(x2d.data_ptr(), q.data_ptr(), scale.data_ptr(), q_t.data_ptr(),
                                        scale_t.data_ptr(), m, k, m_t, x2d.stride(0), *scale.stride(),
                                        *scale_t.stride(), IN_KINDS[x2d.dtype], int(pow2), int(blocks), q_t_group,
                                        raw_stream(dev))  # fmt: skip
    if switch_needed(dev):
        call_on_device(backend.quantize_transposed, address, dev)
    else:
        backend.quantize_transposed(address)


class RowSourceArgs(NamedTuple):
    """What the grouped transposing quantizer's rows are (protocol.SOURCE_*; fp8gemm/backend.hpp RowSourceKind)."""

    source: int = SOURCE_ROWS
    index: torch.Tensor | None = None  # gather: int64 [M]
    row_weight: torch.Tensor | None = None  # gather: fp32 [M] or None
    gate_up: torch.Tensor | None = None  # SwiGLU backward: h [M, K], rows kernel-readable
    source_rows: int = 0  # gather: x's rows


PLAIN_ROWS = RowSourceArgs()


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def call_quantize_grouped_transposed(backend, x2d: torch.Tensor, offs, q, scale, q_t, scale_t, pow2: bool,
                                     source: RowSourceArgs = PLAIN_ROWS) -> None:  # fmt: skip
    """The backend's ``quantize_grouped_transposed`` entry on x2d (rows kernel-readable; [M >= 1, K] sorted by expert,
    or what ``source`` reads) and offs (int32 [E], contiguous) into the given outputs (``q`` [M, K], ``q_t`` [K, 128 *
    (E + M // 128 + 1)], contiguous; scales as strided tensors), on x2d's device and its current stream."""
    dev = device_index(x2d)
    m, k = q.shape
    gate_up = source.gate_up
    address = _pack_quantize_grouped(x2d.data_ptr(), q.data_ptr(), scale.data_ptr(), q_t.data_ptr(),
                                     scale_t.data_ptr(), offs.data_ptr(), m, k, offs.shape[0], q_t.shape[1],
                                     x2d.stride(0), *scale.stride(), *scale_t.stride(), IN_KINDS[x2d.dtype], int(pow2),
                                     _address(source.index), _address(source.row_weight), _address(gate_up),
                                     source.source_rows, 0 if gate_up is None else gate_up.stride(0), source.source,
                                     IN_KINDS[gate_up.dtype] if gate_up is not None else 0,
                                     raw_stream(dev))  # fmt: skip
    if switch_needed(dev):
        call_on_device(backend.quantize_grouped_transposed, address, dev)
    else:
        backend.quantize_grouped_transposed(address)


def kernel_quantize(backend, x2d: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's quantization entry on the current device and stream (x2d's device, M >= 1): (codes, scales)."""
    q, scale, _ = call_quantize(backend, x2d, pow2, x2d.device.index, False)
    return q, scale


def out_kind(dtype: torch.dtype) -> int:
    return OUT_FP32 if dtype is torch.float32 else OUT_BF16


def requested_backend(name: str | None) -> str | None:
    """``backend=`` as the caller passed it, else ``$FP8GEMM_BACKEND``, else None (the best fit)."""
    return name or registry.env_backend()


# --- the torch.library ops ------------------------------------------------------------------------------------

_library = torch.library.Library(LIBRARY, "FRAGMENT")
_infer_schema = getattr(torch.library, "infer_schema", None) or torch._library.infer_schema.infer_schema  # torch 2.4


class Op:
    """``fn`` (annotated as for ``torch.library.custom_op``) as the op ``torch.ops.<LIBRARY>.<name>``, registered with
    the low-level ``torch.library`` API: custom_op's per-call wrappers cost a compiled model 44 us per call on an H100
    host (docs/benchmarks.md, "Host overhead"). Its autograd kernel refuses an input that requires grad (no op has a
    backward), then runs the op below autograd and bumps the version of every tensor it writes."""

    def __init__(self, name: str, fn, public: str, arg_names: tuple[str, ...], mutates_args: tuple[str, ...]):
        self.qualname = f"{LIBRARY}::{name}"
        _library.define(name + _infer_schema(fn, mutates_args=mutates_args))
        _library.impl(name, fn, "CompositeExplicitAutograd")
        overload = getattr(getattr(torch.ops, LIBRARY), name).default
        written = [i for i, a in enumerate(overload._schema.arguments) if a.alias_info and a.alias_info.is_write]

        def autograd_kernel(*args):
            refuse_grad(public, arg_names, args)
            with torch._C._AutoDispatchBelowADInplaceOrView():
                result = overload(*args)
            for i in written:
                torch.autograd.graph.increment_version(args[i])
            return result

        _library.impl(name, autograd_kernel, "Autograd")

    def register_fake(self, fn):
        torch.library.register_fake(self.qualname, fn, lib=_library)
        return fn


def op(name: str, public: str, arg_names: tuple[str, ...], mutates_args: tuple[str, ...] = ()):
    """Decorator: the function becomes ``torch.ops.<LIBRARY>.<name>`` (:class:`Op`); ``public`` and ``arg_names``
    name the entry point and its tensors in the grad refusal."""
    return lambda fn: Op(name, fn, public, arg_names, mutates_args)


# --- the backend for a device, as the steady-state call needs it ---------------------------------------------


class FastBackend(NamedTuple):
    """A GPU backend with what a steady-state call reads of it, looked up once per (device, requested name)."""

    backend: object
    fp8_dtype: torch.dtype
    read_a_scale_ld: object  # validation.ld_reader of its a_scale layout
    read_b_scale_ld: object
    native: object  # its NativeOps, or None


_fast_backends: dict[tuple[int, str | None], FastBackend | None] = {}
registry.on_refresh(_fast_backends.clear)


def fast_backend(index: int, requested: str | None) -> FastBackend | None:
    """The backend for CUDA/ROCm device ``index`` (``requested``: a name, or None for the best fit); None where
    the reference runs."""
    key = (index, requested)
    if key not in _fast_backends:
        chosen = registry.select(torch.device("cuda", index), requested).backend
        _fast_backends[key] = (
            None
            if chosen is REFERENCE
            else FastBackend(
                chosen,
                getattr(torch, chosen.fp8_dtype),
                ld_reader(chosen.a_scale_layout),
                ld_reader(chosen.b_scale_layout),
                chosen.native,
            )
        )
    return _fast_backends[key]


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a subclass (DTensor, a fake tensor) takes the Python planner


def native_ops(t: torch.Tensor, other, requested: str | None):
    """The native ops (fp8gemm.native) of the backend for ``t``'s device when it is the current one and ``t`` and
    ``other`` are plain tensors, else None."""
    if type(t) not in _PLAIN or type(other) not in _PLAIN:
        return None
    dev = device_index(t)
    if dev < 0:
        return None
    found = fast_backend(dev, requested_backend(requested))
    return None if found is None or dev != current_device() else found.native


def empty_scale(m: int, kb: int, layout: ScaleLayout | None, device) -> tuple[torch.Tensor, int]:
    """An uninitialised fp32 [m, kb] scale tensor in ``layout`` (row-major when None) and its leading dimension."""
    if layout is None:
        return torch.empty((m, kb), dtype=torch.float32, device=device), kb
    mult = layout.ld_multiple
    if layout.order == K_MAJOR:
        ld = -(-kb // mult) * mult
        return torch.empty_strided((m, kb), (ld, 1), dtype=torch.float32, device=device), ld
    ld = max(-(-m // mult) * mult, mult)
    return torch.empty_strided((m, kb), (1, ld), dtype=torch.float32, device=device), ld


def row_stride(t: torch.Tensor) -> int:
    """The row stride (elements) of ``t`` [..., rows, cols] a kernel is handed. One row is never stepped over, and
    torch reports any stride for a dim of size 1 (0, 1, the row length...): then the row length itself, a multiple
    of 16 bytes for every operand the grouped checks pass (FP8 K a multiple of 128, N a multiple of 16)."""
    return t.stride(-2) if t.shape[-2] > 1 else t.shape[-1]


def group_stride(t: torch.Tensor, ld: int) -> int:
    """The group stride (elements) of a 3-D ``t`` [G, rows, cols] with row stride ``ld``: as :func:`row_stride`,
    one group's (never applied) is the size of its rows, so that every stride a backend gets is a multiple of 16
    bytes (a tensor map refuses any other, applied or not)."""
    return t.stride(0) if t.shape[0] > 1 else t.shape[1] * ld


def kernel_rows(x2d: torch.Tensor) -> torch.Tensor:
    """``x2d`` if a kernel can read it in place (unit column stride, 16-byte aligned rows), else a contiguous copy."""
    size = x2d.element_size()
    if x2d.stride(1) == 1 and (x2d.stride(0) * size) % 16 == 0 and x2d.data_ptr() % 16 == 0:
        return x2d
    return x2d.clone(memory_format=torch.contiguous_format)


# --- scratch memory -------------------------------------------------------------------------------------------

# Scratch up to this size (split-K partial sums, the FP8 copy of a decode step's activations) is kept per
# (device, stream): one allocation less per call, ~2 us of host time. Kernels on one stream run in order, so a
# kept buffer is never written while an earlier kernel reads it; under graph capture every call allocates, as a
# graph must own its memory. A buffer is kept only if it came from the allocator's default pool: a private pool
# (torch.compile's CUDA-graph warm-up, a user's MemPool) may hand its memory to a graph whose replays overwrite
# it, and torch.compile refuses a pool holding tensors it does not track. Streams are keyed with their device:
# every device's default stream is handle 0.
SCRATCH_KEPT_BYTES = 1 << 20
_kept_scratch: dict[tuple[int, int], tuple[torch.Tensor, int] | None] = {}  # None: this stream keeps none
registry.on_refresh(_kept_scratch.clear)


def scratch(nbytes: int, device: torch.device, stream: int) -> int:
    """The device address of ``nbytes`` of scratch for kernels launched next on ``stream`` of ``device``."""
    if not nbytes:
        return 0
    if nbytes <= SCRATCH_KEPT_BYTES and not capturing():
        key = (device.index, stream)
        kept = _kept_scratch.get(key, False)
        if kept is False:
            buffer = torch.empty(SCRATCH_KEPT_BYTES, dtype=torch.uint8, device=device)
            kept = _kept_scratch[key] = (buffer, buffer.data_ptr()) if in_default_pool(buffer) else None
        if kept is not None:
            return kept[1]
    return torch.empty(nbytes, dtype=torch.uint8, device=device).data_ptr()  # freed to this stream, in order


def in_default_pool(buffer: torch.Tensor) -> bool:
    """Whether ``buffer`` lies in a segment of the caching allocator's default pool (asked once per stream: the
    allocator's snapshot walks every segment)."""
    if buffer.device.type != "cuda":
        return True
    address = buffer.data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return tuple(segment["segment_pool_id"]) == (0, 0)
    return False


def kept_scratch_addresses() -> dict[tuple[int, int], int]:
    """(device, stream) -> address of its kept scratch buffer (for tests and diagnostics)."""
    return {key: kept[1] for key, kept in _kept_scratch.items() if kept is not None}
