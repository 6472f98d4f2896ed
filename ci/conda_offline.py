"""The conda path of all four packages without conda channels: build, index, solve, install, test.

No conda channel is reachable here, so the real recipes cannot resolve their compilers. What runs offline:
1. Each package's wheel is built once from this checkout (pip, this machine's nvcc or clang++-19), and
   rattler-build packages it channel-free: a *test build* with the real recipe's name, license file,
   channel-free run requirements (the fp8gemm-core pin) and run constraints (the GPU gate), and the real
   recipe's script tests, run with this machine's python (the prefix's site-packages on its path).
2. rattler indexes the four into one local channel. Each arch package is solved as a machine with its GPU
   (CONDA_OVERRIDE_CUDA_ARCH, the detection pixi and rattler use; __amdgpu_arch as rattler defines it from
   conda/rattler#2806 -- version major.minor.stepping, build string 0 -- given as a generic virtual package,
   since this py-rattler predates that detection), with another GPU (refused) and with no GPU virtual package
   at all (stock conda and mamba: installed), then installed into a fresh prefix where its recipe tests run.
   The GPUs, gates and wheel builds come from packages/*/arch.toml.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arches  # noqa: E402
from render_recipes import GATES, RECIPES, ROOT, render  # noqa: E402

SITE = Path(sysconfig.get_paths()["purelib"]).relative_to(sysconfig.get_paths()["data"])  # lib/python3.X/site-packages
ARCHES = arches.by_package()
# Another GPU's value of each package's gate: the solve must refuse the package there.
OTHER_GPU = {package: a.refused_on for package, a in ARCHES.items()}
WHEEL_ENV = {"fp8gemm-core": {}, **{package: a.build_env for package, a in ARCHES.items()}}
PACKAGES = list(WHEEL_ENV)


def build_wheel(package: str, out_dir: Path) -> Path:
    """The package's wheel from this checkout, built without isolation against the installed fp8gemm-core."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # The core builds in isolation (a current setuptools for its PEP 639 license); arch packages need the core.
    # No recipe host is solved here (no stubs): the recipes' host pytorch >=2.10 is this machine's torch, if any.
    isolation = [] if package == "fp8gemm-core" else ["--no-build-isolation"]
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out_dir),
           str(ROOT / "packages" / package)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **WHEEL_ENV[package]}, timeout=1800)
    if run.returncode:
        raise RuntimeError(f"wheel of {package} failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    (wheel,) = out_dir.glob("*.whl")
    return wheel


def recipe_tests(package: str) -> list[str]:
    """The real recipe's script test commands, as rendered (the first variant: they do not vary)."""
    return [line for t in render(RECIPES / package)[0].tests if "script" in t for line in t["script"]]


def _test_recipe(package: str, wheel: Path) -> dict:
    real = render(RECIPES / package)[0]
    run = [r for r in real.requirements.get("run", []) if r.startswith("fp8gemm-core")]
    # The machine's python stands in for the prefix's: the prefix's site-packages go on its path.
    prologue = f'export PYTHONPATH="$PREFIX/{SITE}"; python() {{ "{sys.executable}" "$@"; }}'
    return {
        "schema_version": 1,
        "package": real.package,
        "source": {"path": str(ROOT / "packages" / package)},
        "build": {
            "number": 0,
            "script": f"{sys.executable} -m pip install {wheel} --no-deps --no-compile --prefix $PREFIX -q",
            # libstdc++, libc and libamdhip64 come from this machine, not from a conda package, in a test build.
            "dynamic_linking": {"missing_dso_allowlist": ["*"]},
        },
        "requirements": {"run": run, "run_constraints": real.requirements.get("run_constraints", [])},
        "tests": [{"script": [prologue, *recipe_tests(package)]}],
        "about": {**real.about, "summary": f"channel-free test build of {package} (CI only, never published)"},
    }


def build_channel(workdir: Path, wheels: dict[str, Path] | None = None) -> Path:
    """Test builds of the four packages in ``workdir/channel``, indexed; ``wheels`` reuses built wheels."""
    from rattler.index import index_fs
    from rattler_build import EnvironmentIsolation, Stage0Recipe, VariantConfig

    channel = workdir / "channel"
    for package in PACKAGES:
        wheel = (wheels or {}).get(package) or build_wheel(package, workdir / "wheels" / package)
        recipe_dir = workdir / "recipes" / package
        recipe_dir.mkdir(parents=True, exist_ok=True)
        (recipe_dir / "recipe.yaml").write_text(yaml.safe_dump(_test_recipe(package, wheel), sort_keys=False))
        (variant,) = Stage0Recipe.from_file(str(recipe_dir / "recipe.yaml")).render(VariantConfig())
        variant.run_build(output_dir=channel, channels=[channel.as_uri()], env_isolation=EnvironmentIsolation.NONE,
                          no_include_recipe=True)  # fmt: skip
    asyncio.run(index_fs(channel))
    return channel


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A machine's GPU as virtual packages: ``gate`` (__cuda_arch / __amdgpu_arch) at ``version``; None: no GPU
    virtual package, as with stock conda and mamba or a machine without a GPU."""

    gate: str | None = None
    version: str | None = None


def virtual_packages(gpu: Gpu) -> list:
    from rattler import GenericVirtualPackage, PackageName, Version, VirtualPackage, VirtualPackageOverrides
    from rattler.package.build_string import BuildString

    # The CUDA GPU through rattler's own detection and its override variables; the AMD one as rattler#2806
    # detects it (version major.minor.stepping, build 0), given as a generic package: this py-rattler predates it.
    env = {"CONDA_OVERRIDE_CUDA": "12.8", "CONDA_OVERRIDE_CUDA_ARCH": gpu.version} if gpu.gate == "__cuda_arch" else {}
    saved = {k: os.environ.pop(k, None) for k in ("CONDA_OVERRIDE_CUDA", "CONDA_OVERRIDE_CUDA_ARCH")}
    os.environ.update(env)
    try:
        detected = [v.into_generic() for v in VirtualPackage.detect(VirtualPackageOverrides.from_env())]
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    detected = [v for v in detected if v.name.normalized not in ("__cuda", "__cuda_arch")] + [
        v for v in detected if env and v.name.normalized in ("__cuda", "__cuda_arch")
    ]
    if gpu.gate == "__amdgpu_arch":
        detected.append(GenericVirtualPackage(PackageName(gpu.gate), Version(gpu.version), BuildString("0")))
    return detected


def solve(channel: Path, spec: str, gpu: Gpu):
    """Solve ``spec`` against the local channel as a machine with this GPU would."""
    from rattler import Channel
    from rattler import solve as rattler_solve

    return asyncio.run(rattler_solve([Channel(channel.as_uri())], [spec], platforms=["linux-64", "noarch"],
                                     virtual_packages=virtual_packages(gpu)))  # fmt: skip


def install(records, prefix: Path) -> None:
    from rattler import install as rattler_install

    asyncio.run(rattler_install(records, prefix, show_progress=False))


def prefix_env(prefix: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(prefix / SITE), "PATH": f"{prefix / 'bin'}:{os.environ['PATH']}"}


def run_recipe_tests(package: str, prefix: Path) -> list[subprocess.CompletedProcess]:
    """The real recipe's script tests in ``prefix``, with this machine's python; each result (stdout, rc)."""
    env = {**prefix_env(prefix), "PREFIX": str(prefix)}
    script = f'python() {{ "{sys.executable}" "$@"; }}\n'
    return [subprocess.run(["bash", "-c", script + line], capture_output=True, text=True, env=env, timeout=600)
            for line in recipe_tests(package)]  # fmt: skip


def run_packaged_tests(package_file: Path, channel: Path) -> list:
    """rattler-build's own test run of a built package: a test environment solved from the local channel
    with this machine's virtual packages (no GPU here), as on a GPU-less build machine."""
    from rattler_build import Package

    pkg = Package.from_file(str(package_file))
    return [pkg.run_test(i, channel=[channel.as_uri()]) for i in range(pkg.test_count)]


def info_on(prefix: Path, platform: str, name: str, targets: tuple[str, ...], arch: str) -> dict:
    """``fp8gemm info --json`` in ``prefix`` as on a GPU of this description (a CPU stands in for it)."""
    code = (
        "import json, torch; from fp8gemm import registry; from fp8gemm.cli import info_dict\n"
        f"registry.describe_device = lambda d: registry.DeviceInfo({platform!r}, {name!r}, {targets!r}, {arch!r})\n"
        "print(json.dumps(info_dict(torch.device('cuda', 0), None)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=prefix_env(prefix),
                         timeout=300)  # fmt: skip
    if run.returncode:
        raise RuntimeError(run.stderr)
    return json.loads(run.stdout)


def built_packages(channel: Path) -> dict[str, Path]:
    return {p.name.rsplit("-", 2)[0]: p for p in channel.glob("*/*.conda")}


def main() -> int:
    import tempfile

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        channel = build_channel(work)
        print("built:", sorted(p.name for p in built_packages(channel).values()))
        for package in PACKAGES[1:]:
            gate, version = GATES[package]
            for label, gpu, expect in (("its GPU", Gpu(gate, version), True), ("no GPU package", Gpu(), True),
                                       ("another GPU", Gpu(gate, OTHER_GPU[package]), False)):  # fmt: skip
                try:
                    records = solve(channel, package, gpu)
                    ok, what = expect, f"installs {sorted(r.name.normalized for r in records)}"
                except Exception as exc:  # the solver's refusal
                    ok, what = not expect, "refused: " + str(exc).splitlines()[0]
                failures += not ok
                print(f"{package} with {label} ({gate} {gpu.version}): {what}{'' if ok else '  <-- WRONG'}")
            prefix = work / "prefix" / package
            install(solve(channel, package, Gpu(gate, version)), prefix)
            for run in run_recipe_tests(package, prefix):
                failures += run.returncode != 0
                print(f"  recipe test rc={run.returncode}: {run.args[-1].splitlines()[-1][:100]}")
    print("FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
