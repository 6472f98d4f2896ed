"""``fp8gemm bench --train-run`` and ``--train-fsdp`` (each with ``--moe``) on the CPU: the models, their conversion,
the standard library's bytes as its text, the optimizer, and each run end to end in its smoke mode with its report's
fields. No timing is asserted."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch
from fp8gemm.cli import main
from fp8gemm.nn import Fp8TrainingExperts, Fp8TrainingLinear, convert
from fp8gemm_bench import train_bench, train_fsdp, train_fsdp_moe, train_model, train_moe_run, train_run
from torch import nn

pytestmark = pytest.mark.filterwarnings("ignore:.*pure-torch reference")


def test_the_corpus_is_the_standard_librarys_source_in_sorted_order():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = train_model.stdlib_files()
    relative = [f.relative_to(root).as_posix() for f in files]
    assert relative == sorted(relative) and all(f.suffix == ".py" for f in files)
    assert "os.py" in relative and not any("site-packages" in r or "dist-packages" in r for r in relative)
    data, info = train_model.stdlib_corpus(limit_bytes=300_000)
    again, info_again = train_model.stdlib_corpus(limit_bytes=300_000)
    assert data == again and info == info_again and len(data) == info["bytes"] == 300_000
    first = files[0].read_bytes()
    assert data[: len(first)] == first[:300_000] and info["root"] == str(root)


def test_batches_of_one_seed_come_in_one_order():
    text = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    a, b = (train_model.Batches(text, 3, 16, seed=5, device="cpu") for _ in range(2))
    for _ in range(3):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and xa.shape == (3, 16)
        assert torch.equal(xa[:, 1:], ya[:, :-1])  # targets: the next byte
    other = train_model.Batches(text, 3, 16, seed=6, device="cpu")
    assert not torch.equal(next(other)[0], next(train_model.Batches(text, 3, 16, seed=5, device="cpu"))[0])


def test_the_models_sizes():
    cfg = train_model.CONVERGENCE
    assert cfg.parameters() >= 100e6 and cfg.vocab == 256
    assert (
        sum(p.numel() for p in train_model.ByteLlama(train_model.SMOKE).parameters()) == train_model.SMOKE.parameters()
    )
    big = train_model.LLAMA3_8B_8_LAYERS
    assert (big.hidden, big.intermediate, big.heads, big.kv_heads, big.layers) == (4096, 14336, 32, 8, 8)
    qkv = (big.heads + 2 * big.kv_heads) * big.head_dim
    assert {(qkv, big.hidden), (2 * big.intermediate, big.hidden), (big.hidden, big.intermediate)} <= set(
        train_bench.LLAMA3_8B_NK.values()
    )
    for c in (cfg, big, train_model.SMOKE):
        assert all(v % 128 == 0 for v in (c.hidden, c.head_dim, c.intermediate, c.kv_heads * c.head_dim))


def test_the_converted_model_trains_its_projections_in_fp8():
    model = train_model.build_model(train_model.SMOKE, seed=0, device="cpu")
    report = convert(model, training=True)
    fp8 = {name for name, m in model.named_modules() if isinstance(m, Fp8TrainingLinear)}
    projections = {f"blocks.{i}.{p}" for i in range(train_model.SMOKE.layers) for p in ("qkv", "o", "gate_up", "down")}
    assert fp8 == projections == set(report.converted) and set(report.skipped) == {"lm_head"}
    assert type(model.lm_head) is nn.Linear
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    loss = train_model.loss_fn(model, tokens, tokens)
    loss.backward()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in model.parameters())


def test_master_adamw_keeps_float32_weights_and_writes_them_back():
    model = nn.Linear(128, 128, bias=False).bfloat16()
    opt = train_model.MasterAdamW(model, lr=1e-2)
    before = opt.master[0].clone()
    model(torch.randn(4, 128).bfloat16()).float().square().mean().backward()
    opt.step()
    opt.zero_grad()
    assert opt.master[0].dtype is torch.float32 and not torch.equal(opt.master[0], before)
    assert torch.equal(model.weight, opt.master[0].bfloat16()) and model.weight.grad is None


def test_the_learning_rate_warms_up_then_decays_to_a_tenth():
    lrs = [train_model.lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == 0.1 and lrs[9] == 1.0 and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))


def test_the_convergence_smoke_run(tmp_path):
    js, png = tmp_path / "run.json", tmp_path / "run.png"
    assert main(["bench", "--train-run", "--smoke", "--device", "cpu", "--json", str(js), "--plot", str(png)]) == 0
    report = json.loads(js.read_text())
    assert report["kind"] == "convergence" and png.read_bytes()[:4] == b"\x89PNG"
    assert {"root", "files", "bytes", "sha256", "python"} <= report["corpus"].keys()
    steps = train_run.SMOKE_RUN["steps"]
    assert set(report["runs"]) == set(train_run.MODES)
    for run in report["runs"].values():
        assert len(run["losses"]) == run["steps"] == steps and run["stopped_early_at"] is None
        assert all(math.isfinite(v) for v in run["losses"]) and run["tokens_per_s"] > 0
        assert run["peak_memory_bytes"] is None and math.isfinite(run["eval_loss"])  # no CUDA memory on a CPU
    conversion = report["runs"][train_run.FP8]["conversion"]
    assert conversion["fp8_training_linear_layers"] == 4 * train_model.SMOKE.layers
    s = report["summary"]
    assert s["compared_steps"] == steps and set(s["final_loss"]) == set(train_run.MODES)
    assert s["final_loss_ratio"] == pytest.approx(s["final_loss"][train_run.FP8] / s["final_loss"][train_run.BF16])
    assert abs(s["final_loss_ratio"] - 1) < 0.02  # same start, same batches, four steps
    assert {"eval_loss", "peak_memory_ratio", "tokens_per_s_ratio", "final_loss_within_1pct"} <= s.keys()


def test_the_throughput_smoke_run(tmp_path):
    js, png = tmp_path / "tp.json", tmp_path / "tp.png"
    argv = ["bench", "--train-run", "--throughput", "--smoke", "--device", "cpu", "--json", str(js), "--plot", str(png)]
    assert main(argv) == 0
    report = json.loads(js.read_text())
    assert report["kind"] == "throughput" and png.read_bytes()[:4] == b"\x89PNG"
    for run in report["runs"].values():
        assert len(run["step_seconds"]) == train_run.SMOKE_THROUGHPUT["steps"] and run["tokens_per_s"] > 0
    assert report["summary"]["tokens_per_s_ratio"] > 0 and report["summary"]["target_tokens_per_s_ratio"] == 1.25


def test_micro_batches_add_up_to_the_batchs_loss_and_gradients():
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256))
    inputs, targets = torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16))
    grads = []
    for parts in (1, 4):
        model.zero_grad()
        loss = train_run._accumulated_step(model, inputs, targets, parts, reuse=parts > 1)
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss1, g1), (loss4, g4) = grads
    assert torch.allclose(loss1, loss4, rtol=1e-5) and all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g4, strict=True)
    )


def test_the_throughput_smoke_run_with_micro_batches(tmp_path):
    js = tmp_path / "tp.json"
    argv = [
        "bench",
        "--train-run",
        "--throughput",
        "--smoke",
        "--micro-batches",
        "2",
        "--device",
        "cpu",
        "--json",
        str(js),
    ]
    assert main(argv) == 0
    report = json.loads(js.read_text())
    assert report["training"]["micro_batches"] == 2 and report["training"]["batch"] % 2 == 0
    assert all(run["tokens_per_s"] > 0 for run in report["runs"].values())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--train-run", "--micro-batches", "2", "--smoke"], "--micro-batches goes with --train-run --throughput"),
        (["--train-run", "--throughput", "--micro-batches", "3"], "must divide the throughput run's 4 sequences"),
        (["--micro-batches", "2"], "--micro-batches with --train-run --throughput"),
    ],
)
def test_micro_batch_mistakes_exit_2_with_the_fix(capsys, argv, words):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_moe_models_sizes_and_weights():
    big = train_moe_run.MOE
    assert big.layers >= 4 and (big.hidden, big.heads, big.head_dim, big.kv_heads) == (512, 4, 128, 2)
    assert (big.experts, big.experts_per_token, big.moe_intermediate, big.vocab) == (16, 4, 256, 256)
    assert big.max_positions >= train_moe_run.SEQ
    config = big.transformers_config()
    assert config.decoder_sparse_step == 1 and config.mlp_only_layers == [] and config.norm_topk_prob
    assert not config.tie_word_embeddings and not config.output_router_logits
    small = train_moe_run.SMOKE
    model = train_moe_run.build_model(small, seed=0, device="cpu")
    assert sum(p.numel() for p in model.parameters()) == small.parameters() > small.active_parameters()
    again = train_moe_run.build_model(small, seed=0, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


def test_the_moe_convergence_smoke_run(tmp_path):
    js, png = tmp_path / "moe.json", tmp_path / "moe.png"
    argv = ["bench", "--train-run", "--moe", "--smoke", "--device", "cpu", "--json", str(js), "--plot", str(png)]
    assert main(argv) == 0
    report = json.loads(js.read_text())
    assert report["kind"] == "convergence" and png.read_bytes()[:4] == b"\x89PNG"
    assert (
        report["model"]["architecture"] == "Qwen3MoeForCausalLM"
        and report["targets"]["final_loss_ratio_within"] == 0.01
    )
    assert report["router"]["aux_loss"] is False and report["training"]["time_budget_s"] == train_moe_run.TIME_BUDGET
    steps, layers = train_run.SMOKE_RUN["steps"], train_moe_run.SMOKE.layers
    assert set(report["runs"]) == set(train_run.MODES)
    for run in report["runs"].values():
        assert len(run["losses"]) == run["steps"] == steps and run["stopped_early_at"] is None
        assert all(math.isfinite(v) for v in run["losses"]) and math.isfinite(run["eval_loss"])
        assert len(run["expert_share"]) == layers and all(
            sum(s) == pytest.approx(1, abs=1e-3) for s in run["expert_share"]
        )
    assert report["runs"][train_run.BF16]["experts_module"].startswith("Qwen3MoeExperts")
    assert report["runs"][train_run.FP8]["experts_module"] == "Fp8TrainingExperts"
    conversion = report["runs"][train_run.FP8]["conversion"]
    assert conversion["fp8_training_experts"] == layers > 0 and conversion["fp8_training_linear_layers"] == 4 * layers
    assert conversion["converted_count"] == len(conversion["converted"]) == 5 * layers
    assert set(conversion["skipped"]) == {"lm.lm_head"} and conversion["kept_count"] == 1
    assert len(conversion["routers_kept_bf16"]) == layers
    s = report["summary"]
    assert s["compared_steps"] == steps and abs(s["final_loss_ratio"] - 1) < 0.02
    assert {"eval_loss", "peak_memory_ratio", "tokens_per_s_ratio", "final_loss_within_1pct"} <= s.keys()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--train-run", "--moe", "--throughput", "--smoke"], "--throughput times the dense model"),
        (["--train-run", "--moe", "--train-fsdp", "--smoke"], "separate benchmarks"),
        (["--train-run", "--moe"], "add --smoke to run the harness"),
        (["--train-fsdp", "--moe"], "add --smoke to run the harness"),
        (["--train-fsdp", "--moe", "--train", "--smoke"], "separate benchmarks"),
    ],
)
def test_moe_run_mistakes_exit_2_with_the_fix(capsys, argv, words):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_converted_moe_model_holds_fp8_training_experts():
    model, conversion = train_moe_run.prepare_model(train_run.FP8, train_moe_run.SMOKE, seed=0, device="cpu")
    experts = [m for m in model.modules() if isinstance(m, Fp8TrainingExperts)]
    assert len(experts) == conversion["fp8_training_experts"] == train_moe_run.SMOKE.layers
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    train_model.loss_fn(model, tokens, tokens).backward()
    assert all(e.gate_up_proj.grad is not None and e.down_proj.grad is not None for e in experts)


def test_a_run_past_its_time_budget_stops_and_says_so():
    data, _ = train_model.stdlib_corpus(limit_bytes=50_000)
    text, held_out = train_model.split_corpus(data)
    result = train_run.train(train_run.BF16, train_model.SMOKE, text, held_out, steps=30, batch=1, seq=64, lr=1e-3,
                             warmup=2, seed=0, device="cpu", deadline=0.0, eval_batches=1,
                             progress=lambda text: None)  # fmt: skip
    assert result["stopped_early_at"] == 10 and len(result["losses"]) == 10


def test_fsdp2_on_two_cpu_ranks_matches_one_device(tmp_path):
    """The gloo version of the two-GPU check: fully_shard of the converted model, each rank half of every batch."""
    js = tmp_path / "fsdp.json"
    assert main(["bench", "--train-fsdp", "--smoke", "--device", "cpu", "--json", str(js)]) == 0
    report = json.loads(js.read_text())
    assert report["fsdp2"]["backend"] == "gloo" and report["fsdp2"]["world"] == train_fsdp.WORLD
    assert report["fsdp2"]["fp8_training_linear_layers"] == report["one_device"]["converted"] == 8
    assert len(report["fsdp2"]["losses"]) == len(report["one_device"]["losses"]) == train_fsdp.SMOKE_RUN["steps"]
    assert report["summary"]["within_tolerance"] and report["summary"]["max_rel_diff"] <= train_fsdp.TOLERANCE
    assert report["environment"]["nccl_nvls_enable"] == "0"


def test_fsdp2_of_the_moe_model_on_two_cpu_ranks_matches_one_device(tmp_path):
    """--moe: the Qwen3-MoE model, whose converted experts hold 3-D Parameters that fully_shard splits on dim 0 (each
    rank half of the experts), against one device."""
    js, png = tmp_path / "fsdp_moe.json", tmp_path / "fsdp_moe.png"
    argv = ["bench", "--train-fsdp", "--moe", "--smoke", "--device", "cpu", "--json", str(js), "--plot", str(png)]
    assert main(argv) == 0
    report = json.loads(js.read_text())
    cfg = train_fsdp_moe.SMOKE
    assert report["kind"] == "fsdp2-moe" and report["model"]["architecture"] == "Qwen3MoeForCausalLM"
    assert png.read_bytes()[:4] == b"\x89PNG"
    fsdp = report["fsdp2"]
    assert fsdp["backend"] == "gloo" and fsdp["world"] == train_fsdp.WORLD and fsdp["wrapped"] == "FSDPByteQwen3Moe"
    assert fsdp["fp8_training_experts"] == cfg.layers and fsdp["fp8_training_linear_layers"] == 4 * cfg.layers
    assert fsdp["converted"] == report["one_device"]["converted"] == 5 * cfg.layers  # q, k, v, o and the experts
    shards = fsdp["shards_rank0"]["Fp8TrainingExperts"]
    want = {"gate_up_proj": [cfg.experts, 2 * cfg.moe_intermediate, cfg.hidden],
            "down_proj": [cfg.experts, cfg.hidden, cfg.moe_intermediate]}  # fmt: skip
    for name, shape in want.items():
        assert shards[name]["global"] == shape and shards[name]["local"] == [shape[0] // train_fsdp.WORLD, *shape[1:]]
        assert shards[name]["placements"] in (["S(0)"], ["Shard(dim=0)"])
    assert len(fsdp["losses"]) == len(report["one_device"]["losses"]) == train_fsdp.SMOKE_RUN["steps"]
    assert report["one_device"]["micro_batches"] == train_fsdp.WORLD  # the ranks' shares: the same FP8 blocks
    assert report["summary"]["within_tolerance"] and report["summary"]["max_rel_diff"] < 1e-5  # the order of sums
