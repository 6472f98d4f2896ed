"""Conda recipes without conda channels: render every variant, build/index/install/solve offline."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from isa import require_tool, search_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))
import conda_offline  # noqa: E402
import render_recipes  # noqa: E402

ARCH_RECIPES = ["fp8gemm-cuda-sm120", "fp8gemm-cuda-sm90a", "fp8gemm-rocm-gfx942"]


@pytest.fixture(scope="module")
def rendered():
    return {d.name: render_recipes.render(d) for d in render_recipes.recipe_dirs()}


def test_every_recipe_renders_every_variant_and_passes_the_checks(rendered):
    assert set(rendered) == {"fp8gemm-core", *ARCH_RECIPES}
    version = render_recipes._core_version()
    assert [e for variants in rendered.values() for r in variants for e in render_recipes.check(r, version)] == []
    assert len(rendered["fp8gemm-core"]) == 1 and rendered["fp8gemm-core"][0].variant["target_platform"] == "noarch"
    for cuda in ("fp8gemm-cuda-sm120", "fp8gemm-cuda-sm90a"):  # python 3.10-3.13 x CUDA 12.8/12.9/13.0
        assert {(r.variant["python"], r.variant["cuda_compiler_version"]) for r in rendered[cuda]} == {
            (p, c) for p in ("3.10", "3.11", "3.12", "3.13") for c in ("12.8", "12.9", "13.0")
        }


def test_arch_gates_are_in_the_rendered_run_requirements(rendered):
    assert "__cuda_arch ==12.0" in rendered["fp8gemm-cuda-sm120"][0].requirements["run"]
    assert "__cuda_arch ==9.0" in rendered["fp8gemm-cuda-sm90a"][0].requirements["run"]
    assert "__amdgpu_arch ==9.4.2" in rendered["fp8gemm-rocm-gfx942"][0].requirements["run"]
    gfx = rendered["fp8gemm-rocm-gfx942"][0].requirements
    assert "rocm-cmake 6.3.*" in gfx["build"] and "hip-devel 6.3.*" in gfx["host"]


@pytest.mark.parametrize("recipe", ARCH_RECIPES)
def test_arch_packages_skip_other_platforms(recipe):
    root = render_recipes.RECIPES / recipe
    assert render_recipes.skipped_on(root, "osx-arm64") and render_recipes.skipped_on(root, "win-64")
    assert not render_recipes.skipped_on(root, "linux-64")


def test_check_catches_a_missing_gate_and_a_wrong_pin(rendered):
    r = rendered["fp8gemm-cuda-sm120"][0]
    broken = dataclasses.replace(r, requirements={**r.requirements, "run": ["python", "fp8gemm-core >=0.1"]})
    errors = "\n".join(render_recipes.check(broken, "0.1.0"))
    assert "fp8gemm-core ==0.1.0" in errors and "__cuda_arch ==12.0" in errors and "__cuda >=" in errors


def test_unknown_recipe_key_is_a_render_error(tmp_path):
    from rattler_build import Stage0Recipe

    text = (render_recipes.RECIPES / "fp8gemm-core" / "recipe.yaml").read_text()
    with pytest.raises(Exception, match="(?i)unknown|invalid|not allowed|bogus"):
        Stage0Recipe.from_yaml(text.replace("build:\n", "build:\n  bogus_field: 1\n", 1))


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    require_tool("nvcc")
    with pytest.MonkeyPatch.context() as env:  # the test build inherits this process's environment
        env.setenv("PATH", search_path())
        return conda_offline.build_channel(tmp_path_factory.mktemp("conda"))


def test_solver_picks_sm120_for_cc_12_0(channel):
    records = conda_offline.solve(channel, "fp8gemm-cuda-sm120", cuda="12.8", cuda_arch="12.0")
    assert sorted(r.name.normalized for r in records) == ["fp8gemm-core", "fp8gemm-cuda-sm120"]


@pytest.mark.parametrize("cuda, cuda_arch", [("12.8", "9.0"), ("12.4", "12.0")])
def test_solver_refuses_sm120_for_another_gpu_or_an_old_driver(channel, cuda, cuda_arch):
    with pytest.raises(Exception, match="fp8gemm-cuda-sm120"):
        conda_offline.solve(channel, "fp8gemm-cuda-sm120", cuda=cuda, cuda_arch=cuda_arch)


def test_installed_prefix_resolves_the_backend_entry_point(channel, tmp_path):
    records = conda_offline.solve(channel, "fp8gemm-cuda-sm120", cuda="13.0", cuda_arch="12.0")
    conda_offline.install(records, tmp_path / "prefix")
    module_file, info = conda_offline.backends_in_prefix(tmp_path / "prefix")
    assert module_file.startswith(str(tmp_path / "prefix"))
    (sm120,) = [b for b in info["installed"] if b["name"] == "sm120"]
    assert sm120["error"] is None and sm120["distribution"] == "fp8gemm-cuda-sm120"
    assert sm120["targets"] == ["sm_120"] and "nvcc" in sm120["build_info"]["compiler"]
