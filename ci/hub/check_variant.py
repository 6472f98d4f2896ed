"""Run the core's conformance suite (the rows of `fp8gemm check`) through a kernel-builder-built variant: its vendored
core, its backends from the op library (ci/hub/torch_binding.cpp through fp8gemm/_bundled/<arch>/_C.py).

python3 ci/hub/check_variant.py build/<variant> [--backend sm90a] [--expect-arches fp8gemm_cuda_sm90a ...] [--quick]
Prints one line per failure and ends with 'N passed, N failed'; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
from pathlib import Path


def load(variant: Path):
    """kernels.get_local_kernel where `kernels` is installed, else the same import by hand (package = metadata id)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import kernels

        return kernels.get_local_kernel(variant)
    except ImportError:
        name = json.loads((variant / "metadata.json").read_text())["id"]
        spec = importlib.util.spec_from_file_location(
            name, variant / "__init__.py", submodule_search_locations=[str(variant)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", type=Path)
    parser.add_argument("--backend", help="the backend to check (default: the registry's choice)")
    parser.add_argument("--expect-arches", nargs="*", default=None, help="the arch modules the op library must hold")
    parser.add_argument("--device", default=None)
    parser.add_argument("--quick", action="store_true", help="the fixed cases only (no random shapes)")
    args = parser.parse_args(argv)
    kernel = load(args.variant.resolve())
    core = kernel.fp8gemm
    from importlib import import_module

    conformance = import_module(f"{core.__name__}.testing.conformance")
    grouped = import_module(f"{core.__name__}.testing.conformance_grouped")
    layer = import_module(f"{core.__name__}.testing.conformance_layer")
    registry = import_module(f"{core.__name__}.registry")
    ops = import_module(f"{core.__name__}.ops")
    import torch

    built = json.loads(kernel._ops.arches())
    print(f"{kernel.__name__}: op library arches {built}, protocol {kernel._ops.protocol_version()}")
    results: list[tuple[str, bool, str]] = []
    if args.expect_arches is not None:
        results.append(("op library arches", sorted(built) == sorted(args.expect_arches), f"{built}"))
    for entry in kernel.installed_backends():
        results.append((f"backend {entry.name} loads", entry.error is None, str(entry.error)))
    targets = {e.name: e.backend.targets for e in kernel.installed_backends() if e.error is None}
    # one library holds every arch of the variant: each must report its own build's targets
    results.append(("each backend its own targets", len(set(targets.values())) == len(targets), f"{targets}"))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    chosen = registry.select(device, args.backend).backend
    print(f"conformance of backend {chosen.name} on {device}")
    fp8 = ops.preferred_fp8_dtype(device, args.backend)
    seed = conformance.DEFAULT_SEED
    for case in conformance.cases(device, n_random=0 if args.quick else 6, seed=seed):
        r = conformance.run_case(case, device, fp8, args.backend, seed=seed)
        results.append((case.id, r.passed, f"{r.rel_err:.2e} {r.detail}"))
    for bad in conformance.BAD_INPUTS:
        ok, detail = conformance.run_bad_input(bad, device, fp8, args.backend)
        results.append((f"bad input {bad.id}", ok, detail))
    seeds = random.Random(seed)
    for case in layer.quant_cases():
        ok, detail = layer.run_quant_case(case, device, args.backend, seed=seeds.getrandbits(63))
        results.append((f"quantize {case.id}", ok, detail))
    for case in layer.LINEAR_CASES:
        ok, detail = layer.run_linear_case(case, device, args.backend, seed=seeds.getrandbits(63))
        results.append((f"linear {case.id}", ok, detail))
    for case in grouped.cases(device, n_random=0 if args.quick else 2, seed=seed):
        r = grouped.run_case(case, device, fp8, args.backend, seed=seed)
        results.append((f"grouped {case.id}", r.passed, f"{r.rel_err:.2e} {r.detail}"))
    for bad in grouped.BAD_INPUTS:
        ok, detail = grouped.run_bad_input(bad, device, fp8, args.backend)
        results.append((f"grouped bad input {bad.id}", ok, detail))
    failed = [(n, d) for n, ok, d in results if not ok]
    for name, detail in failed:
        print(f"FAIL {name}: {detail}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
