"""Time fp8gemm alone on a few shapes (median, L2 flushed): quick A/B runs of kernel knobs."""

import functools
import sys

import fp8gemm
import torch
import triton.testing

shapes = [tuple(map(int, s.split(","))) for s in sys.argv[1:]] or [
    (4096, 7168, 16384),
    (4096, 2112, 7168),
    (128, 7168, 16384),
]
for m, n, k in shapes:
    a, sa = fp8gemm.quantize_activation(torch.randn(m, k, device="cuda"))
    b, sb = fp8gemm.quantize_weight(torch.randn(n, k, device="cuda"))
    sb = fp8gemm.prepare_weight_scale(sb)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = functools.partial(fp8gemm.gemm, a, b, sa, sb, out=out)
    ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
    print(f"{m}x{n}x{k}: {ms * 1e3:.1f} us, {2 * m * n * k / ms / 1e9:.0f} TFLOP/s")
