"""``fp8gemm bench --train --moe``: the experts layer and k-grouped harness end to end in its smoke mode on the CPU,
its report's fields, its case list, the reference layer against float64 and its command-line mistakes. No timing is
asserted."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from fp8gemm.cli import main
from fp8gemm_bench import bench, train_moe_bench, train_moe_peers
from fp8gemm_bench.train_moe_peers import BF16, K_OURS, K_OURS_BF16, KGROUPED_PATHS, LAYER_PATHS, OURS

pytestmark = pytest.mark.filterwarnings("ignore:.*pure-torch reference")


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_moe")
    js, png = out / "train_moe.json", out / "train_moe.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    code = main(["bench", "--train", "--moe", "--smoke", "--device", "cpu", "--json", str(js), *plot])
    return code, json.loads(js.read_text()), png if plot else None


def test_the_smoke_run_writes_a_report_and_a_plot(smoke_report):
    code, report, png = smoke_report
    assert code == 0 and (png is None or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n")
    env = report["environment"]
    for key in ("date", "device", "torch", "fp8gemm", "seed", "peers", "missing", "method", "smoke", "notes",
                "copy_bandwidth_bytes_per_s", "roofline"):  # fmt: skip
        assert key in env, key
    assert env["smoke"] is True and env["seed"] == bench.DEFAULT_SEED and env["copy_bandwidth_bytes_per_s"] > 0
    assert report["paths"] == {"layer": list(LAYER_PATHS), "kgrouped": list(KGROUPED_PATHS)}
    assert set(report["summary"]["targets"]) == set(train_moe_bench.TARGETS)
    assert report["summary"]["ours_vs_bf16"]["cases"] == len(train_moe_bench.ROUTINGS)
    kgrouped = sum(r["set"] == "kgrouped" for r in report["rows"])
    for key in ("roofline_bound_of_the_promotion", "kgrouped_over_wgrad_roofline"):
        assert report["summary"][key]["cases"] == kgrouped > 0, key


def test_every_path_is_timed_or_reported_with_its_reason(smoke_report):
    _, report, _ = smoke_report
    cases = train_moe_bench.all_cases(train_moe_bench.SMOKE_MODELS, train_moe_bench.SMOKE_TOKENS)
    assert [r["label"] for r in report["rows"]] == [c.label for c in cases]
    for r in report["rows"]:
        paths = LAYER_PATHS if r["set"] == "layer" else KGROUPED_PATHS
        assert set(paths) == r["us"].keys() | r["errors"].keys()
        assert r["tflops"].keys() == r["us"].keys()
        assert all(why.startswith(("missing: ", "not run: ")) for why in r["errors"].values())
        if r["set"] == "layer":
            assert {OURS, BF16} <= r["us"].keys() and r["vs_bf16"][BF16] == 1.0
        else:
            assert K_OURS in r["us"] and r["rel_err"][K_OURS] < 1e-5  # the float64 product of its FP8 operands
            assert 1e-5 < r["rel_err"][K_OURS_BF16] < train_moe_bench.BF16_ROUNDING  # that product rounded once
            assert r["roofline_bf16_us"] <= r["roofline_us"]
            assert r["roofline_us"] > 0 and r["roofline_bound"] in ("compute", "memory")
            assert set(r["dense_tflops"]) == {train_moe_bench.W_FORWARD_FORM, train_moe_bench.W_OURS}
            assert r["wgrad_roofline_us"] > 0  # the same roofline at the dense weight gradient's rate


def test_gradient_errors_against_float64(smoke_report):
    _, report, _ = smoke_report
    (row,) = report["gradient_errors"]
    keys = {"out", "dx", "dw13", "dw2", "dweights"}
    assert row["rel_err"][BF16].keys() == keys and all(e < 0.01 for e in row["rel_err"][BF16].values())
    assert all(0.01 < e < 0.1 for e in row["rel_err"][OURS].values())  # FP8's, within the layer's 10%


def test_a_cut_short_report_resumes_without_timing_again(smoke_report):
    _, report, _ = smoke_report

    def timer(fn):
        fn()  # the copy-bandwidth probe; a kept case is never timed again
        return 1.0

    timer.iters, timer.warmup_calls, timer.warmup_seconds = 1, 1, 0.0
    again = train_moe_bench.run("cpu", smoke=True, earlier=report, timer=timer, progress=lambda text: None)
    assert again["rows"] == report["rows"] and again["environment"]["processes"] == 2


def test_the_case_list_and_the_loop_grouped_mm():
    cases = train_moe_bench.all_cases()
    layers = [c for c in cases if c.set == "layer"]
    assert {c.model for c in layers} == {"deepseek-v3", "deepseek-v3-ep8", "qwen3-30b-a3b"}
    assert {c.tokens for c in layers} == {4096, 16384} and len(cases) == 3 * len(layers)
    assert len({c.label for c in cases}) == len(cases)
    a, b = torch.randn(7, 16, dtype=torch.float64), torch.randn(3, 16, 8, dtype=torch.float64)
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)
    got = train_moe_peers.loop_grouped_mm(a, b, offs)
    assert torch.allclose(got, torch.cat([a[:2] @ b[0], a[2:] @ b[2]]))


def test_peers_that_cannot_run_here_are_reported_with_the_reason():
    missing = train_moe_peers.missing_paths(torch.device("cpu"))
    assert set(missing) == {train_moe_peers.TORCHAO, train_moe_peers.K_DEEPGEMM, train_moe_peers.K_DEEPGEMM_GEMM}


def test_deepgemm_operands_are_laid_out_as_its_own_test_lays_them_out():
    """Each expert's codes [rows, k_e] K-major one after another, an empty expert left out, and the scales the
    transpose of a contiguous [sum k_e / 128, rows] (MN-major: DeepGEMM reads them in place, transposes nothing)."""
    gen = torch.Generator().manual_seed(0)
    dy, x = torch.randn(300, 256, generator=gen).bfloat16(), torch.randn(300, 384, generator=gen).bfloat16()
    ops = train_moe_peers.kgrouped_operands(dy, x, torch.tensor([100, 100, 300], dtype=torch.int32))
    blocks = train_moe_peers.expert_blocks(ops)
    assert blocks == [(0, 1), (1, 0), (2, 2)]
    data, scales = train_moe_peers._pack_k_major(ops.a_t, ops.a_scale_t, blocks)
    assert data.shape == (256 * 128 * 3,) and scales.shape == (256, 3) and scales.stride() == (1, 256)
    cols = [*range(0, 128), *range(256, 512)]  # expert 0's block, expert 2's two
    assert torch.equal(scales, ops.a_scale_t[:, [0, 2, 3]])
    assert torch.equal(
        data.view(torch.uint8),
        torch.cat([ops.a_t[:, c].reshape(-1) for c in (cols[:128], cols[128:])]).view(torch.uint8),
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--train", "--moe"], "add --smoke to run the harness"),
        (["--train", "--moe", "--smoke", "--shapes", "256,256,256"], "--shapes goes with --train;"),
        (["--train", "--moe", "--smoke", "--resume"], "--resume goes with --train and --json"),
    ],
)
def test_mistakes_exit_2_with_the_fix(capsys, argv, words):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
