"""fp8gemm_bench.model_summary: the whole-model report's ratios and targets, from a synthetic report."""

from __future__ import annotations

import pytest
from fp8gemm_bench import model_summary


def _variant(graph: dict, compiled: dict | None = None) -> dict:
    times = {"cuda_graph": graph} | ({"torch_compile": compiled} if compiled else {})
    return {"times_us": times, "logits_rel_err_vs_bf16": 0.08}


def test_graph_and_compile_ratios_each_against_the_targets():
    results = {"qwen3-moe": {
        "bf16": _variant({"1x1": 1000.0, "8x1": 1800.0}, {"8x1": 2700.0}),
        "convert": _variant({"1x1": 900.0, "8x1": 1200.0}, {"8x1": 4400.0}),
        "hf-fp8-python": _variant({"1x1": 950.0, "8x1": 1300.0}, {"8x1": 3000.0}),
        "hf-fp8-experts": _variant({"1x1": 905.0, "8x1": 1210.0}),
    }}  # fmt: skip
    s = model_summary.summarize(results)["qwen3-moe"]
    graph = s["convert speed over bf16"]
    assert graph["per_batch"] == {"1x1": pytest.approx(1000 / 900), "8x1": pytest.approx(1.5)} and graph["met"]
    compiled = s["convert speed over bf16 (torch.compile)"]
    assert compiled["per_batch"] == {"8x1": pytest.approx(2700 / 4400)} and compiled["met"] is False
    route = s["hf-fp8-python speed over convert (torch.compile)"]
    assert route["per_batch"]["8x1"] == pytest.approx(4400 / 3000) and route["met"] is True
    assert s["hf-fp8-experts speed over convert"]["per_batch"]["8x1"] == pytest.approx(1200 / 1210)
    assert "hf-fp8-experts speed over convert (torch.compile)" not in s  # not compiled in this report
    assert "hf-fp8-local speed over convert" not in s  # not run
    assert s["logits_rel_err_vs_bf16"]["convert"] == 0.08
