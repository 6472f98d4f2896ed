"""Machine code of the arch packages before and after a source change, kernel by kernel, without a GPU.

python3 ci/compare_sass.py [--base REF] [--head REF] [--new NAME ...] [--keep DIR] [TARGET ...]

TARGET: an arch package's backend name (its shipped build) or <backend>-<test target> for its test build, as
packages/*/arch.toml states them (sm90a, sm120, sm120-sm90, gfx942); default all.
Each TARGET's package is built twice with its own CMakeLists.txt (pip wheel, the flags it ships with): from
git REF (default main) and from the working tree, each against its own fp8gemm-core. Each kernel's SASS (cuobjdump -sass: every instruction
with its encoding) and resource usage (cuobjdump -res-usage), or AMDGPU ISA (llvm-objdump-19), is then
paired with the kernel of identical code in the other build, whatever their names: a refactor that only
moves and renames code leaves every kernel paired and the exit status 0. Unpaired kernels are listed
with the first differing lines against the nearest kernel of the same instruction count, and the exit
status is 1. Kernels added since REF are named with --new (a part of their mangled name, e.g. quantize_kernel):
unpaired kernels of the working tree that match are listed as new and pass; a --new that matches none fails.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci"))
import arches  # noqa: E402
from isa import build_wheel, require_tool  # noqa: E402


def _targets() -> dict[str, tuple[str, dict, str]]:
    """name: (package, build environment, disassembler), from the arch manifest."""
    out = {}
    for a in arches.arches():
        tool = "sass" if a.platform == "cuda" else "amdgpu"
        out[a.backend] = (a.package, a.build_env, tool)
        if a.test_build:
            out[f"{a.backend}-{a.test_build['target'].replace('_', '')}"] = (a.package, a.test_build["env"], tool)
    return out


TARGETS = _targets()
_ADDRESS = re.compile(r"/\*[0-9a-f]{4}\*/")
_ISA_ADDRESS = re.compile(r"// [0-9A-F]+:")  # llvm-objdump's "// 00000000ADDR: ENCODING" comment
_SYMBOL = re.compile(r"<[^<>+\s]+(\+0x[0-9a-f]+)?>")  # a branch target as <function+offset>


def sass_kernels(module: Path) -> dict[str, str]:
    """Each kernel's SASS (instructions and encodings) plus its resource usage line, by mangled name."""
    cuobjdump = require_tool("cuobjdump")
    env = {**os.environ, "PATH": f"{Path(cuobjdump).parent}:{os.environ['PATH']}"}  # it calls nvdisasm
    sass = subprocess.run([cuobjdump, "-sass", str(module)], capture_output=True, text=True, env=env, check=True)
    parts = re.split(r"^\s*Function : (\S+)\s*$", sass.stdout, flags=re.M)
    usage = subprocess.run([cuobjdump, "-res-usage", str(module)], capture_output=True, text=True, check=True).stdout
    resources = dict(re.findall(r"Function (\S+):\s*\n?\s*(REG:.*)", usage))
    kernels = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [" ".join(line.split()) for line in body.splitlines()]  # column widths vary with the file
        code = [line for line in lines if line.startswith("/*") and not line.startswith("/* 0x")]
        encodings = [line for line in lines if line.startswith("/* 0x")]
        kernels[name] = "\n".join([resources.get(name, ""), *code, *encodings])
    return kernels


def amdgpu_kernels(elfs: list[Path], mcpu: str) -> dict[str, str]:
    """Each function's AMDGPU ISA (llvm-objdump-19 -d --mcpu=<target>) in the device code objects, encodings kept.

    Absolute addresses and the function names in branch targets are dropped: a longer symbol table or a renamed
    kernel moves every function's address without changing its code.
    """
    objdump = require_tool("llvm-objdump-19")
    kernels = {}
    for elf in elfs:
        asm = subprocess.run([objdump, "-d", f"--mcpu={mcpu}", str(elf)], capture_output=True, text=True, check=True)
        parts = re.split(r"^[0-9a-f]+ <(\S+)>:\s*$", asm.stdout, flags=re.M)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            lines = [_SYMBOL.sub(r"<\1>", _ISA_ADDRESS.sub("//", " ".join(line.split()))) for line in body.splitlines()]
            code = [line for line in lines if line]
            if not all(line.startswith("s_nop") for line in code):  # not alignment padding before a function
                kernels[name] = "\n".join(code)
    return kernels


def build_kernels(tree: Path, target: str, work: Path) -> dict[str, str]:
    package, env, kind = TARGETS[target]
    mcpu = arches.by_package()[package].target
    core = tree / "packages" / "fp8gemm-core" / "src"  # the tree's own headers and CMake function
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(core), os.environ.get("PYTHONPATH")]))}
    (work / "wheel").mkdir(parents=True)
    wheel = build_wheel(package, work / "wheel", env, root=tree)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(work / "site")
    if kind == "amdgpu":
        return amdgpu_kernels(sorted((work / "site").glob(f"*/isa/*{mcpu}.elf")), mcpu)
    return sass_kernels(next((work / "site").glob("*/_C*.so")))


def instruction_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if _ADDRESS.match(line) or " // " in line)


def compare(base: dict[str, str], head: dict[str, str]) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """Kernels paired by identical code (base name, head name), and the unpaired ones of each side."""
    by_code: dict[str, list[str]] = {}
    for name, code in head.items():
        by_code.setdefault(code, []).append(name)
    pairs, unpaired_base = [], []
    for name, code in sorted(base.items()):
        if by_code.get(code):
            pairs.append((name, by_code[code].pop(0)))
        else:
            unpaired_base.append(name)
    unpaired_head = sorted(name for names in by_code.values() for name in names)
    return pairs, unpaired_base, unpaired_head


def split_new(unpaired_head: list[str], new: list[str]) -> tuple[list[str], list[str]]:
    """The unpaired kernels of the new build that match a --new name, and the rest."""
    added = [name for name in unpaired_head if any(part in name for part in new)]
    return added, [name for name in unpaired_head if name not in added]


def nearest_diff(code: str, others: dict[str, str], lines: int = 12) -> str:
    if not others:
        return "  (no kernel left in the other build)"
    name = min(others, key=lambda n: abs(instruction_count(others[n]) - instruction_count(code)))
    diff = difflib.unified_diff(code.splitlines(), others[name].splitlines(), lineterm="", n=0)
    return f"  nearest: {name}\n" + "\n".join("    " + line for line in list(diff)[2 : 2 + lines])


def checkout(revision: str, tree: Path) -> Path:
    """The packages/ folder of a git revision, under `tree`."""
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "packages"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=list(TARGETS), help=", ".join(TARGETS))
    parser.add_argument("--base", default="main", help="git revision to compare the working tree against")
    parser.add_argument("--head", help="git revision to compare instead of the working tree")
    parser.add_argument(
        "--new",
        action="append",
        default=[],
        metavar="NAME",
        help="a kernel added since --base (part of its mangled name): listed as new, not a difference; repeatable",
    )
    parser.add_argument("--keep", type=Path, help="build here and keep the builds (default: a temporary folder)")
    args = parser.parse_args(argv)
    if unknown := set(args.targets) - set(TARGETS):
        parser.error(f"unknown target {sorted(unknown)}: choose from {', '.join(TARGETS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        base_tree = checkout(args.base, work / "base")
        head_tree = checkout(args.head, work / "head") if args.head else ROOT
        failed, matched = False, set()
        for target in args.targets:
            base = build_kernels(base_tree, target, work / f"{target}-base")
            head = build_kernels(head_tree, target, work / f"{target}-head")
            pairs, only_base, only_head = compare(base, head)
            added, only_head = split_new(only_head, args.new)
            matched |= {part for part in args.new for name in added if part in name}
            same = sum(a == b for a, b in pairs)
            print(
                f"{target}: {len(pairs)} of {len(base)} kernels identical ({same} under the same name), {len(added)} new"
            )
            for a, b in pairs:
                if a != b:
                    print(f"  {a}\n    = {b}")
            for name in only_base:
                print(f"  only in {args.base}: {name}\n{nearest_diff(base[name], {n: head[n] for n in only_head})}")
            for name in only_head:
                print(f"  only in {args.head or 'the working tree'}: {name}")
            for name in added:
                print(f"  new: {name}")
            failed |= bool(only_base or only_head)
        if unmatched := [part for part in args.new if part not in matched]:
            print(f"--new {' '.join(unmatched)}: no new kernel of {' '.join(args.targets)} matches")
            failed = True
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
