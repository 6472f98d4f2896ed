"""ci/host_overhead.py end to end on the CPU, each run in a fresh interpreter (the null backend replaces the registry's
discovery for the tool's whole process): every per-call row on the null backend, with the ratios and the JSON record;
the whole-model comparison on tiny configs on the reference, where the swapped transformers model must give the
transformers route's logits bit for bit; and the refusal of whole models on a machine without a GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from isa import ROOT
from test_transformers_kernel import needs_transformers

TOOL = ROOT / "ci" / "host_overhead.py"
LINEAR_ROWS = {"F.linear (bf16)", "nn.Linear (bf16)", "fp8gemm.linear", "fp8gemm.linear, Python planner",
               "torch.ops.fp8gemm.linear", "Fp8Linear", "compiled F.linear (bf16)", "compiled fp8gemm.linear"}  # fmt: skip
TRANSFORMERS_ROWS = {"matmul_2d (fp8gemm.hf)", "FP8Linear (transformers)", "FP8Experts (transformers, 'fp8gemm')",
                     "bf16 experts loop (transformers)"}  # fmt: skip


def run_tool(*args: str, timeout: int = 900) -> str:
    run = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


@needs_transformers
def test_null_backend_times_every_row_and_writes_the_ratios(tmp_path):
    out = run_tool("--null", "--calls", "10", "--json", str(tmp_path / "host.json"))
    times = dict(re.findall(r"^  (\S.*?)\s+([\d.]+) us/call$", out, re.M))
    assert set(times) == LINEAR_ROWS | TRANSFORMERS_ROWS | {"fused_experts", "Fp8Experts", "grouped_gemm (offs)"}, out
    assert all(float(t) > 0 for t in times.values())
    ratios = {m[0]: m[1] for m in re.findall(r"^  (\S.*?)\s+([\d.]+)x (.*) \(at most ([\d.]+)x\)$", out, re.M)}
    assert set(ratios) == {"fp8gemm.linear", "Fp8Linear", "matmul_2d (fp8gemm.hf)", "fused_experts"}, out
    report = json.loads((tmp_path / "host.json").read_text())
    assert report["us_per_call"] == pytest.approx({k: float(v) for k, v in times.items()}, abs=0.051)
    assert (
        report["ratios"]["fused_experts"]["of"] == "F.linear (bf16)"
        and report["ratios"]["fused_experts"]["at_most"] == 2
    )
    expected = report["us_per_call"]["fused_experts"] / report["us_per_call"]["F.linear (bf16)"]
    assert report["ratios"]["fused_experts"]["ratio"] == pytest.approx(expected)
    assert report["backend"] == "null" and report["device"] == "cpu" and report["torch"] == torch.__version__
    assert {"date", "fp8gemm-core", "transformers", "python"} <= set(report)


@needs_transformers
def test_whole_models_on_tiny_configs_run_every_variant_and_the_swap_keeps_the_bits(tmp_path):
    out = run_tool("--models", "--tiny", "--batches", "1x1,2x16", "--forwards", "1", "--json", str(tmp_path / "m.json"))
    report = json.loads((tmp_path / "m.json").read_text())["models"]
    assert set(report) == {"qwen3", "qwen3-moe"}, out
    for name, entry in report.items():
        assert set(entry["us"]) == {"bf16", "convert", "hf-fp8", "hf-fp8, null kernel", "hf-fp8+convert"}, name
        assert all(set(times) == {"1x1", "2x16"} and min(times.values()) > 0 for times in entry["us"].values())
        assert entry["vs_bf16"]["bf16"] == {"1x1": 1.0, "2x16": 1.0}
        assert entry["swap_logits_equal"] is True, name  # the swapped modules give the route's logits
    assert report["qwen3"]["swapped"] == 7 * 2  # 7 linears per layer, lm_head kept
    assert report["qwen3-moe"]["swapped"] == 5 * 2  # 4 attention linears and the experts per layer


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_whole_models_at_full_size_are_refused_without_a_gpu(tmp_path):
    out = run_tool("--models", "--json", str(tmp_path / "m.json"), timeout=300)
    assert "skipped: whole models are timed on a GPU (--tiny runs tiny configs on the CPU)" in out
    assert json.loads((tmp_path / "m.json").read_text())["models"].startswith("skipped")
    run = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "no GPU here; --null times fp8gemm's host path on the CPU" in run.stderr
