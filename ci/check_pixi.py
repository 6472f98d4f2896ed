"""Validate pixi.toml: pixi's JSON schema (vendored beside this file, PIXI_SOURCE["schema"]) plus what the schema
cannot see. The schema allows keys pixi itself refuses, so the platform entries are checked against pixi's own parser
(PIXI_SOURCE below), and features, environments, task targets, task order, requires-pixi and the default
environment's test dependencies (every module the test suite imports) are cross-checked. Exit 1 on any problem."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# The schema and the parsing rules below are read from prefix-dev/pixi at this commit (Aug 2026, after v0.77.0):
PIXI_SOURCE = {
    "commit": "2b25fc76dd3b5cc50a235387d948474975c40d73",
    "schema": "schema/schema.json",  # copied unchanged to ci/pixi-manifest-schema.json
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
SCHEMA = ROOT / "ci" / "pixi-manifest-schema.json"
SCHEMA_SHA256 = "2fcd1c270b653733ce2f4d2468a74457e1a7fe7ca9c151377ba5aef415a3544d"  # of the file at PIXI_SOURCE: a changed copy fails the check
# The test suite's tools that are programs, not imports: the runner, and the recipe builds of tests/test_recipes.py.
TEST_TOOLS = ("pytest", "rattler-build", "patchelf")
# Import names whose package in pixi.toml has another name; any other import is its package's name, `_` as `-`.
PACKAGE_OF_IMPORT = {
    "yaml": "pyyaml",
    "rattler": "py-rattler",
    "rattler_build": "py-rattler-build",
    "torch": "pytorch-cpu",
}
# An import inside a try that catches one of these is optional (the test skips or falls back without it).
IMPORT_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception"}
# Folders whose .py files are not the tests' own scripts: installed packages (src/) and what is not the project's.
NOT_SCRIPTS = {"src", "third_party", "build", "output", ".git", ".pixi"}
# A task that builds arch packages (ci/arches.py build, or rattler-build on an arch recipe) needs the core first.
ARCH_BUILD = re.compile(r"ci/arches\.py build|--recipe recipes/fp8gemm-(?!core)")


def schema_errors(manifest: dict, schema_path: Path = SCHEMA) -> list[str]:
    if hashlib.sha256(schema_path.read_bytes()).hexdigest() != SCHEMA_SHA256:
        return [f"schema: {schema_path} is not pixi's {PIXI_SOURCE['schema']} at {PIXI_SOURCE['commit'][:12]}"]
    import jsonschema  # the test extras'; a wrong copy is refused without it

    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"schema: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in IMPORT_GUARDS for n in names)


def unguarded_imports(tree: ast.AST) -> set[str]:
    """The top-level names of the absolute imports a module makes outside a try that catches ImportError, less the
    modules it asks for with pytest.importorskip (the module skips without them)."""
    found: set[str] = set()
    skipped = {
        node.args[0].value.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "importorskip"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import) and not guarded:
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not guarded:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Try):
            body_guarded = guarded or any(_catches_import_errors(h) for h in node.handlers)
            for child in node.body:
                visit(child, body_guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found - skipped


def own_packages(root: Path = ROOT) -> dict[str, str]:
    """Import name -> distribution name of the repository's packages (packages/*/src/<name>, bench/src/<name>)."""
    names = {}
    for pyproject in sorted([*root.glob("packages/*/pyproject.toml"), *root.glob("bench/pyproject.toml")]):
        project = tomllib.loads(pyproject.read_text())["project"]["name"]
        src = pyproject.parent / "src"
        names |= (
            {p.name: project for p in src.iterdir() if p.is_dir() and p.name.isidentifier()} if src.is_dir() else {}
        )
    return names


def test_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """Each module the test suite imports unguarded -> the files that do: the tests and the repository's scripts they
    import (tests/, ci/ and the like, found by name and followed), less the standard library and those scripts."""
    scripts: dict[str, list[Path]] = {}
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in NOT_SCRIPTS)
        for name in sorted(f for f in files if f.endswith(".py")):
            scripts.setdefault(name[:-3], []).append(Path(folder) / name)
    queue = sorted((root / "tests").glob("*.py"))
    seen, imports = set(queue), {}
    while queue:
        path = queue.pop(0)
        for module in sorted(unguarded_imports(ast.parse(path.read_text()))):
            if module in scripts:
                queue += [p for p in scripts[module] if p not in seen]
                seen.update(scripts[module])
            elif module not in sys.stdlib_module_names:
                imports.setdefault(module, []).append(str(path.relative_to(root)))
    return imports


def _default_environment_packages(manifest: dict) -> set[str]:
    tables = [manifest, *(manifest.get("feature", {}).get(f, {}) for f in _env_features(manifest).get("default", []))]
    return {name for t in tables for key in ("dependencies", "pypi-dependencies") for name in t.get(key, {})}


def test_dependency_errors(manifest: dict, root: Path = ROOT) -> list[str]:
    """Every package the test suite imports (and runs) is in the default environment, so `pixi run test` collects."""
    own = own_packages(root)
    needed = {tool: ["the test command"] for tool in TEST_TOOLS}
    for module, files in test_imports(root).items():
        package = own.get(module) or PACKAGE_OF_IMPORT.get(module, module.replace("_", "-"))
        needed.setdefault(package, []).extend(files)
    missing = sorted(set(needed) - _default_environment_packages(manifest))
    if not missing:
        return []
    users = "; ".join(f"{p}: {', '.join(needed[p][:3])}" for p in missing)
    return [f"the default environment lacks test dependencies {missing} ({users})"]


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
    errors += test_dependency_errors(manifest, root)
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
    errors = schema_errors(manifest) + cross_reference_errors(manifest)
    print(f"pixi.toml: validated against {SCHEMA.relative_to(ROOT)} (prefix-dev/pixi {PIXI_SOURCE['schema']})")
    for e in errors:
        print(f"pixi.toml: {e}")
    print(
        f"pixi.toml: platform rules of prefix-dev/pixi@{PIXI_SOURCE['commit'][:12]} ({PIXI_SOURCE['platform_table']})"
    )
    print(f"pixi.toml: {'FAILED' if errors else 'ok'} ({len(errors)} problem(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
