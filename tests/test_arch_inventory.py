"""Every arch package under packages/ is wired into every place an arch must be named (docs/adding-an-arch.md):
its entry point, its build through the core's CMake function, its recipe, the recipe gate, the pixi build task, the
recipe tests and a build test. Read-only text checks, tolerant of each file's format: they look for the package's
name (or its short name) where a human would add it."""

from __future__ import annotations

import re

import pytest
from isa import ROOT

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
    assert "fp8gemm_arch_module(" in cmake, (
        f"packages/{package}/CMakeLists.txt does not build its module with fp8gemm_arch_module() ({GUIDE})"
    )
    backend = read(f"packages/{package}/src/{package.replace('-', '_')}/backend.py")
    assert "backend_from_module" in backend, f"{package}'s backend.py does not use fp8gemm.arch_module ({GUIDE})"


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize(
    ("place", "why"),
    [
        ("recipes/{package}/recipe.yaml", "its conda recipe"),
        ("ci/render_recipes.py", "its virtual-package gate (GATES)"),
        ("pixi.toml", "a build task in the environment of its toolchain"),
        ("tests/test_recipes.py", "the recipe tests (ARCH_RECIPES)"),
    ],
)
def test_package_is_named_in_the_packaging(package, place, why):
    path = place.format(package=package)
    assert package in read(path), f"{path} does not name {package}: add {why} ({GUIDE})"


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_a_build_test(package):
    tests = [p for p in (ROOT / "tests").glob("test_build_*.py") if package in p.read_text()]
    assert tests, f"no tests/test_build_*.py builds {package} (compile it without a GPU, check its ISA; {GUIDE})"
