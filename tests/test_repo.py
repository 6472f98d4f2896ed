"""Repository configuration: pixi.toml validity and cross-references, CI wiring."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
import check_pixi  # noqa: E402

try:
    import tomllib
except ImportError:
    import tomli as tomllib


@pytest.fixture
def manifest():
    return tomllib.loads((ROOT / "pixi.toml").read_text())


def test_pixi_manifest_is_valid(manifest):
    pytest.importorskip("jsonschema")  # the test extras' (ci/setup.sh); a GPU image may lack it
    assert check_pixi.cross_reference_errors(manifest) == []
    assert check_pixi.schema_errors(manifest) == []


def test_schema_check_catches_unknown_keys(manifest):
    pytest.importorskip("jsonschema")
    manifest["workspace"]["bogus-key"] = 1
    manifest["tasks"]["test"]["not-a-field"] = True
    errors = check_pixi.schema_errors(manifest)
    assert any("bogus-key" in e for e in errors) and any("not-a-field" in e for e in errors)


def test_cross_reference_check_catches_dangling_names(manifest):
    manifest["environments"]["broken"] = ["no-such-feature"]
    manifest["feature"]["cuda128"]["tasks"]["build"]["depends-on"].append("no-such-task")
    manifest["feature"]["rocm63"]["platforms"] = ["linux-64-undeclared"]
    errors = "\n".join(check_pixi.cross_reference_errors(manifest))
    assert "undefined feature(s) ['no-such-feature']" in errors
    assert "depends on 'no-such-task'" in errors
    assert "linux-64-undeclared" in errors


def test_environments_and_tasks_the_users_run(manifest):
    assert {"default", "cuda128", "rocm63"} <= set(manifest["environments"])
    assert {"build", "test", "bench", "lint", "render"} <= set(manifest["tasks"])
    rocm = manifest["feature"]["rocm63"]["dependencies"]
    assert rocm["rocm-cmake"] == "6.3.*" and rocm["hipcc"] == "6.3.*"
    assert manifest["feature"]["cuda128"]["dependencies"]["cuda-version"].startswith("12.8")


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\S.*?)\s+# the test command$", readme, re.M)
    assert commands == ["bash ci/test.sh"], commands
    lines = (ROOT / ".ci/run").read_text().splitlines()
    ci = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["exec " + commands[0]]


def test_generated_wgmma_header_is_current():
    """csrc/wgmma.cuh is generated (one overload per tile width): it must match its generator."""
    gen = runpy.run_path(str(ROOT / "packages" / "fp8gemm-cuda-sm90a" / "tools" / "gen_wgmma.py"))
    assert gen["HEADER"].read_text() == gen["render"](), "run python packages/fp8gemm-cuda-sm90a/tools/gen_wgmma.py"


DOCS = sorted(p for p in ROOT.rglob("*.md") if not {".git", "node_modules", "build"} & set(p.relative_to(ROOT).parts))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
RESULTS = ROOT / "bench" / "results"


def test_every_relative_link_in_the_docs_resolves():
    broken = [
        f"{doc.relative_to(ROOT)}: {target}"
        for doc in DOCS
        for target in LINK.findall(doc.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (doc.parent / target).exists()
    ]
    assert broken == []


def test_result_files_are_named_by_gpu_date_and_subject_and_cited():
    """bench/results keeps what README and docs cite, each named <gpu>_<date>_<subject> (no run letters)."""
    cited = "\n".join(doc.read_text() for doc in DOCS)
    for path in RESULTS.iterdir():
        gpu, date, subject = re.fullmatch(r"([a-z0-9]+)_(\d{4}-\d\d-\d\d)_([a-z0-9_]+)\.\w+", path.name).groups()
        assert gpu in {"h100", "h200", "mi300x", "rtx5090"} and all(len(word) > 1 for word in subject.split("_"))
        assert f"bench/results/{path.name}" in cited, f"{path.name} is cited nowhere: delete it or cite it"


PRODUCT_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Words of the lab, not the product: where a script ran, how many times, against which goal.
LAB_WORDS = re.compile(
    r"GPU machine|this session|\bissue \d+|\b(?:two|three|four|five|six|\d+) runs\b|\bnot met\b|\btargets? (?:met|[<>]=?)",
    re.IGNORECASE,
)


def test_the_docs_describe_the_product_not_the_lab():
    """README and docs say what fp8gemm does, how fast and how it was measured: no run counts, goals or machines."""
    found = [
        f"{doc.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for doc in PRODUCT_DOCS
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        for match in [LAB_WORDS.search(line)]
        if match
    ]
    assert found == []


def test_the_gpu_script_has_the_documented_steps():
    """ci/gpu/run.sh refuses a step it does not have, and docs/benchmarks.md documents each of its steps."""
    script, doc = (ROOT / "ci/gpu/run.sh").read_text(), (ROOT / "docs/benchmarks.md").read_text()
    steps = re.search(r'^STEPS=" (.*) "$', script, re.M).group(1).split()
    assert {"build", "tests", "sanitize", "bench-layer", "bench-moe", "models", "ab"} <= set(steps)
    documented = re.findall(r"^\| `([a-z-]+)` \|", doc.split("## Running it on a GPU", 1)[1], re.M)
    assert documented == steps
    run = subprocess.run(["bash", "ci/gpu/run.sh", "no-such-step"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "unknown step 'no-such-step'" in run.stderr
