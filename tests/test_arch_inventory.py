"""Every arch package under packages/ is wired into every place an arch must be named (docs/adding-an-arch.md):
its entry point, its build through the core's CMake function, its arch manifest (packages/<package>/arch.toml), its
recipe stating the manifest's gate, and a build test; and the manifest's consumers name no arch themselves."""

from __future__ import annotations

import ast
import re
import sys

import pytest
from isa import ROOT

sys.path.insert(0, str(ROOT / "ci"))
import arches  # noqa: E402

PACKAGES = sorted(p.name for p in (ROOT / "packages").glob("fp8gemm-*-*") if (p / "pyproject.toml").exists())
GUIDE = "see docs/adding-an-arch.md"


def short_name(package: str) -> str:
    """fp8gemm-cuda-sm90a -> sm90a: the backend's name, by the naming convention."""
    return package.split("-", 2)[2]


def read(path: str) -> str:
    file = ROOT / path
    assert file.exists(), f"{path} is missing ({GUIDE})"
    return file.read_text()


def test_arch_packages_are_found():
    assert len(PACKAGES) >= 3, PACKAGES  # sm90a, sm120, gfx942 at least


@pytest.mark.parametrize("package", PACKAGES)
def test_package_declares_its_backend_and_builds_with_the_core(package):
    pyproject = read(f"packages/{package}/pyproject.toml")
    assert re.search(r'entry-points\."fp8gemm\.backends"\]\s*\n\s*' + short_name(package) + r"\s*=", pyproject), (
        f"packages/{package}/pyproject.toml: no `{short_name(package)} = ...` entry point in fp8gemm.backends ({GUIDE})"
    )
    assert "fp8gemm-core" in pyproject, f"packages/{package}/pyproject.toml: fp8gemm-core not in build requirements"
    cmake = read(f"packages/{package}/CMakeLists.txt")
    assert re.search(r"^fp8gemm_(cuda|hip)_arch_module\(", cmake, re.M), (
        f"packages/{package}/CMakeLists.txt does not build its module with the core's fp8gemm_cuda_arch_module() or "
        f"fp8gemm_hip_arch_module() ({GUIDE})"
    )
    backend = read(f"packages/{package}/src/{package.replace('-', '_')}/backend.py")
    assert "backend_from_module" in backend, f"{package}'s backend.py does not use fp8gemm.arch_module ({GUIDE})"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_scale_layout_multiple_is_stated_once_by_the_build(package):
    """csrc/launch.hpp states kAScaleLdMultiple; the module binds it (fp8gemm/arch_module.hpp a_scale_ld_multiple(),
    also the two-step linear entry's layout) and backend.py reads it from there: no second literal."""
    assert re.search(r"^constexpr int kAScaleLdMultiple = \d+;", read(f"packages/{package}/csrc/launch.hpp"), re.M)
    backend = code(f"packages/{package}/src/{package.replace('-', '_')}/backend.py")
    assert "ScaleLayout(MN_MAJOR, _C.a_scale_ld_multiple())" in backend, (
        f"{package}'s backend.py states its own multiple"
    )
    module = read(f"packages/{package}/csrc/module.cpp")
    assert not re.search(r"define_two_step_linear_entry\([^;]*,\s*\d+\s*\)", module) and (
        "define_arch_module(" in module or "define_a_scale_ld_multiple(" in module
    ), f"packages/{package}/csrc/module.cpp does not bind kAScaleLdMultiple ({GUIDE})"


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_a_manifest_and_a_recipe_stating_its_gate(package):
    manifest = arches.by_package().get(package)
    assert manifest, f"packages/{package}/arch.toml is missing ({GUIDE})"
    assert manifest.backend == short_name(package), (
        f"packages/{package}/arch.toml: backend must be {short_name(package)!r}"
    )
    recipe = read(f"recipes/{package}/recipe.yaml")
    assert manifest.gate in recipe and f'"{manifest.gate_version}"' in recipe, (
        f"recipes/{package}/recipe.yaml does not state the gate {manifest.gate} =={manifest.gate_version} ({GUIDE})"
    )
    assert (ROOT / "recipes" / "variants" / f"{manifest.toolchain}.yaml").exists(), (
        f"packages/{package}/arch.toml: no recipes/variants/{manifest.toolchain}.yaml for its toolchain ({GUIDE})"
    )


def code(path: str) -> str:
    """A Python file's code without its docstrings and comments (examples in prose are fine)."""
    tree = ast.parse(read(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_nothing_outside_the_package_folders_names_an_arch_for_the_packaging():
    """The consumers of the manifest name no arch package themselves: adding one touches only its folders."""
    pixi = arches.tomllib.loads(read("pixi.toml"))  # its GPU platforms are dev environments; its tasks build
    texts = {"pixi.toml tasks": str([pixi.get("tasks"), [f.get("tasks") for f in pixi["feature"].values()]])}
    texts |= {path: code(path) for path in ("ci/render_recipes.py", "ci/conda_offline.py", "ci/compare_sass.py")}
    texts["ci/gpu/run.sh"] = "\n".join(line.split("#")[0] for line in read("ci/gpu/run.sh").splitlines())
    for path, text in texts.items():
        named = [p for p in PACKAGES if p in text or re.search(rf"\b{short_name(p)}\b", text)]
        assert not named, f"{path} names {named}: read packages/*/arch.toml instead ({GUIDE})"
    assert arches.table_errors() == [], "run python3 ci/arches.py tables"


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_a_build_test(package):
    """CUDA packages are built and ISA-checked by tests/test_build_cuda.py from their manifest; others name theirs."""
    if arches.by_package()[package].platform == "cuda":
        manifest = arches.by_package()[package]
        assert manifest.isa and manifest.isa.get("opcodes") and manifest.isa.get("kernels"), (
            f"packages/{package}/arch.toml: [isa] lacks the SASS opcodes or the kernel count ({GUIDE})"
        )
        return
    tests = [p for p in (ROOT / "tests").glob("test_build_*.py") if package in p.read_text()]
    assert tests, f"no tests/test_build_*.py builds {package} (compile it without a GPU, check its ISA; {GUIDE})"
