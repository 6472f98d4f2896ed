"""docs/install.md's pip path, followed as typed in a fresh clone: the core, then an arch package built
against it (the tested sm_90a package with nvcc, gfx942 with clang++-19 as the document says), and `fp8gemm info`
sees it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from isa import require_tool

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "install.md"


def pip_commands(doc: Path = DOC) -> list[str]:
    block = re.search(r"<!-- pip-from-checkout:.*?-->\n```bash\n(.*?)```", doc.read_text(), re.S)
    assert block, f"{doc.name} lost its pip-from-checkout block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_shows_the_tested_pip_commands():
    """The README's install block is the one the tests below follow as typed."""
    assert pip_commands(ROOT / "README.md") == pip_commands()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh clone of this checkout's HEAD and an environment whose only fp8gemm is what the doc installs
    (the machine's torch and build tools stay visible, as the doc's prerequisites)."""
    tmp = tmp_path_factory.mktemp("install")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "fp8gemm")], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")], check=True)
    env = {**os.environ, "PATH": f"{tmp / 'venv' / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(tmp / "venv")}
    env.pop("PYTHONPATH", None)
    return tmp / "fp8gemm", env


def _run(line: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    run = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"{line}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


def _installed(cwd: Path, env: dict) -> dict:
    return {b["name"]: b for b in json.loads(_run("fp8gemm info --json --device cpu", cwd, env).stdout)["installed"]}


def test_the_documented_pip_commands_install_the_core_and_sm90a(clone):
    nvcc = require_tool("nvcc")  # the doc's prerequisite: nvcc on PATH (ci/setup.sh may have it from PyPI)
    repo, env = clone
    env = {**env, "PATH": f"{Path(nvcc).parent}:{env['PATH']}"}
    commands = pip_commands()
    assert commands[0] == "pip install ./packages/fp8gemm-core"
    # The arch package tested on its GPU.
    assert commands[2] == "pip install --no-build-isolation ./packages/fp8gemm-cuda-sm90a"
    for line in commands:
        _run(line, repo, env)
    sm90a = _installed(repo, env)["sm90a"]
    assert sm90a["error"] is None and sm90a["distribution"] == "fp8gemm-cuda-sm90a"
    where = _run("python -c 'import fp8gemm, fp8gemm_cuda_sm90a as m; print(fp8gemm.__file__, m.__file__)'", repo, env)
    venv = env["VIRTUAL_ENV"]
    assert [p.startswith(venv) for p in where.stdout.split()] == [True, True], where.stdout  # what the doc installed


def test_the_documented_gfx942_line_without_rocm(clone):
    require_tool("clang++-19")
    repo, env = clone
    (line,) = re.findall(r"`(FP8GEMM_HIP_COMPILER=clang\+\+-19 .*?rocm-gfx942)`", DOC.read_text())
    _run("pip install ./packages/fp8gemm-core", repo, env)
    _run(line, repo, env)
    gfx942 = _installed(repo, env)["gfx942"]
    assert gfx942["error"] is None and gfx942["targets"] == ["gfx942"]
