"""The gfx942 kernels (csrc/kernels.hip and the launcher csrc/launch.cpp, unchanged) executed by the
CPU emulator (packages/fp8gemm-rocm-gfx942/emulation) through fp8gemm.gemm, as on an MI300X: the
conformance suite's shapes (tails in M and N, odd K/128, both tile configs, split-K and its reduction),
its bad inputs, and launch errors.

What this proves: the kernels' numerics under the documented MFMA semantics and the HIP barrier
discipline. What it cannot: timing, or hardware behaviour beyond the ISA documentation.
``FP8GEMM_GFX942_EMU_CSRC=<folder>`` runs a modified copy of csrc/ instead (how a broken lane mapping
or a removed barrier was shown to fail here)."""

from __future__ import annotations

import collections
import ctypes
import os
import sys

import fp8gemm
import pytest
import torch
from conftest import cpu_tensors_play_a_gpu
from fp8gemm import ops, registry, runtime
from fp8gemm.protocol import (
    GROUPED_ARGS,
    LAUNCH_ARGS,
    MOE_MIRRORS,
    PROTOCOL_VERSION,
    QUANTIZE_ARGS,
    TRAINING_MIRRORS,
)
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance
from isa import ROOT, require_tool

EMULATION = ROOT / "packages" / "fp8gemm-rocm-gfx942" / "emulation"
sys.path.insert(0, str(EMULATION))
import gfx942_emulator  # noqa: E402

MI300X = registry.DeviceInfo("rocm", "AMD Instinct MI300X (emulated)", ("gfx942",), "gfx942:sramecc+:xnack-")
FP8 = torch.float8_e4m3fnuz
MI300X_CUS = 304
CASES = conformance.cases("cpu", n_random=2)  # random shapes from conformance.DEFAULT_SEED, views included


@pytest.fixture(scope="package")
def emulator(tmp_path_factory):
    """The emulator, built once per test run, with the package's kernels (or $FP8GEMM_GFX942_EMU_CSRC's)."""
    require_tool("cmake")
    compiler = os.environ.get(gfx942_emulator.COMPILER_ENV) or require_tool("clang++-19")
    build_dir = gfx942_emulator.build(tmp_path_factory.getbasetemp() / "gfx942-emulator", compiler=compiler)
    return gfx942_emulator.Emulator(build_dir)


class StreamOrderedTorch:
    """``torch`` as ops.py sees it, with a GPU's stream-ordered scratch memory: the fast path drops its
    workspace tensor right after enqueuing, which the caching allocator allows on a GPU (a freed block is
    reused only by later work on that stream), but a CPU tensor's memory is freed at once and the
    emulated kernel would write freed memory. Its last few allocations are kept until later ones."""

    def __init__(self):
        self._recent = collections.deque(maxlen=4)

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *args, **kwargs):
        tensor = torch.empty(*args, **kwargs)
        self._recent.append(tensor)
        return tensor


@pytest.fixture
def mi300x(emulator, monkeypatch):
    """fp8gemm sees an MI300X with the emulated gfx942 backend installed; CPU tensors are its memory."""
    backend = emulator.backend()
    installed = (registry.InstalledBackend(f"{backend.name} = gfx942_emulator", backend.package, backend, None),)
    monkeypatch.setattr(registry, "installed_backends", lambda refresh=False: installed)
    monkeypatch.setattr(registry, "describe_device", lambda device: MI300X)
    cpu_tensors_play_a_gpu(monkeypatch)
    stream_ordered = StreamOrderedTorch()
    for module in (ops, runtime):
        monkeypatch.setattr(module, "torch", stream_ordered)
    registry.clear_caches()
    emulator.use_cu_count(MI300X_CUS)
    yield backend
    registry.clear_caches()


def test_the_emulated_backend_is_the_packages_descriptor(mi300x):
    assert registry.select("cpu").backend is mi300x
    assert mi300x.fp8_dtype == "float8_e4m3fnuz" and mi300x.targets == ("gfx942",) and mi300x.quantize is not None
    assert (mi300x.a_scale_layout.order, mi300x.a_scale_layout.ld_multiple) == ("mn_major", 4)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_conformance(case, emulator, mi300x):
    launches = emulator.launches
    result = conformance.run_case(case, "cpu", FP8, mi300x.name)
    assert result.passed, f"{case.id}: rel. err {result.rel_err:.3e} {result.detail}"
    assert emulator.launches == launches + (case.m > 0)  # the kernels ran, once


# (m, n, k, CUs, split-K expected): 32-row and 128-row tiles, uneven and even splits, tails in M and N.
PLANS = [
    (32, 256, 1152, MI300X_CUS, True),  # 32-row tiles, 9 K blocks in splits of 5 + 4
    (33, 144, 2304, MI300X_CUS, True),  # 128-row tiles, 4 splits (5 + 5 + 5 + 3), 95 rows and 112 columns of tail
    (300, 528, 2304, 64, True),
    (300, 528, 2304, 1, False),
    (17, 48, 128, 1, False),  # one K block, 32-row tile
]


@pytest.mark.parametrize("m,n,k,cus,split", PLANS, ids=[f"{m}x{n}x{k}-{c}cu" for m, n, k, c, _ in PLANS])
def test_tile_configs_and_split_k(emulator, mi300x, m, n, k, cus, split):
    emulator.use_cu_count(cus)
    assert (emulator.workspace_bytes(m, n, k) > 0) == split
    for out_dtype in (torch.float32, torch.bfloat16):
        result = conformance.run_case(conformance.Case(m, n, k, out_dtype), "cpu", FP8, mi300x.name)
        assert result.passed, f"{cus} CUs, {out_dtype}: rel. err {result.rel_err:.3e} {result.detail}"


@pytest.mark.parametrize("bad", conformance.BAD_INPUTS, ids=[b.id for b in conformance.BAD_INPUTS])
def test_bad_input_is_rejected_as_on_the_gpu(bad, mi300x):
    ok, detail = conformance.run_bad_input(bad, "cpu", FP8, mi300x.name)
    assert ok, f"expected {bad.error.__name__} mentioning {bad.match!r}; got {detail}"


def test_launcher_errors_reach_python(emulator, mi300x):
    """launch.cpp's own checks raise through the emulated binding, like the real one's."""
    m, n, k = 8, 128, 1024
    gen = torch.Generator().manual_seed(0)
    a, b, a_scale, b_scale = conformance.make_inputs(conformance.Case(m, n, k), FP8, "cpu", gen)
    assert emulator.workspace_bytes(m, n, k) > 0
    out = torch.empty(m, n, dtype=torch.float32)
    scale_mn = torch.zeros(k // 128, 8)
    args = (a.data_ptr(), b.data_ptr(), scale_mn.data_ptr(), b_scale.data_ptr(), out.data_ptr(), 0, m, n, k)
    with pytest.raises(gfx942_emulator.EmulationError, match="split-K plan needs the workspace"):
        mi300x.launch(LAUNCH_ARGS.pack(*args, k, k, n, 8, k // 128, 1, 0))


def test_arguments_of_another_protocol_version_are_refused(emulator, mi300x):
    """The package's launcher reads the wire header before anything else, as its compiled module does."""
    address = LAUNCH_ARGS.pack(*[0] * len(LAUNCH_ARGS.fields))
    ctypes.c_uint32.from_address(address).value = PROTOCOL_VERSION + 1
    with pytest.raises(
        gfx942_emulator.EmulationError,
        match=rf"launch: arguments of protocol version {PROTOCOL_VERSION + 1} .*reads version {PROTOCOL_VERSION}",
    ):
        mi300x.launch(address)
    assert emulator.protocol_version() == PROTOCOL_VERSION
    optional = [m for m in TRAINING_MIRRORS if m.entry in gfx942_emulator.MODULE_ENTRIES]  # the entries it has
    sizes = {"launch": LAUNCH_ARGS.size, "quantize": QUANTIZE_ARGS.size, "grouped_launch": GROUPED_ARGS.size,
             **{mirror.entry: mirror.size for mirror in (*MOE_MIRRORS, *optional)}}  # fmt: skip
    assert emulator.args_sizes() == sizes


def test_oracle_distance_of_a_plain_fp32_product_is_within_tolerance(emulator, mi300x):
    """The tolerance is not vacuous here: the emulated kernel must beat a deliberately wrong scale."""
    case = conformance.Case(64, 256, 512, torch.float32)
    gen = torch.Generator().manual_seed(3)
    a, b, a_scale, b_scale = conformance.make_inputs(case, FP8, "cpu", gen)
    out = torch.full((64, 256), float("nan"))
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend=mi300x.name)
    right = oracle(a, b, a_scale, b_scale)
    wrong = oracle(a, b, a_scale.roll(1, dims=1), b_scale)
    assert conformance.relative_error(out, right) < conformance.TOLERANCE[torch.float32]
    assert conformance.relative_error(out, wrong) > 100 * conformance.TOLERANCE[torch.float32]
