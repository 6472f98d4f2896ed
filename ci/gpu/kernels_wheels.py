"""The `kernels` wheels (and its `kernels_data` of the same version, where one exists) in a folder that the installed
transformers accepts: the newest version in KERNELS_MIN_VERSION .. KERNELS_MAX_VERSION of
transformers/utils/import_utils.py (docs/transformers.md, "Versions"). Prints their paths, or exits 1.

Usage: python3 ci/gpu/kernels_wheels.py FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.version import Version


def accepted_range() -> tuple[Version, Version]:
    from transformers.utils import import_utils

    return Version(import_utils.KERNELS_MIN_VERSION), Version(import_utils.KERNELS_MAX_VERSION)


def wheels(folder: Path, low: Version, high: Version) -> list[Path]:
    by_version: dict[Version, list[Path]] = {}
    for wheel in folder.glob("kernels*.whl"):
        name, version = wheel.name.split("-")[:2]
        if name in ("kernels", "kernels_data"):
            by_version.setdefault(Version(version), []).append(wheel)
    fits = [v for v in by_version if low <= v < high and any(w.name.startswith("kernels-") for w in by_version[v])]
    return sorted(by_version[max(fits)]) if fits else []


def main() -> int:
    low, high = accepted_range()
    found = wheels(Path(sys.argv[1]), low, high)
    if not found:
        print(f"no kernels wheel in {sys.argv[1]} within >= {low}, < {high}", file=sys.stderr)
        return 1
    print(" ".join(map(str, found)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
