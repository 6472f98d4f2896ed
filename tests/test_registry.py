"""Backend discovery and selection, with fake installed distributions (real entry points on disk).

The fake "GPU" backends here compute on CPU memory through the raw pointers the core hands them,
so these tests also check the launch protocol: pointers, leading dims, scale layouts, out kind.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import fp8gemm
import pytest
import torch
from conftest import cpu_tensors_play_a_gpu
from fp8gemm import ops, registry
from fp8gemm.reference import oracle, reference_quantize
from fp8gemm.registry import DeviceInfo
from fp8gemm.testing import conformance

H100 = DeviceInfo("cuda", "Fake H100", ("sm_90a", "sm_90"), "9.0")
MI300X = DeviceInfo("rocm", "Fake MI300X", ("gfx942",), "gfx942:sramecc+:xnack-")

# A module that implements a backend in Python over raw pointers to host memory.
POINTER_BACKEND = """
import ctypes, torch
from fp8gemm.protocol import Backend, ScaleLayout, MN_MAJOR, K_MAJOR, OUT_FP32, LAUNCH_ARGS, QUANTIZE_ARGS
from fp8gemm.reference import oracle, reference_quantize
from fp8gemm.runtime import IN_KINDS

CALLS = []

def _view(ptr, dtype, rows, cols, row_stride, col_stride):
    if rows == 0 or cols == 0:
        return torch.empty(rows, cols, dtype=dtype)
    size = ((rows - 1) * row_stride + (cols - 1) * col_stride + 1) * torch.empty((), dtype=dtype).element_size()
    raw = torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)
    return raw.view(dtype).as_strided((rows, cols), (row_stride, col_stride))

def _scale(ptr, layout, rows, cols, ld):
    strides = (ld, 1) if layout.order == K_MAJOR else (1, ld)
    return _view(ptr, torch.float32, rows, cols, *strides)

def make_quantize(name, a_layout, fp8):  # the reference's codes and scales, written in the backend's a_scale layout
    dtypes = {kind: dtype for dtype, kind in IN_KINDS.items()}
    def quantize(address):
        f = QUANTIZE_ARGS.unpack(address)
        m, k = f["m"], f["k"]
        CALLS.append(dict(name=name, entry="quantize", m=m, k=k, scale_ld=f["scale_ld"], pow2=f["pow2"]))
        q, scale = reference_quantize(_view(f["x"], dtypes[f["in_kind"]], m, k, f["ldx"], 1), getattr(torch, fp8), bool(f["pow2"]))
        _view(f["q"], getattr(torch, fp8), m, k, k, 1).copy_(q)
        _scale(f["scale"], a_layout, m, k // 128, f["scale_ld"]).copy_(scale)
    return quantize

def make(name, targets, platform="cuda", priority=0, a_layout=ScaleLayout(), b_layout=ScaleLayout(), fp8="float8_e4m3fn",
         quantizes=False):
    def launch(address):
        f = LAUNCH_ARGS.unpack(address)
        a, b, sa, sb, out, ws, m, n, k = (f[key] for key in ("a", "b", "a_scale", "b_scale", "out", "workspace", "m", "n", "k"))
        lda, ldb, ldo, sa_ld, sb_ld, out_kind = (f[key] for key in ("lda", "ldb", "ldo", "a_scale_ld", "b_scale_ld", "out_kind"))
        CALLS.append(dict(name=name, m=m, n=n, k=k, lda=lda, ldb=ldb, ldo=ldo, sa_ld=sa_ld, sb_ld=sb_ld, out_kind=out_kind, ws=ws))
        dtype = getattr(torch, fp8)
        A, B = _view(a, dtype, m, k, lda, 1), _view(b, dtype, n, k, ldb, 1)
        SA = _scale(sa, a_layout, m, k // 128, sa_ld)
        SB = _scale(sb, b_layout, -(-n // 128), k // 128, sb_ld)
        O = _view(out, torch.float32 if out_kind == OUT_FP32 else torch.bfloat16, m, n, ldo, 1)
        O.copy_(oracle(A, B, SA, SB))
    return Backend(name=name, platform=platform, targets=targets, fp8_dtype=fp8, version="9.9",
                   launch=launch, package="fake-" + name, build_info={"compiler": "python"},
                   a_scale_layout=a_layout, b_scale_layout=b_layout, priority=priority,
                   workspace_bytes=lambda m, n, k: 256, quantize=make_quantize(name, a_layout, fp8) if quantizes else None)

hopper = make("hopper", ("sm_90a",), a_layout=ScaleLayout(MN_MAJOR, 4), b_layout=ScaleLayout(K_MAJOR, 4))
hopper_generic = make("hopper_generic", ("sm_90", "sm_80"), priority=5)
hopper_quantizing = make("hopper_quantizing", ("sm_90a",), priority=-2, a_layout=ScaleLayout(MN_MAJOR, 4),
                         b_layout=ScaleLayout(K_MAJOR, 4), quantizes=True)
amd = make("amd", ("gfx942",), platform="rocm", fp8="float8_e4m3fnuz")

def factory():
    return make("lazy", ("sm_90a",), priority=-1)

def wrong_type():
    return "not a backend"
"""


def _install_fake(root, dist: str, entry_points: dict[str, str]) -> None:
    info = root / f"{dist}-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[fp8gemm.backends]\n{lines}\n")


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """A site dir with fake arch packages: good ones, a broken binary, a misnamed one."""
    (tmp_path / "fake_backends.py").write_text(POINTER_BACKEND)
    (tmp_path / "broken_backend.py").write_text(
        "raise ImportError('libcudart.so.13: cannot open shared object file')\n"
    )
    _install_fake(
        tmp_path,
        "fp8gemm_fake_hopper",
        {
            "hopper": "fake_backends:hopper",
            "hopper_generic": "fake_backends:hopper_generic",
            "lazy": "fake_backends:factory",
            "hopper_quantizing": "fake_backends:hopper_quantizing",
        },
    )
    _install_fake(tmp_path, "fp8gemm_fake_amd", {"amd": "fake_backends:amd"})
    _install_fake(
        tmp_path,
        "fp8gemm_fake_broken",
        {"broken": "broken_backend:BACKEND", "misnamed": "fake_backends:amd", "wrongtype": "fake_backends:wrong_type"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    # Only the fake distributions: real arch packages installed here must not take part.
    real = registry._entry_points
    monkeypatch.setattr(
        registry, "_entry_points", lambda: [ep for ep in real() if ep.dist.name.startswith("fp8gemm_fake")]
    )
    importlib.invalidate_caches()
    registry.installed_backends(refresh=True)
    yield tmp_path
    sys.modules.pop("fake_backends", None)
    monkeypatch.undo()  # before the refresh: the caches must be rebuilt from the real entry points, for later tests
    registry.installed_backends(refresh=True)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend the CPU is a GPU of the given kind: selection and launch then take the GPU path."""

    def use(info: DeviceInfo):
        monkeypatch.setattr(registry, "describe_device", lambda device: info)
        cpu_tensors_play_a_gpu(monkeypatch, stream=1234)
        registry.clear_caches()

    yield use
    registry.clear_caches()


def _loaded(name):
    return next(ib for ib in registry.installed_backends() if ib.name == name)


def test_discovers_every_entry_point_and_reports_broken_ones(fake_site):
    names = {ib.name: ib for ib in registry.installed_backends()}
    assert {"hopper", "hopper_generic", "lazy", "amd", "broken", "misnamed", "wrongtype"} <= set(names)
    assert names["hopper"].backend.targets == ("sm_90a",) and names["hopper"].distribution == "fp8gemm_fake_hopper"
    assert names["lazy"].backend.name == "lazy"  # a zero-argument factory is called
    assert "libcudart.so.13" in names["broken"].error and names["broken"].backend is None
    assert "calls itself 'amd'" in names["misnamed"].error
    assert "expected fp8gemm.protocol.Backend" in names["wrongtype"].error


def test_picks_the_arch_specific_target_first(fake_site, fake_gpu):
    fake_gpu(H100)
    # hopper (sm_90a) beats hopper_generic (sm_90, higher priority) and lazy (sm_90a, lower priority).
    assert fp8gemm.select("cpu").backend.name == "hopper"


def test_priority_breaks_ties(fake_site, fake_gpu):
    fake_gpu(DeviceInfo("cuda", "Fake", ("sm_80a", "sm_80"), "8.0"))
    assert fp8gemm.select("cpu").backend.name == "hopper_generic"


def test_rocm_device_gets_the_rocm_backend(fake_site, fake_gpu):
    fake_gpu(MI300X)
    assert fp8gemm.select("cpu").backend.name == "amd"
    assert fp8gemm.preferred_fp8_dtype("cpu") == torch.float8_e4m3fnuz


def test_override_by_argument_and_environment(fake_site, fake_gpu, monkeypatch):
    fake_gpu(H100)
    assert fp8gemm.select("cpu", "lazy").backend.name == "lazy"
    monkeypatch.setenv(registry.ENV_VAR, "hopper_generic")
    assert fp8gemm.select("cpu").backend.name == "hopper_generic"
    assert fp8gemm.select("cpu", "reference").backend.name == "reference"  # argument beats env


def test_missing_backend_error_names_device_installed_and_package(fake_site, fake_gpu):
    fake_gpu(DeviceInfo("cuda", "Fake RTX 5090", ("sm_120a", "sm_120"), "12.0"))
    with pytest.raises(RuntimeError) as exc:
        fp8gemm.select("cpu")
    msg = str(exc.value)
    assert "Fake RTX 5090" in msg and "12.0" in msg
    assert "hopper (sm_90a, from fp8gemm_fake_hopper)" in msg
    assert "broken (BROKEN" in msg and "libcudart.so.13" in msg
    assert "conda install fp8gemm-cuda-sm120a or fp8gemm-cuda-sm120" in msg


def test_forcing_a_broken_or_foreign_backend_is_an_error(fake_site, fake_gpu):
    fake_gpu(H100)
    with pytest.raises(RuntimeError, match="failed to load: ImportError: libcudart"):
        fp8gemm.select("cpu", "broken")
    with pytest.raises(RuntimeError, match="built for rocm gfx942"):
        fp8gemm.select("cpu", "amd")


def test_cpu_tensors_use_the_reference_without_any_backend():
    assert fp8gemm.select("cpu").backend.name == "reference"


@pytest.mark.parametrize("backend", ["hopper", "hopper_generic"])
@pytest.mark.parametrize("case", [conformance.Case(37, 272, 640, col_major_scales=True),
                                  conformance.Case(130, 144, 384, torch.float32, strided=True),
                                  conformance.Case(1, 16, 128, preallocated_out=False),
                                  conformance.Case(1, 272, 640, view="transposed-row")], ids=lambda c: c.id)  # fmt: skip
def test_launch_protocol_through_raw_pointers(fake_site, fake_gpu, case, backend):
    """The core's pointers, strides and scale layouts, read back by a backend, give the right answer."""
    fake_gpu(H100)
    result = conformance.run_case(case, "cpu", torch.float8_e4m3fn, backend)
    assert result.passed, result.detail
    call = importlib.import_module("fake_backends").CALLS[-1]
    assert call["name"] == backend and (call["m"], call["n"], call["k"]) == (case.m, case.n, case.k)
    assert call["ws"] != 0  # the backend asked for workspace and got a pointer
    if case.m == 1:  # one row's stride, never stepped over, is handed as the row length (a tensor map's rule)
        assert (call["lda"], call["ldo"]) == (case.k, case.n)
    if backend == "hopper":  # MN-major scales with leading dims padded to 4
        assert call["sa_ld"] % 4 == 0 and call["sa_ld"] >= case.m
        assert call["sb_ld"] % 4 == 0


def test_prepared_weight_scale_is_not_converted_again(fake_site, fake_gpu, monkeypatch):
    fake_gpu(H100)
    b_scale = torch.rand(3, 5).t().contiguous().t()  # column-major; hopper wants K-major, ld % 4
    prepared = fp8gemm.prepare_weight_scale(b_scale)
    assert prepared.stride() == (8, 1) and torch.equal(prepared, b_scale)
    from fp8gemm.validation import conform_scale

    assert conform_scale(prepared, _loaded("hopper").backend.b_scale_layout)[0] is prepared


def test_wrong_fp8_dtype_for_backend(fake_site, fake_gpu):
    fake_gpu(MI300X)
    args = conformance.make_inputs(conformance.Case(16, 128, 128), torch.float8_e4m3fn, "cpu", torch.Generator())
    with pytest.raises(TypeError, match="takes torch.float8_e4m3fnuz"):
        fp8gemm.gemm(*args)


def test_info_cli_reports_broken_backend_with_loader_error(fake_site):
    env_path = str(fake_site)
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {env_path!r})
        from fp8gemm.cli import main
        sys.exit(main(["info", "--device", "cpu"]))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "FAILED TO LOAD" in run.stdout and "libcudart.so.13" in run.stdout
    assert "hopper" in run.stdout and "selected: reference" in run.stdout


@pytest.mark.parametrize("bad", conformance.BAD_INPUTS, ids=[b.id for b in conformance.BAD_INPUTS])
def test_fast_path_never_accepts_bad_input(fake_site, fake_gpu, bad):
    """Every bad input still raises its precise error with a backend that takes the fast path."""
    fake_gpu(H100)
    if bad.id == "a_scale-device":
        pytest.skip("the fake GPU backend runs on the CPU: no second device to move a_scale to")
    ok, detail = conformance.run_bad_input(bad, "cpu", torch.float8_e4m3fn, "hopper_generic")
    assert ok, detail


def test_steady_state_call_takes_the_fast_path(fake_site, fake_gpu, monkeypatch):
    fake_gpu(H100)
    case = conformance.Case(64, 256, 512)
    a, b, a_scale, b_scale = conformance.make_inputs(case, torch.float8_e4m3fn, "cpu", torch.Generator().manual_seed(0))
    b_scale = fp8gemm.prepare_weight_scale(b_scale, backend="hopper")
    a, a_scale = fp8gemm.quantize_activation(torch.randn(64, 512), backend="hopper")  # scales MN-major
    assert a_scale.stride(0) == 1 and a_scale.stride(1) % 4 == 0
    general = []
    monkeypatch.setattr(ops, "checked_gemm_plan", lambda *args: general.append(args))
    out = torch.full((64, 256), float("nan"), dtype=torch.float32)
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out, backend="hopper")
    assert general == []  # no fallback: everything was already in the backend's layout
    assert conformance.relative_error(out, oracle(a, b, a_scale, b_scale)) < 1e-5


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", ["hopper", "hopper_quantizing"])
def test_linear_without_a_linear_entry_quantizes_then_launches_the_gemm(fake_site, fake_gpu, backend, x_dtype):
    """A backend without a linear entry: its quantization kernel (the reference where it has none) writes the scales
    in the layout its GEMM reads, then its GEMM runs: the result is the GEMM of the reference's codes, bit for bit,
    with or without scales already prepared (the checked and the fast plan)."""
    fake_gpu(H100)
    seed = 60 + (backend == "hopper") + 2 * (x_dtype == torch.float16)
    print(f"data seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, 3, 256, generator=gen) * 4).to(x_dtype)
    weight, weight_scale = fp8gemm.quantize_weight(torch.randn(144, 256, generator=gen))
    bias = torch.randn(144, generator=gen).to(x_dtype)
    q, scale = reference_quantize(x.reshape(6, 256), torch.float8_e4m3fn, True)
    gemm_dtype = torch.bfloat16 if x_dtype == torch.bfloat16 else torch.float32
    want = ((oracle(q, weight, scale, weight_scale).to(gemm_dtype) + bias).to(x_dtype)).view(2, 3, 144)
    calls = importlib.import_module("fake_backends").CALLS
    for scales in (weight_scale, fp8gemm.prepare_weight_scale(weight_scale, backend=backend)):
        calls.clear()
        y = fp8gemm.linear(x, weight, scales, bias, pow2_scales=True, backend=backend)
        assert y.dtype == x_dtype and torch.equal(y, want)
        entries = [(c["name"], c.get("entry", "launch")) for c in calls]
        expected = [(backend, "quantize")] if backend == "hopper_quantizing" else []
        assert entries == [*expected, (backend, "launch")]
        assert calls[-1]["sa_ld"] % 4 == 0 and calls[-1]["sa_ld"] >= 6  # MN-major scales, ld padded to 4
