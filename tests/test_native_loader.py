"""fp8gemm.native's loader on any machine: which arch modules get native ops and the reason shown by `fp8gemm info`
when one does not; and the wrappers' handling of a declined call. The ops themselves: tests/test_native_ops.py (GPU)."""

from __future__ import annotations

import types

import pytest
import torch
from fp8gemm import native
from fp8gemm.protocol import K_MAJOR, MN_MAJOR, ScaleLayout

A_LAYOUT, B_LAYOUT = ScaleLayout(MN_MAJOR, 4), ScaleLayout(K_MAJOR, 1)


def arch_module(tmp_path, with_library=True, entries=True):
    module = types.ModuleType("fp8gemm_fake_arch._C")
    module.__file__ = str(tmp_path / "_C.so")
    module.a_scale_ld_multiple = lambda: 4
    if entries:
        module.native_entries = lambda: 0
    if with_library:
        (tmp_path / native.LIBRARY_NAME).write_bytes(b"")
    return module


def test_a_module_without_entries_or_library_has_none(tmp_path):
    ops, why = native.load_native_ops(arch_module(tmp_path, entries=False), "float8_e4m3fn", A_LAYOUT, B_LAYOUT)
    assert ops is None and "without native entries" in why
    bare = tmp_path / "bare"
    bare.mkdir()
    ops, why = native.load_native_ops(arch_module(bare, with_library=False), "float8_e4m3fn", A_LAYOUT, B_LAYOUT)
    assert ops is None and why == "no (built without torch >= 2.10)"


def test_an_old_or_cpu_torch_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(native, "torch_version", lambda: (2, 9))
    ops, why = native.load_native_ops(arch_module(tmp_path), "float8_e4m3fn", A_LAYOUT, B_LAYOUT)
    assert ops is None and why == "no (needs a GPU build of torch >= 2.10)"
    monkeypatch.setattr(native, "torch_version", lambda: (2, 11))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert native.load_native_ops(arch_module(tmp_path), "float8_e4m3fn", A_LAYOUT, B_LAYOUT)[0] is None


def test_other_layouts_and_a_second_build_have_none(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    module = arch_module(tmp_path)
    ops, why = native.load_native_ops(module, "float8_e4m3fn", ScaleLayout(MN_MAJOR, 8), B_LAYOUT)
    assert ops is None and "scale layouts" in why
    ops, why = native.load_native_ops(module, "float8_e4m3fn", A_LAYOUT, ScaleLayout(MN_MAJOR, 1))
    assert ops is None and "scale layouts" in why
    monkeypatch.setitem(native._loaded, "fp8gemm_fake_arch", tmp_path / "elsewhere" / native.LIBRARY_NAME)
    ops, why = native.load_native_ops(module, "float8_e4m3fn", A_LAYOUT, B_LAYOUT)
    assert ops is None and "another build of fp8gemm_fake_arch" in why


def test_a_library_that_does_not_load_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ops, why = native.load_native_ops(arch_module(tmp_path), "float8_e4m3fn", A_LAYOUT, B_LAYOUT)  # an empty file
    assert ops is None and why.startswith(f"no ({native.LIBRARY_NAME} did not load")
    assert "fp8gemm_fake_arch" not in native._loaded


def test_only_a_declined_call_goes_on_to_the_planner():
    native.reraise_unless_miss(RuntimeError(native.NATIVE_MISS + "weight layout"))
    with pytest.raises(RuntimeError, match="launch failed"):
        native.reraise_unless_miss(RuntimeError("fp8gemm_sm90a: launch failed"))
    # The dispatcher sending a CPU or meta argument past the op's CUDA kernel: the planner names the argument.
    native.reraise_unless_miss(NotImplementedError("Could not run 'pkg::gemm' with arguments from the 'CPU' backend."))
    native.reraise_unless_miss(
        NotImplementedError(
            "pkg::grouped_gemm: attempted to run this operator with Meta tensors, but there was no fake"
        )
    )
    with pytest.raises(NotImplementedError, match="another block size"):
        native.reraise_unless_miss(NotImplementedError("another block size"))
