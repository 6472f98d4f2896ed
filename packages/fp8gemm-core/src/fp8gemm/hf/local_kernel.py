"""``use_in_transformers()``: transformers' fine-grained FP8 layers run on this fp8gemm, installed with pip or conda.

transformers loads ``kernels-community/finegrained-fp8`` with ``kernels.get_kernel`` (``lazy_load_kernel`` in
``transformers/integrations/hub_kernels.py``), and ``kernels`` resolves a repository id through the ``LOCAL_KERNELS``
environment variable (``repo_id=path``, entries separated by ``:``; ``kernels/load.py``) before the Hub. So this
writes a local kernel repository whose module re-exports :mod:`.finegrained_fp8` and maps the id to it there: no
private name of transformers or kernels is patched, and no network is used.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO_ID = "kernels-community/finegrained-fp8"  # transformers' _HUB_KERNEL_MAPPING["finegrained-fp8"]
REQUESTED_VERSION = 4  # what transformers 5.22-5.24 ask for; kernels does not check a local kernel's version
VARIANT = "torch-universal"  # a noarch variant kernels accepts on every backend (kernels/variants.py)
NAMES = ("matmul_2d", "matmul_batched", "matmul_grouped")
DEEPGEMM_SWITCH = "TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR"  # transformers/integrations/finegrained_fp8.py, fp8_linear

_made: dict[str, Path] = {}


def _torch_backend() -> str:
    import torch

    return "cuda" if torch.version.cuda else "rocm" if torch.version.hip else "cpu"


def kernel_repository() -> Path:
    """A kernels repository (``build/torch-universal/``: metadata.json, __init__.py) whose module re-exports this
    package's ``matmul_2d``, ``matmul_batched`` and ``matmul_grouped``; one per process, removed at exit."""
    package = __package__  # fp8gemm.hf, or a vendored copy's name: the module imports the copy that wrote it
    if package not in _made:
        root = Path(tempfile.mkdtemp(prefix="fp8gemm-finegrained-fp8-"))
        atexit.register(shutil.rmtree, root, True)
        variant = root / "build" / VARIANT
        variant.mkdir(parents=True)
        module_id = "_fp8gemm_finegrained_fp8_" + hashlib.sha256(package.encode()).hexdigest()[:10]
        metadata = {"name": "fp8gemm", "id": module_id, "version": 1, "license": "Apache-2.0",
                    "python-depends": [], "backend": {"type": _torch_backend()}}  # fmt: skip
        (variant / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        (variant / "__init__.py").write_text(
            f'"""fp8gemm as {REPO_ID}: the functions transformers calls."""\n\n'
            f"from {package}.finegrained_fp8 import {', '.join(NAMES)}  # noqa: F401\n"
        )
        _made[package] = root
    return _made[package]


def _check_transformers() -> None:
    """Refuse where transformers would not call the kernel: a ``kernels`` outside the range it accepts, or another
    finegrained-fp8 kernel it has already loaded in this process (it keeps the first)."""
    if "transformers" not in sys.modules:
        try:
            import transformers  # noqa: F401
        except ImportError:
            return  # nothing to check: the mapping still serves kernels.get_kernel(REPO_ID)
    from transformers.utils import import_utils

    if not import_utils.is_kernels_available():
        import kernels

        raise ImportError(
            f"transformers {sys.modules['transformers'].__version__} takes kernels >= "
            f"{import_utils.KERNELS_MIN_VERSION}, < {import_utils.KERNELS_MAX_VERSION}, and kernels {kernels.__version__} "
            f"is installed: transformers would not load any finegrained-fp8 kernel. Install a kernels in that range, "
            f"or a transformers that accepts this one"
        )
    integration = sys.modules.get("transformers.integrations.finegrained_fp8")
    loaded = getattr(integration, "_FINEGRAINED_FP8", None)  # read only: what transformers keeps once loaded
    if loaded is not None and not getattr(loaded.matmul, "__module__", "").endswith(".hf.finegrained_fp8"):
        raise RuntimeError(
            f"transformers already holds another finegrained-fp8 kernel in this process ({loaded.matmul.__module__}) "
            "and keeps it: call fp8gemm.hf.use_in_transformers() before the model's first forward"
        )


def use_in_transformers(repo_id: str = REPO_ID) -> ModuleType:
    """Make every ``kernels.get_kernel(repo_id)`` in this process, transformers' included, load fp8gemm's
    finegrained-fp8 interface from a local directory; returns that kernel module.

    It adds ``repo_id=<directory>`` to ``LOCAL_KERNELS`` (replacing an entry for ``repo_id``, keeping the others), so
    child processes inherit it while this one runs. Call it before the model's first forward: transformers keeps the
    first kernel it loads. Needs the ``kernels`` package, in the version range the installed transformers accepts.
    Where transformers has FP8 experts, it also registers the experts implementation ``"fp8gemm"``
    (:func:`~fp8gemm.hf.register_experts_implementation`), which a model takes with
    ``experts_implementation="fp8gemm"``. Unless already set, it sets ``TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR=1``:
    transformers' FP8 linear otherwise tries DeepGEMM before this kernel on every call, takes it where it loads, and
    retries a failed load each time (~85 us per call on an H100 host).
    """
    try:
        import kernels
    except ImportError as exc:
        raise ImportError("use_in_transformers needs the kernels package: pip install kernels") from exc
    _check_transformers()
    path = kernel_repository()
    if ":" in str(path):
        raise RuntimeError(f"LOCAL_KERNELS separates entries with ':', which the kernel directory {path} contains")
    kept = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e and e.split("=", 1)[0] != repo_id]
    os.environ["LOCAL_KERNELS"] = ":".join([*kept, f"{repo_id}={path}"])
    os.environ.setdefault(DEEPGEMM_SWITCH, "1")  # read by transformers' fp8_linear on every call
    kernel = kernels.get_kernel(repo_id, version=REQUESTED_VERSION)
    _register_experts()
    return kernel


def _register_experts() -> None:
    """The experts implementation too, where this transformers has FP8 experts (5.17 and later; an older one keeps
    the kernel route alone)."""
    try:
        import transformers.integrations.finegrained_fp8 as integration
    except ImportError:
        return
    if hasattr(integration, "ALL_FP8_EXPERTS_FUNCTIONS"):
        from .experts import register_experts_implementation

        register_experts_implementation()
