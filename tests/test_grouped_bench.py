"""``fp8gemm bench --grouped`` on the CPU: its case lists, splits, DeepGEMM's padding, the summary, and a run end to
end on tiny cases with a wall-clock timer (no GPU here: the CUDA-graph timing itself runs on a GPU only)."""

from __future__ import annotations

import json
import time

import pytest
from fp8gemm.cli import main
from fp8gemm_bench import cli as cli_bench
from fp8gemm_bench import grouped_bench, grouped_peers
from fp8gemm_bench.bench import seeded_generator
from fp8gemm_bench.grouped_peers import BF16, DENSE_LOOP, DG_CONTIGUOUS, DG_CONTIGUOUS_GEMM, DG_MASKED, DG_PADDING
from fp8gemm_bench.grouped_peers import OURS_CONTIGUOUS as OURS_C
from fp8gemm_bench.grouped_peers import OURS_MASKED as OURS_M
from fp8gemm_bench.grouped_peers import OURS_ROW_IDS as ROW_IDS
from fp8gemm_bench.grouped_peers import OURS_ROW_IDS_PADDED as ROW_IDS_PADDED


def test_the_case_lists_are_the_ones_the_issue_names():
    assert grouped_bench.DEEPGEMM_CONTIGUOUS_GROUPS == [(4, 8192), (8, 4096)]
    assert grouped_bench.DEEPGEMM_MASKED_GROUPS == [(1, 1024), (2, 512), (4, 256), (32, 192)]
    assert grouped_bench.DEEPGEMM_NK == [(4096, 7168), (7168, 2048), (6144, 7168), (7168, 3072)]
    assert grouped_bench.EXPERTS == 32 and set(grouped_bench.EXPERT_NK.values()) == {(4096, 7168), (7168, 2048)}
    assert grouped_bench.TOKENS_PER_EXPERT[0] == 1 and grouped_bench.TOKENS_PER_EXPERT[-1] == 8192
    cases = grouped_bench.all_cases(0)
    by_set = {}
    for c in cases:
        by_set.setdefault(c.set, []).append(c)
    assert {(len(c.counts), c.expected_m, c.n, c.k) for c in by_set["deepgemm-contiguous"]} == {
        (g, m, n, k) for g, m in [(4, 8192), (8, 4096)] for n, k in grouped_bench.DEEPGEMM_NK
    }
    assert {(len(c.counts), c.expected_m, c.n, c.k) for c in by_set["deepgemm-masked"]} == {
        (g, m, n, k) for g, m in [(1, 1024), (2, 512), (4, 256), (32, 192)] for n, k in grouped_bench.DEEPGEMM_NK
    }
    experts = by_set["deepseek-v3-experts"]
    assert len(experts) == 2 * len(grouped_bench.TOKENS_PER_EXPERT) * 2
    for c in experts:
        assert len(c.counts) == 32 and sum(c.counts) == 32 * c.tokens_per_expert
        assert (c.split == "balanced") == (set(c.counts) == {c.tokens_per_expert})
    for c in by_set["deepgemm-contiguous"] + by_set["deepgemm-masked"]:  # DeepGEMM's tests: 0.7-1.3x expected
        assert all(int(0.7 * c.expected_m) <= m <= 1.3 * c.expected_m for m in c.counts)
        assert c.m_max is None or max(c.counts) <= c.m_max
    assert len({c.label for c in cases}) == len(cases)


def test_the_skewed_split_is_seeded_sums_to_the_total_and_is_skewed():
    def split(seed, total=32 * 64):
        return grouped_bench.skewed_split(total, 32, seeded_generator(seed, "cpu", "split"))

    assert split(0) == split(0) and split(0) != split(1)
    for seed in range(5):
        for total in (32, 100, 2048, 262144):
            counts = split(seed, total)
            assert sum(counts) == total and len(counts) == 32 and min(counts) >= 0
            top = sorted(counts, reverse=True)[: grouped_bench.HOT_EXPERTS]
            assert sum(top) >= grouped_bench.HOT_SHARE * total - grouped_bench.HOT_EXPERTS
    assert grouped_bench.largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert grouped_bench.all_cases(0) == grouped_bench.all_cases(0) != grouped_bench.all_cases(1)


def test_deepgemm_padding_against_a_hand_computed_example():
    padded, dest, m_indices = grouped_peers.deepgemm_padding([3, 0, 130, 1], 128)
    assert padded == [128, 0, 256, 128]
    assert dest == [0, 1, 2, *range(128, 258), 384]
    assert m_indices == [0] * 3 + [-1] * 125 + [2] * 130 + [-1] * 126 + [3] + [-1] * 127
    assert len(m_indices) == sum(padded) == 512
    assert grouped_peers.deepgemm_padding([128, 256], 128) == ([128, 256], list(range(384)), [0] * 128 + [1] * 256)
    assert grouped_peers.masked_slots([2, 0, 1], 4) == [0, 1, 8]


def _row(set_, counts, us, split="balanced"):
    return {"set": set_, "label": f"{set_} {counts} {split}", "counts": list(counts), "split": split, "us": us}


def test_the_summary_geomeans_from_a_synthetic_report():
    rows = [
        _row(
            "deepgemm-contiguous",
            [200, 300],
            {OURS_C: 10.0, DG_CONTIGUOUS_GEMM: 12.0, DG_CONTIGUOUS: 15.0, ROW_IDS: 11.0, ROW_IDS_PADDED: 13.0},
        ),  # fmt: skip
        _row("deepgemm-masked", [100], {OURS_M: 10.0, DG_MASKED: 9.0}),
        _row(
            "deepseek-v3-experts",
            [4, 0, 60],
            {OURS_C: 2.0, OURS_M: 4.0, DG_CONTIGUOUS: 6.0, DG_PADDING: 1.5, BF16: 8.0, DENSE_LOOP: 4.0},
            "skewed",
        ),  # fmt: skip
        _row("deepseek-v3-experts", [128, 128], {OURS_C: 10.0, DG_CONTIGUOUS: 30.0, BF16: 30.0}),  # aligned
        _row("deepseek-v3-experts", [100, 100], {OURS_C: 10.0, DG_CONTIGUOUS: 20.0, BF16: 30.0}),  # unaligned
    ]
    s = grouped_bench.summarize(rows, alignment=128)
    own = s["ours_vs_deepgemm_own_shapes"]
    assert own["geomean"] == pytest.approx((1.2 * 0.9) ** 0.5) and own["slowest"] == pytest.approx(0.9)
    assert own["cases"] == 2 and own["met"] is True
    skew = s["skewed_unaligned_vs_deepgemm_incl_padding"]
    assert skew["cases"] == 2 and skew["geomean"] == pytest.approx((3.0 * 2.0) ** 0.5)
    assert s["decode_contiguous_vs_bf16_grouped_mm"]["geomean"] == pytest.approx(4.0)  # only rows <= 64 per group
    assert s["decode_masked_vs_bf16_grouped_mm"]["geomean"] == pytest.approx(2.0)
    assert s["decode_contiguous_vs_dense_loop"]["geomean"] == pytest.approx(2.0)
    assert s["decode_masked_vs_dense_loop"]["geomean"] == pytest.approx(1.0)
    assert s["decode_masked_vs_dense_loop"]["met"] is False
    assert s["deepgemm_padding_share_of_its_path"]["geomean"] == pytest.approx(0.25)
    assert s["row_ids_vs_offs"]["geomean"] == pytest.approx(10 / 11) and s["row_ids_vs_offs"]["met"] is True
    pre_padded = s["row_ids_padded_vs_deepgemm_pre_padded"]
    assert pre_padded["geomean"] == pytest.approx(12 / 13) and pre_padded["met"] is True and pre_padded["cases"] == 1


def _wall_timer(calls):
    start = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - start) / len(calls)


TINY = [
    grouped_bench.Case("deepgemm-contiguous", "tiny contiguous", 256, 256, (3, 0, 130, 1), ("contiguous",),
                       expected_m=64),
    grouped_bench.Case("deepgemm-masked", "tiny masked", 128, 256, (5, 0, 2), ("masked",), 8, 4),
    grouped_bench.Case("deepseek-v3-experts", "tiny experts", 128, 256, (1, 2, 0, 3), ("contiguous", "masked"), 128,
                       2, "skewed", 2),
]  # fmt: skip


def test_the_harness_runs_end_to_end_on_cpu_and_its_json_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(grouped_peers, "deep_gemm_module", _no_deep_gemm)
    saved = []
    report = grouped_bench.run("cpu", TINY, progress=lambda t: None, checkpoint=lambda r: saved.append(len(r["rows"])),
                               timer=_wall_timer)  # fmt: skip
    assert saved == [1, 2, 3] and "partial" not in report
    by_label = {r["label"]: r for r in report["rows"]}
    ids = {ROW_IDS, ROW_IDS_PADDED}  # m_indices, packed and DeepGEMM-padded
    assert set(by_label["tiny contiguous"]["us"]) == {OURS_C, DENSE_LOOP, BF16, *ids}
    assert set(by_label["tiny masked"]["us"]) == {OURS_M, DENSE_LOOP, BF16}
    assert set(by_label["tiny experts"]["us"]) == {OURS_C, OURS_M, DENSE_LOOP, BF16, *ids}
    for r in report["rows"]:
        assert all(err < 4e-3 for err in r["rel_err"].values())
        assert r["tflops"][DENSE_LOOP] == pytest.approx(
            2 * sum(r["counts"]) * r["n"] * r["k"] / r["us"][DENSE_LOOP] / 1e6
        )
        for name in (DG_CONTIGUOUS, DG_CONTIGUOUS_GEMM, DG_PADDING, DG_MASKED):  # missing, not crashing
            if name in grouped_bench.case_paths(grouped_bench.Case(**{k: r[k] for k in _CASE_KEYS})):
                assert r["errors"][name].startswith("missing: deep_gemm is not installed")
    assert report["environment"]["seed"] == 0 and report["environment"]["ours_runs"]["contiguous"] == "reference"
    # decode cases (<= 64 rows in every group) carry the weight-read floor of their groups with rows
    env = report["environment"]
    bandwidth = env["floor_bandwidth_bytes_per_s"]  # the faster of the copy's and the read pass's rates
    assert env["copy_bandwidth_bytes_per_s"] > 0 and env["read_bandwidth_bytes_per_s"] > 0
    assert bandwidth == max(env["copy_bandwidth_bytes_per_s"], env["read_bandwidth_bytes_per_s"])
    assert "weight_floor_us" not in by_label["tiny contiguous"]  # a group of 130 rows: past decode
    for label in ("tiny masked", "tiny experts"):
        r = by_label[label]
        hit = sum(c > 0 for c in r["counts"])
        assert r["weight_bytes_read"] == hit * (r["n"] * r["k"] + 4 * (r["n"] // 128) * (r["k"] // 128))
        assert r["weight_floor_us"] == pytest.approx(r["weight_bytes_read"] / bandwidth * 1e6)
    floor = report["summary"]["decode_masked_over_weight_floor"]
    assert floor["cases"] == 2 and set(floor["per_case"]) == {"tiny masked", "tiny experts"}
    js, png = tmp_path / "g.json", tmp_path / "g.png"
    cli_bench._save_atomically(report, js)
    grouped_bench.plot(json.loads(js.read_text()), png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    cli_bench.print_grouped_summary(json.loads(js.read_text()))


_CASE_KEYS = ("set", "label", "n", "k", "counts", "layouts", "m_max", "expected_m", "split", "tokens_per_expert",
              "masked_skipped")  # fmt: skip


def _no_deep_gemm():
    raise ModuleNotFoundError("No module named 'deep_gemm'", name="deep_gemm")


def test_a_wrong_path_is_reported_not_timed(monkeypatch):
    def broken(p, b, s):
        run, rows = grouped_peers.dense_loop(p, b, s)
        return (lambda: run().mul_(1.1)), rows

    monkeypatch.setitem(grouped_peers.PATHS, DENSE_LOOP, broken)
    monkeypatch.setattr(grouped_bench, "PATHS", grouped_peers.PATHS)
    report = grouped_bench.run("cpu", TINY[:1], progress=lambda t: None, timer=_wall_timer)
    row = report["rows"][0]
    assert DENSE_LOOP not in row["us"] and row["errors"][DENSE_LOOP].startswith("wrong: relative error")
    assert OURS_C in row["us"]


def test_a_resumed_run_keeps_earlier_cases_and_refuses_another_seed():
    first = grouped_bench.run("cpu", TINY[:1], progress=lambda t: None, timer=_wall_timer)
    timed = []
    report = grouped_bench.run("cpu", TINY[:2], progress=timed.append, earlier=json.loads(json.dumps(first)),
                               timer=_wall_timer)  # fmt: skip
    assert len(timed) == 1 and timed[0].startswith("tiny masked") and report["environment"]["processes"] == 2
    assert [r["label"] for r in report["rows"]] == ["tiny contiguous", "tiny masked"]
    with pytest.raises(ValueError, match="seed is 0, this run's is 3"):
        grouped_bench.run("cpu", TINY[:2], progress=lambda t: None, earlier=first, seed=3, timer=_wall_timer)


def test_timing_needs_a_gpu_and_the_cli_says_so_without_a_traceback(tmp_path, capsys):
    with pytest.raises(ValueError, match="timing needs a GPU"):
        grouped_bench.run("cpu", TINY)
    assert main(["bench", "--grouped", "--device", "cpu", "--shapes", "16,256,512"]) == 2
    assert "--grouped times its own case list" in capsys.readouterr().err
    assert main(["bench", "--grouped", "--layer", "--device", "cpu"]) == 2
    assert main(["bench", "--grouped", "--resume", "--device", "cpu"]) == 2
    assert "--resume goes with --layer or --grouped and --json" in capsys.readouterr().err
    assert main(["bench", "--grouped", "--device", "cpu"]) == 0  # no GPU: the recipe's accuracy, as the other modes
    assert "--grouped times grouped GEMMs on a GPU" in capsys.readouterr().out


def test_weight_copies_fill_twice_the_l2():
    assert grouped_bench.weight_copies(10 << 20, 50 << 20) == 10
    assert grouped_bench.weight_copies(940 << 20, 50 << 20) == 2 and grouped_bench.weight_copies(1, 0) == 2
