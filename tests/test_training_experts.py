"""``fp8gemm.training.fused_experts`` and ``fp8gemm.nn.Fp8TrainingExperts``: the forward has ``fp8gemm.fused_experts``'
bits on the quantized weights; the gradients of x, topk_weights, w13 and w2 are within 10% of float64 autograd of the
unquantized layer (bf16's error printed beside); every GEMM of the backward is within the contract of a float64
product of its FP8 operands; skewed and sparse routing, skipped slots, no tokens; only the gradients asked for;
torch.compile; the module and ``convert(model, training=True)`` on a transformers Qwen3-MoE model."""

from __future__ import annotations

import copy
import dataclasses

import fp8gemm
import pytest
import torch
import torch.nn.functional as F
from fp8gemm import registry
from fp8gemm.moe_reference import dequantize64
from fp8gemm.nn import Fp8TrainingExperts, ReferenceOnCpuWarning, convert
from fp8gemm.reference import REFERENCE
from fp8gemm.registry import Selection
from fp8gemm.testing.conformance import DEFAULT_SEED, relative_error
from fp8gemm.training import experts_steps, fused_experts
from test_grouped import refuse_host_reads
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

# FP8 against the unquantized math: x, both weights, the activation and each gradient operand rounded to e4m3, and
# the gate's and up's errors multiply in silu(gate) * up (the forward alone: ~6%). Measured 5.5-7.5%.
GRAD_TOLERANCE = 0.10
GEMM_TOLERANCE = {torch.bfloat16: 4e-3, torch.float32: 5e-4}  # the contract's, by output dtype


@dataclasses.dataclass(frozen=True)
class Case:
    tokens: int
    experts: int
    top_k: int
    inter: int = 128
    routing: str = "uniform"  # uniform | skewed | sparse | skipped
    x_dtype: torch.dtype = torch.bfloat16
    w_dtype: torch.dtype = torch.float32
    pow2: bool = False

    @property
    def id(self) -> str:
        dtypes = f"{str(self.x_dtype)[6:]}-w{str(self.w_dtype)[6:]}" + ("-pow2" if self.pow2 else "")
        return f"T{self.tokens}-E{self.experts}-k{self.top_k}-I{self.inter}-{self.routing}-{dtypes}"


CASES = [
    Case(96, 8, 2),
    Case(150, 4, 2, inter=256, routing="skewed"),  # most rows on two experts: blocks past 128 tokens
    Case(9, 16, 2, routing="sparse"),  # most experts empty
    Case(40, 6, 3, routing="skipped", x_dtype=torch.float32),  # -1 ids: slots that select nothing
    Case(33, 8, 2, x_dtype=torch.float16, w_dtype=torch.bfloat16, pow2=True),
    Case(1, 8, 4, w_dtype=torch.bfloat16),  # one token
]


def make_case(case: Case, seed: int, hidden: int = 256):
    """Leaves x, topk_weights, w13, w2 (requiring grad), topk_ids and the output gradient, from a printed seed."""
    print(f"{case.id}: seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    t, e, i = case.tokens, case.experts, case.inter
    x = (torch.randn(t, hidden, generator=gen) * 2).to(case.x_dtype)
    magnitude = torch.rand(e, 1, 1, generator=gen) + 0.25  # each expert its own scale: a wrong expert shows
    w13 = (torch.randn(e, 2 * i, hidden, generator=gen) * magnitude / 16).to(case.w_dtype)
    w2 = (torch.randn(e, hidden, i, generator=gen) * magnitude / 16).to(case.w_dtype)
    logits = torch.randn(t, e, generator=gen)
    if case.routing == "skewed":
        logits[:, :2] += 4.0
    if case.routing == "sparse":
        logits[:, 3:] -= 8.0
    weights, ids = logits.softmax(-1).topk(case.top_k)
    if case.routing == "skipped":
        ids[::3, 0] = -1
    dout = torch.randn(t, hidden, generator=gen).to(case.x_dtype)
    leaves = [a.requires_grad_() for a in (x, weights, w13, w2)]
    return leaves, ids, dout


def dense_experts(x, ids, weights, w13, w2):
    """The unquantized layer as transformers computes it, differentiable (a loop over experts)."""
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        token, slot = (ids == e).nonzero(as_tuple=True)
        h = x[token] @ w13[e].t()
        y = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t()
        out = out.index_add(0, token, y * weights[token, slot][:, None])
    return out


def _grads_of(fn, leaves, ids, dout, dtype):
    copies = [t.detach().to(dtype).requires_grad_() for t in leaves]
    fn(copies[0], ids, *copies[1:]).backward(dout.to(dtype))
    return [t.grad for t in copies]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradients_against_float64_autograd_of_the_unquantized_layer(case):
    leaves, ids, dout = make_case(case, DEFAULT_SEED + CASES.index(case))
    x, weights, w13, w2 = leaves
    out = fused_experts(x, ids, weights, w13, w2, pow2_scales=case.pow2)
    out.backward(dout)
    assert out.dtype == case.x_dtype and [t.grad.dtype for t in leaves] == [t.dtype for t in leaves]
    want = _grads_of(dense_experts, leaves, ids, dout, torch.float64)
    bf16 = _grads_of(dense_experts, leaves, ids, dout, torch.bfloat16)
    names = ("x", "topk_weights", "w13", "w2")
    errors = {n: relative_error(t.grad, ref) for n, t, ref in zip(names, leaves, want, strict=True)}
    bf16_errors = {n: relative_error(g, ref) for n, g, ref in zip(names, bf16, want, strict=True)}
    forward = relative_error(out, dense_experts(*(t.detach().double() for t in (x, ids, weights, w13, w2))))
    print(f"forward {forward:.4f}; against float64: " + ", ".join(f"d{n} {e:.4f} (bf16 {bf16_errors[n]:.4f})"
                                                                   for n, e in errors.items()))  # fmt: skip
    assert max(errors.values()) < GRAD_TOLERANCE


def _record(monkeypatch):
    """Every grouped GEMM and k-grouped weight gradient the layer runs, with its operands and result."""
    calls = []
    grouped, wgrad = experts_steps.grouped_product, experts_steps.kgrouped_wgrad

    def record_grouped(plan, a, a_scale, b, b_scale, offs, dtype, **kwargs):
        out = grouped(plan, a, a_scale, b, b_scale, offs, dtype, **kwargs)
        calls.append(("grouped", (a, a_scale, b, b_scale, offs), out))
        return out

    def record_wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, **kwargs):
        out = wgrad(a_t, b_t, a_scale_t, b_scale_t, offs, **kwargs)
        calls.append(("wgrad", (a_t, a_scale_t, b_t, b_scale_t, offs), out))
        return out

    monkeypatch.setattr(experts_steps, "grouped_product", record_grouped)
    monkeypatch.setattr(experts_steps, "kgrouped_wgrad", record_wgrad)
    return calls


def _float64_product(kind, a, a_scale, b, b_scale, offs):
    """float64 of the FP8 operands, expert by expert (each expert's rows or aligned columns found on the host)."""
    ends, start, parts = offs.tolist(), 0, []
    if kind == "wgrad":
        a64, b64 = dequantize64(a, a_scale), dequantize64(b, b_scale)
    for e, end in enumerate(ends):
        if kind == "grouped":
            parts.append(dequantize64(a[start:end], a_scale[start:end]) @ dequantize64(b[e], b_scale[e]).t())
        else:
            cols = slice(128 * (e + start // 128), 128 * (e + start // 128) + end - start)
            parts.append(a64[:, cols] @ b64[:, cols].t())
        start = end
    return torch.cat(parts) if kind == "grouped" else torch.stack(parts)


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=[CASES[1].id, CASES[3].id])
def test_every_gemm_of_the_backward_within_the_contract(case, monkeypatch):
    """Forward: gate/up (fp32) and down (x's GEMM dtype); backward: dW2, dAct, dW13, dX: each against float64 of
    the FP8 operands it was given."""
    leaves, ids, dout = make_case(case, DEFAULT_SEED + 100)
    calls = _record(monkeypatch)
    fused_experts(leaves[0], ids, *leaves[1:]).backward(dout)
    assert [kind for kind, _, _ in calls] == ["grouped", "grouped", "wgrad", "grouped", "wgrad", "grouped"]
    for kind, operands, out in calls:
        if kind == "wgrad":  # the k-grouped operands' scales are per row of a_t / b_t
            a_t, sa, b_t, sb, offs = operands
            want = _float64_product(kind, a_t, sa, b_t, sb, offs)
        else:
            want = _float64_product(kind, *operands)
            out = out[: operands[4][-1]]  # rows past offs[-1] belong to no expert (zeros)
        err = relative_error(out, want)
        print(f"{kind} {tuple(out.shape)} {out.dtype}: {err:.2e}")
        assert err < GEMM_TOLERANCE[out.dtype]


def _quantized(w13, w2, pow2=False):
    q13, s13 = fp8gemm.nn.experts.quantize_experts(w13.detach(), torch.float8_e4m3fn, pow2)
    q2, s2 = fp8gemm.nn.experts.quantize_experts(w2.detach(), torch.float8_e4m3fn, pow2)
    return q13, s13, q2, s2


@pytest.mark.parametrize("case", CASES[3:5], ids=[c.id for c in CASES[3:5]])
def test_forward_has_the_bits_of_fused_experts_on_the_quantized_weights(case):
    (x, weights, w13, w2), ids, _ = make_case(case, DEFAULT_SEED + 102)
    out = fused_experts(x, ids, weights, w13, w2, pow2_scales=case.pow2)
    with torch.no_grad():
        want = fp8gemm.fused_experts(x, ids, weights, *_quantized(w13, w2, case.pow2), pow2_scales=case.pow2)
        assert torch.equal(out, want) and out.requires_grad
        assert torch.equal(fused_experts(x, ids, weights, w13, w2, pow2_scales=case.pow2), want)  # the inference call


def test_saves_fp8_transposes_not_the_high_precision_input():
    """x's routed rows are kept as FP8 x^T; the only high-precision rows kept are the gate/up product (bf16), and the
    down GEMM's rows only when topk_weights needs a gradient."""
    (x, weights, w13, w2), ids, _ = make_case(Case(96, 8, 2), DEFAULT_SEED + 103)
    for keep_y in (False, True):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
            fused_experts(x, ids, weights if keep_y else weights.detach(), w13, w2)
        fp8 = [tuple(t.shape) for t in saved if t.dtype == torch.float8_e4m3fn]
        large = [(t.dtype, tuple(t.shape)) for t in saved if t.dtype in (torch.bfloat16, torch.float32)
                 and t.numel() >= x.numel()]  # fmt: skip
        # x^T and act^T in 10 blocks (E + 192 // 128 + 1); the weights' transposes
        assert fp8 == [(256, 1280), (128, 1280), (8, 256, 256), (8, 128, 256)]
        assert large == [(torch.bfloat16, (192, 256))] * (1 + keep_y)  # gate/up product; the down GEMM's rows


@pytest.mark.parametrize("frozen", ["x", "topk_weights", "w13", "w2"])
def test_only_the_gradients_asked_for_are_computed(frozen):
    leaves, ids, dout = make_case(Case(50, 4, 2, routing="skewed"), DEFAULT_SEED + 104)
    fused_experts(leaves[0], ids, *leaves[1:]).backward(dout)
    full = [t.grad for t in leaves]
    names = ("x", "topk_weights", "w13", "w2")
    again = [t.detach().requires_grad_(n != frozen) for n, t in zip(names, leaves, strict=True)]
    fused_experts(again[0], ids, *again[1:]).backward(dout)
    for name, t, want in zip(names, again, full, strict=True):
        assert t.grad is None if name == frozen else torch.equal(t.grad, want)


def test_no_tokens():
    (x, weights, w13, w2), ids, _ = make_case(Case(4, 4, 2), DEFAULT_SEED + 105)
    x0, w0 = x.detach()[:0].requires_grad_(), weights.detach()[:0].requires_grad_()
    out = fused_experts(x0, ids[:0], w0, w13, w2)
    out.sum().backward()
    assert out.shape == (0, 256) and torch.equal(w13.grad, torch.zeros_like(w13)) and x0.grad.shape == (0, 256)


def test_forward_and_backward_never_read_values_on_the_host(monkeypatch):
    """On meta tensors (no values, as a GPU's for the host): routing, quantizers, grouped GEMMs, k-grouped weight
    gradients and both combines run forward and backward with every host read refused."""
    leaves, ids, dout = make_case(Case(20, 4, 2), DEFAULT_SEED + 113)
    leaves = [t.detach().to("meta").requires_grad_() for t in leaves]
    monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(REFERENCE, "meta plays a GPU"))
    with pytest.MonkeyPatch.context() as reads:
        refuse_host_reads(reads)
        fused_experts(leaves[0], ids.to("meta"), *leaves[1:]).backward(dout.to("meta"))
    assert [tuple(t.grad.shape) for t in leaves] == [(20, 256), (20, 2), (4, 256, 256), (4, 256, 128)]


def test_compiled_forward_and_backward_match_eager():
    torch._dynamo.reset()
    leaves, ids, dout = make_case(Case(40, 4, 2, routing="skewed"), DEFAULT_SEED + 106)

    def step(x, ids, weights, w13, w2):
        return (fused_experts(x, ids, weights, w13, w2).float() * dout.float()).sum()

    step(leaves[0], ids, *leaves[1:]).backward()
    eager = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    torch.compile(step, fullgraph=True, backend="aot_eager")(leaves[0], ids, *leaves[1:]).backward()
    for got, want in zip((t.grad for t in leaves), eager, strict=True):
        assert torch.equal(got, want)
    torch._dynamo.reset()


ERRORS = [
    ("fp8-w13", lambda x, w13, w2: (x, w13.detach().to(torch.float8_e4m3fn), w2), TypeError,
     "w13 must be the high-precision master weights.*use fp8gemm.fused_experts for inference"),
    ("odd-inter", lambda x, w13, w2: (x, w13[:, :192], w2[..., :96]), ValueError, r"2I = 192: I must be a positive"),
    ("w2-shape", lambda x, w13, w2: (x, w13, w2[:, :128]), ValueError, r"w2 must be \[E, H, I\]"),
    ("int-x", lambda x, w13, w2: (x.int(), w13, w2), TypeError, "x must be a bfloat16/float16/float32 tensor"),
    ("h-mismatch", lambda x, w13, w2: (x[:, :128], w13, w2), ValueError, "H must agree"),
]  # fmt: skip


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument_and_the_fix(case):
    _, pick, error, message = case
    (x, weights, w13, w2), ids, _ = make_case(Case(4, 4, 2), DEFAULT_SEED + 107)
    x, w13, w2 = pick(x, w13, w2)
    with pytest.raises(error, match=message):
        fused_experts(x, ids, weights, w13, w2)


def test_routing_errors_come_from_fused_experts_checks():
    (x, weights, w13, w2), ids, _ = make_case(Case(4, 4, 2), DEFAULT_SEED + 108)
    with pytest.raises(ValueError, match=r"topk_ids holds 4, outside \[-1, E = 4\)"):
        fused_experts(x, torch.full_like(ids, 4), weights, w13, w2)
    with pytest.raises(ValueError, match=r"topk_weights must be \[T, k\]"):
        fused_experts(x, ids, weights[:, :1], w13, w2)


# --- the module and convert ----------------------------------------------------------------------------------------


def test_module_holds_the_parameters_and_runs_training_fused_experts():
    (x, weights, w13, w2), ids, dout = make_case(Case(12, 4, 2), DEFAULT_SEED + 109)
    source = torch.nn.Module()
    source.gate_up_proj, source.down_proj = torch.nn.Parameter(w13.detach()), torch.nn.Parameter(w2.detach())
    module = Fp8TrainingExperts.from_experts(source, pow2_scales=True)
    assert module.gate_up_proj is source.gate_up_proj and module.down_proj is source.down_proj
    assert list(module.state_dict()) == ["gate_up_proj", "down_proj"] and "pow2_scales=True" in repr(module)
    out = module(x.view(3, 4, 256), ids.view(3, 4, 2), weights.view(3, 4, 2))
    assert torch.equal(out.view(12, 256), fused_experts(x, ids, weights, w13, w2, pow2_scales=True))
    out.view(12, 256).backward(dout)
    assert source.gate_up_proj.grad is not None and x.grad is not None
    fresh = Fp8TrainingExperts(4, 256, 128, dtype=torch.bfloat16)
    assert fresh.gate_up_proj.abs().max() <= 1 / 16 and fresh.down_proj.std() > 0
    with pytest.raises(ValueError, match=r"intermediate size \(I = 96\) is not a positive multiple of 128"):
        Fp8TrainingExperts(4, 256, 96)
    with pytest.raises(TypeError, match="as nn.Parameters"):
        Fp8TrainingExperts.from_experts(torch.nn.Linear(2, 2))


def _qwen3_moe(seed: int):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                            max_position_embeddings=64, num_experts=8, num_experts_per_tok=2,
                            tie_word_embeddings=False)  # fmt: skip
    return Qwen3MoeForCausalLM(config).bfloat16()


def test_convert_a_transformers_model_for_training_and_round_trip_its_state():
    model = _qwen3_moe(DEFAULT_SEED % 1000)
    base = copy.deepcopy(model)
    experts = [f"model.layers.{i}.mlp.experts" for i in (0, 1)]
    params = {name: model.get_submodule(name).gate_up_proj for name in experts}
    with pytest.warns(ReferenceOnCpuWarning):
        report = convert(model, training=True)
    assert set(experts) <= set(report.converted) and list(report.skipped) == ["lm_head"]
    assert all(type(model.get_submodule(n)) is Fp8TrainingExperts for n in experts)
    assert all(model.get_submodule(n).gate_up_proj is params[n] for n in experts)
    state = model.state_dict()
    assert list(state) == list(base.state_dict())  # the same names: checkpoints load either way
    restored = _qwen3_moe(1)
    restored.load_state_dict(state)
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in state.items())

    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(DEFAULT_SEED + 110))
    losses = {label: _loss_backward(m, ids) for label, m in (("bf16", base), ("fp8", model))}
    print(f"losses: bf16 {losses['bf16']:.4f}, converted {losses['fp8']:.4f}")
    assert abs(losses["fp8"] - losses["bf16"]) < 0.01 * losses["bf16"]
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in params.values())


def _loss_backward(model, ids) -> float:
    logits = model(ids).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256).double(), ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.item()


def test_converted_experts_gradients_inside_a_model_against_float64_and_bf16():
    """Only the experts converted: their gradients, through the bf16 model around them, against the float64 model's,
    beside the bf16 model's own error (which dominates in the first layer: random weights, small gradients)."""
    base = _qwen3_moe(DEFAULT_SEED % 1000 + 1)
    float64 = copy.deepcopy(base).double()
    float64.config._experts_implementation = "eager"  # transformers' grouped_mm takes no float64
    fp8 = copy.deepcopy(base)
    with pytest.warns(ReferenceOnCpuWarning):
        convert(fp8, training=True, skip=lambda name, module: not name.endswith(".experts"))
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(DEFAULT_SEED + 111))
    for model in (float64, base, fp8):
        _loss_backward(model, ids)
    for name in (f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("gate_up_proj", "down_proj")):
        want = float64.get_parameter(name).grad
        ours, bf16 = (relative_error(m.get_parameter(name).grad, want) for m in (fp8, base))
        print(f"{name}: against float64 {ours:.4f} (bf16 {bf16:.4f})")
        assert ours < bf16 + 0.05


def test_opcheck_of_the_layers_ops_and_compiled_inference():
    """The forward and backward ops (fake implementations, autograd registration, AOT dispatch); without grad, the
    compiled layer is the inference call with the eager bits."""
    (x, weights, w13, w2), ids, dout = make_case(Case(20, 4, 2, routing="skewed"), DEFAULT_SEED + 112)
    x, weights, w13, w2 = (t.detach() for t in (x, weights, w13, w2))
    q13, s13, q2, s2 = _quantized(w13, w2)
    tests = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    args = (x, ids, weights, q13, s13, q2, s2, False, True, "reference")
    torch.library.opcheck(torch.ops.fp8gemm.training_experts_forward.default, args, test_utils=tests)
    _, *saved = torch.ops.fp8gemm.training_experts_forward(*args)
    t13, t2 = (fp8gemm.training.quantize_experts_with_transpose(w) for w in (w13, w2))
    grads_args = (dout, saved, t13.q_t, t13.scale_t, t2.q_t, t2.scale_t, [True, True, False, True], x.dtype,
                  weights.dtype, w13.dtype, w2.dtype, False, "reference")  # fmt: skip
    torch.library.opcheck(torch.ops.fp8gemm.training_experts_backward.default, grads_args, test_utils=tests)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(fused_experts, fullgraph=True, backend="aot_eager")(x, ids, weights, w13, w2)
        assert torch.equal(compiled, fused_experts(x, ids, weights, w13, w2))
    torch._dynamo.reset()
