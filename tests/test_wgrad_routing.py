"""The core's routing of the weight-gradient form to a backend's optional ``wgrad_launch`` (fp8gemm/training_entries.hpp):
a per-row ``b_scale`` and ``accumulate=True`` reach it with the scales conformed to its layouts, in one launch each;
a backend without it keeps the reference (per row) and the product-then-add (accumulate). The backend here is a fake
that computes in Python over the raw pointers it is handed, on CPU tensors playing a GPU's memory."""

from __future__ import annotations

import dataclasses

import fp8gemm
import pytest
import torch
from conftest import cpu_tensors_play_a_gpu
from fp8gemm import registry
from fp8gemm.protocol import K_MAJOR, LAUNCH_ARGS, MN_MAJOR, OUT_BF16, OUT_FP32, WGRAD_ARGS, Backend, ScaleLayout
from fp8gemm.reference import oracle
from fp8gemm.testing.conformance import relative_error
from test_gemm_wgrad import FP32_TOLERANCE, _float64_product, _operands
from test_registry import H100

A_LAYOUT = ScaleLayout(MN_MAJOR, 4)
WGRAD_B_LAYOUT = ScaleLayout(MN_MAJOR, 8)  # another multiple than A's, so a test sees which one is applied


def _view(ptr: int, dtype, rows: int, cols: int, row_stride: int, col_stride: int) -> torch.Tensor:
    import ctypes

    size = ((rows - 1) * row_stride + (cols - 1) * col_stride + 1) * torch.empty((), dtype=dtype).element_size()
    raw = torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)
    return raw.view(dtype).as_strided((rows, cols), (row_stride, col_stride))


def _scale_view(ptr: int, layout: ScaleLayout, rows: int, cols: int, ld: int) -> torch.Tensor:
    return _view(ptr, torch.float32, rows, cols, *((ld, 1) if layout.order == K_MAJOR else (1, ld)))


class FakeWgrad:
    """A backend with both entries, in Python: ``launch`` (the block form) and ``wgrad_launch``, each recording its
    arguments and writing the float64 product of what it reads (added into out for accumulate)."""

    def __init__(self, with_wgrad: bool = True):
        self.calls: list[dict] = []
        self.with_wgrad = with_wgrad

    def launch(self, address: int) -> None:
        f = LAUNCH_ARGS.unpack(address)
        self.calls.append(dict(f, entry="launch"))
        m, n, k = f["m"], f["n"], f["k"]
        a = _view(f["a"], torch.float8_e4m3fn, m, k, f["lda"], 1)
        b = _view(f["b"], torch.float8_e4m3fn, n, k, f["ldb"], 1)
        sa = _scale_view(f["a_scale"], A_LAYOUT, m, k // 128, f["a_scale_ld"])
        sb = _scale_view(f["b_scale"], ScaleLayout(K_MAJOR, 4), -(-n // 128), k // 128, f["b_scale_ld"])
        dtype = torch.float32 if f["out_kind"] == OUT_FP32 else torch.bfloat16
        _view(f["out"], dtype, m, n, f["ldo"], 1).copy_(oracle(a, b, sa, sb))

    def wgrad(self, address: int) -> None:
        f = WGRAD_ARGS.unpack(address)
        self.calls.append(dict(f, entry="wgrad_launch"))
        m, n, k = f["m"], f["n"], f["k"]
        a = _view(f["a"], torch.float8_e4m3fn, m, k, f["lda"], 1)
        b = _view(f["b"], torch.float8_e4m3fn, n, k, f["ldb"], 1)
        sa = _scale_view(f["a_scale"], A_LAYOUT, m, k // 128, f["a_scale_ld"])
        sb = _scale_view(f["b_scale"], WGRAD_B_LAYOUT, n, k // 128, f["b_scale_ld"])
        dtype = torch.float32 if f["out_kind"] == OUT_FP32 else torch.bfloat16
        out = _view(f["out"], dtype, m, n, f["ldo"], 1)
        product = oracle(a, b, sa, sb).float()  # the fp32 product, rounded once for a bf16 out
        out.copy_(out.double() + product if f["accumulate"] else product)

    def backend(self) -> Backend:
        extra = {}
        if self.with_wgrad:
            extra = dict(wgrad_launch=self.wgrad, wgrad_workspace_bytes=lambda m, n, k: 0,
                         wgrad_b_scale_layout=WGRAD_B_LAYOUT)  # fmt: skip
        return Backend(name="hopper", platform="cuda", targets=("sm_90a",), fp8_dtype="float8_e4m3fn", version="1",
                       launch=self.launch, a_scale_layout=A_LAYOUT, b_scale_layout=ScaleLayout(K_MAJOR, 4),
                       **extra)  # fmt: skip

    def entries(self) -> list[str]:
        return [call["entry"] for call in self.calls]


@pytest.fixture
def gpu(monkeypatch):
    """``gpu(fake)``: fp8gemm sees an H100 whose only backend is ``fake``; CPU tensors are its memory."""

    def use(fake: FakeWgrad) -> Backend:
        backend = fake.backend()
        installed = (registry.InstalledBackend("hopper = fake", "fake", backend, None),)
        monkeypatch.setattr(registry, "installed_backends", lambda refresh=False: installed)
        monkeypatch.setattr(registry, "describe_device", lambda device: H100)
        cpu_tensors_play_a_gpu(monkeypatch, stream=77)
        registry.clear_caches()
        return backend

    yield use
    registry.clear_caches()


@pytest.mark.parametrize("m, n, k", [(64, 48, 256), (130, 272, 384)])
def test_per_row_form_runs_the_wgrad_entry(gpu, m, n, k):
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(300 + m, m, n, k)  # row-major scales: both are conformed to MN-major
    out = torch.full((m, n), float("nan"))
    assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out) is out
    returned = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
    assert fake.entries() == ["wgrad_launch", "wgrad_launch"]
    call = fake.calls[0]
    assert (call["m"], call["n"], call["k"], call["accumulate"], call["stream"]) == (m, n, k, 0, 77)
    assert (call["lda"], call["ldb"], call["ldo"]) == (k, k, n)
    assert call["a_scale_ld"] % 4 == 0 and call["a_scale_ld"] >= m
    assert call["b_scale_ld"] % 8 == 0 and call["b_scale_ld"] >= n
    assert relative_error(out, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    assert torch.equal(returned, out)


@pytest.mark.parametrize("form", ["per-row", "per-block"])
def test_accumulate_is_one_launch_that_adds(gpu, form):
    """accumulate=True: the product added into out by the entry itself (no temporary, no second kernel); a per-block
    b_scale reaches it repeated onto b's rows."""
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(51, 40, 144, 256)
    if form == "per-block":
        b, b_scale = fp8gemm.quantize_weight(b.float() * b_scale.repeat_interleave(128, dim=1))
    start = torch.randn(40, 144, generator=torch.Generator().manual_seed(52)) * 50
    out = start.clone()
    assert fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True) is out
    assert fake.entries() == ["wgrad_launch"] and fake.calls[0]["accumulate"] == 1
    assert relative_error(out, start.double() + oracle(a, b, a_scale, b_scale)) < FP32_TOLERANCE


def test_the_block_form_without_accumulate_keeps_the_launch(gpu):
    fake = FakeWgrad()
    gpu(fake)
    a, _, a_scale, _ = _operands(61, 64, 48, 256)
    b, b_scale = fp8gemm.quantize_weight(torch.randn(48, 256, generator=torch.Generator().manual_seed(62)))
    fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
    fp8gemm.gemm(a, b, a_scale, b_scale)
    assert fake.entries() == ["launch", "launch"]


def test_a_backend_without_the_entry_keeps_the_reference_and_the_add(gpu):
    fake = FakeWgrad(with_wgrad=False)
    gpu(fake)
    a, b, a_scale, b_scale = _operands(71, 64, 48, 256)
    out = torch.full((64, 48), float("nan"))
    fp8gemm.gemm(a, b, a_scale, b_scale, out=out)  # per row: the reference
    assert fake.entries() == []
    assert relative_error(out, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    block_b, block_scale = fp8gemm.quantize_weight(b.float())
    start = out.clone()
    fp8gemm.gemm(a, block_b, a_scale, block_scale, out=out, accumulate=True)  # the product (launch), then one add
    assert fake.entries() == ["launch"] and fake.calls[0]["out_kind"] == OUT_FP32
    assert relative_error(out, start.double() + oracle(a, block_b, a_scale, block_scale)) < FP32_TOLERANCE


def test_bf16_output_is_the_entrys_float32_product_rounded_once(gpu):
    """A per-row b_scale with a bf16 output (a bf16 weight's gradient) is one launch with out_kind OUT_BF16; the
    accumulating form stays float32 only."""
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(83, 64, 48, 256)
    got = fp8gemm.gemm(a, b, a_scale, b_scale)  # bf16 by default
    assert got.dtype == torch.bfloat16 and fake.entries() == ["wgrad_launch"]
    assert fake.calls[0]["out_kind"] == OUT_BF16 and fake.calls[0]["accumulate"] == 0
    assert torch.equal(got, fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32).bfloat16())


def test_no_tokens_and_errors_never_reach_the_entry(gpu):
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(81, 64, 48, 256)
    assert fp8gemm.gemm(a[:0], b, a_scale[:0], b_scale, out_dtype=torch.float32).shape == (0, 48)
    with pytest.raises(TypeError, match="accumulate=True needs a torch.float32 out"):
        fp8gemm.gemm(a, b, a_scale, b_scale, out=torch.zeros(64, 48, dtype=torch.bfloat16), accumulate=True)
    out = torch.zeros(64, 48, requires_grad=True)
    with pytest.raises(RuntimeError, match="out requires grad"):
        fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True)
    assert fake.entries() == []


def test_scale_views_are_conformed_to_an_aligned_copy(gpu):
    """A column slice of a wider scale tensor (one micro-batch's tokens) reaches the entry in its layout, 16-byte
    aligned; the result is the slice's product."""
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(91, 64, 48, 512)
    a, b = a[:, 128:384].contiguous(), b[:, 128:384].contiguous()
    a_scale, b_scale = a_scale[:, 1:3], b_scale[:, 1:3]
    out = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
    (call,) = fake.calls
    assert call["a_scale"] % 16 == 0 and call["b_scale"] % 16 == 0
    assert relative_error(out, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE


def test_compiled_calls_reach_the_entry(gpu):
    fake = FakeWgrad()
    gpu(fake)
    a, b, a_scale, b_scale = _operands(95, 64, 48, 256)

    def step(a, b, a_scale, b_scale, out):
        product = fp8gemm.gemm(a, b, a_scale, b_scale, out_dtype=torch.float32)
        fp8gemm.gemm(a, b, a_scale, b_scale, out=out, accumulate=True)
        return product

    out = torch.ones(64, 48)
    product = torch.compile(step, fullgraph=True, backend="aot_eager")(a, b, a_scale, b_scale, out)
    assert set(fake.entries()) == {"wgrad_launch"} and all(call["accumulate"] == 0 for call in fake.calls)
    assert relative_error(product, _float64_product(a, b, a_scale, b_scale)) < FP32_TOLERANCE
    assert torch.equal(out, 1 + product)


def test_the_training_layers_weight_gradient_takes_the_entry(gpu):
    """fp8gemm.training.linear's dW = dY^T X is the per-row form: on a backend with the entry it is one wgrad_launch
    over the padded token count (M_pad = 256 for 200 tokens), and the gradient is the float64 product's."""
    fake = FakeWgrad()
    gpu(fake)
    gen = torch.Generator().manual_seed(97)
    x = torch.randn(200, 256, generator=gen, requires_grad=True)
    weight = (torch.randn(128, 256, generator=gen) * 0.05).requires_grad_()
    dy = torch.randn(200, 128, generator=gen)
    fp8gemm.training.linear(x, weight).backward(dy)
    wgrad = [call for call in fake.calls if call["entry"] == "wgrad_launch"]
    assert len(wgrad) == 1
    assert (wgrad[0]["m"], wgrad[0]["n"], wgrad[0]["k"], wgrad[0]["accumulate"]) == (128, 256, 256, 0)
    assert relative_error(weight.grad, (dy.double().t() @ x.detach().double())) < 0.05


def test_backend_dataclass_replace_keeps_the_entry():
    """The gfx942 emulator (and others) rename a loaded backend with dataclasses.replace: the entry and its layout
    come along."""
    backend = FakeWgrad().backend()
    renamed = dataclasses.replace(backend, name="renamed")
    assert renamed.wgrad_launch == backend.wgrad_launch and renamed.wgrad_b_scale_layout == WGRAD_B_LAYOUT
