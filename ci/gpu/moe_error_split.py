"""Where the MoE bench check's error comes from, on one of its cases (same seed, data and weights as the bench):
the error on the check's tokens against all tokens and against random 8-token samples, then by stage (the gate/up
product against float64, the activation codes it moves, the output against float64 of the op's own codes).
Usage: python3 ci/gpu/moe_error_split.py [model] [tokens] [routing]   (default: deepseek-v3 1024 skewed)"""

import sys

import torch
import torch.nn.functional as F
from fp8gemm import moe_bench
from fp8gemm.conformance import relative_error
from fp8gemm.moe_peers import grouped_operands, ours
from fp8gemm.moe_reference import dequantize64, reference_fused_experts
from fp8gemm.quantize import reference_quantize

SAMPLES, SAMPLE_TOKENS, CHUNK = 2000, 8, 256


def yardstick(inp, w):
    """float64 yardstick of every token, in chunks of tokens."""
    chunks = [slice(i, i + CHUNK) for i in range(0, inp.tokens, CHUNK)]
    weights = (w.w13, w.w13_scale, w.w2, w.w2_scale)
    return torch.cat(
        [reference_fused_experts(inp.x[c], inp.topk_ids[c], inp.topk_weights[c], *weights) for c in chunks]
    )


def sample_errors(out, ref):
    gen = torch.Generator().manual_seed(1)
    picks = (torch.randint(0, out.shape[0], (SAMPLE_TOKENS,), generator=gen) for _ in range(SAMPLES))
    return torch.tensor([relative_error(out[p], ref[p]) for p in picks])


def stage_errors(inp, w, inter):
    """The grouped GEMMs' chain on the op's operands: gate/up error, codes moved, down output on its own codes."""
    order, offs, a1, s1, h, a2, s2 = grouped_operands(inp, w)
    own = torch.empty(a2.shape[0], w.w2.shape[1], dtype=torch.float64, device=h.device)
    h_diff = h_norm = moved = 0.0
    start = 0
    for e, end in enumerate(offs.tolist()):
        r = slice(start, end)
        start = end
        if r.start == r.stop:
            continue
        h64 = dequantize64(a1[r], s1[r]) @ dequantize64(w.w13[e], w.w13_scale[e]).t()
        h_diff += float((h[r].double() - h64).norm() ** 2)
        h_norm += float(h64.norm() ** 2)
        codes, _ = reference_quantize((F.silu(h64[:, :inter]) * h64[:, inter:]).float(), w.w13.dtype, False)
        moved += int((codes.view(torch.uint8) != a2[r].view(torch.uint8)).sum())
        own[r] = dequantize64(a2[r], s2[r]) @ dequantize64(w.w2[e], w.w2_scale[e]).t()
    position = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    combined = (own[position].view(inp.tokens, inp.top_k, -1) * inp.topk_weights.double()[..., None]).sum(1)
    return (h_diff / h_norm) ** 0.5, moved / a2.numel(), combined


def main(name="deepseek-v3", tokens="1024", kind="skewed"):
    device, seed = torch.device("cuda"), moe_bench.DEFAULT_SEED
    model = {m.name: m for m in moe_bench.MODELS}[name]
    case = moe_bench.Case(name, int(tokens), kind)
    w = moe_bench.make_weights(model, {"fp8": 1, "bf16": 0}, device, None, seed)["fp8"][0]
    inp = moe_bench.case_inputs(model, case, device, None, seed)
    out = ours("contiguous")(inp, w)[0]().double()
    ref = yardstick(inp, w)
    check = torch.tensor(moe_bench.checked_tokens(case, seed))
    draws = sample_errors(out, ref)
    print(f"{case.label}, seed {seed}: against the yardstick, the check's {len(check)} tokens "
          f"{relative_error(out[check], ref[check]):.3e}, all tokens {relative_error(out, ref):.3e}; "
          f"{SAMPLES} random {SAMPLE_TOKENS}-token samples: median {draws.median():.3e}, "
          f"99th percentile {draws.quantile(0.99):.3e}, max {draws.max():.3e}")  # fmt: skip
    gate_up, moved, own = stage_errors(inp, w, model.inter)
    print(f"gate/up fp32 against float64 {gate_up:.2e}; activation codes moved {moved:.2%}; output against float64 "
          f"of its own codes {relative_error(out, own):.3e}; those codes' float64 against the yardstick "
          f"{relative_error(own, ref):.3e}")  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
