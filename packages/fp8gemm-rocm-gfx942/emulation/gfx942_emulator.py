"""The gfx942 (MI300X) kernels executed on the CPU, for tests without an MI300X.

``build()`` compiles the package's kernel sources (``csrc/kernels.hip``, ``csrc/grouped.hip``, ``csrc/quantize.hip``,
``csrc/moe.hip`` and the host launcher ``csrc/launch.cpp``, unchanged) with clang++ for the host against this folder's
emulated HIP headers and runtime: each workgroup's work-items run as fibers in 64-lane wavefronts, LDS is
per-workgroup memory, barriers and MFMA are rendezvous points, and MFMA follows AMD's documented
register layout (src/mfma.cpp). ``Emulator.backend()`` wraps the result in the package's own
:class:`fp8gemm.protocol.Backend` descriptor, so ``fp8gemm.gemm``, ``fp8gemm.quantize_activation`` and the grouped
GEMMs validate and launch it as they would on an MI300X, with CPU tensors in ``torch.float8_e4m3fnuz``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import fp8gemm

EMULATION_DIR = Path(__file__).resolve().parent
PACKAGE_DIR = EMULATION_DIR.parent
COMPILER_ENV = "FP8GEMM_GFX942_EMU_CXX"  # the clang++ to build with (default clang++-19, else clang++)
SOURCES_ENV = "FP8GEMM_GFX942_EMU_CSRC"  # a kernel source folder to run instead of the package's csrc/
BACKEND_NAME = "gfx942_emulated"


def find_compiler() -> str | None:
    """The clang++ that builds the emulator: $FP8GEMM_GFX942_EMU_CXX, clang++-19 or clang++."""
    return os.environ.get(COMPILER_ENV) or shutil.which("clang++-19") or shutil.which("clang++")


def kernel_sources() -> Path:
    return Path(os.environ.get(SOURCES_ENV) or PACKAGE_DIR / "csrc").resolve()


def build(build_dir: Path, csrc: Path | None = None, compiler: str | None = None) -> Path:
    """Configures and builds the emulator and the kernels of ``csrc`` into ``build_dir`` (CMake)."""
    compiler = compiler or find_compiler()
    if not compiler:
        raise RuntimeError(f"no clang++ found to build the gfx942 emulator; install clang-19 or set {COMPILER_ENV}")
    csrc = Path(csrc or kernel_sources())
    sources = ("kernels.hip", "grouped.hip", "quantize.hip", "moe.hip", "launch.cpp")
    missing = [name for name in sources if not (csrc / name).is_file()]
    if missing:
        raise ValueError(f"csrc={csrc} has no {', '.join(missing)}; point it at a copy of the package's csrc/")
    configure = [
        "cmake", "-S", str(EMULATION_DIR), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CXX_COMPILER={compiler}", f"-DFP8GEMM_GFX942_CSRC={csrc}", f"-DFP8GEMM_INCLUDE={fp8gemm.get_include()}",
    ]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (configure, ["cmake", "--build", str(build_dir), "--parallel"]):
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if run.returncode:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return Path(build_dir)


def _poison_fp8_rows(q: int, scale: int, rows: int, cols: int, scale_ld: int) -> None:
    """FP8 codes 0x80 (NaN in e4m3fnuz) and NaN scales over [rows, cols] and their MN-major scales (K block kb holds
    rows at scale[kb * scale_ld + row]); a call off the 128 grid, which the entry refuses, is left alone."""
    if cols < 128 or scale_ld < rows:
        return
    ctypes.memset(q, 0x80, rows * cols)
    ctypes.memset(scale, 0xFF, 4 * ((cols // 128 - 1) * scale_ld + rows))


class EmulationError(RuntimeError):
    """A launch the emulator refused or a kernel that broke barrier / wave-op discipline."""


class Emulator:
    """The built libraries, loaded: the package's ``launch`` / ``workspace_bytes`` / ``quantize`` on the emulator."""

    def __init__(self, build_dir: Path):
        build_dir = Path(build_dir)
        self.runtime = ctypes.CDLL(str(build_dir / "libgfx942_emu_runtime.so"))
        self.kernels = ctypes.CDLL(str(build_dir / "libgfx942_emu_kernels.so"))
        self.selftest = ctypes.CDLL(str(build_dir / "libgfx942_emu_selftest.so"))
        self.runtime.gfx942_emu_last_error.restype = ctypes.c_char_p
        self.runtime.gfx942_emu_use_cu_count.argtypes = [ctypes.c_int]
        self.runtime.gfx942_emu_decode_fp8.restype = ctypes.c_double
        self.runtime.gfx942_emu_mfma_f32_32x32x16_fp8.argtypes = [ctypes.c_void_p] * 4
        self.kernels.fp8gemm_gfx942_emu_launch.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_protocol_version.restype = ctypes.c_uint32
        self.kernels.fp8gemm_gfx942_emu_args_size.argtypes = [ctypes.c_int]
        self.kernels.fp8gemm_gfx942_emu_args_size.restype = ctypes.c_int64
        self.kernels.fp8gemm_gfx942_emu_workspace_bytes.argtypes = [ctypes.c_int64] * 3
        self.kernels.fp8gemm_gfx942_emu_workspace_bytes.restype = ctypes.c_int64
        self.kernels.fp8gemm_gfx942_emu_quantize.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_quantize_transposed.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_quantize_grouped_transposed.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_wgrad_launch.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_kgrouped_wgrad_launch.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_wgrad_workspace_bytes.argtypes = [ctypes.c_int64] * 3
        self.kernels.fp8gemm_gfx942_emu_wgrad_workspace_bytes.restype = ctypes.c_int64
        self.kernels.fp8gemm_gfx942_emu_grouped_launch.argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_grouped_workspace_bytes.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 4
        self.kernels.fp8gemm_gfx942_emu_grouped_workspace_bytes.restype = ctypes.c_int64
        for step in ("route", "activation", "combine"):
            getattr(self.kernels, f"fp8gemm_gfx942_emu_moe_{step}").argtypes = [ctypes.c_size_t]
        self.kernels.fp8gemm_gfx942_emu_moe_workspace_bytes.argtypes = [ctypes.c_int64] * 3
        self.kernels.fp8gemm_gfx942_emu_moe_workspace_bytes.restype = ctypes.c_int64
        self.selftest.gfx942_emu_selftest_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint]
        self.selftest.gfx942_emu_selftest_launch.argtypes += [ctypes.c_void_p] * 2
        self.launches = 0  # GEMM launches so far: tests check the kernels (not a fallback) ran
        self.quantize_launches = 0
        self.grouped_launches = 0
        self.moe_steps = 0  # step launches (route, activation, combine entries) so far
        self.wgrad_launches = 0
        self.kgrouped_wgrad_launches = 0
        self.quantize_transposed_launches = 0
        self.quantize_grouped_transposed_launches = 0
        self.use_cu_count(304)

    def _error(self) -> str:
        return self.runtime.gfx942_emu_last_error().decode()

    def use_cu_count(self, cu_count: int) -> None:
        """Later launches (on this process) see a GPU with ``cu_count`` compute units (MI300X: 304),
        which decides split-K; each count is an emulated device of its own."""
        if not isinstance(cu_count, int) or cu_count < 1:
            raise ValueError(f"cu_count must be a positive int, got {cu_count!r}")
        if self.runtime.gfx942_emu_use_cu_count(cu_count) < 0:
            raise EmulationError(f"no emulated device left for {cu_count} CUs (64 distinct counts at most)")

    def protocol_version(self) -> int:
        return self.kernels.fp8gemm_gfx942_emu_protocol_version()

    def a_scale_ld_multiple(self) -> int:
        return self.kernels.fp8gemm_gfx942_emu_a_scale_ld_multiple()

    def wgrad_b_scale_ld_multiple(self) -> int:
        return self.kernels.fp8gemm_gfx942_emu_wgrad_b_scale_ld_multiple()

    def args_sizes(self) -> dict[str, int]:
        return {
            "wgrad_launch": self.kernels.fp8gemm_gfx942_emu_args_size(6),
            "quantize_transposed": self.kernels.fp8gemm_gfx942_emu_args_size(7),
            "quantize_grouped_transposed": self.kernels.fp8gemm_gfx942_emu_args_size(8),
            "kgrouped_wgrad_launch": self.kernels.fp8gemm_gfx942_emu_args_size(9),
            "launch": self.kernels.fp8gemm_gfx942_emu_args_size(0),
            "quantize": self.kernels.fp8gemm_gfx942_emu_args_size(1),
            "grouped_launch": self.kernels.fp8gemm_gfx942_emu_args_size(2),
            "moe_route": self.kernels.fp8gemm_gfx942_emu_args_size(3),
            "moe_activation": self.kernels.fp8gemm_gfx942_emu_args_size(4),
            "moe_combine": self.kernels.fp8gemm_gfx942_emu_args_size(5),
        }

    def launch(self, args: int) -> None:
        """``fp8gemm.protocol.LaunchFn`` on the emulator; returns when the kernels have finished."""
        self.launches += 1
        if self.kernels.fp8gemm_gfx942_emu_launch(args):
            raise EmulationError(self._error())

    def wgrad_launch(self, args: int) -> None:
        """``fp8gemm.protocol.WgradFn`` on the emulator; returns when the kernel has finished. Without ``accumulate``
        the output is poisoned first (NaN), so an element the kernel never writes cannot match by luck; with it, out
        holds what the caller put there, which the kernel must add to."""
        from fp8gemm.protocol import OUT_FP32, WGRAD_ARGS

        f = WGRAD_ARGS.unpack(args) if args else {}
        m, n, ldo = f.get("m", 0), f.get("n", 0), f.get("ldo", 0)
        if f.get("out") and m > 0 and n > 0 and ldo >= n and not f["accumulate"]:
            itemsize = 4 if f["out_kind"] == OUT_FP32 else 2  # bf16 out: NaN is 0xffff too
            ctypes.memset(f["out"], 0xFF, itemsize * ((m - 1) * ldo + n))
        self.wgrad_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_wgrad_launch(args):
            raise EmulationError(self._error())

    def kgrouped_wgrad_launch(self, args: int) -> None:
        """``fp8gemm.protocol.KGroupedWgradFn`` on the emulator; returns when the kernel has finished. Without
        ``accumulate`` each expert's out[e] is poisoned first (NaN), as ``wgrad_launch``'s out."""
        from fp8gemm.protocol import KGROUPED_WGRAD_ARGS, OUT_FP32

        f = KGROUPED_WGRAD_ARGS.unpack(args) if args else {}
        m, n, ldo, experts = (f.get(name, 0) for name in ("m", "n", "ldo", "experts"))
        well_formed = m > 0 and n > 0 and ldo >= n and 0 < experts <= self.kgrouped_max_experts()
        if well_formed and f["out"] and not f["accumulate"]:  # else nothing to poison, or out is added into
            itemsize = 4 if f["out_kind"] == OUT_FP32 else 2
            for e in range(experts):  # out[e] alone: what lies between experts is the caller's
                ctypes.memset(f["out"] + itemsize * e * f["out_es"], 0xFF, itemsize * ((m - 1) * ldo + n))
        self.kgrouped_wgrad_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_kgrouped_wgrad_launch(args):
            raise EmulationError(self._error())

    def kgrouped_max_experts(self) -> int:
        return self.kernels.fp8gemm_gfx942_emu_kgrouped_max_experts()

    def wgrad_workspace_bytes(self, m: int, n: int, k: int) -> int:
        size = self.kernels.fp8gemm_gfx942_emu_wgrad_workspace_bytes(m, n, k)
        if size < 0:
            raise EmulationError(self._error())
        return size

    def quantize(self, args: int) -> None:
        """``fp8gemm.protocol.QuantizeFn`` on the emulator; returns when the kernel has finished. The
        outputs are poisoned first (codes 0x80, NaN in e4m3fnuz; scales NaN), as the conformance
        suite poisons GPU memory, so an element the kernel never writes cannot match by luck."""
        from fp8gemm.protocol import QUANTIZE_ARGS

        fields = QUANTIZE_ARGS.unpack(args) if args else {}
        q, scale, m, k, scale_ld = (fields.get(name, 0) for name in ("q", "scale", "m", "k", "scale_ld"))
        if q and scale and m > 0 and k > 0 and scale_ld > 0:  # a malformed call has nothing to poison
            ctypes.memset(q, 0x80, m * k)
            # MN-major: K block kb holds rows at scale[kb * scale_ld + row]; the last block ends at row m.
            ctypes.memset(scale, 0xFF, 4 * ((k // 128 - 1) * scale_ld + m))
        self.quantize_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_quantize(args):
            raise EmulationError(self._error())

    def quantize_transposed(self, args: int) -> None:
        """``fp8gemm.protocol.QuantizeTransposedFn`` on the emulator; returns when the kernel has finished. As for
        ``quantize``, the outputs are poisoned first: q [m, k] and q_t [k, m_t] with code 0x80 (NaN in e4m3fnuz), both
        scale tensors NaN from their first element to their last (strides as packed)."""
        from fp8gemm.protocol import QUANTIZE_TRANSPOSED_ARGS

        f = QUANTIZE_TRANSPOSED_ARGS.unpack(args) if args else {}
        m, k, m_t = f.get("m", 0), f.get("k", 0), f.get("m_t", 0)
        strides = [f.get(name, -1) for name in ("scale_s0", "scale_s1", "scale_t_s0", "scale_t_s1")]
        well_formed = m > 0 and k > 0 and k % 128 == 0 and m_t >= m and m_t % 16 == 0 and min(strides) >= 0
        well_formed = well_formed and f["blocks"] in (0, 1) and (not f["blocks"] or m_t == m)
        if well_formed and all(f[name] for name in ("q", "q_t", "scale", "scale_t")):  # else the entry refuses it
            ctypes.memset(f["q"], 0x80, m * k)
            ctypes.memset(f["q_t"], 0x80, k * m_t)
            row_blocks, k_blocks = -(-m_t // 128), k // 128
            # activations: scale (row, k block), scale_t (column, row block); weights: (row block, k block) and back
            scale_rows, scale_t_rows = (row_blocks, k_blocks) if f["blocks"] else (m, k)
            for address, (s0, s1), rows, cols in (
                (f["scale"], strides[:2], scale_rows, k_blocks),
                (f["scale_t"], strides[2:], scale_t_rows, row_blocks),
            ):
                ctypes.memset(address, 0xFF, 4 * ((rows - 1) * s0 + (cols - 1) * s1 + 1))
        self.quantize_transposed_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_quantize_transposed(args):
            raise EmulationError(self._error())

    def quantize_grouped_transposed(self, args: int) -> None:
        """``fp8gemm.protocol.QuantizeGroupedTransposedFn`` on the emulator, any row source (``source``); returns when
        the kernel has finished. As for ``quantize``, the outputs are poisoned first: q [m, k] and q_t [k, columns] with
        code 0x80 (NaN in e4m3fnuz), both scale tensors NaN from their first element to their last (strides as
        packed); the inputs, whichever the source reads, are left alone."""
        from fp8gemm.protocol import QUANTIZE_GROUPED_TRANSPOSED_ARGS

        f = QUANTIZE_GROUPED_TRANSPOSED_ARGS.unpack(args) if args else {}
        m, k, experts, columns = (f.get(name, 0) for name in ("m", "k", "experts", "columns"))
        strides = [f.get(name, -1) for name in ("scale_s0", "scale_s1", "scale_t_s0", "scale_t_s1")]
        well_formed = m > 0 and k > 0 and k % 128 == 0 and experts > 0 and min(strides) >= 0
        well_formed = well_formed and columns == 128 * (experts + m // 128 + 1)
        if well_formed and all(f[name] for name in ("q", "q_t", "scale", "scale_t")):  # else the entry refuses it
            ctypes.memset(f["q"], 0x80, m * k)
            ctypes.memset(f["q_t"], 0x80, k * columns)
            for address, (s0, s1), rows, cols in (
                (f["scale"], strides[:2], m, k // 128),
                (f["scale_t"], strides[2:], k, columns // 128),
            ):
                ctypes.memset(address, 0xFF, 4 * ((rows - 1) * s0 + (cols - 1) * s1 + 1))
        self.quantize_grouped_transposed_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_quantize_grouped_transposed(args):
            raise EmulationError(self._error())

    def grouped_launch(self, args: int) -> None:
        """``fp8gemm.protocol.GroupedFn`` on the emulator; returns when the kernel has finished."""
        self.grouped_launches += 1
        if self.kernels.fp8gemm_gfx942_emu_grouped_launch(args):
            raise EmulationError(self._error())

    # The step entries (fp8gemm.protocol.MoeStepFn) on the emulator; each returns when its kernels have finished. Their
    # outputs are poisoned first, as ``quantize``'s: FP8 codes 0x80 (NaN), scales and float outputs NaN, offs and
    # positions 0x7fffffff, so an element the kernels never write cannot match by luck.

    def moe_route(self, args: int) -> None:
        from fp8gemm.protocol import MOE_ROUTE_ARGS

        f = MOE_ROUTE_ARGS.unpack(args) if args else {}
        tokens, top_k, experts, hidden = (f.get(name, 0) for name in ("tokens", "top_k", "experts", "hidden"))
        if min(tokens, top_k, experts, hidden) >= 1 and f["q"] and f["scale"] and f["offs"] and f["position"]:
            _poison_fp8_rows(f["q"], f["scale"], tokens * top_k, hidden, f["scale_ld"])
            ctypes.memset(f["offs"], 0x7F, 4 * experts)
            ctypes.memset(f["position"], 0x7F, 4 * tokens * top_k)
        self._step(self.kernels.fp8gemm_gfx942_emu_moe_route, args)

    def moe_activation(self, args: int) -> None:
        from fp8gemm.protocol import MOE_ACTIVATION_ARGS

        f = MOE_ACTIVATION_ARGS.unpack(args) if args else {}
        if min(f.get("rows", 0), f.get("inter", 0)) >= 1 and f["q"] and f["scale"]:
            _poison_fp8_rows(f["q"], f["scale"], f["rows"], f["inter"], f["scale_ld"])
        self._step(self.kernels.fp8gemm_gfx942_emu_moe_activation, args)

    def moe_combine(self, args: int) -> None:
        from fp8gemm.protocol import IN_FP32, MOE_COMBINE_ARGS

        f = MOE_COMBINE_ARGS.unpack(args) if args else {}
        tokens, hidden = f.get("tokens", 0), f.get("hidden", 0)
        if tokens > 0 and hidden > 0 and f["out"]:
            ctypes.memset(f["out"], 0xFF, ((tokens - 1) * f["ldo"] + hidden) * (4 if f["out_kind"] == IN_FP32 else 2))
        self._step(self.kernels.fp8gemm_gfx942_emu_moe_combine, args)

    def _step(self, entry, args: int) -> None:
        self.moe_steps += 1
        if entry(args):
            raise EmulationError(self._error())

    def moe_workspace_bytes(self, tokens: int, top_k: int, experts: int) -> int:
        size = self.kernels.fp8gemm_gfx942_emu_moe_workspace_bytes(tokens, top_k, experts)
        if size < 0:
            raise EmulationError(self._error())
        return size

    def grouped_workspace_bytes(self, layout: int, m: int, n: int, k: int, groups: int) -> int:
        size = self.kernels.fp8gemm_gfx942_emu_grouped_workspace_bytes(layout, m, n, k, groups)
        if size < 0:
            raise EmulationError(self._error())
        return size

    def workspace_bytes(self, m: int, n: int, k: int) -> int:
        size = self.kernels.fp8gemm_gfx942_emu_workspace_bytes(m, n, k)
        if size < 0:
            raise EmulationError(self._error())
        return size

    def decode_fp8(self, code: int) -> float:
        return self.runtime.gfx942_emu_decode_fp8(code)

    def mfma(self, a, b, c):
        """One v_mfma_f32_32x32x16_fp8_fp8 on a wavefront's registers: ``a``, ``b`` uint64 [64] (8 FP8
        codes per lane), ``c`` float32 [64, 16]; returns D, float32 [64, 16] (torch tensors)."""
        import torch

        a, b = a.contiguous(), b.contiguous()
        c = c.to(torch.float32).contiguous()
        if a.shape != (64,) or b.shape != (64,) or c.shape != (64, 16):
            raise ValueError("a and b must be [64] (one 64-bit source per lane), c [64, 16]")
        d = torch.empty(64, 16, dtype=torch.float32)
        self.runtime.gfx942_emu_mfma_f32_32x32x16_fp8(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr())
        return d

    def run_selftest(self, kernel: str, groups: int, block: int, out, inp) -> None:
        """Launches one of src/selftest_kernels.cpp on int32 CPU tensors ``out`` and ``inp``."""
        err = self.selftest.gfx942_emu_selftest_launch(kernel.encode(), groups, block, out.data_ptr(), inp.data_ptr())
        if err:
            raise EmulationError(self._error() if err != 1 else f"no self-test kernel named {kernel!r}")

    def backend(self):
        """The package's Backend descriptor (src/fp8gemm_rocm_gfx942/backend.py: FP8 dtype, scale
        layouts, grouped layouts) with the emulated kernels behind ``launch``, ``quantize``, ``grouped_launch`` and the
        other entries of MODULE_ENTRIES, named ``gfx942_emulated``."""
        module = _emulated_extension(self)
        descriptor = _package_backend_module(module).load()
        info = dict(descriptor.build_info, emulated="CPU, gfx942 emulator (fibers, documented MFMA layout)")
        return dataclasses.replace(
            descriptor, name=BACKEND_NAME, package="fp8gemm-rocm-gfx942 (CPU emulation)", build_info=info
        )


# What the package's module defines (fp8gemm/arch_module.hpp) besides build_info, each an Emulator method here.
MODULE_ENTRIES = ("protocol_version", "args_sizes", "a_scale_ld_multiple", "launch", "workspace_bytes", "quantize",
                  "grouped_launch", "grouped_workspace_bytes", "moe_route", "moe_activation", "moe_combine",
                  "moe_workspace_bytes", "wgrad_launch", "wgrad_workspace_bytes", "wgrad_b_scale_ld_multiple",
                  "kgrouped_wgrad_launch", "kgrouped_max_experts", "quantize_transposed",
                  "quantize_grouped_transposed")  # fmt: skip


def _emulated_extension(emulator: Emulator) -> types.ModuleType:
    """Stands in for the package's compiled ``_C`` module (csrc/module.cpp)."""
    module = types.ModuleType("_C")
    for entry in MODULE_ENTRIES:
        setattr(module, entry, getattr(emulator, entry))
    module.build_info = lambda: {
        "compiler": find_compiler() or "",
        "targets": "gfx942",  # what the kernels are written for; build_info's "emulated" says where they run
        "kernel": f"{kernel_sources() / 'kernels.hip'}",
        "quantize_kernel": f"{kernel_sources() / 'quantize.hip'}",
        "grouped_kernel": f"{kernel_sources() / 'grouped.hip'}",
        "moe_kernels": f"{kernel_sources() / 'moe.hip'}",
    }
    return module


def _package_backend_module(extension: types.ModuleType) -> types.ModuleType:
    """The package's backend.py, imported under a private name with ``extension`` as its ``_C``, so an
    installed fp8gemm_rocm_gfx942 (a real build) is neither used nor disturbed."""
    name = "_fp8gemm_rocm_gfx942_emulated"
    source = PACKAGE_DIR / "src" / "fp8gemm_rocm_gfx942"
    package_spec = importlib.util.spec_from_file_location(
        name, source / "__init__.py", submodule_search_locations=[str(source)]
    )
    package = importlib.util.module_from_spec(package_spec)
    sys.modules[name] = package
    package_spec.loader.exec_module(package)
    sys.modules[f"{name}._C"] = extension
    package._C = extension
    spec = importlib.util.spec_from_file_location(f"{name}.backend", source / "backend.py")
    backend_module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = backend_module
    spec.loader.exec_module(backend_module)
    return backend_module
