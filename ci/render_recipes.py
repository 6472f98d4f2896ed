"""Render every recipe for every variant with py-rattler-build and check what a solver relies on.

Checks: the recipe parses and renders (unknown keys and bad Jinja fail), fp8gemm-core is
noarch: python with its console script, every arch package pins fp8gemm-core to its own version and
carries its virtual-package gate (__cuda + __cuda_arch, or __amdgpu_arch), CUDA variants pin
cuda-version to their compiler version, and arch packages are skipped off linux-64.
Exit 1 on any problem.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# The GPU each arch package may be installed on, as its virtual package says it.
GATES = {
    "fp8gemm-cuda-sm120": ("__cuda_arch", "12.0"),
    "fp8gemm-cuda-sm90a": ("__cuda_arch", "9.0"),
    "fp8gemm-rocm-gfx942": ("__amdgpu_arch", "9.4.2"),
}


@dataclasses.dataclass
class Rendered:
    recipe: str
    variant: dict
    package: dict
    build: dict
    requirements: dict


def render(recipe_dir: Path, platform: str = "linux-64") -> list[Rendered]:
    stage0 = Stage0Recipe.from_file(str(recipe_dir / "recipe.yaml"))
    variants_file = recipe_dir / "variants.yaml"
    variants = VariantConfig.from_file(str(variants_file)) if variants_file.exists() else VariantConfig()
    out = []
    for rv in stage0.render(variants, RenderConfig(platform=PlatformConfig(target_platform=platform))):
        d = rv.recipe.to_dict()
        if d.get("build", {}).get("skip") is True:
            continue
        out.append(
            Rendered(recipe_dir.name, dict(rv.variant), d["package"], d.get("build", {}), d.get("requirements", {}))
        )
    return out


def skipped_on(recipe_dir: Path, platform: str) -> bool:
    """Whether ``build.skip`` drops every variant on ``platform`` (the Python render API keeps them,
    so this asks rattler-build's own render-only build, which applies skip)."""
    code = (
        "import rattler_build as rb; "
        f"rb.build_recipes([{str(recipe_dir / 'recipe.yaml')!r}], render_only=True, target_platform={platform!r})"
    )
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    if run.returncode:
        raise RuntimeError(f"render-only build of {recipe_dir.name} for {platform} failed: {run.stderr[-2000:]}")
    return run.stdout.strip().endswith("[]") and '"subpackages"' not in run.stdout


def recipe_dirs() -> list[Path]:
    return sorted(p.parent for p in RECIPES.glob("*/recipe.yaml"))


def _core_version() -> str:
    (core,) = render(RECIPES / "fp8gemm-core")
    return core.package["version"]


def check(r: Rendered, core_version: str) -> list[str]:
    errors = []
    run = r.requirements.get("run", [])
    where = f"{r.recipe} {r.variant}"
    if r.recipe == "fp8gemm-core":
        if r.build.get("noarch") != "python":
            errors.append(f"{where}: fp8gemm-core must be noarch: python")
        if "fp8gemm = fp8gemm.cli:main" not in r.build.get("python", {}).get("entry_points", []):
            errors.append(f"{where}: the fp8gemm console script is not declared")
        return errors
    if f"fp8gemm-core =={core_version}" not in run:
        errors.append(f"{where}: run requirements lack the pin fp8gemm-core =={core_version}: {run}")
    gate, value = GATES.get(r.recipe, (None, None))
    if gate is None:
        errors.append(f"{where}: no known virtual-package gate for this recipe (add it to GATES)")
    elif f"{gate} =={value}" not in run:
        errors.append(f"{where}: run requirements lack the gate {gate} =={value}: {run}")
    if gate == "__cuda_arch":
        cuda = r.variant.get("cuda_compiler_version")
        if f"__cuda >={cuda}" not in run:
            errors.append(f"{where}: run requirements lack __cuda >={cuda}")
        if f"cuda-version {cuda}.*" not in r.requirements.get("host", []):
            errors.append(f"{where}: host requirements lack cuda-version {cuda}.*")
        if cuda is None or tuple(map(int, cuda.split("."))) < (12, 8):
            errors.append(f"{where}: CUDA {cuda} cannot target these GPUs (needs >= 12.8)")
    return errors


def main() -> int:
    core_version = _core_version()
    errors, rows = [], []
    for recipe_dir in recipe_dirs():
        try:
            rendered = render(recipe_dir)
        except Exception as exc:  # a parse or render error is a check failure, reported with the recipe
            errors.append(f"{recipe_dir.name}: render failed: {exc}")
            continue
        if not rendered:
            errors.append(f"{recipe_dir.name}: no variant renders for linux-64")
        if recipe_dir.name != "fp8gemm-core" and not skipped_on(recipe_dir, "osx-arm64"):
            errors.append(f"{recipe_dir.name}: renders for osx-arm64; arch packages must skip non-linux-64")
        for r in rendered:
            errors += check(r, core_version)
            keys = {k: v for k, v in r.variant.items() if k in ("python", "python_min", "cuda_compiler_version")}
            rows.append(f"{r.recipe:22} {r.package['version']:8} {r.build.get('string', ''):20} {keys}")
    print("\n".join(rows))
    for e in errors:
        print(f"ERROR: {e}")
    print(f"rendered {len(rows)} variant(s) of {len(recipe_dirs())} recipe(s): {'FAILED' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
