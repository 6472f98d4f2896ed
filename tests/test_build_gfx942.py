"""fp8gemm-rocm-gfx942 without an MI300X: it compiles for gfx942 (Debian's clang-19, HIP 5.2 runtime
library), its ISA holds the FP8 MFMA instructions without scratch or spills, the host extension links
and loads, and its host-side tiling logic covers every shape of the contract."""

from __future__ import annotations

import functools
import importlib
import re
import subprocess
import sys
import zipfile

import fp8gemm
import pytest
import torch
from arch_module_checks import check_grouped_refusals
from fp8gemm import registry
from fp8gemm.protocol import (
    GROUPED_CONTIGUOUS,
    GROUPED_MASKED,
    GROUPED_ROW_IDS,
    IN_BF16,
    KGROUPED_WGRAD_ARGS,
    MN_MAJOR,
    OUT_FP32,
    QUANTIZE_GROUPED_TRANSPOSED_ARGS,
    SOURCE_SWIGLU,
    ScaleLayout,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from isa import ROOT, build_wheel, exported_symbols, needed_libraries, require_tool


@pytest.fixture(scope="module")
def gfx942_dir(tmp_path_factory):
    require_tool("clang++-19")
    tmp = tmp_path_factory.mktemp("gfx942")
    wheel = build_wheel(
        "fp8gemm-rocm-gfx942", tmp / "wheel", {"FP8GEMM_HIP_COMPILER": "clang++-19", "FP8GEMM_HEADER_LIGHT": "ON"}
    )
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp / "site")
    return tmp / "site"


@pytest.fixture(scope="module")
def gfx942_module(gfx942_dir):
    sys.path.insert(0, str(gfx942_dir))
    importlib.invalidate_caches()
    yield importlib.import_module("fp8gemm_rocm_gfx942._C")
    sys.path.remove(str(gfx942_dir))


def _disassembly(gfx942_dir, unit: str = "kernels") -> str:
    objdump = require_tool("llvm-objdump-19")
    elf = gfx942_dir / "fp8gemm_rocm_gfx942" / "isa" / f"{unit}-gfx942.elf"
    return subprocess.run([objdump, "-d", "--mcpu=gfx942", str(elf)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("unit", ["kernels", "grouped"])
def test_isa_has_fp8_mfma_and_no_scratch(gfx942_dir, unit):
    """The dense GEMM, the weight-gradient one and its k-grouped form (kernels.hip) and the grouped one: the same tile
    code (csrc/tile.hpp), each in both tile configs."""
    asm = _disassembly(gfx942_dir, unit)
    ops = re.findall(r"^\s+(v_mfma\w+|global_load_dwordx4|ds_write_b128|scratch_\w+|buffer_store\w*)\b", asm, re.M)
    mfma = [op for op in ops if op.startswith("v_mfma")]
    assert set(mfma) == {"v_mfma_f32_32x32x16_fp8_fp8"}, set(mfma)
    kernels = {"kernels": 3, "grouped": 1}[unit]  # kernels.hip: gemm_kernel, wgrad_kernel, kgrouped_wgrad_kernel
    assert len(mfma) == kernels * (4 * 4 + 4 * 1)  # 4 K-steps x (2x2 tiles for 128 rows, 1 tile for 32 rows)
    assert "global_load_dwordx4" in ops and "ds_write_b128" in ops  # 16-byte loads, 16-byte LDS stores
    assert not [op for op in ops if op.startswith(("scratch_", "buffer_store"))]


def test_quantize_isa_reads_16_bytes_reduces_across_lanes_no_scratch(gfx942_dir):
    asm = _disassembly(gfx942_dir, "quantize")
    ops = re.findall(
        r"^\s+(global_load_dwordx4|global_store_dwordx2|ds_bpermute_b32|scratch_\w+|buffer_store\w*)\b", asm, re.M
    )
    assert {"global_load_dwordx4", "global_store_dwordx2", "ds_bpermute_b32"} <= set(ops)
    assert not [op for op in ops if op.startswith(("scratch_", "buffer_store"))]


def _functions(asm: str) -> dict[str, str]:
    """The disassembly of each kernel, by mangled name."""
    parts = re.split(r"^[0-9a-f]+ <(\w+)>:$", asm, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# each transposing quantizer and its instances: from bf16, fp16, fp32; the row sources' gather from each, SwiGLU, and
# its gradient with h of each kind
TRANSPOSING_QUANTIZERS = {"quantize_transposed_kernel": 3, "quantize_grouped_transposed_kernel": 3,
                          "quantize_grouped_source_kernel": 3 + 1 + 3}  # fmt: skip


@pytest.mark.parametrize("kernel", list(TRANSPOSING_QUANTIZERS))
def test_transposing_quantizer_isa_keeps_its_rows_in_registers(gfx942_dir, kernel):
    """quantize_transposed_kernel (fp8gemm/quantize_tiles.cuh), quantize_grouped_transposed_kernel (the same tile
    after fp8gemm/quantize_grouped_tiles.cuh's expert search) and quantize_grouped_source_kernel (that, its rows
    computed by fp8gemm/quantize_sources.cuh): 16-byte row loads, the 16-lane maximum through ds_bpermute, the tile's
    three workgroup barriers (the dense kernel: those alone), 8-byte LDS stores of the transposed codes, and no scratch
    (both passes' rows of a thread held in registers, the tile inlined)."""
    kernels = {name: body for name, body in _functions(_disassembly(gfx942_dir, "quantize")).items()
               if kernel in name}  # fmt: skip
    assert len(kernels) == TRANSPOSING_QUANTIZERS[kernel], sorted(kernels)
    for name, body in kernels.items():
        ops = re.findall(r"^\s+([a-z][a-z0-9_]*)\b", body, re.M)
        barriers = ops.count("s_barrier")
        assert barriers == 3 if kernel == "quantize_transposed_kernel" else barriers > 3, name
        assert {"global_load_dwordx4", "ds_bpermute_b32", "global_store_dwordx2"} <= set(ops), name
        assert any(op.startswith(("ds_write_b64", "ds_write2_b64", "ds_write2st64_b64")) for op in ops), name
        assert not [op for op in ops if op.startswith(("scratch_", "buffer_store"))], name


def test_code_object_targets_gfx942_sramecc_on_xnack_off(gfx942_dir):
    elf = (gfx942_dir / "fp8gemm_rocm_gfx942" / "isa" / "kernels-gfx942.elf").read_bytes()
    assert b"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-" in elf


def _report_field(text: str, key: str) -> int:
    return int(re.search(rf"{key}: (\d+)", text).group(1))


def test_resource_usage_no_spills_lds_fits(gfx942_dir):
    isa = gfx942_dir / "fp8gemm_rocm_gfx942" / "isa"
    units = ("kernels", "grouped", "quantize", "moe")
    report = "".join((isa / f"{unit}-resource-usage.txt").read_text() for unit in units)
    kernels = re.split(r"remark: Function Name: ", report)[1:]
    # two tile configs + split-K reduction + the weight-gradient kernel and its k-grouped form in two tile configs each;
    # grouped in two tile configs; quantization, with a transpose and with one per expert, from bf16, fp16, fp32, and
    # per expert from a row source; the mixture-of-experts steps (count, route, scatter, activation, combine)
    assert len(kernels) == 7 + 2 + 3 * 3 + TRANSPOSING_QUANTIZERS["quantize_grouped_source_kernel"] + 5
    for text in kernels:
        name = text.split()[0]
        field = functools.partial(_report_field, text)
        assert field(r"ScratchSize \[bytes/lane\]") == 0, name
        # The transposing quantizers keep a thread's 8 rows, their bounds and offsets live through both passes
        # (fp8gemm/quantize_tiles.cuh): clang spills SGPRs into VGPR lanes (v_writelane), not to memory (no scratch).
        sgprs_into_lanes = "transposed_kernel" in name or "source_kernel" in name
        assert field("VGPRs Spill") == 0 and (sgprs_into_lanes or field("SGPRs Spill") == 0), name
        assert field("VGPRs") + field("AGPRs") <= 512, name
        assert field(r"LDS Size \[bytes/block\]") <= 64 * 1024, name


def test_host_extension_links_hip_not_torch(gfx942_dir):
    (so,) = (gfx942_dir / "fp8gemm_rocm_gfx942").glob("_C*.so")
    needed = needed_libraries(so)
    assert any(lib.startswith("libamdhip64.so") for lib in needed), needed
    assert not any("torch" in lib or "c10" in lib for lib in needed), needed


def test_host_extension_exports_only_its_init(gfx942_dir):
    """As the CUDA modules (tests/test_build_cuda.py): default-visibility template statics would be shared with any
    other build of the module loaded into the same process."""
    (so,) = (gfx942_dir / "fp8gemm_rocm_gfx942").glob("_C*.so")
    assert exported_symbols(require_tool("readelf"), so) == {"PyInit__C"}


def test_kgrouped_wgrad_entry_is_bound_and_refuses_on_the_host(gfx942_module):
    """module.cpp binds the k-grouped weight gradient (fp8gemm/backend_module.hpp define_kgrouped_wgrad_entry); its
    launcher refuses a call off the layout before it touches a device."""
    assert gfx942_module.kgrouped_max_experts() == 2048
    assert gfx942_module.args_sizes()["kgrouped_wgrad_launch"] == KGROUPED_WGRAD_ARGS.size
    fields = dict.fromkeys(KGROUPED_WGRAD_ARGS.fields, 0) | {"m": 16, "n": 16, "k": 256, "out_kind": OUT_FP32}
    for experts in (0, 2, 2049):  # two experts need three K blocks
        address = KGROUPED_WGRAD_ARGS.pack(*(fields | {"experts": experts}).values())
        with pytest.raises(ValueError, match=r"kgrouped_wgrad_launch: 1 <= experts <= 2048 and k >= 128"):
            gfx942_module.kgrouped_wgrad_launch(address)


def test_grouped_quantizer_refuses_a_source_on_the_host(gfx942_module):
    """launch.cpp checks the row source (fp8gemm/quantize_grouped_launch.hpp check_row_source) before it touches a
    device: a source without a kernel never runs as plain rows."""
    assert gfx942_module.args_sizes()["quantize_grouped_transposed"] == QUANTIZE_GROUPED_TRANSPOSED_ARGS.size
    fields = dict.fromkeys(QUANTIZE_GROUPED_TRANSPOSED_ARGS.fields, 0)
    fields |= {"m": 16, "k": 256, "experts": 1, "columns": 256, "in_kind": IN_BF16}
    for source, message in ((7, "unknown source 7"), (SOURCE_SWIGLU, "the SwiGLU source reads fp32 h")):
        address = QUANTIZE_GROUPED_TRANSPOSED_ARGS.pack(*(fields | {"source": source}).values())
        with pytest.raises(ValueError, match=rf"quantize_grouped_transposed: {message}"):
            gfx942_module.quantize_grouped_transposed(address)


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 20000), n16=st.integers(1, 2048), kb=st.integers(1, 160), cus=st.sampled_from([80, 228, 304]))
def test_launch_geometry_covers_every_output_and_k_block_once(gfx942_module, m, n16, kb, cus):
    n, k = 16 * n16, 128 * kb
    plan = gfx942_module.plan(m, n, k, cus)
    gx, gy, gz = plan["grid"]
    bm, bn, per = plan["block_m"], plan["block_n"], plan["kb_per_split"]
    assert bm == (32 if m <= 32 else 128) and bn == 128
    assert (gx - 1) * bn < n <= gx * bn and (gy - 1) * bm < m <= gy * bm  # every row/col, no empty tile
    assert (gz - 1) * per < kb <= gz * per  # K blocks split without overlap, no empty split
    assert plan["workspace_bytes"] == (gz * m * n * 4 if gz > 1 else 0)
    if gz > 1:
        assert gx * gy < cus and per >= 4 and gx * gy * (gz - 1) < cus  # split only to fill the GPU


def test_backend_registers_and_is_chosen_for_an_mi300x(gfx942_dir, gfx942_module, monkeypatch):
    monkeypatch.syspath_prepend(str(gfx942_dir))
    registry.installed_backends(refresh=True)
    try:
        (ib,) = [ib for ib in registry.installed_backends() if ib.name == "gfx942"]
        assert (
            ib.error is None and ib.backend.fp8_dtype == "float8_e4m3fnuz" and ib.distribution == "fp8gemm-rocm-gfx942"
        )
        # backend.py reads the A-scale multiple from the module (csrc/launch.hpp kAScaleLdMultiple), which states it once
        assert ib.backend.a_scale_layout == ScaleLayout(MN_MAJOR, 4) and gfx942_module.a_scale_ld_multiple() == 4
        mi300x = registry.DeviceInfo("rocm", "AMD Instinct MI300X", ("gfx942",), "gfx942:sramecc+:xnack-")
        monkeypatch.setattr(registry, "describe_device", lambda device: mi300x)
        registry.clear_caches()
        assert fp8gemm.select("cpu").backend.name == "gfx942"
        assert fp8gemm.preferred_fp8_dtype("cpu") == torch.float8_e4m3fnuz
    finally:
        registry.installed_backends(refresh=True)


def test_grouped_launch_refuses_on_the_host_what_the_core_header_refuses(gfx942_module):
    """fp8gemm/grouped_launch.hpp: the size and tile bounds every arch shares, in one message format."""
    check_grouped_refusals(gfx942_module, "fp8gemm-rocm-gfx942", tiles_on_host=True, row_ids=True)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 700), min_size=1, max_size=256), tail=st.integers(0, 300), hint=st.integers(0, 64))
def test_grouped_grid_has_a_row_tile_for_every_split(gfx942_module, sizes, tail, hint):
    """Contiguous: the grid covers the row tiles of any split of m rows into the groups (the device clamps the ends,
    so the groups hold at most m rows); masked: every group's M_max rows."""
    m, groups = sum(sizes) + tail, len(sizes)
    if m == 0:
        return
    plan = gfx942_module.grouped_plan(GROUPED_CONTIGUOUS, m, 4096, groups, hint)
    bm, (gx, gy) = plan["block_m"], plan["grid"]
    assert gx == 32 and bm == (32 if (hint or -(-m // groups)) <= 32 else 128)
    assert sum(-(-rows // bm) for rows in sizes) <= gy <= -(-m // bm) + groups - 1
    ones = min(groups, m) - 1
    worst = [1] * ones + [m - ones]  # single rows (a tile each), then the rest
    assert sum(-(-rows // bm) for rows in worst) <= gy
    masked = gfx942_module.grouped_plan(GROUPED_MASKED, m, 4096, groups, hint)
    per = -(-m // masked["block_m"])
    assert masked["tiles_per_group"] == per and masked["grid"] == (32, groups * per)


def row_id_tiles(ids: list[int], groups: int, block_m: int) -> list[tuple[int, int]]:
    """The row tiles csrc/grouped.hip row_ids_tile walks, as (first row, end): each run of one id in [0, groups) in
    consecutive rows cut into block_m rows from its first row; other ids none."""
    tiles, start = [], 0
    for r in range(1, len(ids) + 1):
        if r == len(ids) or ids[r] != ids[start]:
            if 0 <= ids[start] < groups:
                tiles += [(t, min(t + block_m, r)) for t in range(start, r, block_m)]
            start = r
    return tiles


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(1, 300), st.integers(-2, 9)), min_size=1, max_size=120),
       groups=st.integers(1, 8), hint=st.integers(0, 64))  # fmt: skip
def test_grouped_grid_has_a_row_tile_for_any_row_ids(gfx942_module, runs, groups, hint):
    """Row ids: the grid covers the tiles of any ids (the host never reads them): ceil(m / BM) + m - 1 row tiles, as
    each run adds at most one partial tile; the tile height is the contiguous layout's, and ids sorted by group take as
    many tiles as the same groups through cumulative ends."""
    ids = [i for length, i in runs for _ in range(length)]
    m = len(ids)
    plan = gfx942_module.grouped_plan(GROUPED_ROW_IDS, m, 4096, groups, hint)
    bm, (gx, gy) = plan["block_m"], plan["grid"]
    contiguous = gfx942_module.grouped_plan(GROUPED_CONTIGUOUS, m, 4096, groups, hint)
    assert gx == 32 and bm == contiguous["block_m"] and gy == -(-m // bm) + m - 1
    assert len(row_id_tiles(ids, groups, bm)) <= gy
    assert len(row_id_tiles(list(range(m)), m, bm)) == m <= gy  # a run per row
    sizes = [ids.count(g) for g in range(groups)]
    ordered = [g for g in range(groups) for _ in range(sizes[g])]
    assert len(row_id_tiles(ordered, groups, bm)) == sum(-(-rows // bm) for rows in sizes)


def test_kernels_also_compile_against_the_hip_runtime_headers(tmp_path):
    """The hipcc build path (FP8GEMM_HIP_HEADERS: <hip/hip_runtime.h>) compiles too, here against
    Debian's HIP 5.2 headers; ROCm 6.3's own hipcc is not available on these machines."""
    clang = require_tool("clang++-19")
    pkg = ROOT / "packages" / "fp8gemm-rocm-gfx942"
    for unit in ("kernels", "grouped", "quantize", "moe"):
        cmd = [clang, "-x", "hip", "-std=c++17", "-O3", "--offload-arch=gfx942:sramecc+:xnack-", "-nogpulib",
               "-DFP8GEMM_HIP_HEADERS", "-D__HIP_PLATFORM_AMD__", f"-I{pkg / 'csrc'}", f"-I{fp8gemm.get_include()}",
               "-c", str(pkg / "csrc" / f"{unit}.hip"), "-o", str(tmp_path / f"{unit}.o")]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert (tmp_path / f"{unit}.o").stat().st_size > 0
