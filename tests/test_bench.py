"""``fp8gemm bench``: the accuracy table where there is no GPU, its shape checks, and the timing report's pieces."""

from __future__ import annotations

import json

import pytest
import torch
from fp8gemm.cli import main
from fp8gemm_bench import accuracy, bench
from fp8gemm_bench import cli as cli_bench

BLOCK_SCALED, PER_TENSOR, PER_ROW, BF16 = accuracy.RECIPES


def test_bench_without_a_gpu_shows_the_recipes_accuracy_not_a_speedup(tmp_path, capsys):
    js, png = tmp_path / "a.json", tmp_path / "a.png"
    assert main(["bench", "--device", "cpu", "--shapes", "64,256,1024", "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "Nothing to time on CPU" in out and "speedup" not in out and BLOCK_SCALED in out
    report = json.loads(js.read_text())
    assert report["environment"]["backend"] == "reference" and report["data"] == accuracy.DATA
    assert report["environment"]["seed"] == bench.DEFAULT_SEED and f"data seed {bench.DEFAULT_SEED}" in out
    err = {(r["data"], r["recipe"]): (r["median_rel_err"], r["worst_rel_err"]) for r in report["accuracy"]}
    assert len(err) == len(accuracy.DATA) * len(accuracy.RECIPES) and all(0 < e < 2 for v in err.values() for e in v)
    # e4m3's 3 mantissa bits: ~4% per token for every FP8 recipe; bf16's 8 bits about 10x less.
    assert all(0.015 < err["normal", r][0] < 0.06 for r in (BLOCK_SCALED, PER_TENSOR, PER_ROW))
    assert err["normal", BF16][0] < 0.006 and err["outliers", BF16][1] < 0.01
    # Tokens four decades below the largest underflow with one scale per tensor; a scale per 128 values keeps them.
    assert (
        err["outliers", BLOCK_SCALED][1] < 0.06
        and err["outliers", PER_TENSOR][1] > 2 * err["outliers", BLOCK_SCALED][1]  # 3.6-5x over 60 seeds
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_token_errors_against_float64():
    ref = torch.randn(5, 64, dtype=torch.float64) + 0.1
    noise = torch.randn(5, 64, dtype=torch.float64)
    scale = torch.tensor([1e-3, 1e-2, 0.1, 0.5, 1.0], dtype=torch.float64)[:, None]
    out = (ref + scale * noise * ref.norm(dim=1, keepdim=True) / noise.norm(dim=1, keepdim=True)).float()
    assert torch.allclose(accuracy.token_errors(out, ref), scale.squeeze(1), rtol=1e-4)


def test_outlier_data_spans_the_stated_range():
    x, w = accuracy.make_data("outliers", 256, 128, 1024, torch.Generator().manual_seed(7))
    token_rms = x.pow(2).mean(dim=1).sqrt()
    assert 1e3 < token_rms.max() / token_rms.min() < 1e5  # four decades, give or take the draw
    channel_amax = x.abs().amax(dim=0)
    assert (channel_amax > 30 * channel_amax.median()).sum() == accuracy.OUTLIER_CHANNELS
    with pytest.raises(ValueError, match="data kind must be one of normal, outliers"):
        accuracy.make_data("spiky", 4, 16, 128, torch.Generator())


@pytest.mark.parametrize(
    "shape, message",
    [
        ("16,250,512", "N = 250 must be a positive multiple of 16 (pad it to 256)"),
        ("16,256,100", "K = 100 must be a positive multiple of 128 (pad it to 128)"),
        ("16,256", "has 2 value(s); write a shape as M,N,K"),
        ("16,256,512,1", "has 4 value(s)"),
        ("16,256.5,512", "M, N and K must be integers"),
        ("0,256,512", "M = 0 must be at least 1"),
    ],
)
def test_bad_shapes_name_the_argument_and_the_fix(shape, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--device", "cpu", "--shapes", "16,256,512", shape])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shapes" in err and message in err


def test_timing_needs_a_gpu():
    with pytest.raises(ValueError, match="timing needs a GPU"):
        bench.run([(16, 256, 512)], torch.device("cpu"))
    assert bench.available_peers(torch.device("cpu")) == {}


def test_bench_rounds_alternate_the_order_and_keep_the_median():
    order = []
    scripted = {"ours": iter([3.0, 1.0, 2.0]), "peer": iter([5.0, 4.0, 6.0])}

    def timer(fn):
        order.append(fn())
        return next(scripted[order[-1]])

    rows = {name: {"impl": name, "m": 2, "n": 4, "k": 8} for name in ("ours", "peer", "broken")}
    bench.time_rounds({"ours": lambda: "ours", "peer": lambda: "peer"}, rows, timer, 3, None)
    assert order == ["ours", "peer", "peer", "ours", "ours", "peer"]
    assert rows["ours"]["us"] == 2e6 and rows["ours"]["us_rounds"] == [3e6, 1e6, 2e6]
    assert rows["peer"]["us"] == 5e6 and rows["peer"]["tflops"] == 2.0 * 2 * 4 * 8 / 5.0 / 1e12
    assert "us" not in rows["broken"]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        bench.run([(16, 256, 512)], torch.device("cpu"), rounds=0)
    spread = bench._round_spread({(2, 4, 8): rows["ours"]}, [(2, 4, 8)], [rows["ours"]["tflops"]])
    assert spread == [[pytest.approx(128 / 2e12 - 128 / 3e12)], [pytest.approx(128 / 1e12 - 128 / 2e12)]]  # whiskers
    assert bench._round_spread({(2, 4, 8): rows["broken"]}, [(2, 4, 8)], [0.0]) is None


def test_timing_report_table_json_and_plot(tmp_path, capsys):
    """A GPU report's rendering, from made-up timings: ours at twice the peer's rate, the peer wrong on one shape."""
    env = {"device": "a GPU", "torch": torch.__version__, "date": "2026-01-01T00:00:00+00:00", "rounds": 2,
           "gpu_state": "sustained"}  # fmt: skip
    results = []
    for m, n, k in ((64, 2112, 7168), (4096, 7168, 2048)):
        flops = 2.0 * m * n * k
        for impl, us, err in ((bench.OURS, 10.0, 1e-3), ("peer", 20.0, 0.5 if m == 64 else 1e-3)):
            results.append({"impl": impl, "m": m, "n": n, "k": k, "rel_err": err, "us": us,
                            "tflops": flops / us / 1e6, "us_rounds": [us, us * 1.1]})  # fmt: skip
    report = {"environment": env, "results": results}
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    bench.save_json(report, js)
    bench.plot(report, png)
    cli_bench.print_bench_table(report)
    assert json.loads(js.read_text())["geomean_speedup_of_ours"] == {"peer": pytest.approx(2.0)}
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "median of 2 interleaved rounds" in out and "sustained" in out and "over peer: 2.00x" in out
    assert "WRONG, err 0.5" in out


def test_host_overhead_is_the_median_of_its_loops(monkeypatch):
    """One loop's figure follows the host's state (5-13 us on one H200 host), so the bench reports the median
    of several loops, collection off and on alternating, with the off-loops' range."""
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
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)  # CPU-only test machine
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    clock = [0.0]  # a fake clock: each call lasts exactly 10 ms, whatever the machine's load
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    calls = []

    def call():
        calls.append(None)
        clock[0] += 0.01

    bench._settle(call, "sustained")
    assert len(calls) == 1 + round(bench.SUSTAIN_SECONDS / 0.01)  # one measuring call, then calls of its length
    assert clock[0] >= bench.SUSTAIN_SECONDS
    calls.clear()
    bench._settle(call, "rested")
    assert slept == [bench.REST_SECONDS] and not calls
    bench._settle(call, "as-is")
    assert slept == [bench.REST_SECONDS] and not calls


def test_bench_rejects_an_unknown_gpu_state():
    with pytest.raises(ValueError, match="gpu_state must be one of sustained, rested, as-is"):
        bench.run([(16, 256, 512)], torch.device("cpu"), gpu_state="hot")
    with pytest.raises(ValueError, match="got 'warm'"):
        bench.time_gpu(lambda: None, "warm")


def _fake_layer_bench(monkeypatch, device_name="GPU A"):
    """layer_bench.run with its GPU parts replaced: rows carry made-up times, the rest is the real bookkeeping."""
    from fp8gemm_bench import layer_bench
    from fp8gemm_bench.layer_peers import BF16, GEMM_ALONE, OURS

    timed = []

    def time_shape(m, n, k, paths, device, seed):
        timed.append((m, n, k))
        us = {BF16: 2.0 * m, OURS: 1.0 * m, GEMM_ALONE: 0.8 * m, layer_bench.FLOOR_X: 0.4 * m}
        return {"m": m, "n": n, "k": k, "us": us, "errors": {}}

    env = {"host": "h", "device": device_name, "driver": "1", "torch": "t", "fp8gemm": "v", "backend_build": {}}
    monkeypatch.setattr(layer_bench, "layer_paths", lambda device: {BF16: None, OURS: None})
    monkeypatch.setattr(layer_bench, "time_shape", time_shape)
    monkeypatch.setattr(layer_bench, "environment", lambda device, backend, seed: dict(env, seed=seed))
    monkeypatch.setattr(layer_bench, "peer_versions", lambda: {})
    monkeypatch.setattr(layer_bench, "eager_wall", lambda device, seed: {"us_per_call": {"linear": 1.0, "gemm": 1.0}})
    monkeypatch.setattr(layer_bench, "quantize_bandwidth", lambda device, shapes, seed: [])
    return layer_bench, timed


def test_a_layer_run_cut_short_resumes_where_it_stopped(monkeypatch):
    layer_bench, timed = _fake_layer_bench(monkeypatch)
    shapes = [(1, 256, 512), (16, 256, 512), (512, 256, 512)]
    saved = []

    def checkpoint(report):  # the process is killed after its second shape
        saved.append(json.loads(json.dumps(report)))
        if len(report["rows"]) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        layer_bench.run("cpu", shapes, progress=lambda text: None, checkpoint=checkpoint)
    partial = saved[-1]
    assert partial["partial"] and [(r["m"], r["n"], r["k"]) for r in partial["rows"]] == shapes[:2]
    timed.clear()
    report = layer_bench.run("cpu", shapes[::-1], progress=lambda text: None, earlier=partial)
    assert timed == [shapes[2]] and "partial" not in report and report["environment"]["processes"] == 2
    assert [(r["m"], r["n"], r["k"]) for r in report["rows"]] == shapes[::-1]
    assert report["summary"]["fp8gemm.linear"]["geomean_vs_bf16"] == pytest.approx(2.0)
    assert report["summary"]["layer_over_gemm_alone_m_le_128_max"] == pytest.approx(1.25)
    assert report["summary"][layer_bench.TWO_LAUNCH_BOUND]["geomean_vs_bf16"] == pytest.approx(2.0 / 1.2)


def test_resuming_on_another_gpu_is_refused(monkeypatch):
    layer_bench, _ = _fake_layer_bench(monkeypatch, device_name="GPU B")
    earlier = {"environment": {"host": "h", "device": "GPU A", "driver": "1", "torch": "t"}, "rows": []}
    with pytest.raises(ValueError, match="device is 'GPU A'.*start a new report"):
        layer_bench.run("cpu", [(1, 256, 512)], progress=lambda text: None, earlier=earlier)


def test_resuming_with_another_seed_is_refused(monkeypatch):
    """Rows timed on other data would mix two runs in one report."""
    layer_bench, _ = _fake_layer_bench(monkeypatch)
    first = layer_bench.run("cpu", [(1, 256, 512)], progress=lambda text: None, seed=1)
    assert first["environment"]["seed"] == 1
    with pytest.raises(ValueError, match="seed is 1, this run's is 2"):
        layer_bench.run("cpu", [(1, 256, 512), (16, 256, 512)], progress=lambda text: None, earlier=first, seed=2)


def test_a_shapes_data_depends_on_the_seed_and_the_shape_only():
    def draw(seed, *key):
        return torch.randn(4, generator=bench.seeded_generator(seed, "cpu", *key))

    assert torch.equal(draw(0, 64, 256, 512), draw(0, 64, 256, 512))
    assert not torch.equal(draw(0, 64, 256, 512), draw(1, 64, 256, 512))
    assert not torch.equal(draw(0, 64, 256, 512), draw(0, 64, 256, 1024))
