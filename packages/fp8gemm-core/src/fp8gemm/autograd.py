"""No op has a backward, so none may take part in a graph that will be differentiated: the refusal every op makes
first, once per call (an eager call before it plans, a compiled one as a traced guard, a ``torch.ops`` call in its
autograd kernel)."""

from __future__ import annotations

import torch


def grad_error(op: str, name: str) -> RuntimeError:
    return RuntimeError(
        f"fp8gemm.{op} has no backward, and {name} requires grad: a gradient through it would be wrong. Run "
        f"inference under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
    )


def refuse_grad(op: str, names: tuple[str, ...], tensors: tuple) -> None:
    """Raise when grad mode is on and any of ``tensors`` requires grad (None and non-tensors are skipped)."""
    if torch.is_grad_enabled():
        for name, t in zip(names, tensors, strict=False):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise grad_error(op, name)
