"""What a built arch module does on the host alone, checked without a GPU (tests/test_build_*.py): its grouped launch
refuses, before any device call, what the core's fp8gemm/grouped_launch.hpp refuses, in that header's one message
format; and it states the leading-dimension multiple of its A scales, which its backend.py reads back."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from fp8gemm.protocol import GROUPED_ARGS, GROUPED_CONTIGUOUS, GROUPED_MASKED, GROUPED_ROW_IDS

MAX_SIZE = 2**31 - 257  # fp8gemm/grouped_launch.hpp kGroupedMaxSize: the largest m, n, k or groups
ONE = {"m": 1, "n": 128, "k": 128, "groups": 1, "layout": GROUPED_CONTIGUOUS}
SIZES = "m = {m}, n = {n}, k = {k}, groups = {groups}: each must lie in [0, 2^31 - 256)"
# Fields of a grouped launch (null pointers: none gets past the checks to the device), the words of its refusal: an
# arch whose kernel walks row ids (fp8gemm/grouped_launch.hpp's row_ids) takes layout 2 and names it among its layouts.
LAYOUTS_TAKEN = {False: "contiguous and masked are", True: "contiguous, masked and row ids are"}
SIZES_REFUSED = [({name: value}, None) for name in ("m", "n", "k", "groups") for value in (-1, MAX_SIZE + 1)]


def refused(row_ids: bool) -> list[tuple[dict, str | None]]:
    taken = LAYOUTS_TAKEN[row_ids]
    layouts = [-1, GROUPED_ROW_IDS + 1] + ([] if row_ids else [GROUPED_ROW_IDS])
    return [({"layout": layout}, f"layout {layout} is not supported ({taken})") for layout in layouts] + SIZES_REFUSED


def load_extension(path: Path) -> ModuleType:
    """The compiled module at ``path`` (<package>/_C*.so), imported under its full name (the interpreter keeps one
    module per name of a single-phase extension) without touching sys.modules."""
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grouped_args(**fields: int) -> int:
    values = {**ONE, **fields}
    return GROUPED_ARGS.pack(*(values.get(name, 0) for name in GROUPED_ARGS.fields))


def check_grouped_refusals(module: ModuleType, package: str, tiles_on_host: bool, row_ids: bool = False) -> None:
    """Each of :func:`refused` raises ValueError "<package>: grouped_launch: <words>"; the largest sizes and any empty
    launch pass the checks and return before the device (n = 0: nothing to write). ``tiles_on_host``: the arch counts
    its plan's tiles without a device query, so a launch of 2^31 tiles or more is refused here too. ``row_ids``: its
    kernel takes the row-ids layout (an empty launch of it passes too)."""
    for fields, words in refused(row_ids):
        words = words or SIZES.format(**{**ONE, **fields})
        with pytest.raises(ValueError, match=re.escape(f"{package}: grouped_launch: {words}")):
            module.grouped_launch(grouped_args(**fields))
    empties = [{"m": 0}, {"n": 0}, {"groups": 0}, {"m": MAX_SIZE, "k": MAX_SIZE, "groups": MAX_SIZE, "n": 0}]
    for empty in empties + [{**e, "layout": GROUPED_ROW_IDS} for e in empties] * row_ids:
        module.grouped_launch(grouped_args(**empty))
    assert module.grouped_workspace_bytes(GROUPED_MASKED, MAX_SIZE, 128, 128, 8) == 0
    if tiles_on_host:
        # masked: M_max rows for each group; row ids: one group, but up to a run per row, each a tile of its own
        many = [{"m": MAX_SIZE, "groups": MAX_SIZE, "layout": GROUPED_MASKED}]
        for fields in many + [{"m": MAX_SIZE, "layout": GROUPED_ROW_IDS}] * row_ids:
            with pytest.raises(ValueError, match=rf"{package}: grouped_launch: \d+ x 1 tiles: one launch takes fewer"):
                module.grouped_launch(grouped_args(**fields))
