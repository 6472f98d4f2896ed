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
    LAUNCH_ARGS,
    LINEAR_ARGS,
    MIRRORS,
    MOE_ACTIVATION_ARGS,
    MOE_COMBINE_ARGS,
    MOE_ROUTE_ARGS,
    PROTOCOL_VERSION,
    QUANTIZE_ARGS,
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


def _load(module):
    return backend_from_module(
        module, name="x", package="fp8gemm-cuda-x", version="1", fp8_dtype="float8_e4m3fn",
        a_scale_layout=ScaleLayout(), b_scale_layout=ScaleLayout(),
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
