"""The arch manifest: every packages/<package>/arch.toml, the one place an arch package's facts live.

Read by the recipes' generation and checks (ci/render_recipes.py), the offline solve (ci/conda_offline.py), the
machine-code checks (ci/compare_sass.py, tests/test_build_cuda.py), the GPU script (ci/gpu/run.sh build), the pixi
build tasks and the GPU tables of README.md and docs/install.md.

python3 ci/arches.py tables             rewrite the generated GPU tables in README.md and docs/install.md
python3 ci/arches.py tables --check     exit 1 when they differ from the manifest
python3 ci/arches.py gpu-builds T...    one line per build that runs on a GPU with targets T: package [VAR=value ...]
python3 ci/arches.py build TOOLCHAIN [rattler-build args]   build every arch recipe of that pixi environment
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TABLE_DOCS = {"support": ROOT / "README.md", "install": ROOT / "docs" / "install.md"}
CORE_SUPPORT_ROW = "| `fp8gemm-core` | any | the reference on CPU and any torch GPU; tested in CI and on H100/H200 |"


@dataclasses.dataclass(frozen=True)
class Arch:
    package: str  # fp8gemm-cuda-sm90a
    backend: str  # sm90a: the entry point's name
    platform: str  # cuda or rocm
    target: str  # sm_90a, gfx942
    gpus: str
    toolchain: str  # the pixi environment that builds it: cuda128, rocm63
    status: str
    gate: str  # __cuda_arch or __amdgpu_arch
    gate_version: str
    refused_on: str
    build_env: dict[str, str]
    test_build: dict | None = None  # {"target": "sm_90", "env": {...}}: the same source for another GPU
    isa: dict | None = None  # {"kernels": n, "opcodes": {prefix: minimum}}

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    @property
    def recipe(self) -> Path:
        return ROOT / "recipes" / self.package / "recipe.yaml"


def load(path: Path) -> Arch:
    data = tomllib.loads(path.read_text())
    gate = data["gate"]
    return Arch(
        package=path.parent.name,
        backend=data["backend"],
        platform=data["platform"],
        target=data["target"],
        gpus=data["gpus"],
        toolchain=data["toolchain"],
        status=data["status"],
        gate=gate["name"],
        gate_version=gate["version"],
        refused_on=gate["refused_on"],
        build_env=dict(data.get("build", {}).get("env", {})),
        test_build=data.get("test_build"),
        isa=data.get("isa"),
    )


def arches(root: Path = ROOT) -> list[Arch]:
    return [load(p) for p in sorted((root / "packages").glob("fp8gemm-*/arch.toml"))]


def by_package(root: Path = ROOT) -> dict[str, Arch]:
    return {a.package: a for a in arches(root)}


# --- the GPU tables of README.md ("support") and docs/install.md ("install") ---------------------------


def table(kind: str, items: list[Arch]) -> str:
    if kind == "support":
        rows = ["| package | GPU | status |", "|---|---|---|", CORE_SUPPORT_ROW]
        rows += [f"| `{a.package}` | {a.gpus} | {a.status} |" for a in items]
    else:
        rows = ["| GPU | package | virtual package the solver checks |", "| --- | --- | --- |"]
        rows += [f"| {a.gpus} ({a.target}) | `{a.package}` | `{a.gate} {a.gate_version}` |" for a in items]
    return "\n".join(rows)


def _marked(kind: str) -> re.Pattern:
    return re.compile(rf"(<!-- gpu-table:{kind} .*?-->\n)(.*?)(\n<!-- /gpu-table -->)", re.S)


def synced(kind: str, text: str, items: list[Arch]) -> str:
    pattern = _marked(kind)
    if not pattern.search(text):
        raise ValueError(f"no <!-- gpu-table:{kind} ... --> block")
    return pattern.sub(lambda m: m.group(1) + table(kind, items) + m.group(3), text)


def table_errors(root: Path = ROOT) -> list[str]:
    items = arches(root)
    errors = []
    for kind, doc in TABLE_DOCS.items():
        doc = root / doc.relative_to(ROOT)
        text = doc.read_text()
        if synced(kind, text, items) != text:
            errors.append(f"{doc.relative_to(root)}: the {kind} table differs from packages/*/arch.toml")
    return errors


def write_tables() -> None:
    items = arches()
    for kind, doc in TABLE_DOCS.items():
        doc.write_text(synced(kind, doc.read_text(), items))


# --- builds -----------------------------------------------------------------------------------------------


def gpu_builds(targets: list[str]) -> list[str]:
    """Every build whose machine code runs on a GPU with ``targets``: its shipped build or its test build."""
    lines = []
    for a in arches():
        for target, env in ((a.target, a.build_env), *([(a.test_build["target"], a.test_build["env"])] if a.test_build else [])):  # fmt: skip
            if target in targets:
                lines.append(" ".join([a.package, a.backend, *(f"{k}={v}" for k, v in env.items())]))
    return lines


def build(toolchain: str, extra: list[str]) -> int:
    """rattler-build every arch recipe built in ``toolchain``, with that environment's variant file."""
    chosen = [a for a in arches() if a.toolchain == toolchain]
    if not chosen:
        print(f"no arch package is built in {toolchain!r}", file=sys.stderr)
        return 1
    for a in chosen:
        cmd = ["rattler-build", "build", "--recipe", str(a.recipe.parent),
               "--variant-config", str(ROOT / "recipes" / "variants" / f"{toolchain}.yaml"), *extra]  # fmt: skip
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["tables"]:
        if "--check" in argv:
            errors = table_errors()
            print("\n".join(errors) or "GPU tables match packages/*/arch.toml")
            return 1 if errors else 0
        write_tables()
        return 0
    if argv[:1] == ["gpu-builds"]:
        print("\n".join(gpu_builds(argv[1:])))
        return 0
    if argv[:1] == ["build"] and len(argv) >= 2:
        return build(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
