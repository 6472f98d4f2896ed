"""The floors of ``fused_experts``' host time, timed beside it by ci/host_overhead.py: its backend's native op
called alone (no Python wrapper), and its six launches alone, each entry replaying arguments packed once with every
buffer kept, so no wrapper, check, allocation or packing is counted: what a launch costs on this host."""

from __future__ import annotations

import ctypes
import dataclasses

from fp8gemm import moe, moe_steps, runtime
from fp8gemm.protocol import GROUPED_ARGS, MOE_ACTIVATION_ARGS, MOE_COMBINE_ARGS, MOE_ROUTE_ARGS

ENTRIES = {"moe_route": MOE_ROUTE_ARGS, "grouped_launch": GROUPED_ARGS, "moe_activation": MOE_ACTIVATION_ARGS,
           "moe_combine": MOE_COMBINE_ARGS}  # fmt: skip


class KeptSteps(moe_steps.KernelSteps):
    """The kernel steps, every buffer they allocate kept in ``kept`` (a replayed launch writes only live memory)."""

    def __init__(self, plan, kept: list):
        super().__init__(plan)
        self.kept = kept

    def buffer(self, rows, cols, dtype, device):
        self.kept.append(super().buffer(rows, cols, dtype, device))
        return self.kept[-1]

    def prepare(self, x, topk_ids, topk_weights):
        routed = super().prepare(x, topk_ids, topk_weights)
        self.kept.extend(routed)  # offs, positions and the routed rows: the replayed route writes them
        return routed

    def activation(self, h, offs):
        self.kept.extend(super().activation(h, offs))
        return self.kept[-2:]


def experts_floor_calls(x, ids, weights, w13, s13, w2, s2) -> dict:
    """Rows for ``fused_experts(x, ids, weights, w13, s13, w2, s2)`` on a GPU backend with native ops; {} elsewhere."""
    native = runtime.native_ops(x, w13, None)
    plan = moe.plan_fused_experts(x, ids, weights, w13, s13, w2, s2, "silu", False, None, None)
    tokens, top_k = ids.shape
    if native is None or plan.backend.moe_workspace_bytes(tokens, top_k, w13.shape[0]):
        return {}  # no native op, or a route workspace that moe_steps.route frees at once
    replay, kept = [], []

    def recorder(entry, mirror):
        def record(address):
            packed = ctypes.create_string_buffer(ctypes.string_at(address, mirror.size), mirror.size)
            kept.append(packed)
            replay.append((entry, ctypes.addressof(packed)))
            entry(address)

        return record

    traced = {name: recorder(getattr(plan.backend, name), mirror) for name, mirror in ENTRIES.items()}
    steps = KeptSteps(plan._replace(backend=dataclasses.replace(plan.backend, **traced)), kept)
    kept.append(steps.run(x, ids, weights, w13, s13, w2, s2))

    def launches(kept=kept):  # the packed arguments and device buffers live as long as this row
        for entry, address in replay:
            entry(address)

    return {
        "fused_experts, its native op alone": lambda: native.fused_experts(x, ids, weights, w13, s13, w2, s2, False),
        f"fused_experts, its {len(replay)} launches alone": launches,
    }
