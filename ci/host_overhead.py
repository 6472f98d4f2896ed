"""Host time per call of fp8gemm's ops and layers next to bf16's, in a host-bound loop (docs/benchmarks.md, "Host
overhead"); and, with ``--models``, eager forwards of whole transformers models in bf16 and in each FP8 route.

Per call (us, the best of seven loops with garbage collection off, under ``--mode``): ``F.linear`` and ``nn.Linear``
in bf16; ``fp8gemm.linear``, the same call through the Python planner alone (the route without the backend's native
ops), its ``torch.ops`` op, ``Fp8Linear``; transformers' ``FP8Linear`` and the ``matmul_2d`` it
calls, on ``fp8gemm.hf`` (``use_in_transformers()``); a one-op function under ``torch.compile``; at T tokens,
``fused_experts``, ``Fp8Experts``, transformers' ``FP8Experts`` with ``experts_implementation="fp8gemm"`` and its
bf16 experts loop (Qwen3-30B-A3B's sizes: E = 128, top 8, H = 2048, I = 768). Beside each FP8 row that has one, its
ratio to the bf16 row it replaces, with the most it may be.

    python3 ci/host_overhead.py [--json host.json]       # a GPU: the installed backend
    python3 ci/host_overhead.py --null                   # any machine: CPU tensors play a GPU whose entries return
                                                         # at once: fp8gemm's host path alone; the bf16 rows then
                                                         # include the CPU's compute (small sizes)
    python3 ci/host_overhead.py --models [--json eager.json]   # a GPU: whole models, eager, in each route
    python3 ci/host_overhead.py --models --tiny          # the same end to end on tiny configs (CPU: the reference)

``--models`` builds Qwen3 and Qwen3-MoE from their configs (hidden 4096, ``--layers`` layers, random weights, no
download) and times ``model(ids, use_cache=False, logits_to_keep=1)`` per batch x sequence: bf16; ``convert`` (the bf16
model through ``fp8gemm.nn.convert``); ``hf-fp8``, transformers' own FP8 model (``replace_with_fp8_linear`` with
``FineGrainedFP8Config()``, as quantize-on-load builds it, the MoE with ``experts_implementation="fp8gemm"``) on
``fp8gemm.hf``; ``hf-fp8, null kernel``, the same with a kernel that only allocates its output (transformers' own
host path: the floor of its route); and ``hf-fp8+convert``, that model after ``fp8gemm.nn.convert`` swapped its FP8 modules for
fp8gemm's on the same weights, whose logits must equal ``hf-fp8``'s bit for bit (checked off the null backend).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import datetime
import functools
import gc
import importlib.metadata
import json
import os
import platform
import pstats
import sys
from pathlib import Path

import fp8gemm
import torch
import torch.nn.functional as F
from fp8gemm import registry
from fp8gemm.launch import run_linear
from fp8gemm.plans import checked_linear_plan, fast_linear_plan
from fp8gemm.protocol import ALL_GROUPED_LAYOUTS, MN_MAJOR, Backend, ScaleLayout
from fp8gemm.registry import DeviceInfo, InstalledBackend
from host_floor import experts_floor_calls
from host_models import BATCHES, MODELS, TINY_BATCHES, compare_models, per_call_us

# (row, the bf16 row it replaces, the most the ratio may be)
RATIOS = (("fp8gemm.linear", "F.linear (bf16)", 1.15), ("Fp8Linear", "nn.Linear (bf16)", 1.15),
          ("matmul_2d (fp8gemm.hf)", "F.linear (bf16)", 1.2), ("fused_experts", "F.linear (bf16)", 2.0))  # fmt: skip
QWEN3_30B_A3B_EXPERTS = dict(experts=128, top_k=8, hidden=2048, inter=768)
NULL_EXPERTS = dict(experts=128, top_k=8, hidden=256, inter=128)  # the bf16 loop computes on the CPU


def use_null_backend() -> None:
    """An sm90a-like backend whose entries do nothing; CPU tensors play its device 0 (the tests' stand-in for a GPU),
    process-wide: this tool never undoes it."""
    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import cpu_tensors_play_a_gpu

    def none(*args):
        return None

    moe_steps = {
        f.name: none for f in dataclasses.fields(Backend) if f.name.startswith("moe_") and "bytes" not in f.name
    }
    null = Backend(name="null", platform="cuda", targets=("sm_90a",), fp8_dtype="float8_e4m3fn", version="0",
                   launch=none, quantize=none, linear=none, linear_workspace_bytes=lambda *a: 0,
                   a_scale_layout=ScaleLayout(MN_MAJOR, 4), grouped_launch=none,
                   grouped_layouts=ALL_GROUPED_LAYOUTS,
                   grouped_workspace_bytes=lambda *a: 0, moe_workspace_bytes=lambda *a: 0, **moe_steps)  # fmt: skip
    patch = pytest.MonkeyPatch()
    installed = (InstalledBackend("null = tool", "tool", null, None),)
    patch.setattr(registry, "_discover", functools.lru_cache(maxsize=1)(lambda: installed))
    patch.setattr(registry, "describe_device", lambda device: DeviceInfo("cuda", "null", ("sm_90a",), "9.0"))
    cpu_tensors_play_a_gpu(patch)
    registry.clear_caches()


def transformers_status() -> str | None:
    """Why transformers' FP8 modules cannot run on fp8gemm.hf here, or None (then the kernel is in use)."""
    try:
        import fp8gemm.hf
        from transformers.integrations import finegrained_fp8  # noqa: F401

        fp8gemm.hf.use_in_transformers()
    except (ImportError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def planned(x, w, s):
    """The Python planner's plan of ``fp8gemm.linear(x, w, s)``: its route without the backend's native ops."""
    return fast_linear_plan(x, w, s, None, None) or checked_linear_plan(x, w, s, None, None)


def linear_calls(m: int, n: int, k: int, device: str, with_transformers: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
    bf16 = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    w, s = fp8gemm.quantize_weight(bf16.weight.detach().float())
    layer = fp8gemm.nn.Fp8Linear.from_linear(bf16)
    compiled_bf16 = torch.compile(lambda x: F.linear(x, bf16.weight))
    compiled_ours = torch.compile(lambda x: fp8gemm.linear(x, layer.weight, layer.weight_scale_inv))
    calls = {
        "F.linear (bf16)": lambda: F.linear(x, bf16.weight),
        "nn.Linear (bf16)": lambda: bf16(x),
        "fp8gemm.linear": lambda: fp8gemm.linear(x, w, s),
        "fp8gemm.linear, Python planner": lambda: run_linear(planned(x, w, s), x, w, None, False),
        "torch.ops.fp8gemm.linear": lambda: torch.ops.fp8gemm.linear.default(x, w, s, None, False, ""),
        "Fp8Linear": lambda: layer(x),
        "compiled F.linear (bf16)": lambda: compiled_bf16(x),
        "compiled fp8gemm.linear": lambda: compiled_ours(x),
    }
    if with_transformers:
        from fp8gemm import hf
        from transformers.integrations.finegrained_fp8 import FP8Linear

        theirs = FP8Linear(k, n, block_size=(128, 128)).to(device)
        with torch.no_grad():
            theirs.weight.copy_(w)
            theirs.weight_scale_inv.copy_(s)
        calls["matmul_2d (fp8gemm.hf)"] = lambda: hf.matmul_2d(x, theirs.weight, theirs.weight_scale_inv,
                                                               theirs.block_size, x.dtype)  # fmt: skip
        calls["FP8Linear (transformers)"] = lambda: theirs(x)
    return calls


def experts_calls(tokens: int, sizes: dict, device: str, with_transformers: bool) -> dict:
    e, top_k, h, inter = sizes["experts"], sizes["top_k"], sizes["hidden"], sizes["inter"]
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(e, 2 * inter, h, generator=gen).to(device, torch.bfloat16) * h**-0.5
    down = torch.randn(e, h, inter, generator=gen).to(device, torch.bfloat16) * inter**-0.5
    ours = fp8gemm.nn.Fp8Experts.from_weights(gate_up, down)
    x = torch.randn(tokens, h, generator=gen).to(device, torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)]).to(device)
    weights = torch.rand(tokens, top_k, generator=gen).softmax(-1).to(device, torch.bfloat16)  # as a router gives
    args = (ours.w13, ours.w13_scale_inv, ours.w2, ours.w2_scale_inv)
    calls = {"fused_experts": lambda: fp8gemm.fused_experts(x, ids, weights, *args),
             **experts_floor_calls(x, ids, weights, *args), "Fp8Experts": lambda: ours(x, ids, weights),
             **grouped_calls(x, ids, ours.w13, ours.w13_scale_inv)}  # fmt: skip
    if with_transformers:
        from transformers import Qwen3MoeConfig
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
        from transformers.integrations.moe import use_experts_implementation
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        config = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=inter, num_experts=e, num_experts_per_tok=top_k)
        config._experts_implementation = "eager"
        loop = Qwen3MoeExperts(config).to(device, torch.bfloat16)
        with torch.no_grad():
            loop.gate_up_proj.copy_(gate_up)
            loop.down_proj.copy_(down)
        fp8_config = copy.copy(config)
        fp8_config._experts_implementation = "fp8gemm"
        cls = use_experts_implementation(experts_class=FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS)
        theirs = cls(fp8_config, block_size=(128, 128)).to(device)
        with torch.no_grad():
            for name, value in zip(("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv"),
                                   (ours.w13, ours.w13_scale_inv, ours.w2, ours.w2_scale_inv), strict=True):  # fmt: skip
                getattr(theirs, name).copy_(value)
        calls["FP8Experts (transformers, 'fp8gemm')"] = lambda: theirs(x, ids, weights)
        calls["bf16 experts loop (transformers)"] = lambda: loop(x, ids, weights)
    return calls


def grouped_calls(x, ids, w13, s13) -> dict:
    """The gate/up GEMM of ``fused_experts`` as one ``grouped_gemm`` call on its routed rows: an eager call reads
    ``offs`` (G integers) on the host, which waits for the stream."""
    rows = ids.numel()
    a, a_scale = fp8gemm.quantize_activation(x.repeat_interleave(ids.shape[1], 0))
    offs = torch.bincount(ids.flatten(), minlength=w13.shape[0]).cumsum(0).to(torch.int32)
    b_scale = fp8gemm.prepare_weight_scale(s13)
    assert a.shape[0] == rows
    return {"grouped_gemm (offs)": lambda: fp8gemm.grouped_gemm(a, w13, a_scale, b_scale, offs)}


def ratio_lines(times: dict) -> dict:
    out = {}
    for row, base, most in RATIOS:
        if row in times and base in times:
            out[row] = {"of": base, "ratio": times[row] / times[base], "at_most": most}
    return out


def environment(device: str) -> dict:
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if device == "cuda" else device,
           "TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR": os.environ.get("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR")}  # fmt: skip
    for dist in ("fp8gemm-core", "fp8gemm-cuda-sm90a", "transformers", "kernels"):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:  # where True, transformers' FP8Linear tries DeepGEMM before fp8gemm.hf on every call, unless disabled
        from transformers.integrations.deepgemm import is_deepgemm_loadable

        env["deepgemm_loadable"] = bool(is_deepgemm_loadable())
    except ImportError:
        pass
    return env


def per_call(args, device: str, with_transformers: bool) -> dict:
    m, n, k = map(int, args.shape.split(","))
    sizes = NULL_EXPERTS if args.null else QWEN3_30B_A3B_EXPERTS
    calls = linear_calls(m, n, k, device, with_transformers)
    calls.update(experts_calls(args.tokens, sizes, device, with_transformers))
    with getattr(torch, args.mode)():  # around the calls only: a model's weights are made outside it
        times = time_rows(calls, args)
    ratios = ratio_lines(times)
    for row, r in ratios.items():
        print(f"  {row:38s} {r['ratio']:6.2f}x {r['of']} (at most {r['at_most']}x)")
    return {"shape": [m, n, k], "tokens": args.tokens, "experts": sizes, "us_per_call": times, "ratios": ratios}


def time_rows(calls: dict, args) -> dict:
    times = {}
    for name, fn in calls.items():
        if args.rows and not any(part in name for part in args.rows.split(",")):
            continue
        if args.skip and any(part in name for part in args.skip.split(",")):
            continue
        times[name] = per_call_us(fn, args.calls)
        print(f"  {name:38s} {times[name]:8.1f} us/call", flush=True)
    for name in args.profile or ():
        print(f"cProfile of {name}:")
        profile = cProfile.Profile()
        profile.runcall(lambda fn=calls[name]: [fn() for _ in range(args.calls)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    return times


def by_compiler(calls: dict, count: int) -> None:
    """The linear calls compiled (fullgraph) by each layer of torch.compile: which one adds the time."""
    print("  compiled by (us/call):                 eager backend   aot_eager   inductor")
    for name in ("F.linear (bf16)", "fp8gemm.linear"):
        times = []
        for compiler in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            compiled = torch.compile(calls[name], backend=compiler, fullgraph=True)
            compiled()
            times.append(per_call_us(compiled, count))
        print(f"  {name:38s}" + "".join(f"{t:12.1f}" for t in times))
    torch._dynamo.reset()


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--null", action="store_true", help="the null backend on CPU tensors")
    p.add_argument("--shape", help="M,N,K of the linear calls (default 8,4096,4096; --null: 1,256,256)")
    p.add_argument("--tokens", type=int, default=1, help="tokens of the experts calls (default %(default)s)")
    p.add_argument("--mode", choices=("no_grad", "inference_mode"), default="inference_mode")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed loop (default %(default)s)")
    p.add_argument("--rows", help="time only the rows whose names contain one of these comma-separated words")
    p.add_argument("--skip", help="leave out the rows whose names contain one of these comma-separated words")
    p.add_argument("--profile", action="append", metavar="ROW", help="a cProfile of this row (repeatable)")
    p.add_argument("--compilers", action="store_true",
                   help="also the linear calls compiled by dynamo's eager backend, aot_eager and inductor")  # fmt: skip
    p.add_argument("--models", action="store_true", help="whole models, eager, instead of the per-call rows")
    p.add_argument("--tiny", action="store_true", help="--models on tiny configs (runs on the CPU)")
    p.add_argument("--which", default="qwen3,qwen3-moe", help="--models: which models (default %(default)s)")
    p.add_argument("--layers", type=int, help="--models: decoder layers (default 4; --tiny 2)")
    p.add_argument("--batches", help=f"--models: BxS,... (default {BATCHES}; --tiny {TINY_BATCHES})")
    p.add_argument("--forwards", type=int, default=10, help="--models: forwards per timed loop (default %(default)s)")
    p.add_argument(
        "--rounds", type=int, default=3, help="--models: turns of every variant per batch (default %(default)s)"
    )
    p.add_argument("--json", type=Path, help="write the numbers, with the device, versions and date, to this file")
    args = p.parse_args(argv)
    args.shape = args.shape or ("1,256,256" if args.null else "8,4096,4096")
    args.layers = args.layers or (2 if args.tiny else 4)
    if args.json is not None and args.json.parent.exists() and not args.json.parent.is_dir():
        p.error(f"--json {args.json}: {args.json.parent} is a file, not a folder")
    if args.which and set(args.which.split(",")) - set(MODELS):
        p.error(f"--which {args.which}: the models are {', '.join(MODELS)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    gpu = torch.cuda.is_available() and not args.null
    if args.null:
        use_null_backend()
    if not gpu and not args.null and not args.models:
        print("host_overhead.py: no GPU here; --null times fp8gemm's host path on the CPU", file=sys.stderr)
        return 2
    device = "cuda" if gpu else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # small CPU products: no OpenMP team, whose waits swing with the host's load
    status = transformers_status()
    report = {**environment(device), "mode": args.mode, "backend": "null" if args.null else "installed"}
    where = "null backend, CPU tensors" if args.null else report["device"]
    print(f"{where}, {args.mode}, torch {torch.__version__}"
          + (f"; transformers' rows skipped: {status}" if status else ""))  # fmt: skip
    if report.get("deepgemm_loadable") and report["TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR"] != "1":
        print("note: transformers' FP8Linear tries DeepGEMM before fp8gemm.hf on every call here (a failed load is "
              "retried each time); TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR=1 times fp8gemm's route alone")  # fmt: skip
    gc.disable()
    if args.models:
        if not gpu and not args.tiny:
            report["models"] = "skipped: whole models are timed on a GPU (--tiny runs tiny configs on the CPU)"
            print(report["models"])
        elif status:
            report["models"] = f"skipped: transformers' FP8 route is unavailable ({status})"
            print(report["models"])
        else:
            print(f"whole models, eager, {args.layers} layers, us per forward (use_cache=False, logits_to_keep=1)")
            report["models"] = compare_models(args, device)
    else:
        report.update(per_call(args, device, status is None))
        if args.compilers:
            with getattr(torch, args.mode)():
                by_compiler(linear_calls(*map(int, args.shape.split(",")), device, False), args.calls)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
