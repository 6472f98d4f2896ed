"""The conda path without conda channels: build, index, install, solve.

No conda channel is reachable here, so the real recipes cannot resolve their compilers. What can run
offline, and does:
1. rattler-build builds channel-free *test builds* of fp8gemm-core and fp8gemm-cuda-sm120: the same
   package sources, installed by this machine's python3/pip/nvcc instead of conda's, with every
   requirement that needs a channel left out. The run requirements that remain are those of the
   rendered real recipe that need no channel: the fp8gemm-core pin and the virtual-package gate.
2. rattler indexes them into a local channel, solves, and installs into a fresh prefix, where the
   fp8gemm.backends entry point of the sm120 package resolves and its compiled module loads.
3. The solver, with CONDA_OVERRIDE_CUDA / CONDA_OVERRIDE_CUDA_ARCH, picks the sm120 package for
   compute capability 12.0 and refuses it for 9.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_recipes import RECIPES, ROOT, render  # noqa: E402

SITE = Path(sysconfig.get_paths()["purelib"]).relative_to(sysconfig.get_paths()["data"])  # lib/python3.X/site-packages


def _channel_free_run_requirements(recipe: str) -> list[str]:
    rendered = render(RECIPES / recipe)[0]
    return [r for r in rendered.requirements.get("run", []) if r.startswith(("__", "fp8gemm-core"))]


def _test_recipe(name: str, package_dir: str, env: dict[str, str], run: list[str]) -> dict:
    install = f"{sys.executable} -m pip install {ROOT / 'packages' / package_dir} --no-deps --no-build-isolation --prefix $PREFIX -q"
    return {
        "schema_version": 1,
        "package": {"name": name, "version": "0.1.0"},
        "build": {
            "number": 0,
            "script": {"env": env, "content": install},
            # libstdc++ and libc come from this machine, not from a conda package, in a test build.
            "dynamic_linking": {"missing_dso_allowlist": ["*"]},
        },
        "requirements": {"run": run},
        "about": {"summary": f"channel-free test build of {name} (CI only, never published)"},
    }


def build_channel(workdir: Path) -> Path:
    """Build the two test packages into ``workdir/channel`` and index it."""
    import asyncio

    from rattler.index import index_fs
    from rattler_build import EnvironmentIsolation, Stage0Recipe, VariantConfig

    channel = workdir / "channel"
    recipes = {
        "fp8gemm-core": _test_recipe("fp8gemm-core", "fp8gemm-core", {}, []),
        "fp8gemm-cuda-sm120": _test_recipe(
            "fp8gemm-cuda-sm120", "fp8gemm-cuda-sm120", {"FP8GEMM_CUDA_ARCH": "120"},
            _channel_free_run_requirements("fp8gemm-cuda-sm120"),
        ),
    }  # fmt: skip
    for name, recipe in recipes.items():
        recipe_dir = workdir / "recipes" / name
        recipe_dir.mkdir(parents=True, exist_ok=True)
        (recipe_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        (variant,) = Stage0Recipe.from_file(str(recipe_dir / "recipe.yaml")).render(VariantConfig())
        variant.run_build(output_dir=channel, channels=[channel.as_uri()], env_isolation=EnvironmentIsolation.NONE,
                          no_include_recipe=True)  # fmt: skip
    asyncio.run(index_fs(channel))
    return channel


def solve(channel: Path, spec: str, cuda: str, cuda_arch: str):
    """Solve ``spec`` against the local channel as a machine with this driver and GPU would."""
    import asyncio

    from rattler import Channel, VirtualPackage, VirtualPackageOverrides
    from rattler import solve as rattler_solve

    env = {"CONDA_OVERRIDE_CUDA": cuda, "CONDA_OVERRIDE_CUDA_ARCH": cuda_arch}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        virtual = VirtualPackage.detect(VirtualPackageOverrides.from_env())
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return asyncio.run(rattler_solve([Channel(channel.as_uri())], [spec], platforms=["linux-64", "noarch"],
                                     virtual_packages=virtual))  # fmt: skip


def install(records, prefix: Path) -> None:
    import asyncio

    from rattler import install as rattler_install

    asyncio.run(rattler_install(records, prefix, show_progress=False))


def backends_in_prefix(prefix: Path) -> tuple[str, dict]:
    """Where ``fp8gemm`` is imported from with the prefix on the path, and its ``info --json``."""
    env = {**os.environ, "PYTHONPATH": str(prefix / SITE)}
    code = "import sys, fp8gemm; from fp8gemm.cli import main; print(fp8gemm.__file__); sys.exit(main(['info', '--json', '--device', 'cpu']))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if run.returncode:
        raise RuntimeError(run.stderr)
    module_file, info = run.stdout.split("\n", 1)
    return module_file, json.loads(info)


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        channel = build_channel(work)
        print("built:", sorted(p.name for p in channel.glob("*/*.conda")))
        records = solve(channel, "fp8gemm-cuda-sm120", cuda="12.8", cuda_arch="12.0")
        print("solve for cc 12.0:", sorted(f"{r.name.normalized} {r.version}" for r in records))
        try:
            solve(channel, "fp8gemm-cuda-sm120", cuda="12.8", cuda_arch="9.0")
            print("ERROR: the solver installed the sm120 package on a cc 9.0 GPU")
            return 1
        except Exception as exc:
            print("solve for cc 9.0 refused:", str(exc).splitlines()[0])
        install(records, work / "prefix")
        module_file, info = backends_in_prefix(work / "prefix")
        print("fp8gemm imported from", module_file)
        print("fp8gemm info in the prefix:", [(b["name"], b["distribution"], b["error"]) for b in info["installed"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
