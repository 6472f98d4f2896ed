"""Render every recipe for every variant with py-rattler-build and check what a solver and a feedstock rely on.

Checks: the recipe parses and renders (unknown keys and bad Jinja fail); fp8gemm-core is noarch: python with
its console script and takes torch as a peer (a run constraint at the pip core's torch floor, never a
dependency); every arch package pins fp8gemm-core to its own version and carries the GPU gate of its
packages/<package>/arch.toml as a run constraint on the virtual package (__cuda_arch or __amdgpu_arch: stock
conda, which defines neither, still installs it), no __cuda pin (nvcc's run export sets the driver floor), a
build string naming its CUDA or ROCm version; CUDA variants pin cuda-version to their compiler version and
depend on conda-forge's pytorch at the same floor; ROCm ones do not pull conda-forge's torch (no ROCm build);
arch packages are skipped off linux-64; every recipe has the Apache-2.0 license file, maintainers, and
an sdist URL + sha256 source when a feedstock sets the checksum. Exit 1 on any problem.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arches  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# The GPU each arch package may be installed on, as its virtual package says it (a run constraint): its arch.toml.
GATES = {a.package: (a.gate, a.gate_version) for a in arches.arches()}


def torch_floor() -> str:
    """The torch version the pip core requires (its pyproject.toml): every recipe states the same floor."""
    deps = tomllib.loads((ROOT / "packages" / "fp8gemm-core" / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in deps if re.match(r"torch\b", d)]
    return re.fullmatch(r"torch\s*>=\s*([\d.]+)", torch).group(1)


@dataclasses.dataclass
class Rendered:
    recipe: str
    variant: dict
    package: dict
    build: dict
    requirements: dict
    about: dict = dataclasses.field(default_factory=dict)
    extra: dict = dataclasses.field(default_factory=dict)
    source: list = dataclasses.field(default_factory=list)
    tests: list = dataclasses.field(default_factory=list)


def render(recipe_dir: Path, platform: str = "linux-64", variants: list[Path] = ()) -> list[Rendered]:
    """Every variant of the recipe; ``variants`` are extra variant files that override the recipe's own."""
    stage0 = Stage0Recipe.from_file(str(recipe_dir / "recipe.yaml"))
    variants_file = recipe_dir / "variants.yaml"
    config = VariantConfig.from_file(str(variants_file)) if variants_file.exists() else VariantConfig()
    for extra in variants:
        config = config.merge(VariantConfig.from_file(str(extra)))
    out = []
    for rv in stage0.render(config, RenderConfig(platform=PlatformConfig(target_platform=platform))):
        d = rv.recipe.to_dict()
        if d.get("build", {}).get("skip") is True:
            continue
        parts = {k: d.get(k, {}) for k in ("build", "requirements", "about", "extra")}
        out.append(
            Rendered(
                recipe_dir.name,
                dict(rv.variant),
                d["package"],
                **parts,
                source=d.get("source", []),
                tests=d.get("tests", []),
            )
        )
    return out


def feedstock_source(recipe_dir: Path) -> list:
    """The recipe's source as a feedstock renders it: with the sdist's checksum set."""
    saved = os.environ.get("FP8GEMM_SDIST_SHA256")
    os.environ["FP8GEMM_SDIST_SHA256"] = "0" * 64
    try:
        return render(recipe_dir)[0].source
    finally:
        os.environ.pop("FP8GEMM_SDIST_SHA256") if saved is None else os.environ.__setitem__(
            "FP8GEMM_SDIST_SHA256", saved
        )


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


def _feedstock_errors(r: Rendered) -> list[str]:
    errors = []
    if r.about.get("license") != "Apache-2.0" or "LICENSE" not in r.about.get("license_file", []):
        errors.append(f"{r.recipe}: about needs license Apache-2.0 and license_file LICENSE: {r.about}")
    if not r.extra.get("recipe-maintainers"):
        errors.append(f"{r.recipe}: extra.recipe-maintainers is empty")
    return errors


def _arch_errors(r: Rendered, where: str) -> list[str]:
    errors = []
    run, constraints = r.requirements.get("run", []), r.requirements.get("run_constraints", [])
    gate, value = GATES.get(r.recipe, (None, None))
    if gate is None:
        errors.append(f"{where}: no packages/{r.recipe}/arch.toml states its GPU gate (docs/adding-an-arch.md)")
    elif f"{gate} =={value}" not in constraints:
        errors.append(f"{where}: run constraints lack the gate {gate} =={value}: {constraints}")
    if [s for s in run if s.startswith("__")]:
        errors.append(f"{where}: virtual packages in run requirements (stock conda cannot satisfy them): {run}")
    if [s for s in run + constraints if s.split()[0] == "__cuda"]:
        errors.append(f"{where}: a __cuda pin repeats the CUDA compiler's run export")
    if gate == "__cuda_arch":
        if f"pytorch >={torch_floor()}" not in run:  # conda-forge has CUDA torch: a real run dependency
            errors.append(f"{where}: run requirements lack pytorch >={torch_floor()} (the pip core's torch floor)")
        cuda = r.variant.get("cuda_compiler_version")
        if f"cuda-version {cuda}.*" not in r.requirements.get("host", []):
            errors.append(f"{where}: host requirements lack cuda-version {cuda}.*")
        if cuda is None or tuple(map(int, cuda.split("."))) < (12, 8):
            errors.append(f"{where}: CUDA {cuda} cannot target these GPUs (needs >= 12.8)")
        toolkit = f"cuda{str(cuda).replace('.', '')}"
    else:
        toolkit = f"rocm{str(r.variant.get('rocm_version')).replace('.', '')}"
        if [s for s in run if s.split()[0] in ("pytorch", "pytorch-gpu", "pytorch-cpu")]:
            errors.append(f"{where}: conda-forge's torch has no ROCm build; torch must stay the user's: {run}")
    python = str(r.variant.get("python")).replace(".", "")
    if not re.fullmatch(rf"{toolkit}_py{python}h[0-9a-f]{{7}}_\d+", str(r.build.get("string"))):
        errors.append(f"{where}: build string {r.build.get('string')!r} does not start {toolkit}_py{python}")
    return errors


def check(r: Rendered, core_version: str) -> list[str]:
    errors = _feedstock_errors(r)
    run = r.requirements.get("run", [])
    where = f"{r.recipe} {r.variant}"
    if r.recipe == "fp8gemm-core":
        if r.build.get("noarch") != "python":
            errors.append(f"{where}: fp8gemm-core must be noarch: python")
        if "fp8gemm = fp8gemm.cli:main" not in r.build.get("python", {}).get("entry_points", []):
            errors.append(f"{where}: the fp8gemm console script is not declared")
        if [s for s in run if s.split()[0].startswith("pytorch")]:
            errors.append(f"{where}: torch is a peer (run constraint), not a run requirement: {run}")
        if f"pytorch >={torch_floor()}" not in r.requirements.get("run_constraints", []):
            errors.append(f"{where}: run constraints lack pytorch >={torch_floor()} (the pip core's torch floor)")
        return errors
    if f"fp8gemm-core =={core_version}" not in run:
        errors.append(f"{where}: run requirements lack the pin fp8gemm-core =={core_version}: {run}")
    return errors + _arch_errors(r, where)


def source_errors(recipe_dir: Path) -> list[str]:
    """A checkout builds its own tree; a feedstock the sdist, by URL and checksum."""
    name = recipe_dir.name
    local, feedstock = render(recipe_dir)[0].source, feedstock_source(recipe_dir)
    url = f"https://pypi.org/packages/source/{name[0]}/{name}/{name.replace('-', '_')}-"
    errors = []
    if local != [{"path": f"../../packages/{name}"}]:
        errors.append(f"{name}: the checkout's source is not ../../packages/{name}: {local}")
    if len(feedstock) != 1 or not feedstock[0].get("url", "").startswith(url) or "sha256" not in feedstock[0]:
        errors.append(f"{name}: with FP8GEMM_SDIST_SHA256 set the source is not the sdist {url}...: {feedstock}")
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
        errors += source_errors(recipe_dir)
        if recipe_dir.name != "fp8gemm-core" and not skipped_on(recipe_dir, "osx-arm64"):
            errors.append(f"{recipe_dir.name}: renders for osx-arm64; arch packages must skip non-linux-64")
        for r in rendered:
            errors += check(r, core_version)
            keys = {
                k: v
                for k, v in r.variant.items()
                if k in ("python", "python_min", "cuda_compiler_version", "rocm_version")
            }
            rows.append(f"{r.recipe:22} {r.package['version']:8} {r.build.get('string', ''):20} {keys}")
    print("\n".join(rows))
    for e in errors:
        print(f"ERROR: {e}")
    print(f"rendered {len(rows)} variant(s) of {len(recipe_dirs())} recipe(s): {'FAILED' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
