"""Host time of one small `linear` call by each way it can be called, against bf16 `F.linear` (docs/benchmarks.md,
"Host overhead"): eager `fp8gemm.linear`, the `torch.ops` op, and a one-op function under `torch.compile`; and of one
`fused_experts` call at M tokens (E = 128 experts, top 8, H = K, I = 768; `--null`: I = 128).

    python3 ci/host_overhead.py             # a GPU: the installed backend, 8 x 4096 x 4096
    python3 ci/host_overhead.py --null      # any machine: CPU tensors play a GPU whose entries return at once, so the
                                            # times are fp8gemm's Python path alone (and F.linear's CPU compute)

Each time is the best of seven loops (garbage collection off), in us per call, under `--mode` (no_grad or
inference_mode). `--compilers` times the three linear calls compiled by each layer of torch.compile (dynamo's
`eager` backend, `aot_eager`, inductor). `--profile` adds a cProfile of the compiled `linear` and of `fused_experts`
(the functions that took the most own time).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import pstats
import sys
import time
from pathlib import Path

import fp8gemm
import torch
import torch.nn.functional as F
from fp8gemm import registry
from fp8gemm.protocol import GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS, MN_MAJOR, Backend, ScaleLayout
from fp8gemm.registry import DeviceInfo, InstalledBackend


def use_null_backend() -> None:
    """An sm90a-like backend whose entries do nothing; CPU tensors play its device 0 (the tests' stand-in for a GPU),
    process-wide: this tool never undoes it."""
    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import cpu_tensors_play_a_gpu

    def none(*args):
        return None

    null = Backend(name="null", platform="cuda", targets=("sm_90a",), fp8_dtype="float8_e4m3fn", version="0",
                   launch=none, quantize=none, linear=none, linear_workspace_bytes=lambda *a: 0,
                   a_scale_layout=ScaleLayout(MN_MAJOR, 4), grouped_launch=none,
                   grouped_layouts=(GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS),
                   grouped_workspace_bytes=lambda *a: 0, moe_step=none, moe_workspace_bytes=lambda *a: 0)  # fmt: skip
    patch = pytest.MonkeyPatch()
    installed = (InstalledBackend("null = tool", "tool", null, None),)
    patch.setattr(registry, "_discover", functools.lru_cache(maxsize=1)(lambda: installed))
    patch.setattr(registry, "describe_device", lambda device: DeviceInfo("cuda", "null", ("sm_90a",), "9.0"))
    cpu_tensors_play_a_gpu(patch)
    registry.clear_caches()


def per_call_us(fn, calls: int) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def experts_call(tokens: int, hidden: int, inter: int, device: str, experts: int = 128, top_k: int = 8):
    gen = torch.Generator().manual_seed(1)
    w13, s13 = fp8gemm.quantize_weight(torch.randn(experts * 2 * inter, hidden, generator=gen).to(device))
    w2, s2 = fp8gemm.quantize_weight(torch.randn(experts * hidden, inter, generator=gen).to(device))
    w13, s13 = w13.view(experts, 2 * inter, hidden), fp8gemm.prepare_weight_scale(s13.view(experts, -1, hidden // 128))
    w2, s2 = w2.view(experts, hidden, inter), fp8gemm.prepare_weight_scale(s2.view(experts, -1, inter // 128))
    x = torch.randn(tokens, hidden, generator=gen).to(device, torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(device)
    weights = torch.rand(tokens, top_k, generator=gen).to(device)
    return lambda: fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)


def by_compiler(linears: dict, x: torch.Tensor, count: int) -> None:
    """Each linear call ``fn(x)`` compiled (fullgraph) by each layer of torch.compile: which one adds the time."""
    print("  compiled by (us/call):      eager backend   aot_eager   inductor")
    for name, fn in linears.items():
        times = []
        for compiler in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=compiler, fullgraph=True)
            compiled(x)
            times.append(per_call_us(lambda compiled=compiled: compiled(x), count))
        print(f"  {name:28s}" + "".join(f"{t:12.1f}" for t in times))
    torch._dynamo.reset()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--null", action="store_true", help="the null backend on CPU tensors")
    p.add_argument("--shape", default="8,4096,4096", help="M,N,K (default %(default)s)")
    p.add_argument("--mode", choices=("no_grad", "inference_mode"), default="inference_mode")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--compilers", action="store_true",
                   help="also the three linear calls compiled by dynamo's eager backend, aot_eager and inductor")  # fmt: skip
    args = p.parse_args(argv)
    m, n, k = map(int, args.shape.split(","))
    device = "cpu" if args.null else "cuda"
    if args.null:
        use_null_backend()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
    w_bf16 = torch.randn(n, k, generator=gen).to(device, torch.bfloat16)
    w, s = fp8gemm.quantize_weight(w_bf16.float())
    gc.disable()
    with getattr(torch, args.mode)():
        linears = {
            "F.linear (bf16)": lambda x: F.linear(x, w_bf16),
            "fp8gemm.linear": lambda x: fp8gemm.linear(x, w, s),
            "torch.ops.fp8gemm.linear": lambda x: torch.ops.fp8gemm.linear.default(x, w, s, None, False, ""),
        }
        compiled_bf16 = torch.compile(linears["F.linear (bf16)"])
        compiled_ours = torch.compile(linears["fp8gemm.linear"])
        calls = {name: functools.partial(fn, x) for name, fn in linears.items()}
        calls["compiled F.linear (bf16)"] = lambda: compiled_bf16(x)
        calls["compiled fp8gemm.linear"] = lambda: compiled_ours(x)
        where = "null backend, CPU tensors" if args.null else torch.cuda.get_device_name()
        print(f"{m} x {n} x {k}, {args.mode}, {where}, torch {torch.__version__}")
        calls["fused_experts"] = experts_call(m, k, 128 if args.null else 768, device)
        for name, fn in calls.items():
            print(f"  {name:28s} {per_call_us(fn, args.calls):7.1f} us/call")
        if args.compilers:
            by_compiler(linears, x, args.calls)
        if args.profile:
            for name in ("compiled fp8gemm.linear", "fused_experts"):
                print(f"cProfile of {name}:")
                profile = cProfile.Profile()
                profile.runcall(lambda fn=calls[name]: [fn() for _ in range(args.calls)])
                pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
