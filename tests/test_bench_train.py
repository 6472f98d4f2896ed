"""``fp8gemm bench --train``: the layer and weight-gradient harness end to end in its smoke mode on the CPU, its report's
fields, its case lists and operands, and its command-line mistakes. No timing is asserted."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from fp8gemm.cli import main
from fp8gemm.training import quantize_with_transpose
from fp8gemm_bench import bench, train_bench, train_peers
from fp8gemm_bench.train_peers import BF16, LAYER_PATHS, OURS, W_BF16, W_DEEPGEMM, W_FORWARD_FORM, W_OURS, W_OURS_ACC

pytestmark = pytest.mark.filterwarnings("ignore:.*pure-torch reference")


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    js, png = out / "train.json", out / "train.png"
    code = main(["bench", "--train", "--smoke", "--device", "cpu", "--json", str(js), "--plot", str(png)])
    return code, json.loads(js.read_text()), png


def test_the_smoke_run_writes_a_report_and_a_plot(smoke_report, capsys):
    code, report, png = smoke_report
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    env = report["environment"]
    for key in ("date", "device", "torch", "fp8gemm", "seed", "peers", "missing", "method", "gpu_name", "smoke"):
        assert key in env, key
    assert env["smoke"] is True and env["seed"] == bench.DEFAULT_SEED
    assert report["paths"] == {"layer": list(LAYER_PATHS), "wgrad": list(train_peers.WGRAD_PATHS)}
    assert {"layer", "wgrad", "targets"} <= report["summary"].keys()
    assert set(report["summary"]["targets"]) == set(train_bench.TARGETS)


def test_every_case_times_bf16_and_ours_and_says_why_a_peer_did_not_run(smoke_report):
    _, report, _ = smoke_report
    layers = [r for r in report["rows"] if r["set"] == "layer"]
    wgrads = [r for r in report["rows"] if r["set"] == "wgrad"]
    assert [r["label"] for r in layers] == [c.label for c in train_bench.layer_cases(smoke=True)]
    assert len(wgrads) == len(layers) + len(train_bench.SMOKE_DEEPGEMM_NK)
    for r in layers:
        assert {BF16, OURS} <= r["us"].keys() and r["tflops"].keys() == r["us"].keys()
        assert r["vs_bf16"][BF16] == 1.0 and all(v > 0 for v in r["vs_bf16"].values())
        assert set(LAYER_PATHS) == r["us"].keys() | r["errors"].keys()  # timed, or the reason it was not
    for r in wgrads:
        assert {W_OURS, W_OURS_ACC, W_FORWARD_FORM, W_BF16} <= r["us"].keys()
        assert r["rel_err"][W_OURS] < 1e-5 and r["rel_err"][W_OURS_ACC] < 1e-5  # the float64 product of its operands
        assert r["rel_err"][W_BF16] < 4e-3 and r["rel_err"][W_FORWARD_FORM] < 0.06
        assert set(train_peers.WGRAD_PATHS) == r["us"].keys() | r["errors"].keys()
    assert any(r["model"] == "deepgemm-tests" for r in wgrads)


def test_gradient_errors_against_float64(smoke_report):
    _, report, _ = smoke_report
    nks = {(c.n, c.k) for c in train_bench.layer_cases(smoke=True)}
    assert {(r["n"], r["k"]) for r in report["gradient_errors"]} == nks
    for r in report["gradient_errors"]:
        assert r["m"] == train_bench.SMOKE_ERROR_M
        assert all(0 < e < 0.01 for e in r["rel_err"][BF16].values())  # bf16's rounding of y, dX and dW
        assert all(0.01 < e < 0.05 for e in r["rel_err"][OURS].values())  # FP8's: 3.6-3.8% (docs/training.md)


def test_peers_that_cannot_run_here_are_reported_with_the_reason():
    missing = train_peers.missing_paths(torch.device("cpu"))
    assert set(missing) == {*train_peers.TORCHAO, W_DEEPGEMM, train_peers.W_DEEPGEMM_FORWARD, train_peers.W_SCALED_MM}
    assert all(why.startswith(("missing: ", "not run: ")) for why in missing.values())


def test_a_cut_short_report_resumes_without_timing_again(smoke_report):
    _, report, _ = smoke_report

    def timer(fn):
        raise AssertionError("a kept case was timed again")

    timer.iters, timer.warmup_calls, timer.warmup_seconds = 1, 1, 0.0
    again = train_bench.run("cpu", smoke=True, earlier=report, timer=timer, progress=lambda text: None)
    assert again["rows"] == report["rows"] and again["environment"]["processes"] == 2


def test_a_run_cut_before_its_first_case_keeps_its_gradient_errors(smoke_report, monkeypatch):
    """The report is checkpointed once the accuracy rows exist, and a resumed run takes them from it."""
    _, report, _ = smoke_report
    saved = []

    def stop(report):
        saved.append(json.loads(json.dumps(report)))
        raise KeyboardInterrupt  # cut short at the first checkpoint

    with pytest.raises(KeyboardInterrupt):
        train_bench.run("cpu", smoke=True, checkpoint=stop, progress=lambda text: None)
    assert saved[0]["rows"] == [] and saved[0]["gradient_errors"]
    monkeypatch.setattr(train_bench, "gradient_errors", lambda *a: pytest.fail("computed again"))
    resumed = train_bench.run("cpu", smoke=True, earlier=saved[0], progress=lambda text: None)
    assert resumed["gradient_errors"] == saved[0]["gradient_errors"] and resumed["rows"]


def test_the_case_lists():
    cases = train_bench.layer_cases()
    assert len(cases) == len(train_bench.TRAIN_M) * (len(train_bench.LLAMA3_8B_NK) + len(train_bench.DEEPSEEK_V3_NK))
    assert all(c.n % 128 == 0 and c.k % 128 == 0 for c in cases)
    assert {(c.n, c.k) for c in cases if c.model == "llama-3-8b"} == {(6144, 4096), (4096, 4096), (28672, 4096),
                                                                     (4096, 14336)}  # fmt: skip
    wgrad = train_bench.wgrad_cases(cases)
    own = [r for r in wgrad if train_bench.is_deepgemm_own(r.__dict__)]
    assert {(c.n, c.k) for c in own} == set(train_bench.DEEPGEMM_WGRAD_NK)  # 2112 and 576 among them
    assert len({c.label for c in cases + wgrad}) == len(cases + wgrad)
    with pytest.raises(ValueError, match="N and K multiples of 128"):
        train_bench.layer_cases([(256, 2112, 7168)])


def test_the_weight_gradient_operands_are_the_training_layers_bits():
    x = torch.randn(300, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = quantize_with_transpose(x)
    q_t, scale_t = train_peers.transposed_1x128(x, want.q_t.dtype)
    assert torch.equal(q_t.view(torch.uint8), want.q_t.view(torch.uint8)) and torch.equal(scale_t, want.scale_t)
    q_t, scale_t = train_peers.transposed_1x128(torch.randn(200, 576).bfloat16(), torch.float8_e4m3fn)
    assert q_t.shape == (576, 256) and scale_t.shape == (576, 2)  # any column count; tokens padded to 128


def test_the_timer_warms_up_and_takes_the_median():
    calls = []
    timer = train_bench.Timer("cpu", iters=5, warmup_calls=3, warmup_seconds=0.0)
    assert timer(lambda: calls.append(1)) >= 0 and len(calls) == 8 and len(timer.last) == 5


def test_host_and_gpu_times_apart_only_on_a_gpu_and_the_host_pace_bound(smoke_report):
    assert train_bench.Timer("cpu").split(lambda: None) is None  # no sleep kernel to queue behind
    layers = [r for r in smoke_report[1]["rows"] if r["set"] == "layer"]
    assert all(r["host_us"] == {} and r["gpu_us"] == {} and r["vs_bf16_at_host_pace"] == {} for r in layers)
    row = {"us": {BF16: 300.0, OURS: 350.0}, "host_us": {BF16: 120.0, OURS: 250.0}}
    train_bench._ratios(row)
    assert row["vs_bf16_at_host_pace"] == {BF16: 2.5, OURS: 1.2}  # bf16's time over each path's host time


def test_wgrad_alone_times_only_weight_gradient_rows_on_any_shape(tmp_path):
    """--train --wgrad --shapes: DeepGEMM's kind of shapes (N not a multiple of 128), no layer or accuracy rows."""
    js, png = tmp_path / "wgrad.json", tmp_path / "wgrad.png"
    argv = ["bench", "--train", "--wgrad", "--smoke", "--device", "cpu", "--shapes", "200,144,256", "--json", str(js),
            "--plot", str(png)]  # fmt: skip
    assert main(argv) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    report = json.loads(js.read_text())
    assert [(r["set"], r["m"], r["n"], r["k"]) for r in report["rows"]] == [("wgrad", 200, 144, 256)]
    assert report["gradient_errors"] == []
    (row,) = report["rows"]
    assert train_peers.W_OURS in row["us"] and row["rel_err"][train_peers.W_OURS] < 1e-5


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--train"], "add --smoke to run the harness"),
        (["--train", "--smoke", "--shapes", "256,2112,7168"], "--shapes: 256,2112,7168: a trained layer needs N and K"),
        (["--train", "--smoke", "--steps", "3"], "--steps goes with --train-run or --train-fsdp"),
        (["--train", "--layer"], "--layer and --train are separate benchmarks"),
        (["--throughput"], "--throughput with --train-run"),
        (["--train-fsdp", "--throughput", "--smoke"], "--throughput goes with --train-run"),
        (["--train-run", "--smoke", "--shapes", "256,256,256"], "--shapes goes with --train"),
        (["--train", "--smoke", "--resume"], "--resume goes with --train and --json"),
        (["--train", "--smoke", "--quick"], "--quick and --decode go with --moe"),
        (["--wgrad", "--smoke"], "--wgrad goes with --train"),
        (["--train", "--moe", "--wgrad", "--smoke"], "--wgrad goes with --train"),
        (["--train", "--models", "qwen3-30b-a3b"], "--models goes with --moe or --train --moe"),
        (["--train", "--moe", "--smoke", "--models", "qwen3-30b-a3b"], "--smoke times its own tiny model"),
    ],
)
def test_mistakes_exit_2_with_the_fix(capsys, argv, words):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_models_name_the_known_ones(capsys):
    with pytest.raises((SystemExit, argparse.ArgumentTypeError)) as raised:
        main(["bench", "--device", "cpu", "--moe", "--models", "qwen3,llama"])
    text = str(raised.value) if raised.type is not SystemExit else capsys.readouterr().err
    assert "name one or more of deepseek-v3, deepseek-v3-ep8, qwen3-30b-a3b" in text
