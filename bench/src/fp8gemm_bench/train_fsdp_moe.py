"""``fp8gemm bench --train-fsdp --moe``: the FSDP2 check of ``train_fsdp`` on a mixture of experts, a byte-level
transformers ``Qwen3MoeForCausalLM`` (``train_moe_run``'s model) of 4 sparse layers of 8 experts of 256, top 2, every
attention projection and every experts layer converted (``Fp8TrainingLinear``, ``Fp8TrainingExperts``), the routers
and ``lm_head`` kept. Same batches, steps, optimizer, tolerance, report and plot as the dense check.

``fully_shard`` shards every Parameter on its dim 0, so each rank holds half of the experts of ``gate_up_proj
[E, 2I, H]`` and ``down_proj [E, H, I]`` and all-gathers them whole before the layer's forward and backward: the FP8
layer sees the plain unsharded Parameters and FSDP2 reduce-scatters their gradients (the report records rank 0's
shards). The two runs differ by more than the order of sums: each expert's weight gradient is quantized in 128-token
blocks of that expert's rows, which on two ranks restart at the second rank's first row for the expert, and a tiny
difference in the router can send a token to another expert.
"""

from __future__ import annotations

from torch import nn

from . import train_fsdp
from .train_moe_run import SMOKE, MoeModelConfig, build_model

# 16.0M parameters (6.6M active); the positions cover train_fsdp's sequences
MODEL = MoeModelConfig(hidden=512, layers=4, experts=8, experts_per_token=2, moe_intermediate=256,
                       max_positions=train_fsdp.SEQ)  # fmt: skip


def _decoder_layers(model) -> list[nn.Module]:
    return list(model.lm.model.layers)


HARNESS = train_fsdp.Harness("fsdp2-moe", MODEL, SMOKE, build_model, _decoder_layers)


def run(device, **kwargs) -> dict:
    """``train_fsdp.run`` on the MoE model."""
    return train_fsdp.run(device, harness=HARNESS, **kwargs)


plot = train_fsdp.plot
