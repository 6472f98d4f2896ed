"""pixi.toml as the users run it: GPUs declared per environment in the form pixi parses, builds in order, every
test dependency; and the manifest mistakes pixi's own parser refuses are refused by ci/check_pixi.py too."""

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
    amd = _platform(manifest, "rocm63")
    assert {k: v for k, v in amd.items() if k.startswith("__")} == {"__amdgpu": "0", "__amdgpu_arch": "9.4.2"}
    assert _platform(manifest, "cuda128")["cuda"] == {"driver": "12.8", "arch": "9.0"}
    assert _platform(manifest, "cuda128-sm120")["cuda"]["arch"] == "12.0"
    assert manifest["workspace"]["requires-pixi"] == ">=0.71"
    assert "cutlass" not in manifest["feature"]["cuda128"]["dependencies"]  # no source includes it


def test_arch_builds_build_the_core_first_with_the_environments_toolkit(manifest):
    for feature in ("cuda128", "rocm63"):
        tasks = manifest["feature"][feature]["tasks"]
        assert tasks["build"]["depends-on"] == ["render", "build-core", "build-arches"]
        assert tasks["build-arches"]["depends-on"] == ["build-core"]
        assert tasks["build-arches"]["cmd"].startswith(f"python ci/arches.py build {feature} ")
    rocm = manifest["feature"]["rocm63"]["dependencies"]
    assert {k: rocm[k] for k in ("hipcc", "hip-devel", "rocm-device-libs", "clangxx")} == {
        "hipcc": "6.3.*", "hip-devel": "6.3.*", "rocm-device-libs": "6.3.*", "clangxx": "19.*"
    }  # fmt: skip
    assert "torch" not in str(manifest["feature"]["rocm63"].get("dependencies"))  # ROCm torch: PyTorch's wheels


def test_checks_catch_an_old_pixi_a_core_less_build_and_a_missing_test_dependency(manifest):
    assert check_pixi.cross_reference_errors(manifest) == []
    broken = copy.deepcopy(manifest)
    broken["workspace"]["requires-pixi"] = ">=0.70"
    broken["feature"]["rocm63"]["tasks"]["build-arches"]["depends-on"] = []
    del broken["dependencies"]["pyyaml"]
    errors = "\n".join(check_pixi.cross_reference_errors(broken))
    assert "below (0, 71)" in errors and "'build-arches' builds an arch package before the core" in errors
    assert "lacks test dependencies ['pyyaml']" in errors


GPU = {"name": "gpu", "platform": "linux-64"}


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({**GPU, "amdgpu": "gfx942"}, "unknown key 'amdgpu'"),  # no friendly AMD key in pixi
        ({**GPU, "cuda": {"arch": "9.0"}}, "`cuda.arch` requires `cuda.driver`"),
        ({**GPU, "cuda": {}}, "`cuda` table must set `driver`"),
        ({**GPU, "cuda": {"driver": "12.8", "drivers": "x"}}, "unknown key 'drivers'"),
        ({**GPU, "cuda": "12.8", "typo": "x"}, "unknown key 'typo'"),
        ({**GPU, "__cuda_arch": "9.0"}, "`__cuda_arch` requires `__cuda`"),
        ({**GPU, "cuda": "12.8", "__cuda": "11.0"}, "'__cuda' is declared more than once"),
        ({**GPU, "macos": "13", "osx": "13"}, "alias for 'macos'"),
        ({**GPU, "archspec": ""}, "non-empty microarchitecture"),
        ({**GPU, "__amdgpu_arch": 9.42}, "must be a string"),
        ({"name": "bad name", "platform": "linux-64"}, "not a valid platform name"),
        ({"name": "9gpu", "platform": "linux-64"}, "not a valid platform name"),
        ({"name": "linux", "platform": "linux-64"}, "reserved platform name"),
        ({"name": "linux-64-cuda"}, "not a conda subdir"),
        ({}, "at least one of 'name' or 'platform'"),
        ({"name": "linux-64", "platform": "linux-64", "cuda": "12.8"}, "named after its subdir"),
        ("bogus-platform", "not a conda subdir"),
    ],
)
def test_platform_entries_pixi_refuses_are_refused(manifest, entry, words):
    broken = copy.deepcopy(manifest)
    broken["workspace"]["platforms"].append(entry)
    errors = "\n".join(check_pixi.cross_reference_errors(broken))
    assert words in errors, errors


@pytest.mark.parametrize(
    "entry",
    [
        {**GPU, "__amdgpu": "0", "__amdgpu_arch": "9.4.2"},
        {**GPU, "cuda": {"driver": "12.8"}, "glibc": "2.28", "archspec": "x86_64_v3"},
        {"platform": "linux-aarch64", "cuda": "12.8", "__future_pkg": "1.2=abc"},
        "osx-arm64",
    ],
)
def test_platform_entries_pixi_accepts_pass(manifest, entry):
    manifest["workspace"]["platforms"].append(entry)
    assert check_pixi.platform_errors(manifest) == []


def test_duplicate_platform_names_and_undeclared_feature_platforms(manifest):
    broken = copy.deepcopy(manifest)
    broken["workspace"]["platforms"].append({"name": "linux-64-sm90", "platform": "linux-64", "cuda": "12.0"})
    broken["feature"]["sm120"]["platforms"] = ["linux-64-sm121"]
    errors = "\n".join(check_pixi.cross_reference_errors(broken))
    assert "'linux-64-sm90' is declared more than once" in errors and "linux-64-sm121" in errors


def test_an_arch_toolchain_without_its_build_task_is_caught(manifest):
    del manifest["feature"]["rocm63"]["tasks"]["build-arches"]
    errors = "\n".join(check_pixi.cross_reference_errors(manifest))
    assert "fp8gemm-rocm-gfx942: no task of feature 'rocm63' runs `ci/arches.py build rocm63`" in errors


def test_the_rules_cite_the_pixi_source_they_were_read_from():
    assert len(check_pixi.PIXI_SOURCE["commit"]) == 40
    assert check_pixi.PIXI_SOURCE["platform_table"] == "crates/pixi_manifest/src/toml/platform.rs"


def test_schema_is_found_from_a_worktree_or_an_environment_variable(tmp_path, monkeypatch):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / check_pixi.SCHEMA_NAME).write_text("{}")
    (tmp_path / "a" / "checkout").mkdir(parents=True)
    monkeypatch.delenv("PIXI_MANIFEST_SCHEMA", raising=False)
    assert check_pixi.find_schema(tmp_path / "a" / "checkout") == tmp_path / "shared" / check_pixi.SCHEMA_NAME
    monkeypatch.setenv("PIXI_MANIFEST_SCHEMA", "/elsewhere/schema.json")
    assert check_pixi.find_schema(tmp_path) == Path("/elsewhere/schema.json")
