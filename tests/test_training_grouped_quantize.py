"""The grouped operands of mixture-of-experts training: ``quantize_grouped_with_transpose`` bit for bit against a
per-expert loop over ``reference_quantize`` (every expert count pattern, empty experts, rows past offs[-1]), the
grouped weight quantizer against ``quantize_weight`` per expert, and ``kgrouped_wgrad`` against float64 of the same
FP8 operands per expert (accumulate, empty experts, bf16 output); bad inputs; no host reads; torch.compile."""

from __future__ import annotations

import fp8gemm
import pytest
import torch
from fp8gemm import registry
from fp8gemm.moe_reference import dequantize64
from fp8gemm.reference import REFERENCE, SCALE_FLOOR, reference_quantize
from fp8gemm.registry import Selection
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import (
    grouped_quantize,
    kgrouped_wgrad,
    quantize_experts_with_transpose,
    quantize_grouped_with_transpose,
)
from test_grouped import refuse_host_reads

FN = torch.float8_e4m3fn
# The reference sums exact products of FP8 codes in fp32 and scales once per block: measured ~5e-8 from float64 of
# the same operands, so 1e-6 (the contract a kernel must meet is 5e-4 for fp32 output, 4e-3 for bf16).
WGRAD_FP32_TOLERANCE, WGRAD_BF16_TOLERANCE = 1e-6, 4e-3
UNQUANTIZED_TOLERANCE = 0.06  # against dY^T X of the unquantized rows: two e4m3 operands (measured 3.6%)


def _rows(counts, k=256, extra=0, dtype=torch.bfloat16, seed=0):
    """x [sum(counts) + extra, K] from a printed seed (never zeros) and offs for ``counts``; ``extra`` rows past
    offs[-1] belong to no expert."""
    seed = DEFAULT_SEED + seed
    print(f"seed {seed}, counts {counts}, extra rows {extra}")
    gen = torch.Generator().manual_seed(seed)
    rows = sum(counts) + extra
    magnitude = torch.rand(rows, 1, generator=gen) * 4 + 0.1  # rows at different scales: a block's amax shows
    x = (torch.randn(rows, k, generator=gen) * magnitude).to(dtype)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return x, offs


def _per_expert_loop(x, counts, pow2=False):
    """The layout written out plainly: each expert's 128-token blocks quantized one by one by reference_quantize."""
    k, experts = x.shape[1], len(counts)
    blocks = experts + x.shape[0] // 128 + 1
    q_t = torch.zeros(k, blocks * 128, dtype=FN)
    scale_t = torch.full((k, blocks), SCALE_FLOOR)
    start = 0
    for e, n in enumerate(counts):
        base = e + start // 128
        for j in range(-(-n // 128)):
            chunk = x[start + 128 * j : start + min(128 * (j + 1), n)].float()
            padded = torch.nn.functional.pad(chunk, (0, 0, 0, 128 - chunk.shape[0]))
            q, s = reference_quantize(padded.t(), FN, pow2)
            q_t[:, 128 * (base + j) : 128 * (base + j + 1)] = q
            scale_t[:, base + j] = s[:, 0]
        start += n
    return q_t, scale_t


def _assert_bits(got, counts, pow2=False, x=None):
    want_q, want_s = _per_expert_loop(x, counts, pow2)
    assert torch.equal(got.q_t.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got.scale_t, want_s)
    q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2)
    assert torch.equal(got.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.scale, scale)


COUNTS = [
    [1],
    [127],
    [128],
    [129],
    [300],
    [0, 300, 0],  # one expert holds everything
    [0, 0, 0],  # no tokens at all
    [1, 127, 128, 129, 300],
    [129, 0, 0, 127, 1, 0, 300],
    [255, 257, 1, 0, 128, 128],
]


@pytest.mark.parametrize("counts", COUNTS, ids=["-".join(map(str, c)) for c in COUNTS])
def test_bits_of_a_per_expert_loop(counts):
    x, offs = _rows(counts, seed=len(counts) + sum(counts))
    got = quantize_grouped_with_transpose(x, offs)
    assert got.q_t.shape == (256, 128 * (len(counts) + x.shape[0] // 128 + 1)) and got.scale_t.dtype == torch.float32
    _assert_bits(got, counts, x=x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2"])
def test_input_dtypes_power_of_two_scales_and_rows_of_no_expert(dtype, pow2):
    """Rows past offs[-1] (slots that select nothing) are quantized in q (quantize_activation's rows) and absent
    from q_t: large values there would change a block's scale if they leaked in."""
    counts = [130, 0, 5, 200]
    x, offs = _rows(counts, extra=70, dtype=dtype, seed=3)
    x[-70:] *= 1000
    got = quantize_grouped_with_transpose(x, offs, pow2_scales=pow2)
    want_q, want_s = _per_expert_loop(x[:-70], counts, pow2)
    blocks = len(counts) + x.shape[0] // 128 + 1  # M counts the extra rows
    padded_q = torch.zeros(256, 128 * blocks, dtype=FN)
    padded_q[:, : want_q.shape[1]] = want_q
    padded_s = torch.full((256, blocks), SCALE_FLOOR)
    padded_s[:, : want_s.shape[1]] = want_s
    assert torch.equal(got.q_t.view(torch.uint8), padded_q.view(torch.uint8)) and torch.equal(got.scale_t, padded_s)
    q, scale = fp8gemm.quantize_activation(x, pow2_scales=pow2)
    assert torch.equal(got.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.scale, scale)


def test_rows_of_no_expert_at_all():
    """offs all zero: every row is past offs[-1]; x^T is all gap (zero codes, the all-zero block's scale)."""
    x, _ = _rows([50], seed=15)
    got = quantize_grouped_with_transpose(x, torch.zeros(3, dtype=torch.int32))
    assert got.q_t.shape == (256, 128 * 4) and not got.q_t.view(torch.uint8).any()
    assert torch.equal(got.scale_t, torch.full((256, 4), SCALE_FLOOR))


def test_every_split_of_two_experts():
    """Two experts, every count 0..M for the first (M = 257 tokens): block boundaries at every offset."""
    x, _ = _rows([257], k=128, seed=4)
    for first in range(258):
        counts = [first, 257 - first]
        offs = torch.tensor([first, 257], dtype=torch.int32)
        _assert_bits(quantize_grouped_with_transpose(x, offs), counts, x=x)


@pytest.mark.parametrize("chunk_bytes", [1 << 30, 1], ids=["all-experts-at-once", "one-expert-at-a-time"])
def test_weights_of_every_expert_and_their_transposes(chunk_bytes, monkeypatch):
    monkeypatch.setattr(grouped_quantize, "EXPERTS_CHUNK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(DEFAULT_SEED + 5)
    print(f"seed {DEFAULT_SEED + 5}")
    w = torch.randn(3, 200, 256, generator=gen) * torch.rand(3, 1, 1, generator=gen)
    for pow2 in (False, True):
        got = quantize_experts_with_transpose(w, pow2_scales=pow2)
        for e in range(3):
            q, scale = fp8gemm.quantize_weight(w[e], pow2_scales=pow2)
            assert torch.equal(got.q[e].view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.scale[e], scale)
            assert torch.equal(got.q_t[e].view(torch.uint8), q.t().view(torch.uint8))
            assert torch.equal(got.scale_t[e], scale.t())
    plain = quantize_experts_with_transpose(w.bfloat16(), transpose=False)
    assert plain.q.shape == (3, 200, 256) and plain.q_t.numel() == 0 and plain.scale_t.numel() == 0


# --- kgrouped_wgrad ------------------------------------------------------------------------------------------------


def _wgrad_case(counts, n=128, k=256, seed=6):
    dy, offs = _rows(counts, k=n, seed=seed)
    x, _ = _rows(counts, k=k, seed=seed + 1)
    a, b = quantize_grouped_with_transpose(dy, offs), quantize_grouped_with_transpose(x, offs)
    return dy, x, offs, a, b


def _float64_per_expert(a, b, counts):
    """dY_e^T X_e in float64 of the dequantized FP8 operands, each expert's columns found by a host loop."""
    a64, b64 = dequantize64(a.q_t, a.scale_t), dequantize64(b.q_t, b.scale_t)
    out, start = [], 0
    for e, n in enumerate(counts):
        cols = slice(128 * (e + start // 128), 128 * (e + start // 128) + n)
        out.append(a64[:, cols] @ b64[:, cols].t())
        start += n
    return torch.stack(out)


WGRAD_COUNTS = [[1, 127, 128, 129, 300], [0, 300, 0], [129, 0, 0, 127, 1, 0, 300], [0, 0]]


@pytest.mark.parametrize("counts", WGRAD_COUNTS, ids=["-".join(map(str, c)) for c in WGRAD_COUNTS])
def test_wgrad_against_float64_of_the_same_fp8_operands(counts):
    dy, x, offs, a, b = _wgrad_case(counts)
    want = _float64_per_expert(a, b, counts)
    out = torch.full(want.shape, float("nan"))  # poisoned: every element must be written
    kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=out)
    assert torch.equal(out, kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs))
    empty = [e for e, n in enumerate(counts) if n == 0]
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    if sum(counts):
        err = relative_error(out, want)
        bf16 = kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out_dtype=torch.bfloat16)
        bf16_err = relative_error(bf16, want)
        ends = offs.tolist()
        exact = torch.stack(
            [dy[s - n : s].double().t() @ x[s - n : s].double() for s, n in zip(ends, counts, strict=True)]
        )
        unquantized = relative_error(out, exact)
        print(
            f"against float64 of the FP8 operands: fp32 {err:.2e}, bf16 {bf16_err:.2e}; unquantized {unquantized:.3f}"
        )
        assert err < WGRAD_FP32_TOLERANCE and bf16_err < WGRAD_BF16_TOLERANCE and unquantized < UNQUANTIZED_TOLERANCE
        assert torch.equal(bf16, out.bfloat16())  # the fp32 sum rounded once


def test_wgrad_accumulates_and_leaves_empty_experts_untouched():
    counts = [200, 0, 57, 0]
    _, _, offs, a, b = _wgrad_case(counts, seed=8)
    start = torch.randn(4, 128, 256, generator=torch.Generator().manual_seed(DEFAULT_SEED + 9))
    start[1, 0, 0] = -0.0  # untouched means its bits too: -0.0 + 0.0 would be +0.0
    out = start.clone()
    product = kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs)
    assert kgrouped_wgrad(a.q_t, b.q_t, a.scale_t, b.scale_t, offs, out=out, accumulate=True) is out
    assert torch.equal(out[[0, 2]], start[[0, 2]] + product[[0, 2]])
    assert torch.equal(out[[1, 3]].view(torch.int32), start[[1, 3]].view(torch.int32))


def _wgrad_args():
    _, _, offs, a, b = _wgrad_case([130, 0, 20], seed=10)
    return a.q_t, b.q_t, a.scale_t, b.scale_t, offs


WGRAD_ERRORS = [
    ("bf16-accumulate", dict(out=torch.zeros(3, 128, 256, dtype=torch.bfloat16), accumulate=True), TypeError,
     "accumulate=True adds into out, which must be float32"),
    ("accumulate-no-out", dict(accumulate=True), ValueError, "accumulate=True adds into out=, a float32"),
    ("out-shape", dict(out=torch.zeros(3, 256, 128)), TypeError, r"out must be a float32 or bfloat16 tensor \[E, N, K\]"),
    ("out-dtype-disagrees", dict(out=torch.zeros(3, 128, 256), out_dtype=torch.bfloat16), ValueError, "disagrees"),
    ("out-dtype", dict(out_dtype=torch.float16), TypeError, "out_dtype must be torch.float32 or torch.bfloat16"),
]  # fmt: skip


@pytest.mark.parametrize("case", WGRAD_ERRORS, ids=[c[0] for c in WGRAD_ERRORS])
def test_wgrad_out_errors(case):
    _, kwargs, error, message = case
    with pytest.raises(error, match=message):
        kgrouped_wgrad(*_wgrad_args(), **kwargs)


def test_wgrad_operand_errors():
    a_t, b_t, sa, sb, offs = _wgrad_args()
    bad = {
        "a_t must be": (a_t.float(), b_t, sa, sb, offs),
        "same column count": (a_t, b_t[:, :-128], sa, sb, offs),
        r"a_scale_t must be \[N, cols/128\]": (a_t, b_t, sa[:, :-1], sb, offs),
        "b_scale_t must be torch.float32": (a_t, b_t, sa, sb.double(), offs),
        "offs must be an int32 tensor": (a_t, b_t, sa, sb, offs.long()),
        r"fewer than E \+ 1": (a_t, b_t, sa, sb, torch.zeros(9, dtype=torch.int32)),
        "offs must be non-decreasing": (a_t, b_t, sa, sb, torch.tensor([130, 0, 150], dtype=torch.int32)),
        r"offs\[-1\] = 900 is past the most tokens": (a_t, b_t, sa, sb, torch.tensor([130, 130, 900], dtype=torch.int32)),
        "a_t is torch.float8_e4m3fn but b_t is": (a_t, b_t.view(torch.uint8).view(torch.float8_e4m3fnuz), sa, sb, offs),
        r"a_t.shape\[0\] \(N = 120\) must be a positive multiple of 16": (a_t[:120], b_t, sa[:120], sb, offs),
    }  # fmt: skip
    for message, args in bad.items():
        with pytest.raises((TypeError, ValueError), match=message):
            kgrouped_wgrad(*args)


def test_quantizer_errors():
    x, offs = _rows([100, 28], seed=11)
    bad = {
        "offs must be an int32 tensor": (x, offs.long()),
        r"offs must be an int32 tensor \[E\] \(E >= 1\)": (x, offs[:0]),
        "offs must be non-decreasing": (x, offs.flip(0)),
        r"offs\[-1\] = 129 is past M \(x.shape\[0\]\) = 128": (x, offs + 1),
        r"offs\[0\] = -1 is negative": (x, offs - 101),
        r"x must be 2-D \[M, K\]": (x.view(2, 64, 256), offs),
        r"x's last dim \(K = 200\)": (x[:, :200], offs),
        "x must be a bfloat16/float16/float32 tensor": (x.int(), offs),
        "offs is on meta but x is on cpu": (x, offs.to("meta")),
    }
    for message, (xx, oo) in bad.items():
        with pytest.raises((TypeError, ValueError), match=message):
            quantize_grouped_with_transpose(xx, oo)
    with pytest.raises(RuntimeError, match="has no backward, and x requires grad"):
        quantize_grouped_with_transpose(x.float().requires_grad_(), offs)
    with pytest.raises(ValueError, match=r"w must be 3-D \[E, N, K\]"):
        quantize_experts_with_transpose(x)


def test_no_value_is_read_on_the_host(monkeypatch):
    """On meta tensors (no values), as for a GPU's: both quantizers and kgrouped_wgrad run with host reads refused."""
    x, offs = (t.to("meta") for t in _rows([100, 28], seed=12))
    w = torch.empty(2, 256, 128, device="meta")
    monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(REFERENCE, "meta plays a GPU"))
    with pytest.MonkeyPatch.context() as reads:
        refuse_host_reads(reads)
        g = quantize_grouped_with_transpose(x, offs)
        out = kgrouped_wgrad(g.q_t, g.q_t, g.scale_t, g.scale_t, offs, out=torch.empty(2, 256, 256, device="meta"),
                             accumulate=True)  # fmt: skip
        wq = quantize_experts_with_transpose(w)
    assert g.q_t.shape == (256, 128 * 4) and out.shape == (2, 256, 256) and wq.q_t.shape == (2, 128, 256)


def test_compiled_calls_match_eager():
    torch._dynamo.reset()
    _, x, offs, a, _ = _wgrad_case([130, 0, 20], seed=13)
    w = torch.randn(2, 256, 128, generator=torch.Generator().manual_seed(DEFAULT_SEED + 14))

    def step(x, offs, w, out):
        g = quantize_grouped_with_transpose(x, offs)
        wq = quantize_experts_with_transpose(w)
        product = kgrouped_wgrad(a.q_t, g.q_t, a.scale_t, g.scale_t, offs, out_dtype=torch.bfloat16)
        kgrouped_wgrad(a.q_t, g.q_t, a.scale_t, g.scale_t, offs, out=out, accumulate=True)
        return g.q_t.view(torch.uint8), g.scale_t, wq.q_t.view(torch.uint8), product, out

    eager = step(x, offs, w, torch.ones(3, 128, 256))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x, offs, w, torch.ones(3, 128, 256))
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)
    torch._dynamo.reset()
