"""The public API around the kernel: torch.compile, torch.library, layouts adapter, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import fp8gemm
import pytest
import torch
from fp8gemm import conformance
from fp8gemm.cli import main
from fp8gemm.reference import oracle


def _inputs(m=48, n=272, k=384, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return conformance.make_inputs(conformance.Case(m, n, k), torch.float8_e4m3fn, "cpu", gen)


def test_torch_compile_fullgraph_matches_eager():
    a, b, sa, sb = _inputs()

    def layer(a, sa):
        return fp8gemm.gemm(a, b, sa, sb).float().relu()

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(a, sa), layer(a, sa))


def test_torch_compile_out_variant():
    a, b, sa, sb = _inputs(seed=1)
    out = torch.full((48, 272), float("nan"), dtype=torch.float32)

    def layer(a, sa, out):
        fp8gemm.gemm(a, b, sa, sb, out=out)
        return out * 2

    doubled = torch.compile(layer, backend="aot_eager", fullgraph=True)(a, sa, out)
    assert conformance.relative_error(doubled / 2, oracle(a, b, sa, sb)) < 1e-5


# opcheck's test_schema compares inputs with mul, which CPU torch lacks for FP8; the rest apply.
OPCHECKS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def test_opcheck_of_registered_ops():
    a, b, sa, sb = _inputs(seed=2)
    torch.library.opcheck(
        torch.ops.fp8gemm.gemm.default, (a, b, sa, sb, torch.bfloat16, "reference"), test_utils=OPCHECKS
    )
    out = torch.empty(48, 272, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fp8gemm.gemm_out.default, (a, b, sa, sb, out, "reference"), test_utils=OPCHECKS)


def test_fake_tensor_shapes_and_errors_at_trace_time():
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, sa, sb = _inputs(seed=3)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fa, fb, fsa, fsb = (mode.from_tensor(t) for t in (a, b, sa, sb))
        out = torch.ops.fp8gemm.gemm(fa, fb, fsa, fsb, torch.float32, "")
        assert out.shape == (48, 272) and out.dtype == torch.float32
        with pytest.raises(ValueError, match="a_scale must be"):
            torch.ops.fp8gemm.gemm(fa, fb, fsa[:, :1], fsb, torch.bfloat16, "")


def test_empty_m_returns_empty():
    a, b, sa, sb = _inputs(m=0)
    assert fp8gemm.gemm(a, b, sa, sb).shape == (0, 272)


def test_kxm_layout_adapter():
    a, b, sa, sb = _inputs(seed=4)
    args = fp8gemm.from_kxm_layout(a.t().contiguous(), b.t().contiguous(), sa.t().contiguous(), sb.t().contiguous())
    out = torch.empty(48, 272, dtype=torch.float32)
    fp8gemm.gemm(*args, out=out)
    assert conformance.relative_error(out, oracle(a, b, sa, sb)) < 1e-5
    with pytest.raises(ValueError, match="K differs"):
        fp8gemm.from_kxm_layout(a.t(), b[:, :128].t(), sa.t(), sb.t())


def test_cli_check_passes_on_reference(capsys):
    assert main(["check", "--random", "2", "--device", "cpu"]) == 0
    assert "0 failure(s)" in capsys.readouterr().out


def test_cli_bench_writes_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    assert (
        main(
            ["bench", "--device", "cpu", "--shapes", "16,256,512", "64,128,256", "--json", str(js), "--plot", str(png)]
        )
        == 0
    )
    report = json.loads(js.read_text())
    assert report["environment"]["backend"] == "reference" and report["environment"]["torch"] == torch.__version__
    rows = [r for r in report["results"] if r["impl"] == "fp8gemm"]
    assert len(rows) == 2 and all(r["tflops"] > 0 and r["rel_err"] < 4e-3 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "16x256x512" in capsys.readouterr().out


def test_bench_rounds_alternate_the_order_and_keep_the_median(capsys, tmp_path):
    from fp8gemm import bench

    order = []
    scripted = {"ours": iter([3.0, 1.0, 2.0]), "peer": iter([5.0, 4.0, 6.0])}

    def timer(fn):
        order.append(fn())
        return next(scripted[order[-1]])

    rows = {name: {"impl": name, "m": 2, "n": 4, "k": 8} for name in ("ours", "peer", "broken")}
    bench._time_rounds({"ours": lambda: "ours", "peer": lambda: "peer"}, rows, timer, 3, None)
    assert order == ["ours", "peer", "peer", "ours", "ours", "peer"]
    assert rows["ours"]["us"] == 2e6 and rows["ours"]["us_rounds"] == [3e6, 1e6, 2e6]
    assert rows["peer"]["us"] == 5e6 and rows["peer"]["tflops"] == 2.0 * 2 * 4 * 8 / 5.0 / 1e12
    assert "us" not in rows["broken"]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        bench.run([(16, 256, 512)], torch.device("cpu"), rounds=0)
    spread = bench._round_spread({(2, 4, 8): rows["ours"]}, [(2, 4, 8)], [rows["ours"]["tflops"]])
    assert spread == [[pytest.approx(128 / 2e12 - 128 / 3e12)], [pytest.approx(128 / 1e12 - 128 / 2e12)]]  # whiskers
    assert bench._round_spread({(2, 4, 8): rows["broken"]}, [(2, 4, 8)], [0.0]) is None
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = [
        "bench",
        "--device",
        "cpu",
        "--shapes",
        "16,256,512",
        "--rounds",
        "2",
        "--json",
        str(js),
        "--plot",
        str(png),
    ]
    assert main(argv) == 0 and png.read_bytes()[:4] == b"\x89PNG"
    report = json.loads(js.read_text())
    assert report["environment"]["rounds"] == 2
    assert all(
        len(r["us_rounds"]) == 2 and r["us"] == pytest.approx(sum(r["us_rounds"]) / 2) for r in report["results"]
    )
    assert "median of 2 interleaved rounds" in capsys.readouterr().out


def test_host_overhead_is_the_median_of_its_loops(monkeypatch):
    """One loop's figure follows the host's state (5-13 us on one H200 machine), so the bench reports the median
    of several loops, collection off and on alternating, with the off-loops' range."""
    from fp8gemm import bench

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)  # CPU-only test machine
    monkeypatch.setattr(bench, "time_gpu", lambda fn: 5e-6)
    monkeypatch.setattr(bench, "gemm", lambda *a, **k: None)
    per_call = iter([10e-6, 20e-6, 30e-6, 20e-6, 12e-6, 21e-6])  # loops: off, on, off, on, off, on
    clock = []

    def perf_counter():  # start and end of each loop: 10 calls at the loop's scripted time per call
        clock.append(clock[-1] + 10 * next(per_call) if len(clock) % 2 else 0.0)
        return clock[-1]

    monkeypatch.setattr(bench.time, "perf_counter", perf_counter)
    h = bench.host_overhead(torch.device("cpu"), None, calls=10, repeats=3)
    assert h["wall_us_per_call"] == pytest.approx(12.0) and h["host_overhead_us"] == pytest.approx(7.0)
    assert h["host_overhead_us_range"] == [pytest.approx(5.0), pytest.approx(25.0)]
    assert h["host_overhead_us_gc_on"] == pytest.approx(15.0) and (h["loops"], h["calls_per_loop"]) == (3, 10)


def test_bench_settles_the_gpu_before_each_timing(monkeypatch):
    from fp8gemm import bench

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)  # CPU-only test machine
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    calls = []

    def call():
        calls.append(None)
        end = bench.time.perf_counter() + 0.01
        while bench.time.perf_counter() < end:
            pass

    start = bench.time.perf_counter()
    bench._settle(call, "sustained")
    assert bench.time.perf_counter() - start >= 0.9 * bench.SUSTAIN_SECONDS
    assert 0.8 * bench.SUSTAIN_SECONDS / 0.01 <= len(calls) <= 1.1 * bench.SUSTAIN_SECONDS / 0.01 + 1
    calls.clear()
    bench._settle(call, "rested")
    assert slept == [bench.REST_SECONDS] and not calls
    bench._settle(call, "as-is")
    assert slept == [bench.REST_SECONDS] and not calls


def test_bench_rejects_an_unknown_gpu_state():
    from fp8gemm import bench

    with pytest.raises(ValueError, match="gpu_state must be one of sustained, rested, as-is"):
        bench.run([(16, 256, 512)], torch.device("cpu"), gpu_state="hot")
    with pytest.raises(ValueError, match="got 'warm'"):
        bench.time_gpu(lambda: None, "warm")


def test_cli_rejects_bad_shape_and_bad_backend(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--shapes", "16,256"])
    assert main(["check", "--device", "cpu", "--backend", "nope"]) == 2
    assert "is not installed" in capsys.readouterr().out


def test_python_dash_m_entry():
    run = subprocess.run(
        [sys.executable, "-m", "fp8gemm", "info", "--json", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["selected"]["name"] == "reference"
