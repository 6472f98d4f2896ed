"""Build an arch package's wheel without a GPU and read its machine code (SASS / AMDGPU ISA)."""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def require_tool(name: str) -> str:
    """The tool's path; a skip where it is missing, but a failure in CI (CI must have it)."""
    path = shutil.which(name) or _pip_nvidia_tool(name)
    if path:
        return path
    how = _SETUP_INSTALLS.get(name)
    message = f"{name} not found ({f'bash ci/setup.sh installs it {how}' if how else 'install it on this machine'})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


_SETUP_INSTALLS = {
    **dict.fromkeys(("nvcc", "cuobjdump", "nvdisasm"), "from PyPI"),
    **dict.fromkeys(("clang++-19", "llvm-objdump-19"), "with apt-get, when run as root"),
}


def _pip_nvidia_bin_dirs() -> list[Path]:
    # The nvidia-cuda-nvcc / -cuobjdump / -nvdisasm wheels put their binaries under site-packages/nvidia/cu*/bin
    # (this interpreter's, or the base one's under a venv with system site packages).
    roots = dict.fromkeys([sysconfig.get_paths()["purelib"], *site.getsitepackages()])
    return [d for root in roots for d in sorted(Path(root).glob("nvidia/cu*/bin"))]


def search_path() -> str:
    """PATH with PyPI's CUDA tools after it (ci/setup.sh installs nvcc there where the machine has none), so a
    package build's CMake finds the nvcc that require_tool found."""
    return os.pathsep.join([os.environ.get("PATH", ""), *map(str, _pip_nvidia_bin_dirs())])


def _pip_nvidia_tool(name: str) -> str | None:
    return next((str(d / name) for d in _pip_nvidia_bin_dirs() if (d / name).is_file()), None)


def build_wheel(package: str, out_dir: Path, env: dict[str, str] | None = None, root: Path = ROOT) -> Path:
    """The wheel of packages/<package> under `root` (default: this checkout), built with its own CMakeLists.txt."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out_dir),
        str(root / "packages" / package),
    ]
    env = {**os.environ, "PATH": search_path(), **(env or {})}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    (wheel,) = out_dir.glob("*.whl")
    return wheel


def exported_symbols(readelf: str, library: Path) -> set[str]:
    """The names a shared library defines for other objects: its dynamic symbols that are neither local nor undefined."""
    syms = subprocess.run(
        [readelf, "--dyn-syms", "-W", str(library)], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split() for line in syms.splitlines()]
    # Num: Value Size Type Bind Vis Ndx Name
    return {r[7] for r in rows if len(r) >= 8 and r[0][:-1].isdigit() and r[4] != "LOCAL" and r[6] != "UND"}


def extract_module(wheel: Path, out_dir: Path, pattern: str = r"_C\..*\.so$") -> Path:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if re.search(pattern, n)]
        zf.extract(name, out_dir)
    return out_dir / name


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]+)")


@functools.cache  # one disassembly per binary: the SASS tests of a module all read it
def sass_by_function(cuobjdump: str, binary: Path) -> dict[str, str]:
    """Each function's (mangled name) SASS text. Cached: do not modify the result."""
    env = {**os.environ, "PATH": f"{Path(cuobjdump).parent}:{os.environ['PATH']}"}  # it calls nvdisasm
    sass = subprocess.run([cuobjdump, "-sass", str(binary)], capture_output=True, text=True, env=env, check=True).stdout
    parts = re.split(r"^\s*Function : (\S+)\s*$", sass, flags=re.M)  # preamble, name, body, name, body, ...
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def sass_opcode_sequences(cuobjdump: str, binary: Path) -> dict[str, list[str]]:
    """Each function's (mangled name) opcodes in program order."""
    return {name: _OPCODE.findall(body) for name, body in sass_by_function(cuobjdump, binary).items()}


def sass_opcodes_by_function(cuobjdump: str, binary: Path) -> dict[str, collections.Counter]:
    """Opcode counts of each function (mangled name) in the binary's SASS."""
    return {name: collections.Counter(ops) for name, ops in sass_opcode_sequences(cuobjdump, binary).items()}


def sass_opcodes(cuobjdump: str, binary: Path) -> collections.Counter:
    return sum(sass_opcodes_by_function(cuobjdump, binary).values(), collections.Counter())


def needed_libraries(binary: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)


def sm90a_host_driver(out_dir: Path, source: str):
    """A C++ driver over fp8gemm-cuda-sm90a's plain-C++ headers (heuristics, tile order), built with the host
    compiler; returns a function that runs it on a stdin text and gives back its stdout."""
    cxx = require_tool("g++")
    csrc = ROOT / "packages" / "fp8gemm-cuda-sm90a" / "csrc"
    core_include = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"
    (out_dir / "driver.cpp").write_text(source)
    source, driver = str(out_dir / "driver.cpp"), str(out_dir / "driver")
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{csrc}", f"-I{core_include}", source, "-o", driver], check=True)

    def run(stdin_text: str) -> str:
        return subprocess.run(
            [str(out_dir / "driver")], input=stdin_text, capture_output=True, text=True, check=True
        ).stdout

    return run
