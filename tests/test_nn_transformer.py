"""A small randomly initialised transformer (Hugging Face Qwen3, built from a config) converted to Fp8Linear."""

from __future__ import annotations

import copy

import torch
from fp8gemm.nn import Fp8Linear, convert, load_fp8_checkpoint
from fp8gemm.testing import conformance
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

CONFIG = dict(
    vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=128, tie_word_embeddings=False,
)  # fmt: skip

# Each FP8 matmul is off by ~3.6% RMS (two e4m3 roundings of <= 2^-4 relative each; test_nn measures
# one layer) and a token's logits pass through 7 quantized projections per decoder layer, so their
# errors add to ~8-10% over the two layers here (measured 8.2-9.6% over seeds, bf16 alone 0.7%).
# A wrong scale layout or transposed block gives ~100%: the bound separates them with room.
LOGITS_BOUND = 0.15
TOP1_AGREEMENT = 0.7  # random weights give close logits, so some argmax flips are expected (measured 83-89%)


def _model(device, seed):
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**CONFIG)).to(device=device, dtype=torch.bfloat16).eval()


@torch.no_grad()
def test_converted_transformer_logits_track_the_bf16_model(device):
    model = _model(device, seed=0)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 48), device=device)
    reference = model(ids).logits.double()
    fp8_model = copy.deepcopy(model)
    report = convert(fp8_model)
    assert len(report.converted) == 7 * CONFIG["num_hidden_layers"] and list(report.skipped) == ["lm_head"]
    assert all(isinstance(fp8_model.get_submodule(name), Fp8Linear) for name in report.converted)
    logits = fp8_model(ids).logits
    assert logits.dtype == torch.bfloat16 and logits.device.type == torch.device(device).type
    assert conformance.relative_error(logits, reference) < LOGITS_BOUND
    agreement = (logits.argmax(-1) == reference.argmax(-1)).double().mean().item()
    assert agreement >= TOP1_AGREEMENT


@torch.no_grad()
def test_transformer_checkpoint_round_trip(device, tmp_path):
    source = _model(device, seed=1)
    convert(source)
    save_file(source.state_dict(), tmp_path / "model.safetensors")
    target = _model(device, seed=2)  # other random weights, to be overwritten
    convert(target)
    result = load_fp8_checkpoint(target, tmp_path / "model.safetensors", device=device)
    assert result.missing_keys == [] and result.unexpected_keys == []
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16), device=device)
    assert torch.equal(target(ids).logits, source(ids).logits)
