"""The grouped ops hand a backend with a ``grouped_launch`` entry its arguments through ``protocol.GROUPED_ARGS``.

A fake backend, written in Python over raw pointers to host memory, reads every field back, rebuilds the tensors
from pointers and strides alone, and computes with the reference: the conformance cases then pass only if the core
packed every pointer, stride, group stride and scale layout right.
"""

from __future__ import annotations

import ctypes
import functools

import fp8gemm
import pytest
import torch
from conftest import cpu_tensors_play_a_gpu
from fp8gemm import registry
from fp8gemm.grouped_reference import reference_grouped
from fp8gemm.protocol import (
    GROUPED_ARGS,
    GROUPED_CONTIGUOUS,
    GROUPED_MASKED,
    GROUPED_ROW_IDS,
    K_MAJOR,
    MN_MAJOR,
    OUT_FP32,
    PROTOCOL_VERSION,
    Backend,
    ScaleLayout,
)
from fp8gemm.registry import DeviceInfo, InstalledBackend
from fp8gemm.testing import conformance_grouped

H100 = DeviceInfo("cuda", "Fake H100", ("sm_90a", "sm_90"), "9.0")
ALL_LAYOUTS = (GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS)
PLAIN = ScaleLayout()


def _view(ptr: int, dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """The tensor at a raw host address, from its shape and strides alone."""
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    size = (sum((extent - 1) * stride for extent, stride in zip(shape, strides, strict=True)) + 1) * dtype.itemsize
    raw = torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)
    return raw.view(dtype).as_strided(shape, strides)


def _scale_strides(layout: ScaleLayout, ld: int) -> tuple[int, int]:
    return (ld, 1) if layout.order == K_MAJOR else (1, ld)


def make_backend(name: str, layouts=ALL_LAYOUTS, a_layout=PLAIN, b_layout=PLAIN):
    """A backend whose grouped_launch unpacks GROUPED_ARGS and runs the reference on the tensors it rebuilds."""
    calls = []

    def grouped_launch(address: int) -> None:
        f = GROUPED_ARGS.unpack(address)
        calls.append(f)
        g, m, n, k, layout = f["groups"], f["m"], f["n"], f["k"], f["layout"]
        kb, nb = k // 128, -(-n // 128)
        masked = layout == GROUPED_MASKED
        lead, lead_strides = ((g, m), (f["a_group_stride"], f["lda"])) if masked else ((m,), (f["lda"],))
        a = _view(f["a"], torch.float8_e4m3fn, (*lead, k), (*lead_strides, 1))
        b = _view(f["b"], torch.float8_e4m3fn, (g, n, k), (f["b_group_stride"], f["ldb"], 1))
        scale_lead = (f["a_scale_group_stride"],) if masked else ()
        a_scale = _view(
            f["a_scale"], torch.float32, (*lead, kb), (*scale_lead, *_scale_strides(a_layout, f["a_scale_ld"]))
        )
        b_scale = _view(f["b_scale"], torch.float32, (g, nb, kb),
                        (f["b_scale_group_stride"], *_scale_strides(b_layout, f["b_scale_ld"])))  # fmt: skip
        out_dtype = torch.float32 if f["out_kind"] == OUT_FP32 else torch.bfloat16
        out_lead = (f["out_group_stride"], f["ldo"]) if masked else (f["ldo"],)
        out = _view(f["out"], out_dtype, (*lead, n), (*out_lead, 1))
        rows = _view(f["group_rows"], torch.int32, (g if layout != GROUPED_ROW_IDS else m,), (1,))
        reference_grouped(layout, a, b, a_scale, b_scale, rows.clone(), out)

    backend = Backend(
        name=name, platform="cuda", targets=("sm_90a",), fp8_dtype="float8_e4m3fn", version="0.0",
        launch=lambda address: pytest.fail("the dense launch is not the grouped ops' entry"),
        a_scale_layout=a_layout, b_scale_layout=b_layout, grouped_launch=grouped_launch, grouped_layouts=layouts,
        grouped_workspace_bytes=lambda layout, m, n, k, groups: 64 * groups,
    )  # fmt: skip
    return backend, calls


@pytest.fixture
def fake_grouped(monkeypatch):
    """Two fake backends on a fake H100 whose memory is the host's: "hopper" (every layout, MN-major a_scale with ld
    % 4, K-major b_scale with ld % 4) and "contiguous_only"."""
    hopper, hopper_calls = make_backend("hopper", a_layout=ScaleLayout(MN_MAJOR, 4), b_layout=ScaleLayout(K_MAJOR, 4))
    only, only_calls = make_backend("contiguous_only", layouts=(GROUPED_CONTIGUOUS,))
    installed = tuple(InstalledBackend(f"{b.name} = fake", "fake", b, None) for b in (hopper, only))
    monkeypatch.setattr(registry, "_discover", functools.lru_cache(maxsize=1)(lambda: installed))
    monkeypatch.setattr(registry, "describe_device", lambda device: H100)
    cpu_tensors_play_a_gpu(monkeypatch, stream=1234)
    registry.clear_caches()
    yield {"hopper": hopper_calls, "contiguous_only": only_calls}
    registry.clear_caches()


CASES = conformance_grouped.cases("cpu", n_random=3)


@pytest.mark.parametrize("backend", ["hopper", "contiguous_only"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_launch_protocol_through_raw_pointers(fake_grouped, case, backend):
    result = conformance_grouped.run_case(case, "cpu", torch.float8_e4m3fn, backend)
    assert result.passed, result.detail
    calls = fake_grouped[backend]
    layout = {"offs": GROUPED_CONTIGUOUS, "m_indices": GROUPED_ROW_IDS, "masked": GROUPED_MASKED}[case.layout]
    if case.m == 0 or (backend == "contiguous_only" and layout != GROUPED_CONTIGUOUS):
        assert calls == []  # nothing to compute, or the reference ran: the layout is not the backend's
        return
    (call,) = calls
    assert (call["layout"], call["m"], call["n"], call["k"], call["groups"]) == (
        layout, case.m, case.n, case.k, case.groups,
    )  # fmt: skip
    assert call["stream"] == 1234 and call["workspace"] != 0 and call["version"] == PROTOCOL_VERSION
    assert call["out_kind"] == (OUT_FP32 if case.out_dtype is torch.float32 else 0)
    assert call["expected_m"] == (max(case.rows) if layout == GROUPED_MASKED else 0)
    if layout != GROUPED_MASKED:
        assert call["a_group_stride"] == call["out_group_stride"] == call["a_scale_group_stride"] == 0
    if backend == "hopper":  # scales conformed into its layouts: every group 16-byte aligned
        assert call["a_scale_ld"] % 4 == 0 and call["b_scale_ld"] % 4 == 0
        assert call["b_scale_group_stride"] % 4 == 0 and call["a_scale_group_stride"] % 4 == 0
    _assert_tensor_map_alignment(call)


def _assert_tensor_map_alignment(call: dict) -> None:
    """What cuTensorMapEncodeTiled demands of every address and stride, applied or not (a dim of size 1 too):
    16-byte aligned pointers, strides 16-byte multiples below 2^40 bytes."""
    out_bytes = 4 if call["out_kind"] == OUT_FP32 else 2
    for name in ("a", "b", "a_scale", "b_scale", "out"):
        assert call[name] % 16 == 0, f"{name} pointer {call[name]:#x}"
    sizes = {"lda": 1, "ldb": 1, "ldo": out_bytes, "a_group_stride": 1, "b_group_stride": 1}
    sizes |= {"out_group_stride": out_bytes, "a_scale_group_stride": 4, "b_scale_group_stride": 4}
    for name, size in sizes.items():
        assert (call[name] * size) % 16 == 0 and 0 <= call[name] * size < 1 << 40, f"{name} = {call[name]}"


def test_bad_values_never_reach_the_backend_from_the_host(fake_grouped):
    """A CPU offs past M is refused before any launch."""
    bad = next(b for b in conformance_grouped.BAD_INPUTS if b.id == "offs-past-m")
    ok, detail = conformance_grouped.run_bad_input(bad, "cpu", torch.float8_e4m3fn, "hopper")
    assert ok, detail
    assert fake_grouped["hopper"] == []


def test_prepared_3d_weight_scale_is_read_in_place(fake_grouped):
    """prepare_weight_scale converts [G, nb, kb] once, group by group; the grouped call then passes it as it is."""
    case = conformance_grouped.GroupedCase("offs", (3, 5), 272, 640, col_major_scales=True)
    gen = torch.Generator().manual_seed(conformance_grouped.case_seed(case))
    a, b, a_scale, b_scale, offs = conformance_grouped.make_inputs(case, torch.float8_e4m3fn, "cpu", gen)
    prepared = fp8gemm.prepare_weight_scale(b_scale, backend="hopper")
    assert prepared.shape == b_scale.shape and torch.equal(prepared, b_scale)
    assert prepared.stride(2) == 1 and prepared.stride(1) % 4 == 0 and prepared.stride(0) % 4 == 0
    fp8gemm.grouped_gemm(a, b, a_scale, prepared, offs, backend="hopper")
    (call,) = fake_grouped["hopper"]
    assert call["b_scale"] == prepared.data_ptr() and call["b_scale_group_stride"] == prepared.stride(0)
    assert fp8gemm.prepare_weight_scale(prepared, backend="hopper") is prepared
