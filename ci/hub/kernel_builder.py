"""kernel-builder's CMake project for a build.toml, rendered in Python where kernel-builder itself cannot be built
(its crates need the network): the templates in ci/hub/kernel-builder/ (huggingface/kernels@8ac69fc542a4306eade0759ef7c45b4f2ae57df0,
kernel-builder/src/pyproject/templates/) filled as kernel-builder/src/pyproject/torch/mod.rs, kernel.rs, common.rs and
ops_identifier.rs fill them for a `[torch]` build with "torch" as its kernels' only dependency (CUDA, ROCm and CPU
components; Metal, XPU and CUTLASS are left out).

python3 ci/hub/kernel_builder.py KERNEL_DIR [--unique-id ID]   (writes CMakeLists.txt, cmake/, metadata-*.json,
torch-ext/registration.h beside build.toml, as `kernel-builder create-pyproject` does)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jinja2
import tomllib

TEMPLATES = Path(__file__).resolve().parent / "kernel-builder"
CMAKE_FILES = {  # cmake/<name>: template (torch/mod.rs write_cmake_helpers; metal helpers left out)
    "utils.cmake": "utils.cmake", "kernel.cmake": "kernel.cmake", "build-variants.cmake": "torch/build-variants.cmake",
    "add_build_metadata.py": "torch/add_build_metadata.py", "hipify.py": "torch/cuda/hipify.py",
    "get_gpu_lang.cmake": "torch/get_gpu_lang.cmake", "get_gpu_lang.py": "torch/get_gpu_lang.py",
    "_ops.py.in": "torch/_ops.py.in",
}  # fmt: skip
# Fixes to the copied templates, each checked to apply: without VERBATIM the shell of the local_install target's
# metadata command splits two GPU archs ("12.0;9.0a") at the semicolon (still so at the pinned commit).
TEMPLATE_FIXES = {
    "torch/build-variants.cmake": [(
        'COMMENT "Writing metadata.json with GPU arch info to ${VARIANT_DIR}"\n',
        'COMMENT "Writing metadata.json with GPU arch info to ${VARIANT_DIR}"\n            VERBATIM\n',
    )],
}  # fmt: skip
BACKENDS = ("cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu")  # Backend::all()


def includes(paths: list[str] | None) -> str | None:
    """common.rs prefix_and_join_includes."""
    return ";".join(f"${{CMAKE_SOURCE_DIR}}/{p}" for p in paths) if paths else None


def flags(values: list[str] | None) -> str | None:
    return ";".join(values) if values else None


def fixed_template(template: str) -> str:
    text = (TEMPLATES / template).read_text()
    for old, new in TEMPLATE_FIXES.get(template, []):
        if text.count(old) != 1:
            raise SystemExit(f"{template}: the fix for {old.strip()!r} no longer applies; check the template")
        text = text.replace(old, new)
    return text


def render(kernel_dir: Path, unique_id: str) -> list[Path]:
    build = tomllib.loads((kernel_dir / "build.toml").read_text())
    general, torch = build["general"], build["torch"]
    if general.get("edition") != 5:
        raise SystemExit("build.toml: edition 5 expected")
    name = general["name"]
    python_name = name.replace("-", "_")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True, keep_trailing_newline=True)
    parts = [
        env.get_template("torch/preamble.cmake").render(
            kernel_name=name,
            kernel_unique_id=unique_id,
            python_name=python_name,
            torch_minver=torch.get("minver"),
            torch_maxver=torch.get("maxver"),
            cuda_minver=general.get("cuda", {}).get("minver"),
            cuda_maxver=general.get("cuda", {}).get("maxver"),
        ),  # fmt: skip
        env.get_template("torch/torch-binding.cmake").render(
            includes=includes(torch.get("include")),
            name=name,
            src=torch.get("src", []),
            cxx_flags=flags(torch.get("cxx-flags")),
        ),  # fmt: skip
    ]
    for kernel_name, kernel in build.get("kernel", {}).items():  # kernel.rs render_kernel_component
        if set(kernel["depends"]) != {"torch"}:
            raise SystemExit(f"{kernel_name}: only the torch dependency is rendered here")
        common = dict(name=kernel_name, kernel_name=kernel_name, sources="\n".join(f'"{s}"' for s in kernel["src"]),
                      includes=includes(kernel.get("include")), cxx_flags=flags(kernel.get("cxx-flags")))  # fmt: skip
        backend = kernel["backend"]
        if backend == "cuda":
            text = env.get_template("kernel-component/cuda.cmake").render(
                **common, cuda_capabilities=kernel.get("cuda-capabilities"), cuda_flags=flags(kernel.get("cuda-flags")),
                cuda_minver=kernel.get("cuda-minver"),
            )  # fmt: skip
        elif backend == "rocm":
            text = env.get_template("kernel-component/hip.cmake").render(
                **common, rocm_archs=kernel.get("rocm-archs"), hip_flags=flags(kernel.get("hip-flags"))
            )
        elif backend == "cpu":
            text = env.get_template("kernel-component/cpu.cmake").render(**common)
        else:
            raise SystemExit(f"{kernel_name}: backend {backend} is not rendered here")
        parts.append(text)
    data = [e for e in torch.get("pyext", []) if e != "py"]  # Torch::data_extensions
    parts.append(env.get_template("torch/torch-extension.cmake").render(python_name=python_name, data_extensions=data))
    written = [kernel_dir / "CMakeLists.txt"]
    written[0].write_text("\n".join(parts) + "\n")
    (kernel_dir / "cmake").mkdir(exist_ok=True)
    for target, template in CMAKE_FILES.items():
        (kernel_dir / "cmake" / target).write_text(fixed_template(template))
        written.append(kernel_dir / "cmake" / target)
    (kernel_dir / "torch-ext").mkdir(exist_ok=True)
    (kernel_dir / "torch-ext" / "registration.h").write_text((TEMPLATES / "torch/registration.h").read_text())
    for backend in BACKENDS:  # common.rs write_metadata (kernels-data Metadata::for_backend)
        meta = {"name": name, "id": f"_{python_name}_{backend}_{unique_id}", "version": general["version"],
                "license": general["license"], "upstream": general.get("upstream"),
                "python-depends": general.get("python-depends", []), "backend": {"type": backend}}  # fmt: skip
        (kernel_dir / f"metadata-{backend}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel_dir", type=Path)
    parser.add_argument("--unique-id", default="local", help="the ops namespace's suffix (_<name>_<backend>_<id>)")
    args = parser.parse_args(argv)
    for path in render(args.kernel_dir, args.unique_id):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
