"""Conda recipes without conda channels: every variant rendered and checked, and all four packages built,
indexed, solved (with their GPU, another GPU and none), installed and tested offline. The AMD GPU is given to the
solver as rattler defines __amdgpu_arch (conda/rattler#2806: major.minor.stepping, build 0); the tests that
depend on it say so in their names."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from isa import require_tool, search_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))
import arches  # noqa: E402
import conda_offline  # noqa: E402
import render_recipes  # noqa: E402
from conda_offline import Gpu  # noqa: E402

ARCH_RECIPES = sorted(a.package for a in arches.arches())
CUDA_RECIPES = sorted(a.package for a in arches.arches() if a.platform == "cuda")


@pytest.fixture(scope="module")
def rendered():
    return {d.name: render_recipes.render(d) for d in render_recipes.recipe_dirs()}


def test_every_recipe_renders_every_variant_and_passes_the_checks(rendered):
    assert set(rendered) == {"fp8gemm-core", *ARCH_RECIPES}
    version = render_recipes._core_version()
    assert [e for variants in rendered.values() for r in variants for e in render_recipes.check(r, version)] == []
    assert [e for d in render_recipes.recipe_dirs() for e in render_recipes.source_errors(d)] == []
    assert len(rendered["fp8gemm-core"]) == 1 and rendered["fp8gemm-core"][0].variant["target_platform"] == "noarch"
    for cuda in CUDA_RECIPES:  # python 3.10-3.13 x CUDA 12.8/12.9/13.0
        assert {(r.variant["python"], r.variant["cuda_compiler_version"]) for r in rendered[cuda]} == {
            (p, c) for p in ("3.10", "3.11", "3.12", "3.13") for c in ("12.8", "12.9", "13.0")
        }


def test_arch_recipes_are_their_platforms_templates_filled_in_from_each_package(tmp_path):
    """recipes/<arch package>/ holds recipes/templates/<platform>.* with the package's arch.toml and pyproject.toml
    values: the committed files are that rendering (a hand edit is caught), each with its own package's values."""
    assert render_recipes.template_errors() == []
    for a in arches.arches():
        recipe = render_recipes.arch_recipe_files(a)[render_recipes.RECIPES / a.package / "recipe.yaml"]
        assert f'"{a.gate_version}"' in recipe and f"b.name == '{a.backend}'" in recipe and "@{" not in recipe
        assert recipe.count(a.package) == 6 and recipe.count(a.module) == 4, recipe  # header, name, source, tests
    copy = shutil.copytree(render_recipes.RECIPES, tmp_path / "recipes")
    edited = copy / "fp8gemm-cuda-sm120" / "recipe.yaml"
    edited.write_text(edited.read_text().replace('cuda_arch: "12.0"', 'cuda_arch: "12.1"'))
    (error,) = render_recipes.template_errors(copy)
    assert error.startswith("recipes/fp8gemm-cuda-sm120/recipe.yaml is not its template's rendering")


def test_every_arch_package_has_a_recipe_and_a_manifest(rendered):
    assert set(rendered) - {"fp8gemm-core"} == set(render_recipes.GATES) == set(ARCH_RECIPES)
    assert render_recipes.GATES["fp8gemm-rocm-gfx942"] == ("__amdgpu_arch", "9.4.2")


def test_gates_are_run_constraints_that_stock_conda_can_ignore(rendered):
    for recipe, (gate, value) in render_recipes.GATES.items():
        for r in rendered[recipe]:
            assert r.requirements["run_constraints"] == [f"{gate} =={value}"]
            assert not [s for s in r.requirements["run"] if s.startswith("__")]  # incl. no __cuda pin
    assert {r.build["string"][:13] for r in rendered["fp8gemm-cuda-sm90a"]} >= {"cuda128_py310", "cuda130_py313"}
    assert {r.build["string"][:12] for r in rendered["fp8gemm-rocm-gfx942"]} == {f"rocm63_py31{i}" for i in "0123"}


def test_one_torch_floor_in_the_pip_metadata_and_every_recipe(rendered):
    floor = render_recipes.torch_floor()
    assert floor == "2.4"
    for recipe in CUDA_RECIPES:  # conda-forge has CUDA torch: a real run dependency
        assert {f"pytorch >={floor}" in r.requirements["run"] for r in rendered[recipe]} == {True}
    r = rendered["fp8gemm-cuda-sm90a"][0]
    broken = dataclasses.replace(
        r, requirements={**r.requirements, "run": [s for s in r.requirements["run"] if "torch" not in s]}
    )
    assert "lack pytorch >=2.4" in "\n".join(render_recipes.check(broken, "0.1.0"))
    assert (
        "conda-forge has no ROCm build" in (render_recipes.RECIPES / "fp8gemm-rocm-gfx942" / "recipe.yaml").read_text()
    )


def test_torch_is_the_users_on_rocm_and_a_peer_of_the_core(rendered):
    core = rendered["fp8gemm-core"][0].requirements
    assert "pytorch >=2.4" in core["run_constraints"] and not [s for s in core["run"] if "torch" in s]
    gfx = rendered["fp8gemm-rocm-gfx942"][0].requirements
    assert not [s for s in gfx["run"] if "torch" in s]
    assert {"hipcc 6.3.*", "rocm-device-libs 6.3.*", "clangxx 19.*"} <= set(gfx["build"])
    assert "hip-devel 6.3.*" in gfx["host"]


def test_arch_packages_build_their_native_ops_against_a_host_torch_that_the_run_requirements_ignore(rendered):
    for recipe in ARCH_RECIPES:
        for r in rendered[recipe]:
            host_torch = [s for s in r.requirements["host"] if "torch" in s]
            assert host_torch == (["pytorch-cpu >=2.10"] if recipe.endswith("gfx942") else ["pytorch >=2.10"])
            assert {"pytorch", "pytorch-cpu", "libtorch"} <= set(r.requirements["ignore_run_exports"]["by_name"])
            assert not [s for s in r.requirements["run"] if "torch" in s and s != "pytorch >=2.4"]
            assert r.build["script"]["env"]["SKBUILD_CMAKE_DEFINE"] == "FP8GEMM_NATIVE_OPS=AUTO"
    r = rendered["fp8gemm-cuda-sm120"][0]
    assert r.build["script"]["env"]["FP8GEMM_CUDA_ARCH"] == "120"  # arch.toml's build env beside it
    broken = dataclasses.replace(r, requirements={**r.requirements, "host": r.requirements["host"][:-1]},
                                 build={**r.build, "script": {**r.build["script"], "env": {}}})  # fmt: skip
    errors = "\n".join(render_recipes.check(broken, "0.1.0"))
    assert "host requirements lack pytorch >=2.10" in errors and "FP8GEMM_NATIVE_OPS=AUTO" in errors


def test_license_maintainers_and_feedstock_source(rendered):
    assert (render_recipes.ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    for recipe in rendered:
        assert (render_recipes.ROOT / "packages" / recipe / "LICENSE").resolve() == render_recipes.ROOT / "LICENSE"
        (source,) = render_recipes.feedstock_source(render_recipes.RECIPES / recipe)
        assert source["sha256"] == "0" * 64 and source["url"].endswith(f"/{recipe.replace('-', '_')}-0.1.0.tar.gz")


def test_pixi_variant_files_pick_one_toolkit():
    cuda = render_recipes.render(render_recipes.RECIPES / "fp8gemm-cuda-sm120", variants=[render_recipes.RECIPES / "variants" / "cuda128.yaml"])  # fmt: skip
    assert {r.variant["cuda_compiler_version"] for r in cuda} == {"12.8"}


@pytest.mark.parametrize("recipe", ARCH_RECIPES)
def test_arch_packages_skip_other_platforms(recipe):
    root = render_recipes.RECIPES / recipe
    assert render_recipes.skipped_on(root, "osx-arm64") and render_recipes.skipped_on(root, "win-64")
    assert not render_recipes.skipped_on(root, "linux-64")


def test_check_catches_a_hard_gate_a_driver_pin_and_a_wrong_pin(rendered):
    r = rendered["fp8gemm-cuda-sm120"][0]
    broken = dataclasses.replace(
        r, requirements={**r.requirements, "run": ["python", "fp8gemm-core >=0.1", "__cuda >=12.8", "__cuda_arch ==12.0"],
                         "run_constraints": []}, about={"license": "MIT"}, build={**r.build, "string": "h1234567_0"},
    )  # fmt: skip
    errors = "\n".join(render_recipes.check(broken, "0.1.0"))
    for expected in ("fp8gemm-core ==0.1.0", "lack the gate __cuda_arch ==12.0", "virtual packages in run",
                     "__cuda pin", "license", "build string"):  # fmt: skip
        assert expected in errors


def test_unknown_recipe_key_is_a_render_error(tmp_path):
    from rattler_build import Stage0Recipe

    text = (render_recipes.RECIPES / "fp8gemm-core" / "recipe.yaml").read_text()
    with pytest.raises(Exception, match="(?i)unknown|invalid|not allowed|bogus"):
        Stage0Recipe.from_yaml(text.replace("build:\n", "build:\n  bogus_field: 1\n", 1))


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    require_tool("nvcc"), require_tool("clang++-19"), require_tool("patchelf")
    with pytest.MonkeyPatch.context() as env:  # the test build inherits this process's environment
        env.setenv("PATH", search_path())
        return conda_offline.build_channel(tmp_path_factory.mktemp("conda"))


def _names(records) -> list[str]:
    return sorted(r.name.normalized for r in records)


@pytest.mark.parametrize("package", ARCH_RECIPES)
def test_solver_with_rattlers_gpu_packages_takes_the_package_for_its_gpu_and_where_none_is_declared(channel, package):
    gate, value = render_recipes.GATES[package]
    assert _names(conda_offline.solve(channel, package, Gpu(gate, value))) == ["fp8gemm-core", package]
    # Stock conda and mamba define no __cuda_arch / __amdgpu_arch: the constraint does not apply.
    assert _names(conda_offline.solve(channel, package, Gpu())) == ["fp8gemm-core", package]


@pytest.mark.parametrize("package", ARCH_RECIPES)
def test_solver_with_rattlers_gpu_packages_refuses_the_package_for_another_gpu(channel, package):
    gate, _ = render_recipes.GATES[package]
    with pytest.raises(Exception, match=f"(?s){package}.*constrain"):
        conda_offline.solve(channel, package, Gpu(gate, conda_offline.OTHER_GPU[package]))


@pytest.fixture(scope="module")
def prefixes(channel, tmp_path_factory):
    out = {}
    for package in ARCH_RECIPES:
        out[package] = tmp_path_factory.mktemp(package) / "prefix"
        conda_offline.install(conda_offline.solve(channel, package, Gpu(*render_recipes.GATES[package])), out[package])
    return out


@pytest.mark.parametrize("package", ARCH_RECIPES)
def test_recipe_tests_pass_in_the_installed_prefix(prefixes, package):
    runs = conda_offline.run_recipe_tests(package, prefixes[package])
    assert len(runs) == 3 if package.endswith("gfx942") else len(runs) == 2
    assert [(r.returncode, r.stderr[-2000:]) for r in runs if r.returncode] == []
    where = subprocess.run([sys.executable, "-c", "import fp8gemm; print(fp8gemm.__file__)"], capture_output=True,
                           text=True, env=conda_offline.prefix_env(prefixes[package]), check=True)  # fmt: skip
    assert where.stdout.startswith(str(prefixes[package]))


def test_packaged_tests_run_on_a_machine_without_a_gpu(channel):
    """rattler-build's own test run solves the test environment with this machine's virtual packages (no GPU):
    the gate must not stop it, as a hard __cuda_arch requirement would on conda-forge's GPU-less builders."""
    results = conda_offline.run_packaged_tests(conda_offline.built_packages(channel)["fp8gemm-cuda-sm90a"], channel)
    assert results and all(r.success for r in results), [r.output[-20:] for r in results]


@pytest.mark.parametrize(
    "package, device, needed",
    [
        ("fp8gemm-cuda-sm90a", ("cuda", "RTX 5090", ("sm_120a", "sm_120"), "12.0"), "fp8gemm-cuda-sm120"),
        ("fp8gemm-cuda-sm120", ("cuda", "H100", ("sm_90a", "sm_90"), "9.0"), "fp8gemm-cuda-sm90a"),
        # Stock conda cannot tell an NVIDIA machine from an AMD one: the runtime can.
        ("fp8gemm-rocm-gfx942", ("cuda", "H100", ("sm_90a", "sm_90"), "9.0"), "fp8gemm-cuda-sm90a"),
        ("fp8gemm-cuda-sm90a", ("rocm", "MI300X", ("gfx942",), "gfx942:sramecc+:xnack-"), "fp8gemm-rocm-gfx942"),
    ],
)
def test_info_names_the_package_this_gpu_needs(prefixes, package, device, needed):
    info = conda_offline.info_on(prefixes[package], *device)
    assert info["selected"]["name"] is None
    reason = info["selected"]["reason"]
    assert needed in reason and package in reason and device[1] in reason
