"""The README's "Use" block runs as written: on a GPU where there is one, else on the CPU reference."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def use_block() -> str:
    """The first Python block of the README's "Use" section."""
    section = (ROOT / "README.md").read_text().split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_use_block_runs_as_written():
    check = (
        "\nassert y.shape == (4, 2112) and y.dtype == torch.bfloat16 and bool(torch.isfinite(y.float()).all())"
        "\nassert report.converted and model(x).shape == (4, 7168)\n"
    )
    run = subprocess.run([sys.executable, "-c", use_block() + check], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    if not torch.cuda.is_available():  # the CPU path says once that it is the slow reference
        assert run.stderr.count("pure-torch reference") == 1, run.stderr
