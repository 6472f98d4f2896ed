"""pixi.toml as the users run it: GPUs declared per environment, builds in order, every test dependency."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import test_repo
from test_repo import check_pixi


@pytest.fixture
def manifest():
    return test_repo.tomllib.loads((test_repo.ROOT / "pixi.toml").read_text())


def _platform(manifest, env: str) -> dict:
    (feature,) = [f for f in manifest["environments"][env] if "platforms" in manifest["feature"][f]]
    (name,) = manifest["feature"][feature]["platforms"]
    (table,) = [p for p in manifest["workspace"]["platforms"] if isinstance(p, dict) and p["name"] == name]
    return table


def test_gpu_environments_declare_their_gpu(manifest):
    assert _platform(manifest, "rocm63")["amdgpu"] == "gfx942"
    assert _platform(manifest, "cuda128")["cuda"] == {"driver": "12.8", "arch": "9.0"}
    assert _platform(manifest, "cuda128-sm120")["cuda"]["arch"] == "12.0"


def test_arch_builds_build_the_core_first_with_the_environments_toolkit(manifest):
    for feature, variant in (("cuda128", "cuda128"), ("rocm63", "rocm63")):
        tasks = manifest["feature"][feature]["tasks"]
        assert tasks["build"]["depends-on"][:2] == ["render", "build-core"]
        for task in tasks.values():
            if "--recipe" in task.get("cmd", ""):
                assert task["depends-on"] == ["build-core"] and f"recipes/variants/{variant}.yaml" in task["cmd"]
    rocm = manifest["feature"]["rocm63"]["dependencies"]
    assert {k: rocm[k] for k in ("hipcc", "hip-devel", "rocm-device-libs", "clangxx")} == {
        "hipcc": "6.3.*", "hip-devel": "6.3.*", "rocm-device-libs": "6.3.*", "clangxx": "19.*"
    }  # fmt: skip
    assert "torch" not in str(manifest["feature"]["rocm63"].get("dependencies"))  # ROCm torch: PyTorch's wheels


def test_checks_catch_an_old_pixi_a_core_less_build_and_a_missing_test_dependency(manifest):
    assert check_pixi.cross_reference_errors(manifest) == []
    broken = copy.deepcopy(manifest)
    broken["workspace"]["requires-pixi"] = ">=0.71"
    broken["feature"]["rocm63"]["tasks"]["build-gfx942"]["depends-on"] = []
    del broken["dependencies"]["pyyaml"]
    errors = "\n".join(check_pixi.cross_reference_errors(broken))
    assert "below (0, 82)" in errors and "'build-gfx942' builds an arch package before the core" in errors
    assert "lacks test dependencies ['pyyaml']" in errors


def test_schema_is_found_from_a_worktree_or_an_environment_variable(tmp_path, monkeypatch):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / check_pixi.SCHEMA_NAME).write_text("{}")
    (tmp_path / "a" / "checkout").mkdir(parents=True)
    monkeypatch.delenv("PIXI_MANIFEST_SCHEMA", raising=False)
    assert check_pixi.find_schema(tmp_path / "a" / "checkout") == tmp_path / "shared" / check_pixi.SCHEMA_NAME
    monkeypatch.setenv("PIXI_MANIFEST_SCHEMA", "/elsewhere/schema.json")
    assert check_pixi.find_schema(tmp_path) == Path("/elsewhere/schema.json")
