"""A few launches for compute-sanitizer (memcheck, racecheck): tails, split-K, fp32 out, strides, views; grouped
GEMMs in both layouts (empty groups, rows past offs[-1], every masked_m up to M_max); with --moe, fused_experts alone."""

import sys

import torch
from fp8gemm.testing import conformance, conformance_grouped

backend = sys.argv[1] if len(sys.argv) > 1 else None
grouped_only = "--grouped-only" in sys.argv[2:]  # the grouped kernels' cases alone
moe_only = "--moe" in sys.argv[2:]  # fused_experts' step kernels alone
# The default plan picks 16-, 64- and 192-wide tiles and 256-row ones here (700 x 4000: 128 x 192,
# 2000 x 4000: 256 x 128, both with M and N tails), and the widths that straddle two B-scale blocks
# at every offset (330 x 4080: 128 x 96, 1000 x 2096: 128 x 160, with tails; 40 x 18400: 64 x 96).
SHAPES = [
    (1, 16, 128),
    (37, 272, 640),
    (64, 2112, 1024),
    (130, 144, 384),
    (257, 400, 1152),
    (2100, 272, 384),
    (700, 4000, 1024),
    (2000, 4000, 512),
    (330, 4080, 640),
    (1000, 2096, 1024),
    (40, 18400, 384),
]
CASES = [conformance.Case(m, n, k, torch.float32 if i % 2 else torch.bfloat16, i % 2 == 0, i % 3 == 0)
         for i, (m, n, k) in enumerate(SHAPES)] + conformance.VIEW_CASES  # fmt: skip
for case in [] if grouped_only or moe_only else CASES:
    r = conformance.run_case(case, "cuda", torch.float8_e4m3fn, backend)
    print(f"{case.id}: rel err {r.rel_err:.2e} {'ok' if r.passed else 'FAIL ' + r.detail}")
    assert r.passed
# The grouped suite's fixed cases of the layouts a kernel runs (contiguous offs, masked); m_indices is the reference's.
# --small: the fixed edge cases only (racecheck runs ~1000x slower than the kernels).
small = "--small" in sys.argv[2:]
GROUPED = (
    [c for c in conformance_grouped.cases("cpu" if small else "cuda", n_random=0) if c.layout in ("offs", "masked")]
    if not moe_only
    else []
)
for case in GROUPED:
    r = conformance_grouped.run_case(case, "cuda", torch.float8_e4m3fn, backend)
    print(f"{case.id}: rel err {r.rel_err:.2e} {'ok' if r.passed else 'FAIL ' + r.detail}")
    assert r.passed
# --moe: fused_experts' step kernels (route in one launch and in chunks, out-of-range ids, fp32 x), whole pipeline.
if moe_only:
    import fp8gemm
    from fp8gemm.moe_reference import reference_fused_experts

    gen = torch.Generator("cuda").manual_seed(0)
    for tokens, experts, top_k, hidden, inter, dtype in [(1, 8, 2, 256, 256, torch.bfloat16),
                                                         (37, 16, 4, 384, 256, torch.float32),
                                                         (300, 32, 8, 256, 128, torch.bfloat16)]:  # fmt: skip
        x = torch.randn(tokens, hidden, generator=gen, device="cuda").to(dtype)
        ids = torch.randint(-1, experts + 2, (tokens, top_k), generator=gen, device="cuda", dtype=torch.int32)
        weights = torch.rand(tokens, top_k, generator=gen, device="cuda")
        w13 = [fp8gemm.quantize_weight(torch.randn(2 * inter, hidden, generator=gen, device="cuda") / hidden**0.5)
               for _ in range(experts)]  # fmt: skip
        w2 = [fp8gemm.quantize_weight(torch.randn(hidden, inter, generator=gen, device="cuda") / inter**0.5)
              for _ in range(experts)]  # fmt: skip
        args = (torch.stack([q for q, _ in w13]), torch.stack([s for _, s in w13]),
                torch.stack([q for q, _ in w2]), torch.stack([s for _, s in w2]))  # fmt: skip
        out = fp8gemm.fused_experts(x, ids, weights, *args, backend=backend)
        ref = reference_fused_experts(x, ids, weights, *args)
        err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        print(f"moe T{tokens} E{experts} k{top_k} {dtype}: rel err {err:.2e}")
        assert err < 1e-2, err
