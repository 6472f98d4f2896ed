"""``fp8gemm bench --train-fsdp --moe``: the FSDP2 check of ``train_fsdp`` on a mixture of experts, a byte-level
transformers ``Qwen3MoeForCausalLM`` (``train_moe_run``'s model) of 4 sparse layers of 8 experts of 256, top 2, every
attention projection and every experts layer converted (``Fp8TrainingLinear``, ``Fp8TrainingExperts``), the routers
and ``lm_head`` kept. Same batches, steps, optimizer, tolerance, report and plot as the dense check.

``fully_shard`` shards every Parameter on its dim 0, so each rank holds half of the experts of ``gate_up_proj
[E, 2I, H]`` and ``down_proj [E, H, I]`` and all-gathers them whole before the layer's forward and backward: the FP8
layer sees the plain unsharded Parameters and FSDP2 reduce-scatters their gradients (the report records rank 0's
shards).

The one-device run takes each batch as two micro-batches, the ranks' halves, and adds their gradients. Each expert's
weight gradient is quantized in 128-token blocks of that expert's rows, so where one batch's rows of an expert split
between two ranks the blocks differ (no share of the batch can keep them aligned, as the dense check's 128-token shares
do), and so do the gradients, by a few FP8 rounding steps. Measured on two gloo CPU ranks over the 50 steps: the
whole batch on one device drifts from the ranks' loss by up to 0.87% (past 0.5% from step 26); in two micro-batches
it stays within 5e-8, which is what this check is for (FSDP2's sharding of the layer's Parameters, not data
parallelism's rounding).
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


HARNESS = train_fsdp.Harness("fsdp2-moe", MODEL, SMOKE, build_model, _decoder_layers, one_device_parts=train_fsdp.WORLD)


def run(device, **kwargs) -> dict:
    """``train_fsdp.run`` on the MoE model."""
    return train_fsdp.run(device, harness=HARNESS, **kwargs)


plot = train_fsdp.plot
