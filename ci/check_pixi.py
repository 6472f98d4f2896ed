"""Validate pixi.toml: JSON schema (shared/pixi-manifest-schema.json, found from any checkout: $PIXI_MANIFEST_SCHEMA,
else a shared/ folder beside the checkout or any folder above it, else beside the main checkout of a git worktree)
plus what the schema cannot see. The schema allows keys pixi itself refuses, so the platform entries are checked
against pixi's own parser (PIXI_SOURCE below), and features, environments, task targets, task order, requires-pixi
and the test dependencies are cross-checked. Exit 1 on any problem."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_NAME = "pixi-manifest-schema.json"
# The parsing rules below are read from prefix-dev/pixi at this commit (Aug 2026, after v0.77.0):
PIXI_SOURCE = {
    "commit": "2b25fc76dd3b5cc50a235387d948474975c40d73",
    "platform_table": "crates/pixi_manifest/src/toml/platform.rs",  # TomlPixiPlatform, take_cuda_entry
    "platform_name": "crates/pixi_manifest/src/platform.rs",  # valid_pixi_platform_name, PixiPlatform::new
    "feature_platforms": "crates/pixi_manifest/src/toml/manifest.rs",  # validate_referenced_platforms
    "family_names": "crates/pixi_manifest/src/target.rs",  # family_name_to_selector
    "task_targets": "crates/pixi_task/src/task_graph.rs",  # MissingTaskError while building the graph
}
# TomlPlatform: the conda subdirs a platform may name.
SUBDIRS = {"linux-32", "linux-64", "linux-aarch64", "linux-armv6l", "linux-armv7l", "linux-ppc64le", "linux-ppc64",
           "linux-s390x", "linux-riscv32", "linux-riscv64", "osx-64", "osx-arm64", "win-32", "win-64", "win-arm64",
           "emscripten-wasm32", "wasi-wasm32", "zos-z"}  # fmt: skip
# FRIENDLY_VIRTUAL_PACKAGES (key: conda name), plus `name` and `platform`; any other key must start with `__`.
FRIENDLY_KEYS = {"cuda": "__cuda", "archspec": "__archspec", "glibc": "__glibc", "linux": "__linux",
                 "macos": "__osx", "osx": "__osx", "windows": "__win"}  # fmt: skip
CUDA_TABLE_KEYS = {"driver", "arch"}
RESERVED_PLATFORM_NAMES = {"linux", "unix", "win", "osx", "macos"}  # family selectors
MAX_PLATFORM_NAME = 64
# Inline platform tables, `cuda = { driver, arch }` and raw `__name` keys all arrived in pixi 0.71.0 (its
# CHANGELOG: "Rich platforms", "Friendly __cuda_arch support"); v0.70.2's platform.rs has none of them.
PIXI_FOR_PLATFORM_TABLES = (0, 71)
# Modules the test suite imports at collection, as conda packages of the default environment.
TEST_DEPENDENCIES = ("pytest", "hypothesis", "jsonschema", "pyyaml", "py-rattler", "rattler-build", "patchelf")
# A task that builds arch packages (ci/arches.py build, or rattler-build on an arch recipe) needs the core first.
ARCH_BUILD = re.compile(r"ci/arches\.py build|--recipe recipes/fp8gemm-(?!core)")


def _git_main_checkout(root: Path) -> Path | None:
    run = subprocess.run(["git", "-C", str(root), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                         capture_output=True, text=True)  # fmt: skip
    return Path(run.stdout.strip()).parent if run.returncode == 0 and run.stdout.strip() else None


def find_schema(root: Path = ROOT) -> Path | None:
    if os.environ.get("PIXI_MANIFEST_SCHEMA"):
        return Path(os.environ["PIXI_MANIFEST_SCHEMA"])
    main = _git_main_checkout(root)
    for base in [root, *root.parents, *([main, *main.parents] if main else [])]:
        if (base / "shared" / SCHEMA_NAME).is_file():
            return base / "shared" / SCHEMA_NAME
    return None


# Where the schema was found (a path that does not exist when it was not).
SCHEMA = find_schema() or ROOT.parent / "shared" / SCHEMA_NAME


def schema_errors(manifest: dict, schema_path: Path = SCHEMA) -> list[str]:
    import jsonschema

    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"schema: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def _env_features(manifest: dict) -> dict[str, list[str]]:
    envs = {}
    for name, spec in manifest.get("environments", {}).items():
        envs[name] = spec if isinstance(spec, list) else spec.get("features", [])
    return envs


def _platform_name(entry) -> str | None:
    return entry if isinstance(entry, str) else entry.get("name", entry.get("platform"))


def _platform_names(manifest: dict) -> set[str]:
    return {_platform_name(p) for p in manifest["workspace"].get("platforms", [])} - {None}


def platform_name_errors(name) -> list[str]:
    """valid_pixi_platform_name: ASCII, a letter first, letters, digits and '-' after, no '-' last, <= 64 bytes,
    not a family selector."""
    if not isinstance(name, str) or not name:
        return [f"platform name {name!r} must be a non-empty string"]
    if len(name.encode()) > MAX_PLATFORM_NAME:
        return [f"platform name {name!r} is longer than {MAX_PLATFORM_NAME} bytes"]
    if not re.fullmatch(r"[A-Za-z]([A-Za-z0-9-]*[A-Za-z0-9])?", name):
        return [f"{name!r} is not a valid platform name (a letter first, then letters, digits, '-'; no '-' last)"]
    if name in RESERVED_PLATFORM_NAMES:
        return [f"{name!r} is a reserved platform name (a target family)"]
    return []


def _cuda_errors(where: str, cuda) -> list[str]:
    """take_cuda_entry: a version string, or a table of `driver` and optional `arch` (`arch` needs `driver`)."""
    if isinstance(cuda, str):
        return []
    if not isinstance(cuda, dict):
        return [f"{where}: `cuda` must be a version string or a table"]
    errors = [
        f"{where}: `cuda` table: unknown key {k!r} (allowed: driver, arch)" for k in cuda if k not in CUDA_TABLE_KEYS
    ]
    if "driver" not in cuda:
        errors.append(
            f"{where}: `cuda.arch` requires `cuda.driver`"
            if "arch" in cuda
            else f"{where}: `cuda` table must set `driver`"
        )
    return errors


def _declared_packages(entry: dict) -> list[str]:
    """The conda virtual-package names an inline platform table declares."""
    names = [FRIENDLY_KEYS[k] for k in entry if k in FRIENDLY_KEYS]
    if isinstance(entry.get("cuda"), dict) and "arch" in entry["cuda"]:
        names.append("__cuda_arch")
    return names + [k for k in entry if k.startswith("__")]


def platform_entry_errors(entry) -> list[str]:
    """One [workspace].platforms entry as TomlPixiPlatform::deserialize parses it."""
    if isinstance(entry, str):
        return [] if entry in SUBDIRS else [f"platform {entry!r} is not a conda subdir pixi knows"]
    if not isinstance(entry, dict):
        return [f"platform entry {entry!r} must be a string or a table"]
    where = f"platform {_platform_name(entry) or entry!r}"
    errors = [
        f"{where}: unknown key {k!r} (pixi takes name, platform, {', '.join(FRIENDLY_KEYS)} and raw `__name` keys)"
        for k in entry
        if k not in ("name", "platform", *FRIENDLY_KEYS) and not k.startswith("__")
    ]
    if "macos" in entry and "osx" in entry:
        errors.append(f"{where}: 'osx' is an alias for 'macos'; set only one")
    errors += _cuda_errors(where, entry["cuda"]) if "cuda" in entry else []
    if entry.get("archspec") == "":
        errors.append(f"{where}: 'archspec' requires a non-empty microarchitecture string")
    for key in (k for k in entry if k.startswith("__")):
        value = entry[key]
        if not isinstance(value, str) or not re.fullmatch(r"[^=\s]+(=\S*)?", value):
            errors.append(f"{where}: raw virtual package {key} = {value!r} must be a string 'version[=build]'")
    declared = _declared_packages(entry)
    errors += [
        f"{where}: {n!r} is declared more than once" for n in sorted({n for n in declared if declared.count(n) > 1})
    ]
    if "__cuda_arch" in declared and "__cuda" not in declared:
        errors.append(f"{where}: `__cuda_arch` requires `__cuda` to be declared as well")
    subdir, name = entry.get("platform"), entry.get("name")
    if subdir is None and name is None:
        errors.append(f"{where}: a platform entry must set at least one of 'name' or 'platform'")
    elif (subdir or name) not in SUBDIRS:
        errors.append(f"{where}: {subdir or name!r} is not a conda subdir; set 'platform' explicitly")
    if name is not None:
        errors += [f"{where}: {e}" for e in platform_name_errors(name)]
        if name == subdir and declared:
            errors.append(f"{where}: a platform named after its subdir cannot declare virtual packages; rename it")
    return errors


def platform_errors(manifest: dict) -> list[str]:
    entries = manifest["workspace"].get("platforms", [])
    errors = [e for entry in entries for e in platform_entry_errors(entry)]
    names = [_platform_name(p) for p in entries]
    return errors + [
        f"platform {n!r} is declared more than once" for n in sorted({n for n in names if names.count(n) > 1})
    ]


def _depends(task) -> list[str]:
    if not isinstance(task, dict):
        return []
    dep = task.get("depends-on", [])
    dep = dep if isinstance(dep, list) else [dep]
    return [d if isinstance(d, str) else d["task"] for d in dep]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def requires_pixi_errors(manifest: dict) -> list[str]:
    floor = _version(manifest["workspace"].get("requires-pixi", ">=0").lstrip(">="))
    tables = any(isinstance(p, dict) for p in manifest["workspace"].get("platforms", []))
    if tables and floor < PIXI_FOR_PLATFORM_TABLES:
        return [f"requires-pixi {floor} is below {PIXI_FOR_PLATFORM_TABLES}, which inline platform tables need"]
    return []


def build_order_errors(manifest: dict) -> list[str]:
    """Every task that builds an arch package first builds the core it needs in its host environment."""
    errors = []
    for name, feat in manifest.get("feature", {}).items():
        for task_name, task in feat.get("tasks", {}).items():
            cmd = task.get("cmd", "") if isinstance(task, dict) else task
            if ARCH_BUILD.search(cmd) and "build-core" not in _depends(task):
                errors.append(f"feature {name!r}: task {task_name!r} builds an arch package before the core")
    return errors


def cross_reference_errors(manifest: dict, root: Path = ROOT) -> list[str]:
    errors = []
    features = manifest.get("feature", {})
    platforms = _platform_names(manifest)
    default_tasks = manifest.get("tasks", {})
    for env, feats in _env_features(manifest).items():
        missing = [f for f in feats if f not in features]
        if missing:
            errors.append(f"environment {env!r} uses undefined feature(s) {missing}")
        visible = set(default_tasks) | {t for f in feats for t in features.get(f, {}).get("tasks", {})}
        for f in ["<default>"] + feats:
            tasks = default_tasks if f == "<default>" else features.get(f, {}).get("tasks", {})
            for name, task in tasks.items():
                for dep in _depends(task):
                    if dep not in visible:
                        errors.append(f"environment {env!r}: task {name!r} depends on {dep!r}, which it cannot see")
    for name, feat in features.items():
        for p in feat.get("platforms", []):
            if p not in platforms:
                errors.append(f"feature {name!r} names platform {p!r}, not declared in [workspace].platforms")
    if "default" not in _env_features(manifest) and "tasks" not in manifest:
        errors.append("no default environment tasks")
    for required in ("build", "test", "bench", "lint"):
        if required not in default_tasks:
            errors.append(f"default environment lacks the {required!r} task")
    for env in ("cuda128", "rocm63"):
        if env not in _env_features(manifest):
            errors.append(f"environment {env!r} is missing")
    missing = [d for d in TEST_DEPENDENCIES if d not in manifest.get("dependencies", {})]
    if missing:
        errors.append(f"the default environment lacks test dependencies {missing}")
    errors += platform_errors(manifest) + requires_pixi_errors(manifest) + build_order_errors(manifest)
    errors += toolchain_errors(manifest, root)
    return errors


def toolchain_errors(manifest: dict, root: Path = ROOT) -> list[str]:
    """Each arch package's toolchain (packages/*/arch.toml) is a feature whose tasks build its arches."""
    errors = []
    for toml in sorted((root / "packages").glob("fp8gemm-*/arch.toml")):
        toolchain = tomllib.loads(toml.read_text())["toolchain"]
        tasks = manifest.get("feature", {}).get(toolchain, {}).get("tasks", {})
        if not any(f"ci/arches.py build {toolchain}" in str(t) for t in tasks.values()):
            errors.append(f"{toml.parent.name}: no task of feature {toolchain!r} runs `ci/arches.py build {toolchain}`")
    return errors


def main() -> int:
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    errors = cross_reference_errors(manifest)
    if SCHEMA.exists():
        errors = schema_errors(manifest) + errors
        print(f"pixi.toml: validated against {SCHEMA}")
    else:
        print(
            f"note: no shared/{SCHEMA_NAME} above {ROOT} or $PIXI_MANIFEST_SCHEMA; schema skipped, cross-references checked"
        )
    for e in errors:
        print(f"pixi.toml: {e}")
    print(
        f"pixi.toml: platform rules of prefix-dev/pixi@{PIXI_SOURCE['commit'][:12]} ({PIXI_SOURCE['platform_table']})"
    )
    print(f"pixi.toml: {'FAILED' if errors else 'ok'} ({len(errors)} problem(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
