"""``python -m fp8gemm_bench.train_moe_ablation``: its emulation of the recipe is the recipe (the same quantizer as
fp8gemm's, the same layer as ``fp8gemm.training.fused_experts`` up to rounding order), and its smoke run on the CPU
writes every mode's curve. No loss value is asserted of the runs."""

from __future__ import annotations

import importlib.util
import json
import types

import fp8gemm
import pytest
import torch
from fp8gemm_bench import train_moe_ablation as ablation

pytestmark = pytest.mark.filterwarnings("ignore:.*pure-torch reference")
SEED = 5


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_the_fake_quantizer_is_fp8gemms_activation_quantizer():
    print(f"seed {SEED}")
    x = torch.randn(37, 384, generator=torch.Generator().manual_seed(SEED)) * 3
    expected = fp8gemm.dequantize(*fp8gemm.quantize_activation(x))
    assert relative(ablation.along_k(x), expected) < 1e-6
    assert relative(ablation.along_k(x), x) > 1e-3  # it quantizes


def test_the_emulated_experts_are_the_fp8_layer_up_to_rounding_order():
    """Forward and the four gradients within 3% of fp8gemm's layer (each is 5-8% from float64: the FP8 error), and
    the emulation itself off float64 by the recipe's error, not more."""
    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    tokens, hidden, inter, experts, top_k = 150, 256, 256, 6, 2
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().requires_grad_()
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.05).bfloat16().requires_grad_()
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 0.05).bfloat16().requires_grad_()
    probs, ids = torch.randn(tokens, experts, generator=gen).softmax(-1).topk(top_k)
    weights = (probs / probs.sum(-1, keepdim=True)).requires_grad_()
    module = types.SimpleNamespace(num_experts=experts, gate_up_proj=w13, down_proj=w2, quantize_intermediate=True)
    emulated = ablation.emulated_experts_forward(module, x, ids, weights)
    dout = torch.randn(emulated.shape, generator=gen).bfloat16()
    leaves = (x, weights, w13, w2)
    ours = fp8gemm.training.fused_experts(x, ids, weights, w13, w2)
    pairs = [(emulated, ours)]
    grads = torch.autograd.grad(emulated, leaves, dout), torch.autograd.grad(ours, leaves, dout)
    pairs += list(zip(*grads, strict=True))
    errors = [relative(a, b) for a, b in pairs]
    assert max(errors) < 0.03, errors
    exact = [leaf.detach().double().requires_grad_() for leaf in leaves]
    module64 = types.SimpleNamespace(num_experts=experts, gate_up_proj=exact[2], down_proj=exact[3])
    y64 = torch.zeros(tokens, hidden, dtype=torch.float64)
    for slot in range(top_k):
        for e in range(experts):
            rows = (ids[:, slot] == e).nonzero().flatten()
            gate, up = (exact[0][rows] @ module64.gate_up_proj[e].T).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ module64.down_proj[e].T
            y64 = y64.index_add(0, rows, y * exact[1][rows, slot, None])
    assert 0.01 < relative(emulated, y64) < 0.10


def test_the_smoke_run_writes_every_mode(tmp_path):
    js, png = tmp_path / "ablation.json", tmp_path / "ablation.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    assert ablation.main(["--smoke", "--device", "cpu", "--json", str(js), *plot]) == 0
    report = json.loads(js.read_text())
    assert list(report["runs"]) == list(ablation.MODES)
    assert all(len(r["losses"]) == r["steps"] > 0 for r in report["runs"].values())
    assert report["summary"]["final_loss_ratio"][ablation.BF16] == 1.0
    assert not plot or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        ablation.main(["--modes", "bf16,fp9", "--json", str(js)])
