"""Lay out fp8gemm as a Hugging Face `kernels` repository: build/<variant>/ as kernels.get_kernel and
kernels.get_local_kernel load it, plus a kernel-builder build.toml describing the same sources.

python3 ci/build_hub.py [--out output/hub] [--wheel ARCH.whl ...] [--build PLATFORM ...] [--torch X.Y]

Variants (the names kernels/variants.py parses and resolves against the installed torch and its backend):
  torch-cpu                            noarch: the core, which runs the pure-torch reference on CPU
  torch<XY>-cu<XY>-x86_64-linux        the core plus every CUDA arch binary given (--wheel) or built (--build cuda)
  torch<XY>-rocm<XY>-x86_64-linux      the same for ROCm
Each variant holds metadata.json, an __init__.py exporting the core's API (plus matmul_2d, matmul_batched and
matmul_grouped, transformers' finegrained-fp8 interface: one layout serves both repository ids), and fp8gemm/: the
core's Python (its CLI left out) with its torch.library namespace (runtime.LIBRARY) and its backend entry-point group
renamed to the variant's id, so a Hub copy and an installed fp8gemm run side by side in one process; the arch packages
sit in fp8gemm/_bundled/ with their entry points, found only by this copy. The arch modules are built per Python
(pybind11): a variant carries one _C per Python whose wheel it was given.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arches  # noqa: E402

ROOT = arches.ROOT
CORE = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm"
NAME = "fp8gemm"
KERNEL_VERSION = 1  # the Hub's major version: bump on any API change (kernels' kernel-requirements.md)
LEFT_OUT = ("cli*.py", "__main__.py")  # the CLI needs rich, which a Hub kernel may not import
LIBRARY_LINE = re.compile(r'^LIBRARY = "fp8gemm"', re.M)
GROUP_LINE = re.compile(r'^ENTRY_POINT_GROUP = "fp8gemm\.backends"', re.M)
# Spellings that would bypass the renamed namespace or reach the installed core instead of this copy.
FORBIDDEN = re.compile(r'"fp8gemm::|torch\.ops\.fp8gemm\b|^\s*(from|import) fp8gemm\b', re.M)

INIT = '''"""fp8gemm, loaded by Hugging Face `kernels`: the core's API, with the arch binaries bundled in this variant."""

import importlib.metadata as _metadata
import pathlib as _pathlib
import sys as _sys

_DIST = _pathlib.Path(__file__).parent / "fp8gemm" / "_bundled" / "{dist}"


class _BundledBackends(_metadata.DistributionFinder):
    """Shows this copy's registry the entry points of the backends bundled beside it (a group only it reads)."""

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=_metadata.DistributionFinder.Context()):
        if context.name in (None, "{dist_name}") and _DIST.is_dir():
            yield _metadata.PathDistribution(_DIST)


if not any(type(f).__name__ == "_BundledBackends" and getattr(f, "dist", None) == _DIST for f in _sys.meta_path):
    _finder = _BundledBackends()
    _finder.dist = _DIST
    _sys.meta_path.append(_finder)

from .fp8gemm import *  # noqa: E402,F403
from .fp8gemm import __all__, __version__  # noqa: E402,F401

# transformers' fine-grained FP8 kernel interface: LOCAL_KERNELS=kernels-community/finegrained-fp8=<this repository>
from .fp8gemm.hf.finegrained_fp8 import matmul_2d, matmul_batched, matmul_grouped  # noqa: E402,F401
'''


def kernel_id(backend: str, payload: list[Path]) -> str:
    """Unique per build (kernels: ops live in torch.ops.<id>): the backend and a hash of every shipped file."""
    digest = hashlib.sha256()
    for path in sorted(payload):
        digest.update(path.name.encode() + path.read_bytes())
    return f"_{NAME}_{backend}_{digest.hexdigest()[:10]}"


def vendor_core(dest: Path, library: str) -> None:
    """The core's Python into ``dest`` with its op namespace and entry-point group renamed to ``library``."""
    for src in sorted(CORE.rglob("*.py")):
        rel = src.relative_to(CORE)
        if any(rel.match(pattern) for pattern in LEFT_OUT) or "__pycache__" in rel.parts:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(src.read_text())
    rename(dest / "runtime.py", LIBRARY_LINE, f'LIBRARY = "{library}"', "runtime.LIBRARY")
    rename(dest / "protocol.py", GROUP_LINE, f'ENTRY_POINT_GROUP = "{library}.backends"', "protocol.ENTRY_POINT_GROUP")
    left = [f"{p.relative_to(dest)}: {m.group(0).strip()}" for p in dest.rglob("*.py") for m in FORBIDDEN.finditer(p.read_text())]  # fmt: skip
    if left:
        raise SystemExit(f"the core names its namespace outside runtime.LIBRARY, which the Hub copy renames: {left}")


def rename(path: Path, line: re.Pattern, new: str, what: str) -> None:
    text, count = line.subn(new, path.read_text())
    if count != 1:
        raise SystemExit(f"{path.name}: expected one `{line.pattern.lstrip('^')}` line ({what}), found {count}")
    path.write_text(text)


def wheel_entry_points(zf: zipfile.ZipFile) -> dict[str, str]:
    (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read_string(zf.read(name).decode())
    return dict(parser["fp8gemm.backends"])


def build_info(so: Path) -> dict:
    """The module's build_info(), read in a fresh interpreter (the module loads without a GPU)."""
    code = (
        "import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('_C', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(json.dumps(dict(m.build_info())))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(so)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def bundle(wheel: Path, core: Path, bundled: dict) -> dict:
    """Unpack an arch wheel's package into core/_bundled/, its imports of the core made relative; its facts."""
    with zipfile.ZipFile(wheel) as zf:
        (name, value), *more = wheel_entry_points(zf).items()
        module = value.split(".")[0]
        for member in zf.namelist():
            if member.startswith(f"{module}/"):
                zf.extract(member, core / "_bundled")
    package = core / "_bundled" / module
    for py in package.glob("*.py"):
        py.write_text(re.sub(r"^from fp8gemm\.", "from ...", py.read_text(), flags=re.M))
    so = sorted(package.glob("_C*.so"))
    info = build_info(so[-1])
    bundled.setdefault(name, {"module": module, "value": value, "pythons": []})["pythons"] += [s.name for s in so]
    return {"backend": name, "targets": info["targets"].split(","), "cuda": info.get("cuda_runtime")}


def write_dist_info(core: Path, library: str, kid: str, bundled: dict) -> tuple[str, str]:
    dist = f"{library}.dist-info"
    info = core / "_bundled" / dist
    info.mkdir(parents=True, exist_ok=True)
    dist_name = "fp8gemm-hub-" + library.removeprefix(f"_{NAME}_").replace("_", "-")
    version = re.search(r'__version__ = "(.+?)"', (CORE / "__init__.py").read_text()).group(1)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    lines = [f"[{library}.backends]"] + [
        f"{n} = {kid}.fp8gemm._bundled.{b['value']}" for n, b in sorted(bundled.items())
    ]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return dist, dist_name


def cuda_arch(target: str) -> str:
    """sm_90a -> 9.0a, sm_120 -> 12.0: the capabilities metadata.json lists (kernels/archs.py)."""
    major, minor, suffix = re.fullmatch(r"sm_(\d+)(\d)(a?)", target).groups()
    return f"{major}.{minor}{suffix}"


def write_variant(out: Path, variant: str, backend: str, wheels: list[Path]) -> Path:
    """One build/<variant>/ directory: the core, the given arch wheels, metadata.json, __init__.py."""
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / NAME
        bundled: dict = {}
        facts = [bundle(w, stage, bundled) for w in wheels]
        payload = [p for p in stage.rglob("*") if p.is_file()] + [p for p in CORE.rglob("*.py")]
        kid = kernel_id(backend, payload)
        vendor_core(stage, kid)
        dist, dist_name = write_dist_info(stage, kid, kid, bundled)
        target_dir = out / "build" / variant
        shutil.rmtree(target_dir, ignore_errors=True)
        target_dir.mkdir(parents=True)
        shutil.copytree(stage, target_dir / NAME)
    targets = sorted({t for f in facts for t in f["targets"]})
    archs = [cuda_arch(t) for t in targets] if backend == "cuda" else targets
    metadata = {
        "name": NAME,
        "id": kid,
        "version": KERNEL_VERSION,
        "license": "Apache-2.0",
        "upstream": "https://github.com/fp8gemm/fp8gemm",
        "python-depends": [],
        "backend": {"type": backend, **({"archs": archs} if archs else {})},
    }
    (target_dir / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    (target_dir / "__init__.py").write_text(INIT.format(dist=dist, dist_name=dist_name))
    return target_dir


def build_arch_wheels(platform_name: str, work: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from isa import build_wheel

    return [
        build_wheel(a.package, work / a.backend, a.build_env) for a in arches.arches() if a.platform == platform_name
    ]


def backend_variant(backend: str, wheels: list[Path], rocm: str) -> str:
    """cu130 from the CUDA runtime the binaries were built with; rocm63 from the ROCm release given."""
    if backend == "rocm":
        return "rocm" + rocm.replace(".", "")
    versions = set()
    for wheel in wheels:
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
            (so,) = [n for n in zf.namelist() if re.search(r"/_C\..*\.so$", n)][:1]
            versions.add(build_info(Path(zf.extract(so, tmp)))["cuda_runtime"])
    if len(versions) != 1:
        raise SystemExit(
            f"the CUDA wheels were built with different CUDA runtimes {sorted(versions)}: one variant each"
        )
    major, minor = versions.pop().split(".")[:2]
    return f"cu{major}{minor}"


def platform_of(wheel: Path) -> str:
    package = re.match(r"(fp8gemm_[a-z]+_[a-z0-9]+)-", wheel.name).group(1).replace("_", "-")
    return arches.by_package()[package].platform


def build_toml(out: Path, platforms: set[str]) -> Path:
    """kernel-builder's source tree (edition 5 build.toml): each arch package's sources and GPUs, the core's
    headers in include/ and its Python in torch-ext/fp8gemm/, copied beside build/."""
    for stale in ("include", "torch-ext", *(a.module for a in arches.arches())):
        shutil.rmtree(out / stale, ignore_errors=True)
    shutil.copytree(CORE / "include", out / "include")
    shutil.copytree(
        CORE, out / "torch-ext" / NAME, ignore=shutil.ignore_patterns("include", "cmake", "__pycache__", *LEFT_OUT)
    )
    lines = ["[general]", f'name = "{NAME}"', f"version = {KERNEL_VERSION}", "edition = 5", 'license = "Apache-2.0"',
             'upstream = "https://github.com/fp8gemm/fp8gemm"',
             f"backends = [{', '.join(json.dumps(p) for p in sorted(platforms | {'cpu'}))}]", "",
             "[torch]", 'include = ["include"]', "src = []", ""]  # fmt: skip
    for a in arches.arches():
        if a.platform not in platforms:
            continue
        shutil.copytree(ROOT / "packages" / a.package / "csrc", out / a.module)
        src = sorted(str(p.relative_to(out)) for p in (out / a.module).rglob("*") if p.is_file())
        lines += [f"[kernel.{a.module}]", f'backend = "{a.platform}"', 'depends = ["torch"]',
                  f"src = {json.dumps(src)}", 'include = ["include"]']  # fmt: skip
        lines.append(
            f'cuda-capabilities = ["{cuda_arch(a.target)}"]' if a.platform == "cuda" else f'rocm-archs = ["{a.target}"]'
        )
        lines.append("")
    (out / "build.toml").write_text("\n".join(lines))
    return out / "build.toml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "hub")
    parser.add_argument("--wheel", type=Path, nargs="*", default=[], help="arch package wheels to bundle")
    parser.add_argument("--build", choices=["cuda", "rocm"], nargs="*", default=[], help="build these arches' wheels")
    parser.add_argument("--torch", help="the torch X.Y the arch variants are named for (default: the installed)")
    parser.add_argument("--rocm", default="6.3", help="the ROCm release of the rocm variant")
    args = parser.parse_args(argv)
    if args.torch is None:
        import torch

        args.torch = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    major, minor = args.torch.split(".")
    system = f"{platform.machine()}-{platform.system().lower()}"
    made = [write_variant(args.out, "torch-cpu", "cpu", [])]
    with tempfile.TemporaryDirectory() as tmp:
        wheels = list(args.wheel) + [w for p in args.build for w in build_arch_wheels(p, Path(tmp) / p)]
        by_platform: dict[str, list[Path]] = {}
        for wheel in wheels:
            by_platform.setdefault(platform_of(wheel), []).append(wheel)
        for backend, group in sorted(by_platform.items()):
            variant = f"torch{major}{minor}-{backend_variant(backend, group, args.rocm)}-{system}"
            made.append(write_variant(args.out, variant, backend, group))
    made_toml = build_toml(args.out, set(by_platform))
    for path in made:
        print(f"{path.relative_to(args.out)}: {json.loads((path / 'metadata.json').read_text())['id']}")
    print(made_toml.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
