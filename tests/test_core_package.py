"""What the fp8gemm-core package holds: what users import (no benchmark or peer module in its wheel, no plotting or
table library pulled by ``import fp8gemm``, torch its only dependency), and how the benchmarks' package reaches it
(public names, and the internal modules listed here); no module of either reaches another's private names."""

from __future__ import annotations

import ast
import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "packages" / "fp8gemm-core"
BENCH = ROOT / "bench" / "src" / "fp8gemm_bench"
# Libraries the benchmarks use and the library must not import.
BENCH_ONLY = {"matplotlib", "rich", "pandas", "fp8gemm_bench"}
# The public subpackages (docs: nn, hf; fp8gemm.testing, the conformance suite) beside fp8gemm.__all__.
PUBLIC_SUBPACKAGES = ("fp8gemm.nn", "fp8gemm.hf", "fp8gemm.testing", "fp8gemm.training")
# The core modules the benchmarks import beyond the public API, and why.
INTERNAL_ENTRIES = {
    "fp8gemm.reference": "oracle and expand_scales: the float64 reference every path is checked against",
    "fp8gemm.moe_reference": "the experts layer's float64 reference",
    "fp8gemm.registry": "the backend a run selects, reported with its timings",
    "fp8gemm.protocol": "argument structs and layout codes: the raw-entry floor and which grouped kernels exist",
    "fp8gemm.runtime": "fast_backend and raw_stream: the launches' cost without Python (layer_bench)",
    "fp8gemm.grouped_checks": "uses_grouped_kernel: whether ours ran a kernel or the reference",
    "fp8gemm.cli_args": "the options and error wording `fp8gemm bench` shares with the core's commands",
}


def test_import_fp8gemm_pulls_no_plotting_or_table_library():
    code = "import sys, fp8gemm; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert set(run.stdout.split()) & BENCH_ONLY == set()


@pytest.fixture(scope="module")
def core_wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The core's wheel, built from a copy of its source (the checkout's own build/ folders stay untouched)."""
    tmp = tmp_path_factory.mktemp("core_wheel")
    source = tmp / "fp8gemm-core"
    shutil.copytree(CORE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(tmp / "dist")], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("fp8gemm_core-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        yield zf


def test_the_core_wheel_holds_no_benchmark_or_peer_module(core_wheel):
    names = core_wheel.namelist()
    assert "fp8gemm/testing/conformance.py" in names and "fp8gemm/cli.py" in names  # what users import is there
    assert [n for n in names if "bench" in Path(n).name or "peers" in Path(n).name] == []


def test_the_core_depends_on_torch_alone(core_wheel):
    (metadata,) = [n for n in core_wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = email.parser.Parser().parsestr(core_wheel.read(metadata).decode()).get_all("Requires-Dist")
    assert [r for r in requires if "extra ==" not in r] == ["torch>=2.4"]


def _private_reaches(path: Path) -> list[str]:
    """Every ``from X import _name`` and ``module._name`` in ``path`` where X or module is fp8gemm's or the bench's."""
    tree, modules, found = ast.parse(path.read_text()), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or node.module.split(".")[0] in ("fp8gemm", "fp8gemm_bench")
        ):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(
                        f"{path.name}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {alias.name}"
                    )
                modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def _core_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every import of fp8gemm in ``path``: ``from X import name``, or ``import X`` (name "")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "fp8gemm":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names if alias.name.split(".")[0] == "fp8gemm"]
    return found


BENCH_MODULES = sorted(BENCH.glob("*.py"))
CORE_MODULES = sorted((CORE / "src" / "fp8gemm").rglob("*.py"))


@pytest.mark.parametrize("path", BENCH_MODULES + CORE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reaches_another_modules_private_names(path):
    assert _private_reaches(path) == []


@pytest.mark.parametrize("path", BENCH_MODULES, ids=lambda p: p.name)
def test_the_bench_reaches_the_core_through_its_api_and_the_listed_entries(path):
    import fp8gemm

    public = {*fp8gemm.__all__, "__version__"}
    wrong = []
    for line, module, name in _core_imports(path):
        target = f"{module}.{name}" if module == "fp8gemm" and name and name not in public else module
        if target != "fp8gemm" and not target.startswith(PUBLIC_SUBPACKAGES) and target not in INTERNAL_ENTRIES:
            wrong.append(f"{path.name}:{line}: {target} is neither fp8gemm's API nor listed in INTERNAL_ENTRIES")
    assert wrong == []
