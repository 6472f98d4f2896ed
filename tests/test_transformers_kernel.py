"""transformers' own FP8 modules on fp8gemm's finegrained-fp8 interface (fp8gemm.hf), loaded by transformers itself
through `kernels`, on CPU on fp8gemm's reference; and the interface's functions called directly.

transformers refuses FP8 models on CPU at load (FineGrainedFP8HfQuantizer.validate_environment dequantizes a
pre-quantized checkpoint to bf16 and raises for on-the-fly quantization), so whole models belong to the GPU. Here its
FP8Linear, FP8GroupedLinear and FP8Experts (experts_implementation grouped_mm, batched_mm and eager, with and without
expert-parallel sentinel ids) are built directly, as replace_with_fp8_linear builds them, filled with FP8 weights and
scales drawn from a printed seed, and run under torch.no_grad: their forwards are transformers' unmodified code, which
loads the kernel with kernels.get_kernel("kernels-community/finegrained-fp8"). Each route runs in a fresh interpreter,
as a user starts one: LOCAL_KERNELS pointing at ci/build_hub.py's layout, and fp8gemm.hf.use_in_transformers(). Both
must match a float64 reference of the same quantized operands and agree bit for bit. Written against transformers
5.22.2 with kernels 0.17.2 (5.23 and later take kernels >= 0.18.2; the interface they call is the same in 5.24.0).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import fp8gemm
import pytest
import torch
from fp8gemm import hf, registry
from fp8gemm.reference import REFERENCE, oracle
from fp8gemm.registry import Selection
from fp8gemm.testing.conformance import TOLERANCE, relative_error
from test_grouped import HostRead, refuse_host_reads

SEED = int(os.environ.get("FP8GEMM_TEST_SEED", "20261201"))
REPO_ID = "kernels-community/finegrained-fp8"
HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 256, 128, 4, 2, 9
# The experts' outputs pass two FP8 GEMMs with a bf16 gate between and a bf16 sum of TOP_K terms after; against
# float64 that adds two bf16 roundings to one GEMM's (measured 1.3-1.8e-3 over seeds 1-4): the bf16 GEMM bound holds.
EXPERTS_BOUND = TOLERANCE[torch.bfloat16]


def _transformers_status() -> str | None:
    """Why transformers cannot drive the kernel here, or None."""
    try:
        from transformers.integrations import finegrained_fp8  # noqa: F401
        from transformers.utils import import_utils
    except ImportError as exc:
        return f"transformers with FP8Experts is not installed ({exc})"
    if not import_utils.is_kernels_available():
        return f"the installed kernels is outside transformers' range {import_utils.KERNELS_MIN_VERSION} .. <{import_utils.KERNELS_MAX_VERSION}"  # fmt: skip
    return None


needs_transformers = pytest.mark.skipif(_transformers_status() is not None, reason=str(_transformers_status()))


def _gen(offset: int) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + offset)


def fp8_weight(shape, offset: int, magnitude: float = 1.0):
    """FP8 codes and fp32 block scales of random weights whose magnitude varies from block to block (never zero)."""
    w = torch.randn(*shape, generator=_gen(offset)) * magnitude
    blocks = torch.rand(*shape[:-2], -(-shape[-2] // 128), shape[-1] // 128, generator=_gen(offset + 1)) * 8 + 0.25
    w = w * blocks.repeat_interleave(128, -2)[..., : shape[-2], :].repeat_interleave(128, -1)
    pairs = [fp8gemm.quantize_weight(m) for m in w.reshape(-1, *shape[-2:])]
    q = torch.stack([p[0] for p in pairs]).reshape(shape)
    return q, torch.stack([p[1] for p in pairs]).reshape(*shape[:-2], *pairs[0][1].shape)


def activations(shape, offset: int, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(offset)) * 3).to(dtype)


def routing(offset: int, sentinels: bool):
    """top-k expert ids and bf16 weights per token; with ``sentinels``, some ids are EXPERTS (another rank's expert)."""
    ids = torch.stack([torch.randperm(EXPERTS, generator=_gen(offset + t))[:TOP_K] for t in range(TOKENS)])
    if sentinels:
        ids[::3, 0] = EXPERTS
        ids[1, :] = EXPERTS
    weights = torch.rand(TOKENS, TOP_K, generator=_gen(offset + 99)).softmax(-1).to(torch.bfloat16)
    return ids, weights


# --- the modules, as the child interpreter builds and runs them -------------------------------------------------------


def build_linear(static: bool = False):
    from transformers.integrations.finegrained_fp8 import FP8Linear

    layer = FP8Linear(384, 272, block_size=(128, 128), activation_scheme="static" if static else "dynamic",
                      has_bias=True)  # fmt: skip
    w, s = fp8_weight((272, 384), 10)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.weight_scale_inv.copy_(s)
        layer.bias.copy_(torch.randn(272, generator=_gen(12)))
        if static:
            layer.activation_scale.fill_(0.021)  # x * 3 of randn: max |x| ~ 13, 13 / 448 ~ 0.03: some saturate
    return layer


def build_grouped_linear():
    from transformers.integrations.finegrained_fp8 import FP8GroupedLinear

    layer = FP8GroupedLinear(256, 256, n_groups=2, block_size=(128, 128))
    w, s = fp8_weight((256, 256), 20)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.weight_scale_inv.copy_(s)
    return layer


def build_experts(implementation: str, expert_parallel: bool):
    from transformers import Qwen3MoeConfig
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    from transformers.integrations.moe import use_experts_implementation

    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, hidden_act="silu")  # fmt: skip
    config._experts_implementation = implementation
    cls = FP8Experts if hasattr(FP8Experts, "_is_wrapped") else use_experts_implementation(
        experts_class=FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS, has_gate=True)  # fmt: skip
    cls._is_wrapped = True  # replace_with_fp8_linear wraps the class in place too; once is enough
    experts = cls(config, block_size=(128, 128))
    # magnitude: gate values of a few units, so the SiLU is neither linear nor zero
    up, up_s = fp8_weight((EXPERTS, 2 * INTER, HIDDEN), 30, magnitude=0.03)
    down, down_s = fp8_weight((EXPERTS, HIDDEN, INTER), 40, magnitude=0.03)
    with torch.no_grad():
        for name, value in (("gate_up_proj", up), ("gate_up_proj_scale_inv", up_s), ("down_proj", down),
                            ("down_proj_scale_inv", down_s)):  # fmt: skip
            getattr(experts, name).copy_(value)
    experts._is_expert_parallel = expert_parallel
    return experts


def run_modules(route: str) -> dict:
    """Every module forward, and the linear and experts modules under torch.compile(fullgraph=True)."""
    if route == "python":
        hf.use_in_transformers()
    from transformers.integrations.finegrained_fp8 import load_finegrained_fp8_kernel

    out: dict = {}
    with torch.no_grad():
        x = activations((2, 5, 384), 1)
        linear = build_linear()
        out["linear"] = linear(x)
        out["compiled_linear"] = torch.compile(linear, fullgraph=True, backend="aot_eager")(x)
        out["linear_fp16"] = build_linear()(x.half())
        out["linear_static"] = build_linear(static=True)(x)
        out["grouped_linear"] = build_grouped_linear()(activations((3, 2, 256), 2))
        hidden = activations((TOKENS, HIDDEN), 3)
        for implementation in ("grouped_mm", "batched_mm", "eager"):
            for ep in (False, True):
                experts = build_experts(implementation, ep)
                ids, weights = routing(4, sentinels=ep)
                out[f"experts_{implementation}{'_ep' * ep}"] = experts(hidden, ids, weights)
                if implementation != "eager":
                    compiled = torch.compile(experts, fullgraph=True, backend="aot_eager")
                    out[f"compiled_{implementation}{'_ep' * ep}"] = compiled(hidden, ids, weights)
    out["kernel_module"] = load_finegrained_fp8_kernel().matmul.__module__
    return out


# --- float64 references of the same quantized operands ---------------------------------------------------------------


def gemm64(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x quantized per token per 128 of K by fp8gemm's reference quantizer (what the kernel does), times w, in float64."""
    q, s = fp8gemm.quantize_activation(x.reshape(-1, x.shape[-1]), fp8_dtype=w.dtype)
    return oracle(q, w, s, w_scale).reshape(*x.shape[:-1], w.shape[0])


def experts64(experts, hidden, ids, weights) -> torch.Tensor:
    """transformers' expert MLP per (token, expert) pair: each GEMM rounded to bf16 as the kernel writes it, the gate in
    bf16 as the module computes it; sentinel pairs contribute nothing; the sum over top-k in float64."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(TOKENS):
        for k in range(TOP_K):
            e = int(ids[t, k])
            if e >= EXPERTS:
                continue
            up = gemm64(hidden[t : t + 1], experts.gate_up_proj[e], experts.gate_up_proj_scale_inv[e]).bfloat16()
            act = experts._apply_gate(up)
            down = gemm64(act, experts.down_proj[e], experts.down_proj_scale_inv[e]).bfloat16()
            out[t] += (down * weights[t, k]).double()[0]
    return out


@torch.no_grad()
def references() -> dict:
    x = activations((2, 5, 384), 1)
    layer, static = build_linear(), build_linear(static=True)
    bias = layer.bias.detach().double()
    s = float(static.activation_scale)
    q = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(-1, 384)
    static_ref = oracle(q, static.weight, torch.full((10, 3), s), static.weight_scale_inv).reshape(2, 5, 272)
    grouped_linear, gx = build_grouped_linear(), activations((3, 2, 256), 2)
    w, ws = grouped_linear.weight.view(2, 128, 256), grouped_linear.weight_scale_inv.view(2, 1, 2)
    ref = {
        "linear": gemm64(x, layer.weight, layer.weight_scale_inv) + bias,
        "linear_fp16": gemm64(x.half(), layer.weight, layer.weight_scale_inv) + bias,
        "linear_static": static_ref + bias,
        "grouped_linear": torch.stack([gemm64(gx[:, g], w[g], ws[g]) for g in range(2)], dim=1).reshape(3, 2, 128),
    }
    hidden = activations((TOKENS, HIDDEN), 3)
    for ep in (False, True):
        experts = build_experts("eager", ep)
        for implementation in ("grouped_mm", "batched_mm", "eager"):
            ref[f"experts_{implementation}{'_ep' * ep}"] = experts64(experts, hidden, *routing(4, sentinels=ep))
    return ref


# --- the tests ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ci"))
    import build_hub

    out = tmp_path_factory.mktemp("hub")
    build_hub.main(["--out", str(out)])
    return out


def run_route(route: str, hub: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FP8GEMM_TEST_SEED": str(SEED)}
    env.pop("LOCAL_KERNELS", None)
    if route == "local":
        env["LOCAL_KERNELS"] = f"{REPO_ID}={hub}"
    result_file = tmp_path / f"{route}.pt"
    run = subprocess.run([sys.executable, __file__, route, str(result_file)], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, f"{route} route failed:\n{run.stdout}\n{run.stderr}"
    return torch.load(result_file)


@needs_transformers
@pytest.mark.skipif(
    bool(torch.version.cuda or torch.version.hip),
    reason="kernels resolves a GPU variant under this torch and this layout holds torch-cpu only "
    "(python3 -m fp8gemm_bench.models runs both routes on the GPU)",
)
def test_transformers_fp8_modules_run_on_fp8gemm_by_both_routes(hub, tmp_path):
    print(f"data seed {SEED} (FP8GEMM_TEST_SEED)")
    local, python = run_route("local", hub, tmp_path), run_route("python", hub, tmp_path)
    hub_id = json.loads((hub / "build" / "torch-cpu" / "metadata.json").read_text())["id"]
    assert local.pop("kernel_module") == f"{hub_id}.fp8gemm.hf.finegrained_fp8"  # the Hub layout's vendored copy
    assert python.pop("kernel_module") == "fp8gemm.hf.finegrained_fp8"  # the installed package
    for route in (local, python):
        for name in [k for k in route if k.startswith("compiled_")]:
            plain = name.removeprefix("compiled_")
            eager = route[plain if plain == "linear" else f"experts_{plain}"]
            assert torch.equal(route.pop(name), eager), f"{name}: torch.compile(fullgraph=True) differs from eager"
    assert local.keys() == python.keys()
    for name in local:
        assert torch.equal(local[name], python[name]), f"{name}: the two routes differ"
    for name, ref in references().items():
        got = local[name]
        bound = EXPERTS_BOUND if name.startswith("experts") else TOLERANCE[torch.bfloat16]
        assert got.dtype == (torch.float16 if name == "linear_fp16" else torch.bfloat16), name
        assert relative_error(got, ref) <= bound, f"{name}: rel. err {relative_error(got, ref):.2e} > {bound}"
    assert not torch.equal(local["linear_static"], local["linear"])  # the static scale is honoured, not ignored
    sentinel_tokens = [1]  # every pick of token 1 is another rank's expert: nothing of it is computed here
    for implementation in ("grouped_mm", "batched_mm", "eager"):
        assert bool((local[f"experts_{implementation}_ep"][sentinel_tokens] == 0).all()), implementation


def test_direct_calls_match_float64_and_rows_in_no_expert_read_zero():
    """matmul_batched / matmul_grouped rows with no local expert hold NaN inputs: they are neither computed nor written
    (they read 0), and every other row matches float64."""
    print(f"data seed {SEED} (FP8GEMM_TEST_SEED)")
    w, ws = fp8_weight((EXPERTS, 272, 384), 50)
    x = activations((23, 384), 51)
    ids = torch.randint(0, EXPERTS, (23,), generator=_gen(52))
    ids[[2, 7, 8]] = torch.tensor([EXPERTS, EXPERTS + 5, -1])
    x[[2, 7, 8]] = math.nan
    valid = (ids >= 0) & (ids < EXPERTS)
    ref = torch.stack([gemm64(x[s], w[ids[s]], ws[ids[s]]) if valid[s] else torch.zeros(272, dtype=torch.float64)
                       for s in range(23)])  # fmt: skip
    for output_dtype in (None, torch.float32):
        y = hf.matmul_batched(x, w, ws, block_size=[128, 128], expert_ids=ids, output_dtype=output_dtype)
        assert y.dtype == (output_dtype or torch.bfloat16) and bool((y[~valid] == 0).all())
        assert relative_error(y[valid], ref[valid]) <= TOLERANCE[y.dtype]
    order = torch.argsort(torch.where(valid, ids, EXPERTS), stable=True)
    offsets = torch.cumsum(torch.bincount(ids[valid], minlength=EXPERTS), 0).to(torch.int32)
    y = hf.matmul_grouped(x[order], w, ws, offsets=offsets, tokens_per_expert=None, block_size=(128, 128))
    assert bool((y[int(offsets[-1]) :] == 0).all())
    assert relative_error(y[: int(offsets[-1])], ref[order][: int(offsets[-1])]) <= TOLERANCE[torch.bfloat16]
    w2, ws2 = w[1], ws[1]
    for dtype, output_dtype in [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None),
                                (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]:  # fmt: skip
        xx = activations((3, 4, 384), 53, dtype)
        y = hf.matmul_2d(xx, w2, ws2, [128, 128], output_dtype)
        assert y.shape == (3, 4, 272) and y.dtype == (output_dtype or dtype)
        out_kind = torch.float32 if y.dtype != torch.bfloat16 else torch.bfloat16
        assert relative_error(y.float(), gemm64(xx, w2, ws2)) <= TOLERANCE[out_kind], (dtype, output_dtype)


def test_power_of_two_scales_stored_as_ue8m0_give_the_fp32_result():
    w, ws = fp8_weight((EXPERTS, 256, 256), 60)
    pow2 = torch.exp2(torch.round(torch.log2(ws)))
    x, ids = activations((11, 256), 61), torch.randint(0, EXPERTS, (11,), generator=_gen(62))
    ue8m0 = pow2.to(torch.float8_e8m0fnu)
    assert torch.equal(hf.matmul_batched(x, w, ue8m0, block_size=[128, 128], expert_ids=ids),
                       hf.matmul_batched(x, w, pow2, block_size=[128, 128], expert_ids=ids))  # fmt: skip
    assert torch.equal(hf.matmul_2d(x, w[0], ue8m0[0], [128, 128]), hf.matmul_2d(x, w[0], pow2[0], [128, 128]))


def _unsupported_cases():
    w, ws = fp8_weight((2, 256, 256), 70)
    fp4 = torch.zeros(2, 256, 128, dtype=torch.int8)
    x, ids, offs = activations((4, 256), 71), torch.tensor([0, 1, 1, 0]), torch.tensor([2, 4], dtype=torch.int32)
    calls = {
        "2d": lambda w, ws, block, **kw: hf.matmul_2d(x, w[0], ws[0], block, **kw),
        "batched": lambda w, ws, block, **kw: hf.matmul_batched(x, w, ws, block_size=block, expert_ids=ids, **kw),
        "grouped": lambda w, ws, block, **kw: hf.matmul_grouped(
            x, w, ws, offsets=offs, tokens_per_expert=None, block_size=block, **kw
        ),  # fmt: skip
    }
    cases = [
        ("block 64x64", (w, ws, [64, 64]), NotImplementedError, "block_size = \\[64, 64\\] \\(another block size\\)"),
        ("block 128x64", (w, ws, [128, 64]), NotImplementedError, "another block size"),
        ("per-tensor (None)", (w, ws, None), NotImplementedError, "per-tensor scales"),
        ("per-tensor ([N, K])", (w, ws, [256, 256]), NotImplementedError, "per-tensor scales"),
        ("FP4 weights", (fp4, ws, [128, 128]), NotImplementedError, "torch.int8 \\(FP4 weights come packed in int8\\)"),
        ("e5m2 weights", (w.to(torch.float8_e5m2), ws, [128, 128]), NotImplementedError, "float8_e5m2"),
        ("MX scales", (w, ws.to(torch.uint8), [128, 128]), NotImplementedError, "weight_scale_inv is torch.uint8"),
        ("scale grid", (w, ws[:, :1], [128, 128]), ValueError, "one scale per 128x128 block"),
    ]
    return {
        f"{name}: {call}": (calls[call], args, error, match) for name, args, error, match in cases for call in calls
    }


UNSUPPORTED = _unsupported_cases()


@pytest.mark.parametrize("call,args,error,match", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_unsupported_inputs_raise_what_transformers_falls_back_on(call, args, error, match):
    with pytest.raises(error, match=match):
        call(*args)


def test_bad_calls_raise_value_errors():
    w, ws = fp8_weight((2, 256, 256), 80)
    x = activations((4, 256), 81)
    with pytest.raises(ValueError, match="expert_ids .* is required"):
        hf.matmul_batched(x, w, ws, block_size=[128, 128])
    with pytest.raises(ValueError, match="one expert id per row"):
        hf.matmul_batched(x, w, ws, block_size=[128, 128], expert_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="offsets .* is required"):
        hf.matmul_grouped(x, w, ws, block_size=[128, 128])
    with pytest.raises(ValueError, match="activation_scale must be one value"):
        hf.matmul_2d(x, w[0], ws[0], [128, 128], None, activation_scale=torch.ones(2))
    with pytest.raises(ValueError, match="multiple of 128"):
        hf.matmul_2d(activations((4, 200), 82), w[0][:, :200], ws[0][:, :2], [128, 128])


def test_batched_and_grouped_never_read_values_on_the_host(monkeypatch):
    """On meta tensors, which have no values, with every host read refused and the reference playing a GPU backend:
    nothing in either path waits on the device, so CUDA graphs capture them."""
    w, ws = (t.to("meta") for t in fp8_weight((EXPERTS, 256, 256), 90))
    x, ids = activations((7, 256), 91).to("meta"), torch.zeros(7, dtype=torch.long, device="meta")
    offsets = torch.zeros(EXPERTS, dtype=torch.int32, device="meta")
    monkeypatch.setattr(registry, "select", lambda device, backend=None: Selection(REFERENCE, "meta plays a GPU"))
    refuse_host_reads(monkeypatch)
    assert hf.matmul_batched(x, w, ws, block_size=[128, 128], expert_ids=ids).shape == (7, 256)
    assert hf.matmul_grouped(x, w, ws, offsets=offsets, block_size=[128, 128]).shape == (7, 256)
    with pytest.raises(HostRead):
        torch.ones(2, device="meta").tolist()


@pytest.mark.parametrize("function", ["matmul_2d", "matmul_batched", "matmul_grouped"])
def test_torch_compile_fullgraph_gives_the_eager_result(function):
    torch._dynamo.reset()
    w, ws = fp8_weight((EXPERTS, 256, 256), 100)
    x, ids = activations((9, 256), 101), torch.randint(0, EXPERTS + 1, (9,), generator=_gen(102))
    offsets = torch.tensor([2, 2, 6, 8], dtype=torch.int32)
    calls = {
        "matmul_2d": lambda x, w, ws: hf.matmul_2d(x, w[0], ws[0], [128, 128], torch.bfloat16),
        "matmul_batched": lambda x, w, ws: hf.matmul_batched(x, w, ws, block_size=[128, 128], expert_ids=ids),
        "matmul_grouped": lambda x, w, ws: hf.matmul_grouped(x, w, ws, offsets=offsets, block_size=[128, 128]),
    }
    with torch.no_grad():
        eager = calls[function](x, w, ws)
        assert torch.equal(torch.compile(calls[function], fullgraph=True, backend="aot_eager")(x, w, ws), eager)
    torch._dynamo.reset()


@needs_transformers
def test_use_in_transformers_refuses_where_transformers_would_not_use_it(monkeypatch):
    from transformers.integrations import finegrained_fp8
    from transformers.utils import import_utils

    monkeypatch.setattr(import_utils, "is_kernels_available", lambda: False)
    with pytest.raises(ImportError, match="transformers would not load any finegrained-fp8 kernel"):
        hf.use_in_transformers()
    monkeypatch.undo()
    hub_kernel = finegrained_fp8.FineGrainedFP8(matmul=_hub_matmul, batched_matmul=None, grouped_matmul=None)
    monkeypatch.setattr(finegrained_fp8, "_FINEGRAINED_FP8", hub_kernel)
    with pytest.raises(RuntimeError, match="already holds another finegrained-fp8 kernel .* before the model's first"):
        hf.use_in_transformers()


def _hub_matmul(*args):  # stands for the Hub kernel's function in the test above
    raise AssertionError("not called")


@needs_transformers
def test_use_in_transformers_keeps_other_local_kernels(monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"someone/other=/opt/other:{REPO_ID}=/opt/stale")
    kernel = hf.use_in_transformers()
    other, ours = os.environ["LOCAL_KERNELS"].split(":")
    assert other == "someone/other=/opt/other" and ours.startswith(f"{REPO_ID}=") and "/opt/stale" not in ours
    assert kernel.matmul_2d is hf.matmul_2d and kernel.matmul_grouped is hf.matmul_grouped


@needs_transformers
@pytest.mark.parametrize("before, after", [(None, "1"), ("0", "0")])
def test_use_in_transformers_turns_off_the_deepgemm_probe_unless_the_user_chose(monkeypatch, before, after):
    if before is None:
        monkeypatch.delenv("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR", raising=False)
    else:
        monkeypatch.setenv("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR", before)
    hf.use_in_transformers()
    assert os.environ["TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR"] == after


if __name__ == "__main__":  # one route in a fresh interpreter: run_route
    torch.save(run_modules(sys.argv[1]), sys.argv[2])
