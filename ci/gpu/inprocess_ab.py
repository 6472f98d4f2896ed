"""In-process A/B of sm90a builds: every build's module loaded into one process under its own package alias.

python3 ci/gpu/inprocess_ab.py ROUNDS NAME=DIR ... [DeepGEMM=-] -- M,N,K ...

Each DIR holds an installed copy of fp8gemm_cuda_sm90a (`pip install --target DIR packages/fp8gemm-cuda-sm90a`,
or a modified copy of the package). Per shape all variants run on the same tensors (the same addresses), each
timed as `fp8gemm bench --rounds` times (do_bench median, L2 flushed, the order reversed every round);
the medians, their ratios to the first variant and the paired ratios (see below) are printed, and every round goes
to $OUT/inprocess_ab.json. `DeepGEMM=-` adds the installed deep_gemm (fp8gemm_bench.peers) as a column.

Why: timed in separate processes, two identical builds differed by 0.975-1.041 per shape even as medians of ten
rounds; in one process they agree to ~0.5% on shapes of 20 us and more
(2-5% on ~12 us decode shapes). A variant's plan is its build's: to compare plan choices, build each one in.
`bash ci/gpu/run.sh ab` runs this on the benchmark shapes as the regression check of a refactor (docs/benchmarks.md).

Paired ratio: the median over rounds of (first variant's time / this variant's time) in the same round. A round's
times fall in one of two states some 5% apart on the decode shapes (11.2 or 11.9 us at 64x7168x2048 on an H200),
so a median lands on either; the same-round ratio mostly compares like with like. Three copies of one build: medians
0.949-1.054 apart, paired ratios 0.995-1.012 (docs/benchmarks.md).
"""

import importlib
import importlib.util
import json
import os
import statistics
import sys
import time

import fp8gemm
import torch
from fp8gemm import arch_module, launch
from fp8gemm.reference import oracle
from fp8gemm.testing.conformance import relative_error
from fp8gemm.validation import conform_scale
from fp8gemm_bench import bench

DEEPGEMM = "DeepGEMM"


def load_build(alias: str, root: str):
    """The Backend of the fp8gemm_cuda_sm90a copy under `root`, imported as package `alias`, without native ops (the
    library registers them under the package's own name, once a process; the A/B times the launch entries)."""
    arch_module.load_native_ops = lambda *args: (None, "no (an A/B copy)")
    pkg = os.path.join(root, "fp8gemm_cuda_sm90a")
    spec = importlib.util.spec_from_file_location(
        alias, os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return importlib.import_module(alias + ".backend").load()


def shape_calls(backends: dict, with_deepgemm: bool, m: int, n: int, k: int):
    """Per variant a zero-argument call on one set of inputs, and its relative error against the reference."""
    gen = bench.seeded_generator(bench.DEFAULT_SEED, "cuda", m, n, k)
    a, a_scale = fp8gemm.quantize_activation(torch.randn(m, k, device="cuda", generator=gen))
    b, b_scale = fp8gemm.quantize_weight(torch.randn(n, k, device="cuda", generator=gen))
    ref = oracle(a, b, a_scale, b_scale)
    # The scales in the builds' layouts once, outside the timed calls (else each call launches a transpose).
    layouts = next(iter(backends.values()))
    a_scale, _ = conform_scale(a_scale, layouts.a_scale_layout)
    b_scale, _ = conform_scale(b_scale, layouts.b_scale_layout)
    calls, errors = {}, {}
    for name, backend in backends.items():
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        calls[name] = lambda backend=backend, out=out: launch.launch_gemm(backend, a, b, a_scale, b_scale, out)
        calls[name]()
        errors[name] = relative_error(out, ref)
    if with_deepgemm:
        from fp8gemm_bench.peers import available_peers

        calls[DEEPGEMM] = available_peers(torch.device("cuda"))[DEEPGEMM](a, b, a_scale, b_scale, torch.bfloat16)
        errors[DEEPGEMM] = relative_error(calls[DEEPGEMM](), ref)
    torch.cuda.synchronize()
    return calls, errors


def paired_ratio(reference: dict, row: dict) -> float:
    """Median over rounds of reference time / row time in the same round (module docstring: paired ratio)."""
    pairs = zip(reference.get("us_rounds", [reference["us"]]), row.get("us_rounds", [row["us"]]), strict=True)
    return statistics.median(ref / us for ref, us in pairs)


def main(argv: list[str]) -> None:
    rounds, argv = int(argv[0]), argv[1:]
    sep = argv.index("--")
    variants = dict(v.split("=", 1) for v in argv[:sep])
    shapes = [tuple(map(int, s.split(","))) for s in argv[sep + 1 :]]
    backends = {name: load_build(f"ab_{name}", root) for name, root in variants.items() if name != DEEPGEMM}
    names = list(variants)
    results, start = {}, time.time()
    out_path = os.path.join(os.environ.get("OUT", "."), "inprocess_ab.json")
    print(
        f"{'M,N,K':16s}" + "".join(name.rjust(28) for name in names) + "   (us: median, ratio | paired ratio)",
        flush=True,
    )
    for m, n, k in shapes:
        calls, errors = shape_calls(backends, DEEPGEMM in variants, m, n, k)
        bench.time_gpu(calls[names[0]], "sustained")
        rows = {name: {"impl": name, "m": m, "n": n, "k": k} for name in names}
        bench.time_rounds(calls, rows, bench.time_gpu, rounds, None)  # the bench's alternating rounds
        failed = {name: row["error"] for name, row in rows.items() if "error" in row}
        if failed:
            raise SystemExit(f"{m},{n},{k}: {failed}")
        med = {name: row["us"] for name, row in rows.items()}
        results[f"{m},{n},{k}"] = {name: row.get("us_rounds", [row["us"]]) for name, row in rows.items()}
        ratios = {name: (med[names[0]] / med[name], paired_ratio(rows[names[0]], rows[name])) for name in names}
        cells = "".join(f"{med[name]:8.2f} ({ratios[name][0]:.3f} | {ratios[name][1]:.3f})".rjust(28) for name in names)
        print(
            f"{m},{n},{k}".ljust(16) + f"{cells}  err<={max(errors.values()):.1e}  [{time.time() - start:.0f} s]",
            flush=True,
        )
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
