"""Time fp8gemm-cuda-sm90a tile choices on the benchmark shapes (median, L2 flushed).

python3 ci/gpu/tune.py time [M,N,K ...]        time the current plan (env knobs apply) on shapes; TUNE_GPU_STATE=
                                               sustained|rested settles the GPU first (fp8gemm.bench.GPU_STATES)
python3 ci/gpu/tune.py kernels [M,N,K ...]     per-kernel GPU time (torch.profiler, L2 flushed) of one call
python3 ci/gpu/tune.py host                      host cost per call of each layer of the call path
python3 ci/gpu/tune.py tiles OUT.json [SPEC..] time tiles (FP8GEMM_SM90A_TILE; default: all compiled) on the
                                               deepseek-v3 set; TUNE_CHECK=1 runs conformance first
"""

import functools
import json
import os
import subprocess
import sys


def default_specs():
    """Every tile the installed build compiles (its build_info "tiles": tile_config.hpp kTiles).

    A spec is "rows,cols[,cluster]" as FP8GEMM_SM90A_TILE takes it, optionally with more knobs after
    "+": "128,192+SPLITS=2" also sets FP8GEMM_SM90A_SPLITS=2.
    """
    from fp8gemm import registry

    found = [ib.backend for ib in registry.installed_backends() if ib.backend and ib.backend.name == "sm90a"]
    if not found:
        raise SystemExit("fp8gemm-cuda-sm90a is not installed")
    return found[0].build_info["tiles"].split()


def shapes_from(args):
    if args:
        return [tuple(map(int, s.split(","))) for s in args]
    from fp8gemm.bench import SHAPE_SETS

    return SHAPE_SETS["deepseek-v3"]


def gemm_call(m, n, k):
    """fp8gemm.gemm on fresh random FP8 inputs of one shape (called once), and those inputs."""
    import fp8gemm
    import torch

    a, sa = fp8gemm.quantize_activation(torch.randn(m, k, device="cuda"))
    b, sb = fp8gemm.quantize_weight(torch.randn(n, k, device="cuda"))
    sb = fp8gemm.prepare_weight_scale(sb)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    call = functools.partial(fp8gemm.gemm, a, b, sa, sb, out=out)
    call()
    return call, (a, b, sa, sb, out)


def time_shapes(shapes):
    import torch
    from fp8gemm.bench import time_gpu
    from fp8gemm.reference import reference_gemm

    state = os.environ.get("TUNE_GPU_STATE", "as-is")  # as-is: A/B variants alternate per round, so the state cancels

    for m, n, k in shapes:
        call, (a, b, sa, sb, out) = gemm_call(m, n, k)
        err = float("nan")
        if m * n * k <= 2**37:  # the fp32 dequantised product; the float64 oracle runs in `fp8gemm check`
            ref = reference_gemm(a, b, sa, sb, torch.empty(m, n, device="cuda"))
            err = float((out.float() - ref).norm() / ref.norm())
        us = time_gpu(call, state) * 1e6
        row = {"m": m, "n": n, "k": k, "us": us, "tflops": 2 * m * n * k / us / 1e6, "rel_err": err}
        print(json.dumps(row), flush=True)


def kernel_times(shapes, calls=50):
    """Where a call's time goes: each kernel's own duration vs. the do_bench (event-to-event) time."""
    import torch
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for m, n, k in shapes:
        call, _ = gemm_call(m, n, k)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                flush.zero_()
                call()
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type.name == "CUDA" and "elementwise" not in e.name and "fill" not in e.name.lower():
                kernels.setdefault(e.name[:60], []).append(
                    e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
                )
        ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        row = {"m": m, "n": n, "k": k, "do_bench_us": ms * 1e3,
               "kernels_us": {name: sorted(v)[len(v) // 2] for name, v in kernels.items()}}  # fmt: skip
        print(json.dumps(row), flush=True)


def host_layers(calls=20000):
    """Wall time per call (us) of each layer of fp8gemm.gemm on a tiny shape, to see where the host cost is."""
    import time

    import fp8gemm
    import torch
    from fp8gemm import ops, registry

    a, sa = fp8gemm.quantize_activation(torch.randn(16, 256, device="cuda"))
    b, sb = fp8gemm.quantize_weight(torch.randn(128, 256, device="cuda"))
    sb = fp8gemm.prepare_weight_scale(sb)
    out = torch.empty(16, 128, dtype=torch.bfloat16, device="cuda")
    backend = registry.select(a.device).backend
    ptrs = (a.data_ptr(), b.data_ptr(), sa.data_ptr(), sb.data_ptr(), out.data_ptr(), 0)
    launch_args = (*ptrs, 16, 128, 256, 256, 256, 128, 16, 2, 0, torch._C._cuda_getCurrentRawStream(0))
    layers = {
        "gemm(out=)": lambda: fp8gemm.gemm(a, b, sa, sb, out=out),
        "gemm()": lambda: fp8gemm.gemm(a, b, sa, sb),
        "_try_fast": lambda: ops._try_fast(None, a, b, sa, sb, out, None),
        "backend.launch": lambda: backend.launch(*launch_args),
        "backend.workspace_bytes": lambda: backend.workspace_bytes(16, 128, 256),
        "torch.empty(16x128)": lambda: torch.empty((16, 128), dtype=torch.bfloat16, device=a.device),
        "os.environ.get": lambda: os.environ.get(registry.ENV_VAR),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
    }
    for name, fn in layers.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        print(f"{name:28s} {(time.perf_counter() - start) / calls * 1e6:7.2f} us/call", flush=True)
    from fp8gemm.bench import host_overhead

    print(json.dumps(host_overhead(torch.device("cuda"), None)))


def tile_rows(tile):
    """The rows of a "rows,cols[,cluster]" tile, with a clear error for the old "slices,cols" form."""
    parts = tile.split(",")
    if not 2 <= len(parts) <= 3 or not all(p.strip().isdigit() for p in parts) or int(parts[0]) % 64:
        raise SystemExit(f"tile {tile!r}: expected rows,cols[,cluster] with rows a multiple of 64, e.g. 128,192")
    return int(parts[0])


def spec_env(spec):
    tile, *knobs = spec.split("+")
    env = dict(os.environ, FP8GEMM_SM90A_TILE=tile)
    env.update(("FP8GEMM_SM90A_" + k.split("=")[0], k.split("=")[1]) for k in knobs)
    return tile, env


def time_tiles(out_path, specs, check):
    shapes = shapes_from([])
    rows = {spec: tile_rows(spec.split("+")[0]) for spec in specs}  # every spec checked before any timing
    results = {}
    for spec in specs:
        tile, env = spec_env(spec)
        if check:
            cmd = ["fp8gemm", "check", "--backend", "sm90a", "--random", "4", "--seed", "7"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            print(f"{spec}: conformance {proc.stdout.strip().splitlines()[-1] if proc.stdout else proc.stderr[-400:]}")
            if proc.returncode:
                print(proc.stdout[-3000:])
        small = rows[spec] == 64  # 64-row tiles: decode shapes; taller tiles: the rest
        picked = [f"{m},{n},{k}" for m, n, k in shapes if (m <= 128 if small else m >= 128)]
        proc = subprocess.run([sys.executable, __file__, "time", *picked], env=env, capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr[-2000:])
        results[spec] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FP8GEMM_SM90A")}
    proc = subprocess.run([sys.executable, __file__, "time"], env=env, capture_output=True, text=True)
    results["default"] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results, shapes)


def print_table(results, shapes):
    tiles = list(results)
    print("shape".ljust(18) + "".join(t[:13].rjust(14) for t in tiles) + "   best")
    for m, n, k in shapes:
        cells, best = [], (0.0, "")
        for t in tiles:
            row = next((r for r in results[t] if (r["m"], r["n"], r["k"]) == (m, n, k)), None)
            tf = row["tflops"] if row else 0.0
            cells.append(f"{tf:14.0f}" if row else " " * 14)
            if row and t != "default" and tf > best[0]:
                best = (tf, t)
        print(f"{m}x{n}x{k}".ljust(18) + "".join(cells) + f"   {best[1]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["tiles"]:
        time_tiles(sys.argv[2], sys.argv[3:] or default_specs(), check=os.environ.get("TUNE_CHECK") == "1")
    elif sys.argv[1:2] == ["host"]:
        host_layers()
    elif sys.argv[1:2] == ["kernels"]:
        kernel_times(shapes_from(sys.argv[2:]))
    else:
        time_shapes(shapes_from(sys.argv[2:] if sys.argv[1:2] == ["time"] else sys.argv[1:]))
