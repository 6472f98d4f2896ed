"""Validate pixi.toml: JSON schema (../shared/pixi-manifest-schema.json when present) plus
cross-references the schema cannot see (features, platforms, tasks, paths). Exit 1 on any problem."""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT.parent / "shared" / "pixi-manifest-schema.json"


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
    for recipe in sorted((root / "recipes").glob("*/recipe.yaml")):
        if recipe.parent.name not in (root / "pixi.toml").read_text():
            errors.append(f"recipe {recipe.parent.name} is built by no pixi task")
    return errors


def main() -> int:
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    errors = cross_reference_errors(manifest)
    if SCHEMA.exists():
        errors = schema_errors(manifest) + errors
    else:
        print(f"note: {SCHEMA} not found; schema validation skipped, cross-references checked")
    for e in errors:
        print(f"pixi.toml: {e}")
    print(f"pixi.toml: {'FAILED' if errors else 'ok'} ({len(errors)} problem(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
