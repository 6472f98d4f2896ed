"""ci/build_hub.py's Hugging Face `kernels` layout, loaded offline by the `kernels` library on CPU: the torch-cpu
variant runs the reference bit-identically to the installed core under its own op namespace, an arch variant's
bundled binaries are found by its copy of the core only, and build.toml keeps to kernel-builder's edition 5."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from fp8gemm.protocol import PROTOCOL_VERSION
from isa import ROOT, build_wheel, require_tool

sys.path.insert(0, str(ROOT / "ci"))
import arches  # noqa: E402
import build_hub  # noqa: E402

kernels = pytest.importorskip("kernels")
MATMULS = ("matmul_2d", "matmul_batched", "matmul_grouped")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub")
    build_hub.main(["--out", str(out)])
    return out


def load(path: Path, backend: str | None = None):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return kernels.get_local_kernel(path, backend=backend)


def test_cpu_variant_loads_and_matches_the_installed_core(hub):
    import fp8gemm

    kernel = load(hub, backend="cpu")  # resolves build/torch-cpu (a CUDA torch would look for a CUDA variant)
    meta = json.loads((hub / "build" / "torch-cpu" / "metadata.json").read_text())
    assert kernel.__name__ == meta["id"] and meta["name"] == "fp8gemm" and meta["backend"] == {"type": "cpu"}
    x = torch.randn(33, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert torch.equal(kernel.linear(x, *kernel.quantize_weight(w)), fp8gemm.linear(x, *fp8gemm.quantize_weight(w)))
    assert hasattr(getattr(torch.ops, meta["id"]), "gemm") and meta["id"] != "fp8gemm"
    assert sorted(kernel.__all__) == sorted(fp8gemm.__all__)
    # transformers' finegrained-fp8 names, from this copy (tests/test_transformers_kernel.py drives them)
    assert all(getattr(kernel, n).__module__ == f"{meta['id']}.fp8gemm.hf.finegrained_fp8" for n in MATMULS)
    assert not list((hub / "build" / "torch-cpu" / "fp8gemm").glob("cli*.py"))  # the command is left out


def test_variant_names_are_the_ones_kernels_resolves(hub):
    from kernels.variants import parse_variant

    assert parse_variant("torch-cpu").variant_str == "torch-cpu"
    torch_xy = "".join(torch.__version__.split("+")[0].split(".")[:2])
    assert parse_variant(f"torch{torch_xy}-cu130-x86_64-linux").arch.backend.variant_str == "cu130"


def test_arch_variant_finds_its_bundled_binary_and_only_its_own(tmp_path):
    require_tool("clang++-19")
    gfx942 = arches.by_package()["fp8gemm-rocm-gfx942"]
    wheel = build_wheel(gfx942.package, tmp_path / "wheel", gfx942.build_env)
    build_hub.main(["--out", str(tmp_path / "hub"), "--wheel", str(wheel)])
    (variant,) = (tmp_path / "hub" / "build").glob("torch*-rocm63-*")
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["backend"] == {"type": "rocm", "archs": ["gfx942"]}
    kernel = load(variant)  # the variant itself: CPU torch would not pick a ROCm variant
    (backend,) = kernel.installed_backends()
    assert backend.error is None and backend.backend.targets == ("gfx942",)
    assert backend.distribution == "fp8gemm-hub-" + meta["id"].removeprefix("_fp8gemm_").replace("_", "-")
    import fp8gemm

    assert "gfx942" not in [b.name for b in fp8gemm.installed_backends(refresh=True)]


def test_vendoring_refuses_a_core_that_spells_its_namespace_elsewhere(tmp_path, monkeypatch):
    core = tmp_path / "fp8gemm"
    core.mkdir()
    (core / "runtime.py").write_text('LIBRARY = "fp8gemm"\n')
    (core / "protocol.py").write_text('ENTRY_POINT_GROUP = "fp8gemm.backends"\n')
    (core / "ops.py").write_text('@torch.library.custom_op("fp8gemm::gemm", mutates_args=())\ndef gemm(): ...\n')
    monkeypatch.setattr(build_hub, "CORE", core)
    with pytest.raises(SystemExit, match="fp8gemm::"):
        build_hub.vendor_core(tmp_path / "out", "_fp8gemm_cpu_0")
    (core / "ops.py").write_text("")
    (core / "runtime.py").write_text('NAMESPACE = "fp8gemm"\n')
    with pytest.raises(SystemExit, match="runtime.LIBRARY"):
        build_hub.vendor_core(tmp_path / "out2", "_fp8gemm_cpu_0")


# kernel-builder's build.toml, edition 5: the keys its parser accepts (deny_unknown_fields), read from
# huggingface/kernels@8ac69fc542a4306eade0759ef7c45b4f2ae57df0 kernels-data/src/config/v5.rs.
GENERAL = {"name", "version", "edition", "license", "upstream", "source", "backends", "cuda", "hub", "kernel-depends",
           "neuron", "python-depends", "tpu", "xpu"}  # fmt: skip
TORCH = {"include", "minver", "maxver", "pyext", "src", "stable-abi", "cxx-flags"}
KERNEL = {"cuda": {"cuda-capabilities", "cuda-flags", "cuda-minver", "cxx-flags", "depends", "include", "src"},
          "rocm": {"cxx-flags", "depends", "rocm-archs", "hip-flags", "include", "src"}}  # fmt: skip


def test_build_toml_keeps_to_kernel_builders_edition_5(tmp_path):
    build_hub.build_toml(tmp_path, {"cuda", "rocm"})
    config = arches.tomllib.loads((tmp_path / "build.toml").read_text())
    assert set(config) == {"general", "torch", "kernel"} and set(config["general"]) <= GENERAL
    assert config["general"]["edition"] == 5 and set(config["torch"]) <= TORCH
    # the Torch binding, as kernel-builder's torch-ext convention names it (examples/kernels/relu/build.toml)
    assert config["torch"]["src"] == ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]
    modules = {a.module for a in arches.arches()}
    assert {next(m for m in modules if name.startswith(m)) for name in config["kernel"]} == modules
    for name, kernel in config["kernel"].items():
        assert set(kernel) - {"backend"} <= KERNEL[kernel["backend"]], name
        assert kernel["src"] and all((tmp_path / s).is_file() for s in kernel["src"]), name
        assert all((tmp_path / i).is_dir() for i in kernel["include"]) and "torch-ext/hub_shim" in kernel["include"]
    assert config["kernel"]["fp8gemm_cuda_sm90a"]["cuda-capabilities"] == ["9.0a"]
    assert config["kernel"]["fp8gemm_rocm_gfx942"]["rocm-archs"] == ["gfx942"]
    # sm90a's per-source ptxas options (its CMakeLists.txt) as kernel components of their own
    assert (
        "-Xptxas=--register-usage-level=10"
        in config["kernel"]["fp8gemm_cuda_sm90a_tiles_register_level10"]["cuda-flags"]
    )
    compiled = [s for k in config["kernel"].values() for s in k["src"] if s.endswith((".cu", ".cpp", ".hip"))]
    assert len(compiled) == len(set(compiled))  # each source compiled once


def test_source_tree_holds_the_torch_binding_and_the_adapters(tmp_path):
    build_hub.build_toml(tmp_path, {"cuda", "rocm"})
    binding = (tmp_path / "torch-ext" / "torch_binding.cpp").read_text()
    assert (
        "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)" in binding
        and "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)" in binding
    )
    shim = (tmp_path / "torch-ext" / "hub_shim" / "pybind11" / "pybind11.h").read_text()
    assert "#define PYBIND11_MODULE(" in shim and "TORCH_LIBRARY_FRAGMENT" in shim
    package = tmp_path / "torch-ext" / "fp8gemm"
    assert "from ._ops import ops" in (package / "__init__.py").read_text()  # kernel-builder's generated _ops.py
    for a in arches.arches():
        header = (tmp_path / a.module / "fp8gemm_hub_arch.h").read_text()
        assert f"#define FP8GEMM_HUB_ARCH {a.module}" in header and f'#define FP8GEMM_TARGETS "{a.target}"' in header
        bundled = package / "fp8gemm" / "_bundled" / a.module
        assert (bundled / "_C.py").read_text() == (ROOT / "ci" / "hub" / "_C.py").read_text()
        assert "from fp8gemm" not in (bundled / "backend.py").read_text()
    runtime = (package / "fp8gemm" / "runtime.py").read_text()
    assert 'LIBRARY = "_fp8gemm_kb_' in runtime  # its Python ops apart from the C++ namespace and the installed core


def test_adapter_exposes_the_op_librarys_entries(tmp_path, monkeypatch):
    """ci/hub/_C.py on a stand-in op namespace: the pybind11 module's names, JSON results decoded, and an ImportError
    for an arch the library was built without."""
    top = tmp_path / "kbtop"
    (top / "core" / "_bundled" / "fp8gemm_cuda_sm90a").mkdir(parents=True)
    (top / "core" / "_bundled" / "fp8gemm_rocm_gfx942").mkdir(parents=True)
    (top / "__init__.py").write_text("")
    (top / "core" / "__init__.py").write_text("")
    (top / "_ops.py").write_text(
        "import json\nclass _Ops:\n"
        "    def arches(self): return json.dumps(['fp8gemm_cuda_sm90a'])\n"
        "    def fp8gemm_cuda_sm90a__entries(self): return json.dumps({'launch': 'value', 'build_info': 'json'})\n"
        "    def fp8gemm_cuda_sm90a__launch(self, address): self.launched = address\n"
        "    def fp8gemm_cuda_sm90a__build_info(self): return json.dumps({'targets': 'sm_90a'})\n"
        "    def __getattr__(self, name): raise AttributeError(name)\n"
        "ops = _Ops()\n"
    )  # fmt: skip
    for arch in ("fp8gemm_cuda_sm90a", "fp8gemm_rocm_gfx942"):
        (top / "core" / "_bundled" / arch / "__init__.py").write_text("")
        (top / "core" / "_bundled" / arch / "_C.py").write_text((ROOT / "ci" / "hub" / "_C.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    c = importlib.import_module("kbtop.core._bundled.fp8gemm_cuda_sm90a._C")
    assert c.build_info() == {"targets": "sm_90a"}
    c.launch(1234)
    assert importlib.import_module("kbtop._ops").ops.launched == 1234
    with pytest.raises(ImportError, match="holds no fp8gemm_rocm_gfx942"):
        importlib.import_module("kbtop.core._bundled.fp8gemm_rocm_gfx942._C")


@pytest.mark.skipif(
    bool(torch.version.cuda or torch.version.hip),
    reason="a GPU torch makes kernel-builder's project a GPU build: `bash ci/gpu/run.sh hub` builds and checks that one",
)
def test_kernel_builder_cpu_build_runs_the_core(tmp_path):
    """kernel-builder's CMake project (its templates, ci/hub/kernel_builder.py) for the CPU backend, built with the
    CPU torch: the op library (the Torch binding alone) loads through kernels and the core runs its reference."""
    require_tool("cmake")
    require_tool("ninja")
    import subprocess

    build_hub.main(["--out", str(tmp_path), "--builder-backends", "cuda"])
    sys.path.insert(0, str(ROOT / "ci" / "hub"))
    import kernel_builder

    kernel_builder.render(tmp_path, "test")
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)  # noqa: E731
    configure = run("cmake", "-S", ".", "-B", "_b", "-G", "Ninja", f"-DPython3_EXECUTABLE={sys.executable}")
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    made = run("cmake", "--build", "_b", "--target", "local_install")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    (variant,) = (tmp_path / "build").glob("torch*-cpu-*")
    kernel = load(variant)
    assert kernel.__name__ == "_fp8gemm_cpu_test" and json.loads(kernel._ops.arches()) == []
    assert kernel._ops.protocol_version() == PROTOCOL_VERSION and not kernel.installed_backends()
    import fp8gemm

    x = torch.randn(33, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert torch.equal(kernel.linear(x, *kernel.quantize_weight(w)), fp8gemm.linear(x, *fp8gemm.quantize_weight(w)))
