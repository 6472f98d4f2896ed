"""``fp8gemm bench --moe`` on the CPU: its case list, routings, weight-copy plan, the summary, every path (DeepGEMM's
pipeline on a float64 stand-in for its grouped GEMM) checked against float64 and run end to end on tiny models with a
wall-clock timer (no GPU here: the CUDA-graph timing itself runs on a GPU only)."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest
import torch
from fp8gemm.cli import main
from fp8gemm.moe_reference import dequantize64
from fp8gemm_bench import cli as cli_bench
from fp8gemm_bench import grouped_peers, moe_bench, moe_peers
from fp8gemm_bench.moe_peers import (
    BF16_GROUPED,
    BF16_LOOP,
    DG_PIPELINE,
    DG_PIPELINE_EXACT,
    GROUPED_ALONE,
    HF_FP8,
    OURS_CONTIGUOUS,
    STEP_FLOOR,
    STEP_FLOOR_FUSED_COMBINE,
    STEP_FLOORS,
)


def _transformers_status() -> str | None:
    try:
        import kernels  # noqa: F401
        from transformers.integrations.finegrained_fp8 import FP8Experts  # noqa: F401
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: F401
    except Exception as exc:
        return f"transformers with FP8Experts and kernels are not installed ({exc})"
    return None


needs_transformers = pytest.mark.skipif(_transformers_status() is not None, reason=str(_transformers_status()))
OLDER_REPORT = Path(__file__).parents[1] / "bench" / "results" / "h100_2026-11-27_moe.json"
REMOVED_MASKED = "fp8gemm.fused_experts masked"  # a path older reports hold: fused_experts' removed masked layout
TINY = (moe_bench.MoeModel("tiny", 8, 2, 256, 128), moe_bench.MoeModel("tiny4", 4, 2, 128, 256))
CASES = [
    moe_bench.Case("tiny", 5, "uniform"),
    moe_bench.Case("tiny", 40, "skewed"),
    moe_bench.Case("tiny4", 3, "skewed"),
]


def _wall_timer(calls):
    start = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - start) / len(calls)


def fake_deep_gemm():
    """DeepGEMM's contiguous grouped GEMM in float64, row by row, skipping rows whose expert id is -1."""
    dg = types.SimpleNamespace(__version__="float64 stand-in")
    dg.get_mk_alignment_for_contiguous_layout = lambda: 128

    def contiguous(a, b, d, m_indices, disable_ue8m0_cast=True):
        (x, xs), (w, ws) = a, b
        assert disable_ue8m0_cast and xs.stride(0) == 1  # fp32 scales, MN-major as DeepGEMM reads them on sm90
        for e in m_indices.unique().tolist():
            if e < 0:
                continue
            rows = (m_indices == e).nonzero().view(-1)
            x64 = x[rows].double() * xs[rows].double().repeat_interleave(128, 1)
            d[rows] = (x64 @ dequantize64(w[e], ws[e]).t()).to(d.dtype)

    dg.m_grouped_fp8_gemm_nt_contiguous = contiguous
    return dg


@pytest.fixture
def with_peers(monkeypatch):
    """DeepGEMM's pipeline on the stand-in; transformers' kernel state restored afterwards."""
    monkeypatch.setattr(moe_peers, "deep_gemm_module", fake_deep_gemm)
    monkeypatch.setattr(grouped_peers, "deep_gemm_module", fake_deep_gemm)
    missing = moe_peers.missing_paths(torch.device("cpu"))
    monkeypatch.setattr(moe_bench, "missing_paths", lambda device: {k: v for k, v in missing.items()
                                                                    if k not in moe_peers.DEEPGEMM_PATHS})  # fmt: skip
    monkeypatch.setenv("LOCAL_KERNELS", os.environ.get("LOCAL_KERNELS", ""))
    try:
        import transformers.integrations.finegrained_fp8 as integration

        monkeypatch.setattr(integration, "_FINEGRAINED_FP8", integration._FINEGRAINED_FP8)
    except Exception:
        pass


def test_the_case_list_is_the_one_the_issue_names():
    by_name = {m.name: m for m in moe_bench.MODELS}
    assert (by_name["deepseek-v3"].experts, by_name["deepseek-v3"].top_k) == (256, 8)
    assert (by_name["deepseek-v3"].hidden, by_name["deepseek-v3"].inter) == (7168, 2048)
    assert by_name["deepseek-v3-ep8"].experts == 32
    assert tuple(vars(by_name["qwen3-30b-a3b"]).values())[1:] == (128, 8, 2048, 768)
    assert moe_bench.TOKENS == (1, 16, 64, 256, 1024, 4096, 16384)
    cases = moe_bench.all_cases()
    assert len(cases) == 3 * 7 * 2 and len({c.label for c in cases}) == len(cases)
    quick = moe_bench.all_cases(quick=True)
    assert set(quick) < set(cases) and len(quick) == 9
    decode = moe_bench.all_cases(decode=True)
    assert set(decode) == {c for c in cases if c.tokens <= moe_bench.DECODE_MAX_TOKENS} and len(decode) == 18


def test_routings_are_seeded_distinct_per_token_and_skewed():
    model = moe_bench.MoeModel("m", 128, 8, 2048, 768)
    ids, w = moe_bench.routing(model, 4096, "skewed", 0)
    again, _ = moe_bench.routing(model, 4096, "skewed", 0)
    assert torch.equal(ids, again) and not torch.equal(ids, moe_bench.routing(model, 4096, "skewed", 1)[0])
    assert all(len(set(r)) == 8 for r in ids.tolist())  # top-k never names an expert twice
    assert torch.allclose(w.sum(1), torch.ones(4096))
    counts = torch.bincount(ids.view(-1), minlength=128).sort(descending=True).values
    assert counts[: moe_bench.HOT_EXPERTS].sum() > 0.6 * ids.numel()  # a few experts take most rows
    uniform = torch.bincount(moe_bench.routing(model, 4096, "uniform", 0)[0].view(-1), minlength=128)
    assert uniform.max() < 2 * uniform.float().mean()


def test_the_check_samples_distinct_tokens_with_both_ends():
    n = moe_bench.CHECK_TOKENS
    assert moe_bench.check_tokens(n, torch.Generator().manual_seed(0)) == list(range(n))
    picks = moe_bench.check_tokens(16384, torch.Generator().manual_seed(0))
    assert len(picks) == n and picks == sorted(set(picks)) and picks[0] == 0 and picks[-1] == 16383
    assert picks == moe_bench.check_tokens(16384, torch.Generator().manual_seed(0))
    assert picks != moe_bench.check_tokens(16384, torch.Generator().manual_seed(1))


def test_weight_copies_fill_the_l2_within_the_budget():
    qwen = moe_bench.MoeModel("q", 128, 8, 2048, 768)
    plan = moe_bench.plan_copies(qwen, 8, 50 << 20)
    assert plan["copies"] == plan["wanted"] and plan["copies"]["fp8"] * 8 * 3 * 2048 * 768 >= 3 * (50 << 20)
    ds = moe_bench.MoeModel("d", 256, 8, 7168, 2048)
    plan = moe_bench.plan_copies(ds, 8, 50 << 20)
    assert plan["copies"] == {"fp8": 1, "bf16": 1}  # 8 experts already read 7x the L2
    tight = moe_bench.plan_copies(ds, 1, 50 << 20, budget=40 << 30)
    assert tight["copies"]["bf16"] == 1 and "note" in tight
    assert sum(tight["copies"][k] * tight["bytes_per_copy"][k] for k in ("fp8", "bf16")) <= 40 << 30


def test_the_step_floor_runs_in_decode_only_and_every_other_path_at_every_t():
    ds = moe_bench.MoeModel("deepseek-v3", 256, 8, 7168, 2048)
    for t in moe_bench.TOKENS:
        paths, skipped = moe_bench.case_paths(ds, moe_bench.Case("x", t, "u"))
        assert set(paths) | set(skipped) == set(moe_peers.PATH_ORDER) and not set(paths) & set(skipped)
        assert set(skipped) == (set() if t <= moe_bench.DECODE_MAX_TOKENS else set(STEP_FLOORS))
    for floor in STEP_FLOORS:
        runs = [t for t in moe_bench.TOKENS if floor in moe_bench.case_paths(ds, moe_bench.Case("x", t, "u"))[0]]
        assert runs == [t for t in moe_bench.TOKENS if t <= moe_bench.DECODE_MAX_TOKENS] == [1, 16, 64]


def test_the_padding_of_deepgemms_pipeline():
    ids = torch.tensor([[0, 2], [2, 0], [2, 3]])
    assert moe_peers.padded_rows(ids, 4, 128) == 3 * 128
    assert moe_peers.padded_rows_bound(6, 4, 128) == 5 * 128  # vLLM's compute_aligned_M: round_up(6 + 4 * 127, 128)
    assert moe_peers.padded_rows_bound(300, 4, 128) >= 300 + 4 * 127


def test_the_quantizer_matches_ours_and_the_fused_silu_mul():
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    q = torch.empty(7, 512, dtype=torch.float8_e4m3fn)
    s = moe_peers.mn_major_scales(7, 4, "cpu")
    moe_peers.per_token_group_quant_fp8(x, q, s)
    assert s.stride() == (1, 8)
    back = q.float() * s.repeat_interleave(128, 1)
    assert (back - x.float()).norm() / x.float().norm() < 0.05
    q2, s2 = torch.empty(7, 256, dtype=torch.float8_e4m3fn), torch.empty(7, 2)
    moe_peers.per_token_group_quant_fp8(x, q2, s2, silu_mul=True)
    act = torch.nn.functional.silu(x[:, :256].float()) * x[:, 256:].float()
    assert (q2.float() * s2.repeat_interleave(128, 1) - act).norm() / act.norm() < 0.05


@needs_transformers
def test_the_eager_loop_is_transformers_eager_forward_bit_for_bit():
    model = TINY[0]
    ids, w = moe_bench.routing(model, 9, "skewed", 0)
    gen = torch.Generator().manual_seed(3)
    w13 = torch.randn(8, 256, 256, generator=gen).bfloat16()
    w2 = torch.randn(8, 256, 128, generator=gen).bfloat16()
    x = torch.randn(9, 256, generator=gen).bfloat16()
    experts = moe_peers.transformers_bf16_experts(moe_peers.Bf16Weights(w13, w2), 2, "eager")
    with torch.no_grad():
        theirs = experts(x, ids, w)
    ours = moe_peers.eager_loop_forward(x, w, w13, w2, moe_peers.eager_plan(ids, 8, "cpu"))
    assert torch.equal(ours, theirs)


@needs_transformers
def test_the_harness_runs_every_path_end_to_end_on_cpu_and_its_json_plots(tmp_path, with_peers):
    saved = []
    report = moe_bench.run("cpu", CASES, models=TINY, progress=lambda t: None, timer=_wall_timer,
                           checkpoint=lambda r: saved.append(len(r["rows"])))  # fmt: skip
    assert saved == [1, 2, 3] and "partial" not in report
    everything = {OURS_CONTIGUOUS, GROUPED_ALONE, *STEP_FLOORS, BF16_LOOP, BF16_GROUPED, DG_PIPELINE,
                  DG_PIPELINE_EXACT, HF_FP8}  # fmt: skip
    for r in report["rows"]:
        assert set(r["us"]) == everything, r["errors"]
        for name in (OURS_CONTIGUOUS, GROUPED_ALONE, *STEP_FLOORS):
            assert r["rel_err"][name] < moe_bench.YARDSTICK_BOUND
        for name in everything:
            assert r["rel_err_exact"][name] < moe_bench.EXACT_BOUND[moe_peers.WEIGHT_KIND[name]]
        flops = 2 * r["tokens"] * r["top_k"] * 3 * r["hidden"] * r["inter"]
        assert r["tflops"][BF16_LOOP] == pytest.approx(flops / r["us"][BF16_LOOP] / 1e6)
    s = report["summary"]
    assert s[f"{OURS_CONTIGUOUS} vs"][BF16_LOOP]["cases"] == 3
    assert set(s[f"{OURS_CONTIGUOUS} vs"][BF16_LOOP]["by_model"]) == {"tiny", "tiny4"}
    assert (
        s["decode_ours_over_grouped_alone"]["cases"] == s["decode_ours_over_grouped_alone"]["step_floor"]["cases"] == 3
    )
    env = report["environment"]
    bandwidth = env["floor_bandwidth_bytes_per_s"]  # the faster of the copy's and the read pass's rates
    assert env["copy_bandwidth_bytes_per_s"] > 0 and env["read_bandwidth_bytes_per_s"] > 0
    assert bandwidth == max(env["copy_bandwidth_bytes_per_s"], env["read_bandwidth_bytes_per_s"])
    for r in report["rows"]:  # every case here is a decode case: the weight-read floor of the experts it touches
        experts = r["experts_hit"]
        h, i = r["hidden"], r["inter"]
        assert r["weight_bytes_read"] == experts * (
            3 * h * i + 4 * (2 * i // 128) * (h // 128) + 4 * (h // 128) * (i // 128)
        )
        assert r["weight_floor_us"] == pytest.approx(r["weight_bytes_read"] / bandwidth * 1e6)
    assert s["decode_ours_over_weight_floor"]["cases"] == 3 and bandwidth > 0
    assert report["models"]["tiny"]["weights"]["copies"] == {"fp8": 1, "bf16": 1}
    assert report["environment"]["ours_runs"]["contiguous"] == "reference" and HF_FP8 in report["environment"]["notes"]
    js, png = tmp_path / "m.json", tmp_path / "m.png"
    cli_bench._save_atomically(report, js)
    moe_bench.plot(json.loads(js.read_text()), png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    cli_bench.print_moe_summary(json.loads(js.read_text()))


def test_a_wrong_path_is_reported_not_timed_and_a_failing_one_does_not_stop_the_rest(monkeypatch):
    def broken(inp, w):
        run, tokens = moe_peers.ours(inp, w)
        return (lambda: run() * 1.1), tokens

    def failing(inp, w):
        raise RuntimeError("this peer cannot run here")

    monkeypatch.setitem(moe_peers.PATHS, OURS_CONTIGUOUS, broken)
    monkeypatch.setitem(moe_peers.PATHS, GROUPED_ALONE, failing)
    # the real peers stay out: DeepGEMM given CPU tensors would run on a GPU with host pointers
    monkeypatch.setattr(moe_bench, "missing_paths", lambda device: moe_peers.missing_paths(torch.device("cpu")))
    report = moe_bench.run("cpu", CASES[:1], models=TINY, progress=lambda t: None, timer=_wall_timer)
    row = report["rows"][0]
    assert OURS_CONTIGUOUS not in row["us"] and row["errors"][OURS_CONTIGUOUS].startswith("wrong: relative error")
    assert row["errors"][GROUPED_ALONE] == "RuntimeError: this peer cannot run here"
    assert set(STEP_FLOORS) <= row["us"].keys()


def test_a_resumed_run_keeps_earlier_cases_and_refuses_another_seed(monkeypatch):
    monkeypatch.setattr(moe_bench, "PATH_ORDER", (OURS_CONTIGUOUS,))
    first = moe_bench.run("cpu", CASES[:1], models=TINY, progress=lambda t: None, timer=_wall_timer)
    earlier = json.loads(json.dumps(first))
    earlier["rows"][0]["us"][REMOVED_MASKED] = earlier["rows"][0]["us"][OURS_CONTIGUOUS] / 2
    timed = []
    report = moe_bench.run("cpu", CASES[:2], models=TINY, progress=timed.append, earlier=earlier,
                           timer=_wall_timer)  # fmt: skip
    assert report["paths"] == [OURS_CONTIGUOUS]  # the earlier row's masked time is kept, neither listed nor summarized
    assert set(report["summary"]) == {
        f"{OURS_CONTIGUOUS} vs",
        "decode_ours_over_grouped_alone",
        "decode_ours_over_weight_floor",
        "decode_grouped_alone_over_weight_floor",
    }
    assert len(timed) == 1 and timed[0].startswith("tiny T40 skewed") and report["environment"]["processes"] == 2
    assert [r["label"] for r in report["rows"]] == ["tiny T5 uniform", "tiny T40 skewed"]
    with pytest.raises(ValueError, match="seed is 0, this run's is 3"):
        moe_bench.run("cpu", CASES[:2], models=TINY, progress=lambda t: None, earlier=first, seed=3, timer=_wall_timer)


def test_the_summary_from_a_synthetic_report():
    def row(model, tokens, us):
        return {"model": model, "tokens": tokens, "label": f"{model} T{tokens}", "us": us}

    rows = [row("a", 1, {OURS_CONTIGUOUS: 10.0, GROUPED_ALONE: 9.0, BF16_LOOP: 40.0}),
            row("a", 4096, {OURS_CONTIGUOUS: 100.0, BF16_LOOP: 150.0, DG_PIPELINE: 90.0}),
            row("b", 64, {OURS_CONTIGUOUS: 13.0, GROUPED_ALONE: 10.0, STEP_FLOOR: 12.5,
                          STEP_FLOOR_FUSED_COMBINE: 11.5, BF16_LOOP: 13.0})]  # fmt: skip
    s = moe_bench.summarize(rows)
    vs = s[f"{OURS_CONTIGUOUS} vs"][BF16_LOOP]
    assert vs["geomean"] == pytest.approx((4.0 * 1.5 * 1.0) ** (1 / 3)) and vs["slowest_case"] == "b T64"
    assert vs["met"] is True and vs["by_model"]["a"]["cases"] == 2
    assert s[f"{OURS_CONTIGUOUS} vs"][DG_PIPELINE]["slowest"] == pytest.approx(0.9)
    d = s["decode_ours_over_grouped_alone"]
    assert d["worst"] == pytest.approx(1.3) and d["worst_case"] == "b T64" and d["met"] is False
    assert d["step_floor"]["per_case"] == {"b T64": pytest.approx(1.25)} and d["step_floor"]["met"] is False
    assert d["step_floor_fused_combine"]["per_case"] == {"b T64": pytest.approx(1.15)}


def test_the_weight_read_floor_summary_and_its_targets():
    """fused_experts over the floor: 2.0x allowed for Qwen3-30B-A3B at T = 1, 1.3x for every other decode case; a row
    without a floor (past decode) is left out."""

    def row(model, tokens, us, floor):
        r = {"model": model, "tokens": tokens, "label": f"{model} T{tokens}", "us": {OURS_CONTIGUOUS: us}}
        return {**r, "weight_floor_us": floor} if floor else r

    rows = [
        row("qwen3-30b-a3b", 1, 19.0, 10.0),
        row("deepseek-v3", 1, 120.0, 100.0),
        row("deepseek-v3", 4096, 9e3, None),
    ]
    s = moe_bench.summarize(rows)["decode_ours_over_weight_floor"]
    assert s["cases"] == 2 and s["met"] is True and s["worst"] == pytest.approx(1.9)
    assert s["per_case"]["deepseek-v3 T1"] == {"ratio": pytest.approx(1.2), "target_max": 1.3}
    rows[1]["us"][OURS_CONTIGUOUS] = 140.0  # 1.4x the floor: over its 1.3x
    assert moe_bench.summarize(rows)["decode_ours_over_weight_floor"]["met"] is False


def test_an_older_report_with_the_removed_masked_path_still_summarizes_plots_and_prints(tmp_path):
    old = json.loads(OLDER_REPORT.read_text())
    assert REMOVED_MASKED in old["paths"] and sum(REMOVED_MASKED in r["us"] for r in old["rows"]) > 0
    s = moe_bench.summarize(old["rows"])
    assert set(s) == {
        f"{OURS_CONTIGUOUS} vs",
        "decode_ours_over_grouped_alone",
        "decode_ours_over_weight_floor",
        "decode_grouped_alone_over_weight_floor",
    }
    assert s["decode_ours_over_weight_floor"]["cases"] == 0  # rows from before the floor have none
    for other, stat in s[f"{OURS_CONTIGUOUS} vs"].items():
        before = old["summary"][f"{OURS_CONTIGUOUS} vs"][other]
        assert (stat["cases"], stat.get("slowest_case")) == (before["cases"], before.get("slowest_case")), other
        assert stat["geomean"] == pytest.approx(before["geomean"], rel=1e-12, nan_ok=True), other
    assert s[f"{OURS_CONTIGUOUS} vs"][BF16_GROUPED]["geomean"] == pytest.approx(2.52, abs=5e-3)  # README's number
    assert s["decode_ours_over_grouped_alone"]["per_case"] == pytest.approx(
        old["summary"]["decode_ours_over_grouped_alone"]["per_case"], rel=1e-12
    )
    cli_bench.print_moe_summary({**old, "summary": s})
    cli_bench.print_moe_summary(old)
    pytest.importorskip("matplotlib")
    moe_bench.plot(old, tmp_path / "old.png")
    assert (tmp_path / "old.png").read_bytes()[:4] == b"\x89PNG"


def test_timing_needs_a_gpu_and_the_cli_says_so_without_a_traceback(capsys):
    with pytest.raises(ValueError, match="timing needs a GPU"):
        moe_bench.run("cpu", CASES)
    assert main(["bench", "--moe", "--device", "cpu", "--shapes", "16,256,512"]) == 2
    assert "--moe times its own case list" in capsys.readouterr().err
    assert main(["bench", "--moe", "--grouped", "--device", "cpu"]) == 2
    assert main(["bench", "--quick", "--device", "cpu"]) == 2
    assert main(["bench", "--decode", "--device", "cpu"]) == 2
    assert main(["bench", "--moe", "--resume", "--device", "cpu"]) == 2
    assert "or with --moe and --json" in capsys.readouterr().err
    assert main(["bench", "--moe", "--quick", "--device", "cpu"]) == 0  # no GPU: the recipe's accuracy
    assert "--moe times the MoE experts layer on a GPU" in capsys.readouterr().out
