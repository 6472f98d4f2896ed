"""One rank of tests/test_multi_gpu.py's torchrun check: the Linear layer on this rank's GPU, its output all-reduced
over NCCL, and the sum compared bit for bit with every rank's layer run here, one after the other."""

from __future__ import annotations

import os

import fp8gemm
import torch
import torch.distributed as dist

SEED = 20261127


def layer_output(rank: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED + rank)
    x = torch.randn(64, 2048, generator=gen).bfloat16().to(device)
    w = (torch.randn(7168, 2048, generator=gen) / 2048**0.5).to(device)
    q, scale = fp8gemm.quantize_weight(w)
    return fp8gemm.linear(x, q, fp8gemm.prepare_weight_scale(scale)).float()


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    print(f"rank {rank}: seed {SEED + rank} on {torch.cuda.get_device_name(device)}", flush=True)
    with torch.no_grad():
        total = layer_output(rank, device)
        dist.all_reduce(total)
        want = torch.zeros_like(total)
        for r in range(world):
            want += layer_output(r, device)
    if world == 2:  # a sum of two fp32 terms does not depend on the order NCCL adds them in
        assert torch.equal(total, want), (total - want).abs().max().item()
    else:
        torch.testing.assert_close(total, want, rtol=1e-6, atol=1e-6)
    print(f"rank {rank}: all-reduced sum matches", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
