"""Grouped GEMMs are bitwise repeatable: the same call on mixture-of-experts sizes, ten times, gives identical bits.
Usage: python3 ci/gpu/repeatable.py [backend]"""

import sys

import fp8gemm
import torch

backend = sys.argv[1] if len(sys.argv) > 1 else None
gen = torch.Generator(device="cuda").manual_seed(1234)
print("seed 1234")


def fp8(*shape):
    return (torch.randn(*shape, device="cuda", generator=gen) * 8).to(torch.float8_e4m3fn)


def scales(*shape):
    return torch.rand(*shape, device="cuda", generator=gen) + 0.5


def repeats(name, call):
    first = call()
    same = all(torch.equal(first.view(torch.int16), call().view(torch.int16)) for _ in range(9))
    print(f"{name}: {'identical' if same else 'DIFFERENT'} over 10 calls")
    return same


ok = True
for n, k in ((4096, 7168), (7168, 2048)):
    sizes = torch.tensor([900, 0, 13, 4000, 1, 64, 129, 2000], dtype=torch.int32, device="cuda")
    offs, m, g = sizes.cumsum(0).to(torch.int32), int(sizes.sum()), len(sizes)
    a, b = fp8(m, k), fp8(g, n, k)
    sa, sb = scales(m, k // 128), scales(g, n // 128, k // 128)
    args = (a, b, sa, sb, offs)
    ok &= repeats(f"contiguous {n}x{k}", lambda args=args: fp8gemm.grouped_gemm(*args, backend=backend))
    masked_m = torch.tensor([64, 0, 17, 1, 33, 64, 5, 48], dtype=torch.int32, device="cuda")
    a3, sa3 = fp8(g, 64, k), scales(g, 64, k // 128)
    args = (a3, b, sa3, sb, masked_m)
    ok &= repeats(f"masked {n}x{k}", lambda args=args: fp8gemm.grouped_gemm_masked(*args, backend=backend))
sys.exit(0 if ok else 1)
