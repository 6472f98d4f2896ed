"""pixi.toml as the users run it: GPUs declared per environment in the form pixi parses, builds in order, every
package the test suite imports; the manifest mistakes pixi's own parser refuses are refused by ci/check_pixi.py too,
against pixi's schema vendored in ci/."""

from __future__ import annotations

import ast
import copy
import hashlib
import json

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
    assert "lacks test dependencies ['pyyaml'] (pyyaml: ci/" in errors  # imported by a script the tests import


def test_the_default_environment_has_what_the_test_modules_import(manifest):
    """The list is read from the tests' imports: each package a test module needs at collection is one pixi installs
    in the default environment (torch from the cpu feature), so `pixi run test` collects."""
    imports = check_pixi.test_imports()
    assert {"safetensors", "transformers", "torch", "fp8gemm", "yaml"} <= set(imports)
    assert "tests/test_nn_transformer.py" in imports["safetensors"] and "sys" not in imports and "isa" not in imports
    assert check_pixi.test_dependency_errors(manifest) == []
    for table, package in (("dependencies", "safetensors"), ("pypi-dependencies", "transformers")):
        broken = copy.deepcopy(manifest)
        del broken[table][package]
        (error,) = check_pixi.test_dependency_errors(broken)
        assert f"lacks test dependencies ['{package}'] ({package}: tests/" in error
    del manifest["feature"]["cpu"]["dependencies"]["pytorch-cpu"]
    assert "['pytorch-cpu']" in "\n".join(check_pixi.test_dependency_errors(manifest))


def test_an_import_is_optional_only_behind_an_import_guard():
    source = """
import plain
from pkg.sub import name
try:
    import guarded
except ImportError:
    import fallback
try:
    import other
except KeyError:
    pass
def f():
    import nested
optional = pytest.importorskip("skipped.sub")
import skipped
from . import relative
"""
    assert check_pixi.unguarded_imports(ast.parse(source)) == {"plain", "pkg", "fallback", "other", "nested"}


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


def test_the_schema_is_pixis_own_vendored_in_the_repository(manifest, tmp_path):
    """ci/pixi-manifest-schema.json is prefix-dev/pixi's schema/schema.json at PIXI_SOURCE's commit, unchanged: an
    edited copy is refused, so the check never runs against a schema loosened by hand."""
    schema = json.loads(check_pixi.SCHEMA.read_text())
    assert (
        check_pixi.SCHEMA.parent == test_repo.ROOT / "ci" and check_pixi.PIXI_SOURCE["schema"] == "schema/schema.json"
    )
    assert schema["$id"] == "https://pixi.sh/v0.77.0/schema/manifest/schema.json"
    assert hashlib.sha256(check_pixi.SCHEMA.read_bytes()).hexdigest() == check_pixi.SCHEMA_SHA256
    loosened = tmp_path / "schema.json"
    loosened.write_text(json.dumps({**schema, "additionalProperties": True}))
    (error,) = check_pixi.schema_errors(manifest, loosened)
    assert "is not pixi's schema/schema.json at 2b25fc76dd3b" in error
