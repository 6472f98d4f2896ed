"""The repository's stand-alone scripts (ci/, bench/) imported as modules, so tests can call their functions."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from isa import ROOT


def load_script(relative_path: str) -> ModuleType:
    """The script at `relative_path` (from the repository root), executed as a module named after its file."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
