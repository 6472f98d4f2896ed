"""Validate pixi.toml: JSON schema (shared/pixi-manifest-schema.json, found from any checkout: $PIXI_MANIFEST_SCHEMA,
else a shared/ folder beside the checkout or any folder above it, else beside the main checkout of a git worktree)
plus what the schema cannot see: features, platforms, task order, paths, requires-pixi against the features
used, the test dependencies. Exit 1 on any problem."""

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
# The oldest pixi that reads each platform-table key (0.71: inline platform tables themselves).
PIXI_FOR_PLATFORM_KEY = {"cuda": (0, 71), "amdgpu": (0, 82)}
# Modules the test suite imports at collection, as conda packages of the default environment.
TEST_DEPENDENCIES = ("pytest", "hypothesis", "jsonschema", "pyyaml", "py-rattler", "rattler-build", "patchelf")


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


def _platform_names(manifest: dict) -> set[str]:
    names = set()
    for p in manifest["workspace"]["platforms"]:
        names.add(p if isinstance(p, str) else p.get("name", p.get("platform")))
    return names


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
    used = {
        k for p in manifest["workspace"]["platforms"] if isinstance(p, dict) for k in p if k in PIXI_FOR_PLATFORM_KEY
    }
    need = max((PIXI_FOR_PLATFORM_KEY[k] for k in used), default=(0,))
    return [f"requires-pixi {floor} is below {need}, which platform keys {sorted(used)} need"] if floor < need else []


def build_order_errors(manifest: dict) -> list[str]:
    """Every task that builds an arch recipe first builds the core it needs in its host environment."""
    errors = []
    for name, feat in manifest.get("feature", {}).items():
        for task_name, task in feat.get("tasks", {}).items():
            cmd = task.get("cmd", "") if isinstance(task, dict) else task
            if "--recipe recipes/fp8gemm-" in cmd and "fp8gemm-core" not in cmd and "build-core" not in _depends(task):
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
    errors += requires_pixi_errors(manifest) + build_order_errors(manifest)
    for recipe in sorted((root / "recipes").glob("*/recipe.yaml")):
        if recipe.parent.name not in (root / "pixi.toml").read_text():
            errors.append(f"recipe {recipe.parent.name} is built by no pixi task")
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
    print(f"pixi.toml: {'FAILED' if errors else 'ok'} ({len(errors)} problem(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
