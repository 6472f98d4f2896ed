"""The step kernels of fused_experts' pipeline (fp8gemm/moe_steps.cuh through ``Backend.moe_route`` / ``moe_activation``
/ ``moe_combine``): route +
quantize-scatter against the torch path's stable sort and ``reference_quantize`` bit for bit; SiLU-and-mul + quantize
against the torch step; combine against float64; the whole pipeline against the torch steps on the same backend and
the float64 yardstick. Seeded data (seeds printed), every output poisoned first, ids outside [0, E) (-1, E, large),
a token naming one expert twice, empty experts, T = 1 and tokens over several route blocks, bf16/fp16/fp32 x.

On the CPU the gfx942 kernels run on its emulator (csrc/moe.hip unchanged); with ``FP8GEMM_TEST_DEVICE=cuda`` every
installed backend with the step entries that fits the GPU runs the same tests.
"""

from __future__ import annotations

import dataclasses
import re
import types

import fp8gemm
import pytest
import test_gfx942_emulation
import torch
from conftest import backends_under_test, device_under_test
from fp8gemm import moe, moe_steps, moe_torch, registry
from fp8gemm.arch_module import backend_from_module
from fp8gemm.moe_pipeline import MoePlan
from fp8gemm.moe_reference import reference_fused_experts
from fp8gemm.protocol import (
    K_MAJOR,
    MN_MAJOR,
    MOE_ACTIVATION_ARGS,
    MOE_COMBINE_ARGS,
    MOE_MAX_EXPERTS,
    MOE_ROUTE_ARGS,
    OUT_BF16,
    PROTOCOL_VERSION,
    ScaleLayout,
)
from fp8gemm.reference import reference_quantize
from fp8gemm.runtime import IN_KINDS, empty_scale
from fp8gemm.testing import conformance
from fp8gemm.testing.conformance import DEFAULT_SEED
from test_grouped_dispatch import make_backend
from test_moe import MoeCase, bound, make_case

emulator, mi300x = test_gfx942_emulation.emulator, test_gfx942_emulation.mi300x  # built once for the test run
DEVICE = device_under_test()
ON_CPU = DEVICE.type == "cpu"


def _step_backends() -> list[str]:
    if ON_CPU:
        return ["gfx942_emulated"]
    names = [name for name in backends_under_test() if name != "reference"]
    return [name for name in names if registry.select(DEVICE, name).backend.moe_route]


@pytest.fixture(params=_step_backends())
def backend(request):
    """A backend whose step entries run here: the emulated gfx942 on the CPU, the GPU's installed ones on a GPU."""
    if request.param == "gfx942_emulated":
        return request.getfixturevalue("mi300x")
    return registry.select(DEVICE, request.param).backend


class PoisonedTorch:
    """``torch`` as moe_steps.py sees it, every ``empty`` filled with NaN (0xFF bytes: -1 in ints, -NaN in e4m3fn; 0x80
    in e4m3fnuz, its NaN): an element a kernel must write and does not cannot match by luck."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        tensor = torch.empty(*args, **kwargs)
        if tensor.numel():
            tensor.view(torch.uint8).fill_(0x80 if tensor.dtype is torch.float8_e4m3fnuz else 0xFF)
        return tensor


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.setattr(moe_steps, "torch", PoisonedTorch())

    def poisoned_scale(m, kb, layout, device):
        scale, ld = empty_scale(m, kb, layout, device)
        return scale.fill_(float("nan")) if scale.numel() else scale, ld

    monkeypatch.setattr(moe_steps, "empty_scale", poisoned_scale)


def _gen(name: str, seed: int) -> torch.Generator:
    print(f"{name}: seed {seed}")
    return torch.Generator(device=DEVICE).manual_seed(seed)


def torch_route(topk_ids: torch.Tensor, experts: int):
    """The torch steps' routing (moe_torch.py): offs and each slot's sorted row, -1 for an id outside [0, E)."""
    valid, sorted_expert, order = moe_torch.sort_by_expert(topk_ids, experts)
    offs = moe_torch.group_ends(sorted_expert, experts)
    position = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return offs, torch.where(valid, position, -1).view(topk_ids.shape).to(torch.int32)


def _ids(tokens: int, k: int, experts: int, id_dtype, gen) -> torch.Tensor:
    """Random ids over the first half of the experts (the rest stay empty), duplicates within a token, and ids outside
    [0, E): -1, E, a large one (and below -2^31 for int64)."""
    ids = torch.randint(0, max(1, experts // 2), (tokens, k), generator=gen, device=DEVICE)
    flat = ids.view(-1)
    bad = [-1, experts, 1 << 30] + ([-(2**40), 2**40] if id_dtype is torch.int64 else [])
    for i, value in enumerate(bad):
        flat[(7 * i + 3) % flat.numel()] = value
    if k > 1:
        ids[:, 1] = ids[:, 0]  # a token naming one expert twice
    return ids.to(id_dtype)


ROUTE_CASES = [  # tokens, top_k, experts, hidden, x dtype, id dtype, pow2
    (1, 1, 8, 256, torch.bfloat16, torch.int32, False),  # decode: one launch
    (1, 8, 256, 384, torch.bfloat16, torch.int64, False),
    (5, 3, 7, 128, torch.float16, torch.int32, True),
    (300, 8, 64, 128, torch.float32, torch.int64, False),  # 2400 slots: three route blocks (count launch first)
    (700, 3, MOE_MAX_EXPERTS, 128, torch.bfloat16, torch.int32, False),  # 341 tokens a block, E at its limit
]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=lambda c: f"T{c[0]}-k{c[1]}-E{c[2]}-H{c[3]}-{c[4]}-{c[5]}-p{c[6]:d}")
def test_route_is_the_stable_sort_and_writes_quantize_activation_bits(backend, case):
    tokens, k, experts, hidden, x_dtype, id_dtype, pow2 = case
    gen = _gen(f"route {case}", DEFAULT_SEED + tokens * 131 + k * 17 + experts)
    x = (torch.randn(tokens, hidden, generator=gen, device=DEVICE) * 3).to(x_dtype)
    x[0, :7] = torch.tensor([0.0, -0.0, 1e-30, 65504.0, -448.0, 3e-5, 1.0])  # tiny, exact and saturating values
    ids = _ids(tokens, k, experts, id_dtype, gen)
    offs, position, q, scale = moe_steps.route(backend, x, ids, experts, pow2)
    want_offs, want_position = torch_route(ids, experts)
    assert torch.equal(offs, want_offs), "offs differ from the torch path's"
    assert torch.equal(position, want_position), "positions differ from the torch path's stable sort"
    want_q, want_scale = reference_quantize(x, q.dtype, pow2)
    valid = position.view(-1) >= 0
    rows, token = position.view(-1)[valid].long(), torch.arange(tokens * k, device=DEVICE)[valid] // k
    assert bit_equal(q[rows], want_q[token], scale[rows], want_scale[token])
    unwritten = int(offs[-1])  # rows no slot owns keep the poison
    assert bool(q[unwritten:].float().isnan().all()) and bool(scale[unwritten:].isnan().all())


ACTIVATION_SCALE_ULPS = 4  # measured on the emulator: at most 3 (1024 x 1024 values at four magnitudes)
ACTIVATION_MOVED_CODES = 1e-3  # fraction of codes one step from the torch step's; measured: none in 4M


def activation_close(q, want_q, scale, want_scale) -> bool:
    scale, want_scale = scale.contiguous(), want_scale.contiguous()
    if not torch.equal(scale.isnan(), want_scale.isnan()) or not torch.equal(q.float().isnan(), want_q.float().isnan()):
        return False
    if not q.numel():
        return True
    ulps = (scale.view(torch.int32).long() - want_scale.view(torch.int32).long()).abs().nan_to_num(0)
    steps = (q.view(torch.uint8).int() - want_q.view(torch.uint8).int()).abs()
    print(f"scales off by up to {int(ulps.max())} ulps ({int((ulps > 0).sum())} of {ulps.numel()}); codes moved: "
          f"{int((steps > 0).sum())} of {steps.numel()}")  # fmt: skip
    moved_ok = int((steps > 0).sum()) <= ACTIVATION_MOVED_CODES * steps.numel() and int(steps.max()) <= 1
    return int(ulps.max()) <= ACTIVATION_SCALE_ULPS and moved_ok


def bit_equal(q, want_q, scale, want_scale) -> bool:
    same_codes = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    same_scales = torch.equal(scale.contiguous().view(torch.int32), want_scale.contiguous().view(torch.int32))
    return same_codes and same_scales


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("rows, inter, end", [(1, 128, 1), (37, 256, 30), (64, 128, 64), (20, 384, 0), (9, 128, 99)])
def test_activation_quantizes_silu_and_mul_as_the_torch_step(backend, rows, inter, end, pow2):
    """Rows at or past offs[-1] stay unwritten (end 99 > rows: clamped). The kernel's expf is the platform's (on the
    emulator the host's libm, torch's CPU silu Sleef's), so a block's amax, hence its scale, may sit a few fp32 ulps
    from the torch step's, and a code next to a rounding boundary may move one step (docs/moe.md, "Numerics")."""
    gen = _gen(f"activation {rows}x{inter} end {end}", DEFAULT_SEED + rows * 7 + inter + end)
    h = torch.randn(rows, 2 * inter, generator=gen, device=DEVICE) * 4
    h[0, :4] = torch.tensor([-100.0, 100.0, -0.0, 1e-20])  # exp overflow (silu -> -0), large, signed zero, tiny
    offs = torch.tensor([0, end // 2, end], dtype=torch.int32, device=DEVICE)
    q, scale = moe_steps.activation(backend, h, offs, pow2)
    done = min(end, rows)
    want_q, want_scale = reference_quantize(moe_torch.silu_and_mul(h[:done], inter), q.dtype, pow2)
    assert activation_close(q[:done], want_q, scale[:done], want_scale)
    assert bool(q[done:].float().isnan().all()) and bool(scale[done:].isnan().all())


@pytest.mark.parametrize("y_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype, weight_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16),
                                                     (torch.float32, torch.float16)])  # fmt: skip
@pytest.mark.parametrize("tokens, k, hidden", [(13, 4, 2304), (1100, 10, 256)])  # H past a block; the 8-column body
def test_combine_is_the_weighted_sum_in_fp32(backend, y_dtype, out_dtype, weight_dtype, tokens, k, hidden):
    rows = 40
    gen = _gen(f"combine {y_dtype} {out_dtype} {weight_dtype} {tokens}", DEFAULT_SEED + 99)
    y = torch.randn(rows, hidden, generator=gen, device=DEVICE).to(y_dtype)
    position = torch.randint(0, rows, (tokens, k), generator=gen, device=DEVICE, dtype=torch.int32)
    position[::3, 1] = -1
    weights = torch.rand(tokens, k, generator=gen, device=DEVICE).to(weight_dtype)
    weights[::3, 1] = float("nan")  # the weight of a slot that selects nothing is never read
    out = moe_steps.combine(backend, y, position, weights, out_dtype)
    again = moe_steps.combine(backend, y, position, weights, out_dtype)
    assert out.dtype == out_dtype and torch.equal(out.view(torch.uint8), again.view(torch.uint8))  # deterministic
    valid = position >= 0
    terms = y.double()[position.clamp(min=0).long()] * torch.where(valid, weights.double(), 0.0)[..., None]
    exact = terms.sum(1)
    # fp32 fused multiply-adds over k terms, then one rounding to out_dtype
    tol = torch.finfo(out_dtype).eps * exact.abs() + k * 2.0**-23 * terms.abs().sum(1) + 1e-30
    assert bool(((out.double() - exact).abs() <= tol).all())


def test_combine_bodies_give_the_same_bits(backend):
    """Past moe_steps.cuh kMoeCombineNarrowTokens tokens the combine sums 8 columns per item, not 4: the same bits."""
    tokens, k, hidden, rows = 1030, 9, 384, 50
    gen = _gen("combine bodies", DEFAULT_SEED + 98)
    y = torch.randn(rows, hidden, generator=gen, device=DEVICE).to(torch.bfloat16)
    position = torch.randint(-1, rows, (tokens, k), generator=gen, device=DEVICE, dtype=torch.int32)
    weights = torch.rand(tokens, k, generator=gen, device=DEVICE)
    wide = moe_steps.combine(backend, y, position, weights, torch.bfloat16)
    narrow = moe_steps.combine(backend, y, position[:1000], weights[:1000], torch.bfloat16)
    assert torch.equal(wide[:1000].view(torch.uint8), narrow.view(torch.uint8))


def _pipeline_cases() -> list[MoeCase]:
    return [
        MoeCase(1, 8, 1),  # decode, one expert
        MoeCase(1, 8, 4, hidden=384),
        MoeCase(6, 4, 3, routing="repeated"),
        MoeCase(3, 16, 2, routing="sparse"),  # empty experts
        MoeCase(20, 6, 2, routing="skipped"),  # -1 ids
        MoeCase(19, 8, 2, routing="skewed", x_dtype=torch.float32),
        MoeCase(9, 4, 2, x_dtype=torch.float16, weight_dtype=torch.bfloat16, pow2=True),
        MoeCase(520, 8, 2, hidden=128, routing="skewed"),  # 1040 slots: two route blocks
    ]


@pytest.mark.parametrize("case", _pipeline_cases(), ids=lambda c: c.id)
def test_fused_experts_on_the_step_kernels(backend, case, monkeypatch):
    """The step kernels against the torch steps on the same backend (the same GEMMs: differences come from the
    combine's fused multiply-adds and any code the activation's expf moves) and against the float64 yardstick."""
    x, ids, weights, w13, s13, w2, s2 = make_case(case, getattr(torch, backend.fp8_dtype), DEVICE, backend.name)
    if case.routing == "skipped":
        ids[1, 1], ids[2, 0] = case.experts, 1 << 30  # ids only the device would see: they select nothing
        monkeypatch.setattr(moe, "check_topk_id_values", lambda ids, experts: None)
    call = lambda: fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2, backend=backend.name, pow2_scales=case.pow2)
    steps = emulator_counts(backend)
    with torch.no_grad():
        out = call()
        launched = emulator_counts(backend)
        monkeypatch.setattr(moe_steps, "USE_STEP_KERNELS", False)
        torch_steps = call()
    if launched is not None:
        assert (launched[0] - steps[0], launched[1] - steps[1], launched[2] - steps[2]) == (3, 2, 0)
    assert out.dtype == x.dtype and bool(out.isfinite().all())
    valid = (ids >= 0) & (ids < case.experts)
    expected = reference_fused_experts(x, torch.where(valid, ids, -1), torch.where(valid, weights, 0), w13, s13, w2,
                                       s2, pow2_scales=case.pow2)  # fmt: skip
    err, err_torch = conformance.relative_error(out, expected), conformance.relative_error(torch_steps, expected)
    print(f"{case.id} on {backend.name}: rel. err {err:.3e} (torch steps {err_torch:.3e}), vs torch steps "
          f"{conformance.relative_error(out, torch_steps.double()):.3e}")  # fmt: skip
    assert err < bound(case)
    assert conformance.relative_error(out, torch_steps.double()) < 2e-3


def emulator_counts(backend):
    """(moe step launches, grouped launches, quantize launches) of the emulator behind ``backend``, None on a GPU."""
    emu = getattr(backend.moe_route, "__self__", None)  # a compiled entry's is its module
    if not isinstance(emu, test_gfx942_emulation.gfx942_emulator.Emulator):
        return None
    return emu.moe_steps, emu.grouped_launches, emu.quantize_launches


def test_experts_past_the_limit_are_refused():
    x = torch.empty(4, 128, dtype=torch.bfloat16, device="meta")
    w13 = torch.empty(MOE_MAX_EXPERTS + 1, 256, 128, dtype=torch.float8_e4m3fn, device="meta")
    s13 = torch.empty(MOE_MAX_EXPERTS + 1, 2, 1, device="meta")
    w2 = torch.empty(MOE_MAX_EXPERTS + 1, 128, 128, dtype=torch.float8_e4m3fn, device="meta")
    s2 = torch.empty(MOE_MAX_EXPERTS + 1, 1, 1, device="meta")
    ids, weights = torch.zeros(4, 2, dtype=torch.int32, device="meta"), torch.ones(4, 2, device="meta")
    with pytest.raises(
        ValueError, match=r"w13 holds E = 1025 experts \(w13.shape\[0\]\); fused_experts takes at most 1024"
    ):
        fp8gemm.fused_experts(x, ids, weights, w13, s13, w2, s2)


def _packed(mirror, **fields) -> int:
    return mirror.pack(*(fields.get(name, 0) for name in mirror.fields))


ROUTE = dict(tokens=1, top_k=1, experts=8, hidden=128)
COMBINE = dict(tokens=1, top_k=1, hidden=128, out_kind=IN_KINDS[torch.bfloat16], weight_kind=IN_KINDS[torch.float32],
               y_kind=OUT_BF16, rows=4, ldy=128)  # fmt: skip
REFUSED = [  # entry, its mirror, fields, words of the error
    ("moe_route", MOE_ROUTE_ARGS, {**ROUTE, "experts": MOE_MAX_EXPERTS + 1}, "moe_route: E = 1025 experts (w13.shape[0])"),
    ("moe_route", MOE_ROUTE_ARGS, {**ROUTE, "top_k": 2048}, "moe_route: top_k = 2048"),
    ("moe_route", MOE_ROUTE_ARGS, {**ROUTE, "tokens": 3000}, "moe_route: the route step needs its workspace"),
    ("moe_route", MOE_ROUTE_ARGS, {**ROUTE, "hidden": 200}, "moe_route: the hidden size must be a multiple of 128"),
    ("moe_route", MOE_ROUTE_ARGS, {**ROUTE, "id_kind": 2}, "moe_route: unknown x or id kind"),
    ("moe_activation", MOE_ACTIVATION_ARGS, {"experts": 0, "inter": 128, "rows": 1}, "moe_activation: E = 0 experts"),
    ("moe_activation", MOE_ACTIVATION_ARGS, {"experts": 8, "inter": 128, "rows": 2**31}, "more than 2^31 - 1 rows"),
    ("moe_activation", MOE_ACTIVATION_ARGS, {"experts": 8, "inter": 100, "rows": 1}, "intermediate size must be a"),
    ("moe_combine", MOE_COMBINE_ARGS, {**COMBINE, "rows": 0}, "moe_combine: the combine's y needs at least one row"),
    ("moe_combine", MOE_COMBINE_ARGS, {**COMBINE, "ldy": 64}, "a row stride of hidden to 2^29"),
    ("moe_combine", MOE_COMBINE_ARGS, {**COMBINE, "y_kind": 5}, "moe_combine: unknown out, weight or y kind"),
    ("moe_combine", MOE_COMBINE_ARGS, {**COMBINE, "top_k": 0}, "moe_combine: top_k = 0"),
]  # fmt: skip


@pytest.mark.skipif(not ON_CPU, reason="the entries' own refusals, through the emulator")
@pytest.mark.parametrize("entry, mirror, fields, words", REFUSED, ids=[f"{r[0]}-{r[3][:30]}" for r in REFUSED])
def test_each_entry_refuses_what_its_kernels_do_not_take(mi300x, entry, mirror, fields, words):
    with pytest.raises(test_gfx942_emulation.gfx942_emulator.EmulationError, match=re.escape(words)):
        getattr(mi300x, entry)(_packed(mirror, **fields))


@pytest.mark.skipif(not ON_CPU, reason="the wire header, through the emulator")
def test_each_entry_reads_only_its_own_struct(mi300x):
    """A struct packed for another step is refused by its size before any field is read."""
    with pytest.raises(test_gfx942_emulation.gfx942_emulator.EmulationError,
                       match=rf"moe_combine: arguments of protocol version \d+ \({MOE_ROUTE_ARGS.size} bytes\)"):  # fmt: skip
        mi300x.moe_combine(_packed(MOE_ROUTE_ARGS, **ROUTE))


def test_a_binary_without_the_entries_keeps_the_torch_steps():
    backend, _ = make_backend("no_steps", a_layout=ScaleLayout(MN_MAJOR, 4))  # as binaries before the entries
    assert backend.moe_route is None and moe_steps.step_backend(backend) is None
    entries = dict(moe_route=lambda args: None, moe_activation=lambda args: None, moe_combine=lambda args: None)
    with_steps = dataclasses.replace(backend, **entries, moe_workspace_bytes=lambda t, k, e: 0)
    assert moe_steps.step_backend(with_steps) is with_steps
    assert isinstance(moe.steps_for(MoePlan(None, with_steps, None, False, None, None)), moe_steps.KernelSteps)
    k_major = dataclasses.replace(with_steps, a_scale_layout=ScaleLayout(K_MAJOR, 1))  # the kernels write MN-major
    assert moe_steps.step_backend(k_major) is None
    assert isinstance(moe.steps_for(MoePlan(None, k_major, None, False, None, None)), moe_torch.TorchSteps)
    with pytest.raises(TypeError, match="the moe step entries come together"):
        dataclasses.replace(backend, **entries)
    with pytest.raises(TypeError, match="the moe step entries come together"):
        dataclasses.replace(backend, moe_route=entries["moe_route"], moe_workspace_bytes=lambda t, k, e: 0)


def _arch_module(sizes: dict, **entries):
    """An arch package's _C as backend_from_module sees it: the protocol's version, these struct sizes and entries."""
    return types.SimpleNamespace(protocol_version=lambda: PROTOCOL_VERSION, args_sizes=lambda: sizes,
                                 build_info=lambda: {"targets": "sm_90a"}, launch=lambda args: None,
                                 workspace_bytes=lambda m, n, k: 0, moe_workspace_bytes=lambda t, k, e: 0,
                                 **entries)  # fmt: skip


def test_a_binary_with_the_single_step_entry_of_before_loads_and_runs_the_torch_steps():
    """Before one entry per step kernel, binaries had one moe_step entry reading a 216-byte struct for all three: the
    core no longer knows it, so such a binary loads, without step kernels (a new optional entry's rule)."""
    load = lambda module: backend_from_module(module, name="x", package="fp8gemm-cuda-x", version="1",
                                              fp8_dtype="float8_e4m3fn", a_scale_layout=ScaleLayout(MN_MAJOR, 4),
                                              b_scale_layout=ScaleLayout())  # fmt: skip
    before = load(_arch_module({"moe_step": 216}, moe_step=lambda args: None))
    assert before.moe_route is None and moe_steps.step_backend(before) is None
    entries = {mirror.entry: (lambda args: None) for mirror in (MOE_ROUTE_ARGS, MOE_ACTIVATION_ARGS, MOE_COMBINE_ARGS)}
    sizes = {mirror.entry: mirror.size for mirror in (MOE_ROUTE_ARGS, MOE_ACTIVATION_ARGS, MOE_COMBINE_ARGS)}
    now = load(_arch_module(sizes, **entries))
    assert moe_steps.step_backend(now) is now
    with pytest.raises(
        RuntimeError, match=f"its moe_combine arguments are 8 bytes, the core's mirror {sizes['moe_combine']}"
    ):
        load(_arch_module({**sizes, "moe_combine": 8}, **entries))
