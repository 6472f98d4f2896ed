"""The ``fp8gemm`` command's arguments and how it words what stops it: one line that says what to change. Commands
other packages add (``fp8gemm.commands`` entry points, cli.py) use the same."""

from __future__ import annotations

import argparse

import torch

from . import registry

# What to install for each optional package a command may need.
INSTALL_HINTS = {
    "matplotlib": "pip install matplotlib",
    "safetensors": "pip install safetensors",
    "triton": "pip install triton (GPU timings use triton.testing.do_bench)",
}


class UsageError(Exception):
    """A mistake in the command line or its environment that the user can fix: exit status 2, no traceback."""


def error_message(exc: BaseException) -> str:
    """``exc`` as the command prints it: a missing optional package with the command that installs it."""
    if isinstance(exc, ImportError) and exc.name:
        top = exc.name.split(".")[0]
        return f"{top} is needed here and is not installed: {INSTALL_HINTS.get(top, f'pip install {top}')}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc}: {exc.filename}"
    return str(exc)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_argument(text: str) -> torch.device:
    """``--device``: a device this torch can run fp8gemm on, or argparse's error naming the option."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device; write cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(
            f"{text!r}: fp8gemm runs on cpu and cuda devices (ROCm GPUs are cuda devices in torch)"
        )
    if not torch.cuda.is_available():
        if torch.version.cuda is None and torch.version.hip is None:
            why = f"this torch ({torch.__version__}) is built without GPU support"
            fix = "install a CUDA or ROCm build of torch (https://pytorch.org/get-started/locally/)"
        else:
            why = f"torch {torch.__version__} finds no GPU"
            fix = "check the driver (nvidia-smi or rocm-smi) and CUDA_VISIBLE_DEVICES"
        raise argparse.ArgumentTypeError(f"{text!r}: {why}; use --device cpu, or {fix}")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


def count_argument(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}; give a whole number from {least} up")
        return value

    return parse


def requested_backend(args) -> str | None:
    """``--backend``, else ``$FP8GEMM_BACKEND``, else None (the best fit); a name that is not installed is a
    UsageError that lists the names there are."""
    name = args.backend or registry.env_backend()
    if name is None or name == "reference":
        return name
    installed = [ib.name for ib in registry.installed_backends()]
    if name not in installed:
        where, fix = ("--backend", "leave --backend out") if args.backend else (registry.ENV_VAR, "unset it")
        if installed:
            found = (
                f"'reference' (pure torch, any device) and {', '.join(repr(n) for n in installed)}. Use one of those"
            )
        else:
            found = (
                "only 'reference' (pure torch, any device; GPU backends come in arch packages, docs/install.md). Use it"
            )
        raise UsageError(
            f"{where}={name!r} is not an installed backend. Installed: {found}, or {fix} to let fp8gemm pick the "
            "best fit for the device."
        )
    return name
