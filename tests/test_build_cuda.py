"""The CUDA arch packages without a GPU: each compiles for its target only, its SASS holds the FP8
tensor-core instructions its design rests on, nothing spills, and it links neither torch nor cudart."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig

import pytest
from arch_module_checks import check_grouped_refusals, load_extension
from isa import (
    ROOT,
    build_wheel,
    exported_symbols,
    extract_module,
    needed_libraries,
    require_tool,
    sass_by_function,
    sass_opcode_sequences,
    sass_opcodes,
    sass_opcodes_by_function,
)

sys.path.insert(0, str(ROOT / "ci"))
import arches  # noqa: E402

# package: (cubin target, {SASS opcode prefix: minimum count}, kernels in the module), from packages/*/arch.toml.
PACKAGES = {a.package: (a.target, a.isa["opcodes"], a.isa["kernels"]) for a in arches.arches() if a.platform == "cuda"}
BUILD_ENV = {a.package: a.build_env for a in arches.arches()}


@pytest.fixture(scope="module", params=sorted(PACKAGES))
def built(request, tmp_path_factory):
    require_tool("nvcc")
    tmp = tmp_path_factory.mktemp(request.param)
    return request.param, extract_module(
        build_wheel(request.param, tmp / "wheel", BUILD_ENV[request.param]), tmp / "unpacked"
    )


ONE_SET = 1  # tile_config.hpp MainLoop::kOneSet
SM90A_GEMM_KERNELS = 30  # tile_config.hpp: the 16 kTiles, the 6 kGroupedTiles and the 4 kWgradTiles twice
WGRAD_TYPES = (2, 3)  # tile_config.hpp GemmType::kWgrad, kKGroupedWgrad


def sm90a_kernel_params(name: str) -> tuple[int, ...] | None:
    """(rows, cols, cluster, main loop) of a gemm_kernel's mangled name (tile_config.hpp TileConfig), else None."""
    m = re.search(r"gemm_kernelILi(\d+)ELi(\d+)ELi(\d)ELNS_8MainLoopE(\d)E", name)
    return tuple(map(int, m.groups())) if m else None


def sm90a_gemm_type(name: str) -> int:
    """The GemmType of a gemm_kernel's mangled name (tile_config.hpp: 0 dense, 1 grouped, 2 weight gradient, 3 its
    k-grouped form)."""
    return int(re.search(r"GemmTypeE(\d)E", name).group(1))


def test_ships_machine_code_for_its_target_only(built):
    package, module = built
    elves = subprocess.run(
        [require_tool("cuobjdump"), "-lelf", str(module)], capture_output=True, text=True, check=True
    ).stdout
    assert set(re.findall(r"sm_\d+a?", elves)) == {PACKAGES[package][0]}, elves  # one cubin per translation unit


def test_module_exports_only_its_init(built):
    """Every symbol but PyInit__C hidden: statics of inline and template functions with default visibility are
    GNU_UNIQUE, unified across every library loaded into the process, so a second build of the module (an A/B
    harness, two environments' packages) could share the once-per-device shared-memory opt-in and launch without
    it. Our own statics sit in anonymous namespaces, but g++-13 emitted UNIQUE symbols from headers outside csrc/
    (the sm120 module built on a Hopper host) where g++-12 emitted none."""
    package, module = built
    assert exported_symbols(require_tool("readelf"), module) == {"PyInit__C"}


def test_sass_has_the_fp8_tensor_core_path(built):
    package, module = built
    ops = sass_opcodes(require_tool("cuobjdump"), module)
    for prefix, minimum in PACKAGES[package][1].items():
        count = sum(n for op, n in ops.items() if op == prefix or op.startswith(prefix + "."))
        assert count >= minimum, f"{package}: {prefix} x{count}, expected >= {minimum}"
    assert not any(op.startswith(("HMMA", "FFMA")) and "E4M3" in op for op in ops)  # no slow fallback


def test_sm90a_one_set_k_loop_is_unrolled(built):
    """kernel_traits.cuh kAlwaysUnrolled / tile_config.hpp kUnrolledMinKb: the one-set K loop holds 8 unrolled K
    blocks besides the remainder loop's one. 256-row kernels: two 64-row slices of four wgmma per block, no other
    copy. The other one-set tiles (128 x 160, 128 x 192, 192 x 128, and 128 x 128 on long K): one slice, and a
    rolled copy for short segments; one loop per B-scale split (with_former: 4 for 160-wide tiles, 2 for 192,
    1 for 128)."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    expected = {  # (rows, cols, cluster, main loop) -> wgmma per kernel
        (256, 128, 1, ONE_SET): (8 + 1) * 2 * 4,
        (256, 128, 2, ONE_SET): (8 + 1) * 2 * 4,
        (128, 160, 1, ONE_SET): 4 * (8 + 1 + 1) * 4,
        (128, 192, 1, ONE_SET): 2 * (8 + 1 + 1) * 4,
        (192, 128, 1, ONE_SET): 1 * (8 + 1 + 1) * 4,
        (128, 128, 1, ONE_SET): 1 * (8 + 1 + 1) * 4,
    }
    found = {}
    for name, ops in sass_opcodes_by_function(require_tool("cuobjdump"), module).items():
        key = sm90a_kernel_params(name)
        if key in expected and sm90a_gemm_type(name) not in WGRAD_TYPES:  # test_sm90a_wgrad_kernels_promote_per_column
            found[key] = sum(n for op, n in ops.items() if op.startswith("QGMMA."))
    assert sorted(found) == sorted(expected)
    for key, count in found.items():
        assert count >= expected[key], (key, count, expected[key])


def test_sm90a_wgrad_kernels_promote_per_column(built):
    """wgrad_launch.cuh (GemmType::kWgrad and kKGroupedWgrad): the one-set loop unrolled as the dense kernels' (8 K
    blocks, the remainder's 1 and the rolled copy's 1); each stage's B scales come by TMA (four 2-D loads
    a stage: A, B, both scales) and each K block's promotion reads its columns' pairs (LDS.64, one per 8-column group and
    slice) and multiplies both scales per accumulator (an FMUL beside each FFMA); the 128-row tiles' out leaves through
    TMA stores and, accumulated, TMA reduce-adds (epilogue.cuh epilogue_f32_tma), the 192-row tile's directly."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    per_tile = {(192, 128, 1, ONE_SET): (8 + 1 + 1) * 4, (128, 128, 1, ONE_SET): (8 + 1 + 1) * 4,
                (128, 160, 1, ONE_SET): (8 + 1 + 1) * 4, (128, 192, 1, ONE_SET): (8 + 1 + 1) * 4}  # fmt: skip
    expected = {(tile, kind): wgmma for tile, wgmma in per_tile.items() for kind in WGRAD_TYPES}
    found = {}
    for name, ops in sass_opcodes_by_function(require_tool("cuobjdump"), module).items():
        if sm90a_kernel_params(name) and sm90a_gemm_type(name) in WGRAD_TYPES:
            found[sm90a_kernel_params(name), sm90a_gemm_type(name)] = ops
    assert sorted(found) == sorted(expected)
    for key, ops in found.items():
        cols = key[0][1]
        qgmma = sum(n for op, n in ops.items() if op.startswith(f"QGMMA.64x{cols}x32"))
        blocks = qgmma // 4  # K blocks x slices in the SASS
        assert qgmma >= expected[key], (key, qgmma)
        assert ops["LDS.64"] >= blocks * cols // 8, (key, ops["LDS.64"], blocks)
        assert ops["FMUL"] >= ops["FFMA"] // 2 > 0 and ops["FFMA"] >= blocks * cols // 2, (
            key,
            ops["FMUL"],
            ops["FFMA"],
        )
        tma_store = key[0][0] == 128
        assert any(op.startswith("UTMASTG") for op in ops) == tma_store, key
        assert any(op.startswith("UTMAREDG") and ".ADD" in op for op in ops) == tma_store, key
        assert sum(n for op, n in ops.items() if op.startswith("UTMALDG.2D")) >= 4, key


def test_sm90a_decode_tiles_issue_tma_from_an_elected_lane(built):
    """kernel_traits.cuh kElectedProducer (measured 1.024x over 13 decode shapes): in the 64-row
    kernels ptxas knows one thread issues the loads, so no UTMALDG sits in a uniformity loop (ELECT ...
    BRA.U.ANY: ~220 instead of ~110 cycles per stage); the wider tiles keep their lane-0 issue."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    looped = {}  # (rows, cols) -> UTMALDGs followed within 4 instructions by a BRA.U.ANY
    for name, ops in sass_opcode_sequences(require_tool("cuobjdump"), module).items():
        m = re.search(r"gemm_kernelILi(\d+)ELi(\d+)E", name)
        if m:
            loads = [i for i, op in enumerate(ops) if op.startswith("UTMALDG")]
            assert len(loads) >= 3, name
            key = tuple(map(int, m.groups()))
            looped[key] = looped.get(key, 0) + sum("BRA.U.ANY" in ops[i + 1 : i + 5] for i in loads)
    decode = {key: n for key, n in looped.items() if key[0] == 64}
    assert sorted(decode) == [(64, 16), (64, 32), (64, 64), (64, 96), (64, 128)]
    assert all(n == 0 for n in decode.values()), decode
    assert all(n > 0 for key, n in looped.items() if key[0] > 64), looped  # the check sees the loops where they are


def test_sm90a_promotion_ffmas_read_their_operands_from_two_register_banks(built):
    """epilogue.cuh's fp32 epilogue stores 4 bytes at a time: an 8-byte store made ptxas give each running total
    the register parity of its wgmma accumulator, so `FFMA total, acc, scale, total` read two operands from one
    bank (968 of 1152 FFMAs in the 256 x 128 kernel; DeepGEMM's kernel: 0). Fixed, the 256- and 192-row tiles ran
    1-4% fewer SM cycles. No FFMA in any kernel may pair same-parity accumulator and addend."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    ffma = re.compile(r"FFMA R(\d+), R(\d+), R\d+(?:\.reuse)?, R(\d+)\b")
    counts = {}
    for name, body in sass_by_function(require_tool("cuobjdump"), module).items():
        if "gemm_kernel" in name:
            ops = [(int(a), int(c)) for _, a, c in ffma.findall(body)]
            counts[name] = (len(ops), sum(a % 2 == c % 2 for a, c in ops))
    assert len(counts) == SM90A_GEMM_KERNELS and all(total > 0 for total, _ in counts.values()), counts
    assert all(same == 0 for _, same in counts.values()), counts


def wgmma_waits(sass: str) -> tuple[int, int]:
    """(QGMMA instructions, those that end a wait group: `gsb0`) in one function's SASS."""
    qgmma = [line for line in sass.splitlines() if "QGMMA." in line]
    return len(qgmma), sum("gsb0" in line for line in qgmma)


def test_sm90a_wgmma_is_not_serialized(built):
    """Every wait group holds a whole 128-wide K block (four k32 steps), so the tensor core runs them back to back.
    When ptxas cannot prove that no other instruction touches a wgmma's accumulators before its wait, it serialises
    every wgmma (only an info message, C7514: each QGMMA gets its own gsb0 and WARPGROUP.DEPBAR). An experiment
    with the K-block count as a compile-time constant did that to every two-set kernel."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    counts = {
        name: wgmma_waits(body)
        for name, body in sass_by_function(require_tool("cuobjdump"), module).items()
        if "gemm_kernel" in name
    }
    assert len(counts) == SM90A_GEMM_KERNELS and all(qgmma >= 4 for qgmma, _ in counts.values()), counts
    assert all(qgmma >= 4 * waits for qgmma, waits in counts.values()), counts


def test_sm90a_two_set_tiles_prefetch_their_first_b_scales(built):
    """producer.cuh: in the two-set kernels (MainLoop::kTwoSets and kSplitWarpgroups) the TMA thread
    sends each tile's first B-scale line to L2 (`prefetch.global.L2`: CCTL.E.PF2) before the consumers load it; the
    one-set kernels take their B scales from the B-scale warp's segments and have none."""
    package, module = built
    if package != "fp8gemm-cuda-sm90a":
        pytest.skip("sm90a kernels only")
    prefetches = {}
    for name, ops in sass_opcodes_by_function(require_tool("cuobjdump"), module).items():
        if params := sm90a_kernel_params(name):
            two_set = params[3] != ONE_SET
            prefetches[name] = (two_set, ops["CCTL.E.PF2"])
    # 8 two-set, 2 split warpgroups, 2 grouped two-set
    assert sum(two_set for two_set, _ in prefetches.values()) == 12, prefetches
    assert all((count > 0) == two_set for two_set, count in prefetches.values()), prefetches


def test_no_register_spills(built):
    package, module = built
    out = subprocess.run(
        [require_tool("cuobjdump"), "-res-usage", str(module)], capture_output=True, text=True, check=True
    ).stdout
    kernels = re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    assert len(kernels) == PACKAGES[package][2], out
    for name, regs, stack, local in kernels:
        assert int(stack) == 0 and int(local) == 0, f"{name} spills: STACK {stack} LOCAL {local}"
        assert int(regs) <= 255


def test_grouped_launch_refuses_on_the_host_what_the_core_header_refuses(built):
    """fp8gemm/grouped_launch.hpp: one size bound and one message format for every arch. sm90a counts its persistent
    grid's tiles after asking the device for its SM count, so its tile bound is past a GPU-less host's reach. Both
    kernels walk row ids (m_indices): layout 2 passes the checks."""
    package, module = built
    sm90a = package == "fp8gemm-cuda-sm90a"
    check_grouped_refusals(load_extension(module), package, tiles_on_host=not sm90a, row_ids=True)


def test_module_states_the_a_scale_layout_its_backend_reads(built):
    """csrc/launch.hpp kAScaleLdMultiple, bound by fp8gemm/arch_module.hpp: MN-major A scales with 16-byte columns."""
    assert load_extension(built[1]).a_scale_ld_multiple() == 4


def test_binary_links_neither_torch_nor_the_cuda_runtime(built):
    needed = needed_libraries(built[1])
    assert not any("torch" in lib or "c10" in lib or "cudart" in lib or lib.startswith("libcuda.") for lib in needed), (
        needed
    )


def test_every_cuda_arch_links_into_one_library(tmp_path):
    """The core's shared headers compiled once per CUDA arch package link into one library (the hub's CUDA variant
    holds them all) with no kernel and no build_info shared between the arches: each launches its own cubin and
    reports its own targets. Identical pure helpers (ceil_div, moe_grid, ...) may merge."""
    pybind11 = pytest.importorskip("pybind11")
    nvcc, cxx = require_tool("nvcc"), require_tool("g++")
    include = ROOT / "packages" / "fp8gemm-core" / "src" / "fp8gemm" / "include"
    python_headers = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    objects: dict[str, list] = {}
    for package, (target, _, _) in PACKAGES.items():
        csrc = ROOT / "packages" / package / "csrc"
        for source in ("moe.cu", "quantize.cu", "launch.cu"):
            obj = tmp_path / f"{package}_{source}.o"
            cmd = [nvcc, "-std=c++17", "-c", f"-arch={target}", f"-I{include}", f"-I{csrc}", "-Xcompiler", "-fPIC"]
            subprocess.run([*cmd, str(csrc / source), "-o", str(obj)], check=True, capture_output=True)
            objects.setdefault(package, []).append(obj)
        info = tmp_path / f"{package}_info.cpp"  # what module.cpp does with build_info.hpp, its macros per arch
        info.write_text(
            f'#include "fp8gemm/build_info.hpp"\npybind11::dict info_{target}() {{ return fp8gemm::build_info("k"); }}\n'
        )
        macros = [f'-DFP8GEMM_TARGETS="{target}"', '-DFP8GEMM_ARCH_FLAGS=""', '-DFP8GEMM_COMPILER=""']
        obj = tmp_path / f"{package}_info.o"
        subprocess.run([cxx, "-std=c++17", "-c", "-fPIC", f"-I{include}", *python_headers, *macros, str(info), "-o",
                        str(obj)], check=True, capture_output=True)  # fmt: skip
        objects[package].append(obj)
    every = [str(o) for objs in objects.values() for o in objs]
    linked = subprocess.run([nvcc, "-shared", *every, "-o", str(tmp_path / "all.so")], capture_output=True)
    assert linked.returncode == 0, linked.stderr.decode()[-3000:]
    nm = require_tool("nm")

    def external_symbols(objs) -> set[str]:
        out = subprocess.run([nm, "--defined-only", *map(str, objs)], capture_output=True, text=True).stdout
        return {f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[1] in "TWVRDBu"}

    shared = set.intersection(*(external_symbols(objs) for objs in objects.values()))
    assert not [s for s in shared if "__device_stub" in s or "build_info" in s], shared
