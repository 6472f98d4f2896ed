"""The gfx942 emulator's own parts, independent of the package's kernels: v_mfma_f32_32x32x16_fp8_fp8
against AMD's published register layout and a float64 product, FP8 (e4m3fnuz) decoding, and the
barrier / LDS / wave-op rules on small kernels (emulation/src/selftest_kernels.cpp)."""

from __future__ import annotations

import csv
import re

import pytest
import test_gfx942_emulation
import torch
from test_gfx942_emulation import EMULATION, gfx942_emulator

emulator = test_gfx942_emulation.emulator  # built once for the test run, shared with the kernel tests

LAYOUTS = EMULATION / "isa_layouts"


# --- MFMA: the documented layout, read from AMD's calculator output ----------------------------------


def documented_layout(matrix: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(lane, slot) -> (row, column) of ``matrix`` (A, B, C or D), from the Matrix Instruction
    Calculator's table; a slot is a byte of the 64-bit source for A/B, a register for C/D."""
    lines = (LAYOUTS / f"v_mfma_f32_32x32x16_fp8_fp8.{matrix}.csv").read_text().splitlines()
    assert lines[1] == "Instruction: V_MFMA_F32_32X32X16_FP8_FP8"
    header, *body = csv.reader(lines[2:])
    expected = [f"v{b // 4}.[{8 * (b % 4) + 7}:{8 * (b % 4)}]" for b in range(8)] if matrix in "AB" else None
    assert header[1:] == (expected or [f"v{r}" for r in range(16)])
    table = {}
    for row in body:
        for slot, cell in enumerate(row[1:]):
            i, j = re.fullmatch(rf"{matrix}\[(\d+)\]\[(\d+)\]", cell).groups()
            table[int(row[0]), slot] = (int(i), int(j))
    return table


@pytest.mark.parametrize("matrix,shape", [("A", (32, 16)), ("B", (16, 32)), ("C", (32, 32)), ("D", (32, 32))])
def test_documented_layout_covers_each_element_once(matrix, shape):
    table = documented_layout(matrix)
    assert sorted(table.values()) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]


def random_fp8_codes(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    codes = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.int64)
    return torch.where(codes == 0x80, 0x81, codes)  # 0x80 is NaN in e4m3fnuz


def pack_sources(codes: torch.Tensor, table) -> torch.Tensor:
    regs = torch.zeros(64, dtype=torch.int64)
    for (lane, byte), (i, j) in table.items():
        regs[lane] |= int(codes[i, j]) << (8 * byte)
    return regs


def wave_registers(values: torch.Tensor, table) -> torch.Tensor:
    regs = torch.empty(64, 16, dtype=values.dtype)
    for (lane, reg), (i, j) in table.items():
        regs[lane, reg] = values[i, j]
    return regs


def from_wave_registers(regs: torch.Tensor, table) -> torch.Tensor:
    out = torch.empty(32, 32, dtype=regs.dtype)
    for (lane, reg), (i, j) in table.items():
        out[i, j] = regs[lane, reg]
    return out


def decode(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fnuz).double()


@pytest.mark.parametrize("seed", range(4))
def test_mfma_matches_float64_product_in_documented_layout(emulator, seed):
    gen = torch.Generator().manual_seed(seed)
    a_codes, b_codes = random_fp8_codes(32, 16, gen), random_fp8_codes(16, 32, gen)
    c = torch.randn(32, 32, generator=gen) * 100
    d_regs = emulator.mfma(
        pack_sources(a_codes, documented_layout("A")),
        pack_sources(b_codes, documented_layout("B")),
        wave_registers(c, documented_layout("C")),
    )
    d = from_wave_registers(d_regs, documented_layout("D")).double()
    exact = decode(a_codes) @ decode(b_codes) + c.double()
    # Exact products and sum, one rounding to fp32: within half an fp32 ulp of the float64 result.
    assert ((d - exact).abs() <= exact.abs() * 2.0**-24).all(), (d - exact).abs().max()


def test_mfma_nan_operand_poisons_exactly_its_row(emulator):
    gen = torch.Generator().manual_seed(7)
    a_codes, b_codes = random_fp8_codes(32, 16, gen), random_fp8_codes(16, 32, gen)
    a_codes[5, 11] = 0x80
    d_regs = emulator.mfma(
        pack_sources(a_codes, documented_layout("A")),
        pack_sources(b_codes, documented_layout("B")),
        torch.zeros(64, 16),
    )
    nan_rows = from_wave_registers(d_regs, documented_layout("D")).isnan().all(dim=1)
    assert nan_rows.tolist() == [i == 5 for i in range(32)]


def test_fp8_decoding_is_e4m3fnuz(emulator):
    ours = torch.tensor([emulator.decode_fp8(c) for c in range(256)], dtype=torch.float64)
    torch_fnuz = decode(torch.arange(256))
    assert torch.equal(ours.isnan(), torch.arange(256) == 0x80)
    assert torch.equal(ours.nan_to_num(), torch_fnuz.nan_to_num())
    assert ours[0x7F] == 240 and ours[0x01] == 2.0**-10 and ours[0x08] == 2.0**-7 and ours[0x00] == 0


# --- barriers, LDS and wave-level operations on small kernels ---------------------------------------


def _ints(*shape, gen, high=1000):
    return torch.randint(0, high, shape, generator=gen, dtype=torch.int32)


def test_lds_is_shared_by_a_workgroup_through_a_barrier(emulator):
    inp = _ints(3 * 256, gen=torch.Generator().manual_seed(1))
    out = torch.full_like(inp, -7)
    emulator.run_selftest("lds_exchange", 3, 256, out, inp)
    assert torch.equal(out, inp.view(3, 256).roll(-97, dims=1).flatten())


def test_missing_barrier_reads_poisoned_lds(emulator):
    inp = _ints(2 * 256, gen=torch.Generator().manual_seed(2))
    out = torch.full_like(inp, -7)
    emulator.run_selftest("lds_exchange_without_barrier", 2, 256, out, inp)
    wrong = out != inp.view(2, 256).roll(-97, dims=1).flatten()
    assert wrong.sum() > 64 and (out[wrong] == -1).all()  # -1: the poison (0xff bytes), not a stale value


@pytest.mark.parametrize(
    "kernel,message",
    [
        ("skips_barrier", r"work-items 0-76,78-255 wait at s_barrier #1 but work-items 77 finished"),
        ("skips_one_of_two_barriers", r"work-item 5 .* disagree on which barrier"),
        ("barrier_without_fence", r"s_barrier without a preceding release fence"),
        ("divergent_mfma", r"lanes 0-31 wait at v_mfma_f32_32x32x16_fp8_fp8 but lanes 32-63 have returned"),
        (
            "mfma_with_lanes_at_a_barrier",
            r"lanes 0-31 wait at v_mfma_f32_32x32x16_fp8_fp8 while lanes 32-63 went on to a barrier",
        ),
    ],
)
def test_broken_discipline_is_reported(emulator, kernel, message):
    out = torch.zeros(512, dtype=torch.int32)
    with pytest.raises(gfx942_emulator.EmulationError, match=message):
        emulator.run_selftest(kernel, 2, 256, out, out)


def test_mfma_in_a_kernel_is_the_wave_instruction(emulator):
    gen = torch.Generator().manual_seed(3)
    a, b = (pack_sources(random_fp8_codes(32, 16, gen), documented_layout("A")) for _ in range(2))
    c = torch.randn(64, 16, generator=gen)
    inp = torch.cat([a.view(torch.int32).view(64, 2), b.view(torch.int32).view(64, 2), c.view(torch.int32)], dim=1)
    out = torch.zeros(64, 16, dtype=torch.int32)
    emulator.run_selftest("mfma_per_lane", 1, 64, out, inp.contiguous())
    assert torch.equal(out.view(torch.float32), emulator.mfma(a, b, c))


def test_ds_bpermute_reads_the_addressed_lane(emulator):
    gen = torch.Generator().manual_seed(4)
    address, value = _ints(256, gen=gen, high=4 * 128), _ints(256, gen=gen)
    out = torch.zeros(256, dtype=torch.int32)
    emulator.run_selftest("bpermute", 1, 256, out, torch.stack([address, value], dim=1).contiguous())
    source = torch.arange(256) // 64 * 64 + (address // 4) % 64
    assert torch.equal(out, value[source])


@pytest.mark.parametrize("early_exit", [False, True])
def test_shfl_xor_max_over_16_lanes(emulator, early_exit):
    """The activation quantizer's group maximum; lanes that returned are inactive, as under EXEC."""
    x = torch.randn(512, generator=torch.Generator().manual_seed(5))
    out = torch.full((512,), -1, dtype=torch.int32)
    kernel = "max_over_16_lanes" + "_after_early_exit" * early_exit
    emulator.run_selftest(kernel, 2, 256, out, x.view(torch.int32))
    expected = x.view(-1, 16).amax(dim=1).repeat_interleave(16).view(torch.int32)
    if early_exit:
        expected.view(-1, 64)[:, 48:] = -1
    assert torch.equal(out, expected)


def test_shfl_xor_max_with_groups_gone_on_to_a_barrier(emulator):
    """Lanes that left a loop for the barrier after it are inactive for the other groups' exchanges, as under EXEC
    (the transposing quantizer's row loop at M): each 16-lane group g takes its maximum g % 4 times, then all meet."""
    x = torch.randn(512, generator=torch.Generator().manual_seed(6))
    out = torch.full((512,), -1, dtype=torch.int32)
    emulator.run_selftest("max_over_16_lanes_with_groups_at_a_barrier", 2, 256, out, x.view(torch.int32))
    expected = x.view(-1, 16).amax(dim=1).repeat_interleave(16)
    rounds = torch.arange(512) // 16 % 4
    expected[rounds == 0] = x[rounds == 0]
    assert torch.equal(out, expected.view(torch.int32))
