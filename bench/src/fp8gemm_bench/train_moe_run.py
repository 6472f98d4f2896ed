"""``fp8gemm bench --train-run --moe``: the convergence run of ``train_run`` on a mixture of experts. A transformers
``Qwen3MoeForCausalLM`` built from a ``Qwen3MoeConfig`` (random weights from the seed, nothing downloaded) on bytes,
every layer sparse, trained on the Python standard library's source twice, in bf16 and after
``fp8gemm.nn.convert(model, training=True)``, from the same seed, weights and batches: both loss curves, the final loss
(the mean of the last ``train_run.FINAL_WINDOW`` steps) and its ratio, the held-out loss, peak memory and tokens per
second, and how many modules the conversion swapped and which it kept.

The model (``MOE``): 8 layers, hidden 512, 4 attention heads of 128 and 2 kv heads, 16 experts of intermediate 256 of
which each token takes 4 (their weights renormalized, ``norm_topk_prob``), vocab 256 (bytes, as ``train_model``),
untied embeddings. ``convert`` swaps each layer's q, k, v and o projections for ``Fp8TrainingLinear`` and its experts
for ``Fp8TrainingExperts``; it keeps ``lm_head`` (its default ``skip``); the router is a Parameter, not an
``nn.Linear``, and stays in bf16. The bf16 run's experts run as transformers runs them by default
(``experts_implementation``, recorded in the report: ``grouped_mm`` in transformers 5).

The router's auxiliary (load-balancing) loss is left off, transformers' default (``output_router_logits=False``): the
loss both runs minimize is the next-byte cross-entropy alone, as the dense run's, so the ratio compares the same
objective. What the routing did instead is recorded: each run's share of routed tokens per expert and layer over the
held-out evaluation (``expert_share``; uniform is 1/16), which shows an expert collapse if one happened.

Training as the dense run: AdamW on float32 master weights (``train_model.MasterAdamW``), learning rate 1e-3 after 50
warm-up steps, cosine to a tenth, 500 steps of 16 x 512 bytes, eager; both runs together stop at ``TIME_BUDGET``
seconds and record the step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from fp8gemm.nn import Fp8TrainingExperts, convert
from torch import nn

from . import train_run
from .bench import DEFAULT_SEED
from .train_model import VOCAB

STEPS, BATCH, SEQ, LR, WARMUP = 500, 16, 512, 1e-3, 50
TIME_BUDGET = 300.0  # seconds for both runs: one that reaches it stops there and says so
TARGETS = {"final_loss_ratio_within": train_run.TARGETS["final_loss_ratio_within"]}


@dataclass(frozen=True)
class MoeModelConfig:
    """A Qwen3-MoE decoder on bytes, every layer sparse; H, the head dims and I multiples of 128 (``convert``'s)."""

    hidden: int = 512
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 128
    experts: int = 16
    experts_per_token: int = 4
    moe_intermediate: int = 256
    intermediate: int = 1024  # the dense MLP's size, unused: no layer is dense
    vocab: int = VOCAB
    max_positions: int = SEQ
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def transformers_config(self):
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            num_experts=self.experts,
            num_experts_per_tok=self.experts_per_token,
            moe_intermediate_size=self.moe_intermediate,
            intermediate_size=self.intermediate,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            output_router_logits=False,
            tie_word_embeddings=False,
            max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rms_norm_eps=self.norm_eps,
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )

    def _parameters(self, experts: int) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads) + 2 * self.head_dim
        moe = self.experts * self.hidden + experts * 3 * self.hidden * self.moe_intermediate  # router, experts
        return self.layers * (attention + moe + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def parameters(self) -> int:
        """The parameter count of ``ByteQwen3Moe(self)``."""
        return self._parameters(self.experts)

    def active_parameters(self) -> int:
        """The parameters one token computes with: its ``experts_per_token`` experts of each layer, not all."""
        return self._parameters(self.experts_per_token)

    def as_dict(self) -> dict:
        return {**asdict(self), "name": "byte-level Qwen3-MoE", "architecture": "Qwen3MoeForCausalLM",
                "parameters": self.parameters(), "active_parameters": self.active_parameters()}  # fmt: skip


MOE = MoeModelConfig()
SMOKE = MoeModelConfig(hidden=128, layers=2, heads=1, kv_heads=1, experts=4, experts_per_token=2, moe_intermediate=128,
                       intermediate=256, max_positions=train_run.SMOKE_RUN["seq"])  # fmt: skip


class ByteQwen3Moe(nn.Module):
    """``Qwen3MoeForCausalLM`` as ``train_model.loss_fn`` calls a model: ``forward(tokens [B, T]) -> logits``. While
    gradients are off (the evaluation), it counts the tokens each layer routes to each expert (``routed``)."""

    def __init__(self, cfg: MoeModelConfig):
        super().__init__()
        from transformers import Qwen3MoeForCausalLM

        self.cfg = cfg
        self.lm = Qwen3MoeForCausalLM(cfg.transformers_config())
        self.routed = [torch.zeros(cfg.experts, dtype=torch.int64) for _ in range(cfg.layers)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens, use_cache=False).logits

    def experts_modules(self) -> list[nn.Module]:
        return [layer.mlp.experts for layer in self.lm.model.layers]

    def count_routing(self) -> None:
        """Hooks on each layer's experts (those there now: call it after ``convert``) that add up ``routed``."""
        for i, experts in enumerate(self.experts_modules()):
            experts.register_forward_hook(lambda module, args, out, i=i: self._count(i, args[1]))

    def _count(self, layer: int, topk_ids: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            return  # training steps: no extra kernels in the timed steps
        ids = topk_ids.reshape(-1)
        counts = self.routed[layer]
        if counts.device != ids.device:
            counts = self.routed[layer] = counts.to(ids.device)
        counts.index_add_(0, ids, torch.ones_like(ids))  # no host sync, unlike bincount on a GPU


def build_model(cfg: MoeModelConfig, seed: int, device, dtype=torch.bfloat16) -> ByteQwen3Moe:
    """The model with weights drawn from ``seed`` on the CPU (transformers' own initialization; the same weights on
    every device), then moved."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ByteQwen3Moe(cfg)
    return model.to(device=torch.device(device), dtype=dtype)


def prepare_model(mode: str, cfg: MoeModelConfig, seed: int, device):
    """``train_run.prepare_model`` for the MoE model: with the conversion's record, its counts added."""
    model = build_model(cfg, seed, device)
    conversion = None
    if mode == train_run.FP8:
        report = convert(model, training=True)
        conversion = {
            **train_run.conversion_record(model, report),
            "fp8_training_experts": sum(isinstance(m, Fp8TrainingExperts) for m in model.modules()),
            "converted_count": len(report.converted),
            "kept_count": len(report.skipped),
            "routers_kept_bf16": [name for name, m in model.named_modules() if name.endswith("mlp.gate")],
        }
    model.count_routing()
    return model, conversion


def routing_fields(model: ByteQwen3Moe) -> dict:
    """Each layer's share of the held-out evaluation's routed tokens per expert, and the largest share."""
    shares = []
    for counts in model.routed:
        total = counts.sum().item()
        shares.append([round(c / total, 5) if total else 0.0 for c in counts.tolist()])
    experts = model.experts_modules()[0]
    if not isinstance(experts, Fp8TrainingExperts):
        experts = f"{type(experts).__name__}, transformers' {model.lm.config._experts_implementation} route"
    return {
        "experts_module": experts if isinstance(experts, str) else type(experts).__name__,
        "expert_share": shares,
        "max_expert_share": max((max(s) for s in shares), default=0.0),
    }


def run(device, *, steps: int = STEPS, seed: int = DEFAULT_SEED, smoke: bool = False,
        time_budget: float | None = TIME_BUDGET, progress=print, checkpoint=None) -> dict:  # fmt: skip
    """Both runs, bf16 first (``train_run.run_convergence`` on the MoE model); ``checkpoint(report)`` after each."""
    cfg = SMOKE if smoke else MOE
    fields = {
        "targets": TARGETS,
        "router": {
            "aux_loss": False,
            "output_router_logits": False,
            "norm_topk_prob": True,
            "experts_per_token": cfg.experts_per_token,
            "uniform_share": 1 / cfg.experts,
        },  # fmt: skip
    }
    return train_run.run_convergence(device, steps=steps, batch=BATCH, seq=SEQ, lr=LR, warmup=WARMUP, seed=seed,
                                     smoke=smoke, time_budget=time_budget, progress=progress, checkpoint=checkpoint,
                                     cfg=cfg, prepare=prepare_model, trained_fields=routing_fields,
                                     report_fields=fields)  # fmt: skip


plot = train_run.plot
