"""The versioned backend protocol: the Python mirrors match fp8gemm/backend.hpp, packing is per thread, and the
core refuses an arch binary built for another protocol version with the fix."""

from __future__ import annotations

import re
import threading
import types

import pytest
from fp8gemm import get_include
from fp8gemm.arch_module import backend_from_module
from fp8gemm.protocol import (
    GROUPED_ARGS,
    KGROUPED_WGRAD_ARGS,
    LAUNCH_ARGS,
    LINEAR_ARGS,
    MIRRORS,
    MOE_ACTIVATION_ARGS,
    MOE_COMBINE_ARGS,
    MOE_ROUTE_ARGS,
    PROTOCOL_VERSION,
    QUANTIZE_ARGS,
    QUANTIZE_GROUPED_TRANSPOSED_ARGS,
    QUANTIZE_TRANSPOSED_ARGS,
    WGRAD_ARGS,
    Backend,
    ScaleLayout,
)

HEADER = open(f"{get_include()}/fp8gemm/backend.hpp").read()


def test_mirrors_have_the_sizes_the_header_asserts():
    asserted = dict(re.findall(r"sizeof\(Wire<(\w+)>\) == (\d+)", HEADER))
    names = {
        LAUNCH_ARGS: "LaunchArgs",
        QUANTIZE_ARGS: "QuantizeArgs",
        LINEAR_ARGS: "LinearArgs",
        GROUPED_ARGS: "GroupedArgs",
        MOE_ROUTE_ARGS: "MoeRouteArgs",
        MOE_ACTIVATION_ARGS: "MoeActivationArgs",
        MOE_COMBINE_ARGS: "MoeCombineArgs",
        WGRAD_ARGS: "WgradArgs",
        QUANTIZE_TRANSPOSED_ARGS: "QuantizeTransposedArgs",
        QUANTIZE_GROUPED_TRANSPOSED_ARGS: "QuantizeGroupedTransposedArgs",
        KGROUPED_WGRAD_ARGS: "KGroupedWgradArgs",
    }
    assert {names[m]: str(m.size) for m in MIRRORS} == asserted
    assert f"kProtocolVersion = {PROTOCOL_VERSION};" in HEADER


def test_fields_round_trip_and_each_thread_packs_its_own_copy():
    both_packed = threading.Barrier(2)
    seen = {}

    def pack(seed: int):
        fields = [seed * 1000 + i for i in range(len(LAUNCH_ARGS.fields))]
        address = LAUNCH_ARGS.pack(*fields)
        both_packed.wait()  # the other thread has packed too: its copy must not be this one
        seen[seed] = (
            address,
            list(LAUNCH_ARGS.unpack(address).values()) == [PROTOCOL_VERSION, LAUNCH_ARGS.size, *fields],
        )

    threads = [threading.Thread(target=pack, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[1][0] != seen[2][0] and seen[1][1] and seen[2][1]


def _module(**overrides):
    base = dict(
        protocol_version=lambda: PROTOCOL_VERSION,
        args_sizes=lambda: {m.entry: m.size for m in MIRRORS},
        build_info=lambda: {"targets": "sm_90a"},
        launch=lambda address: None,
        workspace_bytes=lambda m, n, k: 0,
    )
    return types.SimpleNamespace(**{**base, **overrides})


def _load(module, **kwargs):
    return backend_from_module(
        module, name="x", package="fp8gemm-cuda-x", version="1", fp8_dtype="float8_e4m3fn",
        a_scale_layout=ScaleLayout(), b_scale_layout=ScaleLayout(), **kwargs,
    )  # fmt: skip


def test_a_binary_of_this_protocol_loads():
    assert _load(_module()).targets == ("sm_90a",)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            {"protocol_version": lambda: PROTOCOL_VERSION + 1},
            f"built for fp8gemm backend protocol {PROTOCOL_VERSION + 1}",
        ),
        ({"protocol_version": None}, "built for fp8gemm backend protocol before versions"),
        (
            {"args_sizes": lambda: {"launch": LAUNCH_ARGS.size + 8}},
            "its launch arguments are 144 bytes, the core's mirror 136",
        ),
    ],
    ids=["newer", "unversioned", "struct-size"],
)
def test_a_binary_of_another_protocol_is_refused_with_the_fix(overrides, words):
    module = _module(**overrides)
    if overrides.get("protocol_version", 1) is None:
        del module.protocol_version
    with pytest.raises(RuntimeError) as raised:
        _load(module)
    assert words in str(raised.value)
    assert "same release" in str(raised.value) or "different fp8gemm/backend.hpp" in str(raised.value)


def test_the_wgrad_struct_mirrors_the_header_field_by_field():
    """WgradArgs: LaunchArgs' fields with ``accumulate`` where LaunchArgs has ``out_kind`` (the output is always fp32)."""
    body = re.search(r"struct WgradArgs \{(.*?)\};", HEADER, re.S).group(1)
    names = re.findall(r"(\w+)(?=[,;])", re.sub(r"//.*", "", body))
    assert tuple(names) == WGRAD_ARGS.fields
    assert WGRAD_ARGS.entry == "wgrad_launch" and WGRAD_ARGS.size == LAUNCH_ARGS.size == 136
    fields = list(range(1, len(WGRAD_ARGS.fields) + 1))
    assert list(WGRAD_ARGS.unpack(WGRAD_ARGS.pack(*fields)).values()) == [PROTOCOL_VERSION, 136, *fields]


def test_the_wgrad_entry_is_optional_and_declared_apart():
    """A binary without wgrad_launch (every one built before it) loads and lacks it; one with it gets its entries and
    the layout its backend.py states; the entry is declared outside arch_entry.hpp, so arches without it build."""
    assert _load(_module()).wgrad_launch is None
    entry, workspace = (lambda address: None), (lambda m, n, k: 0)
    module = _module(wgrad_launch=entry, wgrad_workspace_bytes=workspace)
    layout = ScaleLayout("mn_major", 4)
    backend = _load(module, wgrad_b_scale_layout=layout)
    assert backend.wgrad_launch is entry and backend.wgrad_workspace_bytes is workspace
    assert backend.wgrad_b_scale_layout == layout
    with pytest.raises(TypeError, match="wgrad_launch entry needs wgrad_workspace_bytes and wgrad_b_scale_layout"):
        _load(module)  # the module has the entry, its backend.py states no layout
    old = {m.entry: m.size for m in MIRRORS if m is not WGRAD_ARGS}  # built before the entry: not listed, still loads
    assert _load(_module(args_sizes=lambda: old)).wgrad_launch is None
    with pytest.raises(RuntimeError, match="its wgrad_launch arguments are 144 bytes, the core's mirror 136"):
        _load(_module(args_sizes=lambda: {"wgrad_launch": 144}))
    with pytest.raises(TypeError, match="wgrad_launch entry needs"):
        Backend("x", "cuda", ("sm_90a",), "float8_e4m3fn", "1", lambda address: None, wgrad_launch=entry)
    include = get_include()
    assert "wgrad_launch" not in open(f"{include}/fp8gemm/arch_entry.hpp").read()
    declared = open(f"{include}/fp8gemm/training_entries.hpp").read()
    assert "void wgrad_launch(const fp8gemm::WgradArgs& args);" in declared
    assert "int64_t wgrad_workspace_bytes(int64_t m, int64_t n, int64_t k);" in declared
    module_header = open(f"{include}/fp8gemm/backend_module.hpp").read()
    assert 'sizes["wgrad_launch"] = sizeof(Wire<WgradArgs>);' in module_header
    assert "void define_wgrad_entry(" in module_header


def test_the_transposing_quantizer_is_optional_and_declared_apart():
    """quantize_transposed: absent from a binary built before it (the reference runs), taken when the module has it,
    its size checked, and declared with the training entries, outside arch_entry.hpp."""
    assert _load(_module()).quantize_transposed is None
    entry = lambda address: None  # noqa: E731
    assert _load(_module(quantize_transposed=entry)).quantize_transposed is entry
    size = QUANTIZE_TRANSPOSED_ARGS.size
    with pytest.raises(
        RuntimeError, match=f"its quantize_transposed arguments are {size + 8} bytes, the core's mirror {size}"
    ):
        _load(_module(args_sizes=lambda: {"quantize_transposed": size + 8}))
    include = get_include()
    assert "quantize_transposed" not in open(f"{include}/fp8gemm/arch_entry.hpp").read()
    declared = open(f"{include}/fp8gemm/training_entries.hpp").read()
    assert "void quantize_transposed(const fp8gemm::QuantizeTransposedArgs& args);" in declared
    module_header = open(f"{include}/fp8gemm/backend_module.hpp").read()
    assert 'sizes["quantize_transposed"] = sizeof(Wire<QuantizeTransposedArgs>);' in module_header


def test_the_grouped_transposing_quantizer_is_optional_and_declared_apart():
    """quantize_grouped_transposed: as quantize_transposed, an optional entry of its own struct (no protocol bump)."""
    assert _load(_module()).quantize_grouped_transposed is None
    entry = lambda address: None  # noqa: E731
    assert _load(_module(quantize_grouped_transposed=entry)).quantize_grouped_transposed is entry
    size = QUANTIZE_GROUPED_TRANSPOSED_ARGS.size
    with pytest.raises(
        RuntimeError, match=f"its quantize_grouped_transposed arguments are {size + 8} bytes, the core's mirror {size}"
    ):
        _load(_module(args_sizes=lambda: {"quantize_grouped_transposed": size + 8}))
    include = get_include()
    assert "quantize_grouped_transposed" not in open(f"{include}/fp8gemm/arch_entry.hpp").read()
    declared = open(f"{include}/fp8gemm/training_entries.hpp").read()
    assert "void quantize_grouped_transposed(const fp8gemm::QuantizeGroupedTransposedArgs& args);" in declared
    module_header = open(f"{include}/fp8gemm/backend_module.hpp").read()
    assert 'sizes["quantize_grouped_transposed"] = sizeof(Wire<QuantizeGroupedTransposedArgs>);' in module_header
