"""Lay out fp8gemm as a Hugging Face `kernels` repository: build/<variant>/ as kernels.get_kernel and
kernels.get_local_kernel load it, plus a kernel-builder build.toml describing the same sources.

python3 ci/build_hub.py [--out output/hub] [--wheel ARCH.whl ...] [--build PLATFORM ...] [--torch X.Y]
                       [--builder-backends cuda rocm] [--builder-arches sm90a ...]

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
HUB = ROOT / "ci" / "hub"  # the Torch binding and op adapter of kernel-builder builds
NAME = "fp8gemm"
KERNEL_VERSION = 1  # the Hub's major version: bump on any API change (kernels' kernel-requirements.md)
LEFT_OUT = ("cli*.py", "__main__.py")  # the `fp8gemm` command: a Hub kernel is imported, never run as a command
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


# The variant's __init__.py in kernel-builder's source tree (torch-ext/fp8gemm/): kernel-builder copies the folder's .py
# files and the op library beside them, so the bundled backends' entry points come from this class, not a dist-info
# folder, and only for the arch modules the library was built with (its arches() op; none in a CPU build).
KB_INIT = '''"""fp8gemm, built by Hugging Face kernel-builder: the core's API, its arch entries in this variant's op library."""

import importlib.metadata as _metadata
import json as _json
import pathlib as _pathlib
import sys as _sys

from ._ops import ops as _ops

_BUNDLED = {bundled}  # entry-point name -> (arch module, its Backend factory)
_TOP = __name__


class _HubDistribution(_metadata.Distribution):
    def read_text(self, filename):
        if filename == "METADATA":
            return "Metadata-Version: 2.1\\nName: {dist_name}\\nVersion: {version}\\n"
        if filename == "entry_points.txt":
            built = set(_json.loads(_ops.arches()))
            lines = [f"{{n}} = {{_TOP}}.fp8gemm._bundled.{{m}}.{{v}}" for n, (m, v) in sorted(_BUNDLED.items()) if m in built]
            return "\\n".join(["[{group}]", *lines]) + "\\n"
        return None

    def locate_file(self, path):
        return _pathlib.Path(__file__).parent / path


class _BundledBackends(_metadata.DistributionFinder):
    """Shows this copy's registry the backends its op library holds (an entry-point group only it reads)."""

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=_metadata.DistributionFinder.Context()):
        if context.name in (None, "{dist_name}"):
            yield _HubDistribution()


if not any(type(f).__name__ == "_BundledBackends" and getattr(f, "top", None) == _TOP for f in _sys.meta_path):
    _finder = _BundledBackends()
    _finder.top = _TOP
    _sys.meta_path.append(_finder)

from .fp8gemm import *  # noqa: E402,F403
from .fp8gemm import __all__, __version__  # noqa: E402,F401
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


def arch_build(a: arches.Arch) -> dict:
    """What an arch package's CMakeLists.txt gives the core's fp8gemm_cuda_arch_module() or fp8gemm_hip_arch_module()
    (cmake/fp8gemm_arch_module.cmake): its sources, and the targets and arch flags those derive from its CUDA_ARCH or
    OFFLOAD_ARCH; and the sources that set_source_files_properties() gives options of their own."""
    text = (ROOT / "packages" / a.package / "CMakeLists.txt").read_text()
    call = re.search(r"^fp8gemm_(?:cuda|hip)_arch_module\((.*?)\)\s*$", text, re.M | re.S).group(1)
    args: dict[str, list[str]] = {}
    for word in call.split():  # KEYWORD value ... KEYWORD value ...
        if re.fullmatch(r"[A-Z_]+", word):
            key, args[word] = word, []
        else:
            args[key].append(word)
    cached = dict(re.findall(r'^set\((FP8GEMM_\w+) "([^"]*)" CACHE', text, re.M))
    value = lambda key: re.sub(r"\$\{(\w+)\}", lambda m: cached.get(m.group(1), ""), " ".join(args[key]).strip('"'))  # noqa: E731
    own = {src: opts for src, opts in re.findall(r'set_source_files_properties\((\S+) PROPERTIES COMPILE_OPTIONS "([^"]+)"\)', text)}  # fmt: skip
    if "CUDA_ARCH" in args:
        cc = value("CUDA_ARCH")
        targets, flags = f"sm_{cc}", f"-gencode arch=compute_{cc},code=sm_{cc}"
    else:
        targets, flags = value("OFFLOAD_ARCH").split(":")[0], f"--offload-arch={value('OFFLOAD_ARCH')}"
    return {"targets": targets, "arch_flags": flags, "sources": args["SOURCES"],
            "device": args.get("CUDA_SOURCES", args.get("HIP_SOURCES", [])), "own_options": own}  # fmt: skip


def arch_header(a: arches.Arch, facts: dict) -> str:
    """fp8gemm_hub_arch.h: what the pybind11 stand-in (ci/hub/shim) and build_info.hpp read of this arch."""
    compiler = "nvcc (kernel-builder)" if a.platform == "cuda" else "hipcc (kernel-builder)"
    return (
        "// Generated by ci/build_hub.py: this arch's facts for the pybind11 stand-in (hub_shim/pybind11/pybind11.h)\n"
        "// and fp8gemm/build_info.hpp, in place of fp8gemm_arch_module()'s compile definitions.\n#pragma once\n"
        f"#define FP8GEMM_HUB_ARCH {a.module}\n#define FP8GEMM_TARGETS {json.dumps(facts['targets'])}\n"
        f"#define FP8GEMM_ARCH_FLAGS {json.dumps(facts['arch_flags'])}\n#define FP8GEMM_COMPILER {json.dumps(compiler)}\n"
    )


def torch_ext(out: Path, platforms: set[str], only: set[str] | None = None) -> None:
    """kernel-builder's torch-ext/: the Torch binding (ci/hub/torch_binding.cpp, once for every arch), the pybind11
    stand-in the arch modules compile against, and torch-ext/fp8gemm/, which becomes build/<variant>/: KB_INIT, the
    core vendored under its own op namespace, and each arch package's Python with the op adapter as its _C."""
    ext = out / "torch-ext"
    ext.mkdir(parents=True)
    shutil.copy(HUB / "torch_binding.cpp", ext / "torch_binding.cpp")
    shutil.copy(HUB / "torch_binding.h", ext / "torch_binding.h")
    shutil.copytree(HUB / "shim", ext / "hub_shim")
    package = ext / NAME
    library = kernel_id("kb", [p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts])
    vendor_core(package / NAME, library)
    bundled = {}
    for a in arches.arches():
        if a.platform not in platforms or (only is not None and a.backend not in only):
            continue
        src = ROOT / "packages" / a.package / "src" / a.module
        dest = package / NAME / "_bundled" / a.module
        dest.mkdir(parents=True)
        for py in src.glob("*.py"):
            (dest / py.name).write_text(re.sub(r"^from fp8gemm\.", "from ...", py.read_text(), flags=re.M))
        shutil.copy(HUB / "_C.py", dest / "_C.py")
        points = arches.tomllib.loads((ROOT / "packages" / a.package / "pyproject.toml").read_text())
        for name, value in points["project"]["entry-points"]["fp8gemm.backends"].items():
            bundled[name] = (a.module, value.removeprefix(f"{a.module}."))
    version = re.search(r'__version__ = "(.+?)"', (CORE / "__init__.py").read_text()).group(1)
    dist_name = "fp8gemm-hub-" + library.removeprefix(f"_{NAME}_").replace("_", "-")
    (package / "__init__.py").write_text(
        KB_INIT.format(bundled=repr(bundled), dist_name=dist_name, version=version, group=f"{library}.backends")
    )


def build_toml(out: Path, platforms: set[str], only: set[str] | None = None) -> Path:
    """kernel-builder's source tree (edition 5 build.toml, huggingface/kernels@8ac69fc542a4306eade0759ef7c45b4f2ae57df0
    kernels-data/src/config/v5.rs): the Torch binding in [torch], the core's headers in include/, each arch package's
    csrc as kernel components (one per set of per-source options), its Python in torch-ext/fp8gemm/ (torch_ext());
    ``only``: these arch backends (e.g. {"sm90a"}) of the platforms, for a shorter build."""
    for stale in ("include", "torch-ext", *(a.module for a in arches.arches())):
        shutil.rmtree(out / stale, ignore_errors=True)
    shutil.copytree(CORE / "include", out / "include")
    torch_ext(out, platforms, only)
    binding = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]
    lines = ["[general]", f'name = "{NAME}"', f"version = {KERNEL_VERSION}", "edition = 5", 'license = "Apache-2.0"',
             'upstream = "https://github.com/fp8gemm/fp8gemm"',
             f"backends = [{', '.join(json.dumps(p) for p in sorted(platforms | {'cpu'}))}]", "",
             "[torch]", 'include = ["include"]', f"src = {json.dumps(binding)}", ""]  # fmt: skip
    for a in arches.arches():
        if a.platform not in platforms or (only is not None and a.backend not in only):
            continue
        shutil.copytree(ROOT / "packages" / a.package / "csrc", out / a.module)
        facts = arch_build(a)
        (out / a.module / "fp8gemm_hub_arch.h").write_text(arch_header(a, facts))
        files = sorted(str(p.relative_to(out)) for p in (out / a.module).rglob("*") if p.is_file())
        own = {f"{a.module}/{s.removeprefix('csrc/')}": o.split() for s, o in facts["own_options"].items()}
        groups = [(a.module, [f for f in files if f not in own], [])]
        groups += [(f"{a.module}_{Path(f).stem}", [f], opts) for f, opts in sorted(own.items())]
        # module.cpp sees the pybind11 stand-in and fp8gemm_hub_arch.h, the torch binding's header beside it.
        include = ["include", "torch-ext", "torch-ext/hub_shim", a.module]
        for name, src, opts in groups:
            lines += [f"[kernel.{name}]", f'backend = "{a.platform}"', 'depends = ["torch"]',
                      f"src = {json.dumps(src)}", f"include = {json.dumps(include)}"]  # fmt: skip
            if a.platform == "cuda":
                # fp8gemm_arch_module()'s nvcc options, then the source's own (the arch's CMakeLists.txt)
                lines += [f'cuda-capabilities = ["{cuda_arch(a.target)}"]',
                          f"cuda-flags = {json.dumps(['-O3', '-lineinfo', '-Xptxas=-warn-spills', *opts])}"]  # fmt: skip
            else:
                lines += [f'rocm-archs = ["{a.target}"]', f"hip-flags = {json.dumps(['-O3', '-DFP8GEMM_HIP_HEADERS', *opts])}",
                          'cxx-flags = ["-D__HIP_PLATFORM_AMD__"]']  # fmt: skip
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
    parser.add_argument("--builder-backends", choices=["cuda", "rocm"], nargs="*",
                        help="the GPU backends of kernel-builder's source tree (default: those of the arch variants)")  # fmt: skip
    parser.add_argument("--builder-arches", nargs="*", help="only these arch backends there (e.g. sm90a)")
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
    made_toml = build_toml(
        args.out,
        set(by_platform if args.builder_backends is None else args.builder_backends),
        None if args.builder_arches is None else set(args.builder_arches),
    )
    for path in made:
        print(f"{path.relative_to(args.out)}: {json.loads((path / 'metadata.json').read_text())['id']}")
    print(made_toml.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
