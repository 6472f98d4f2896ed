"""The public API around the kernel: torch.compile, torch.library, layouts adapter, CLI (bench: test_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import fp8gemm
import pytest
import torch
from fp8gemm.cli import main
from fp8gemm.reference import oracle
from fp8gemm.testing import conformance


def _inputs(m=48, n=272, k=384, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return conformance.make_inputs(conformance.Case(m, n, k), torch.float8_e4m3fn, "cpu", gen)


def test_torch_compile_fullgraph_matches_eager():
    a, b, sa, sb = _inputs()

    def layer(a, sa):
        return fp8gemm.gemm(a, b, sa, sb).float().relu()

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(a, sa), layer(a, sa))


def test_torch_compile_out_variant():
    a, b, sa, sb = _inputs(seed=1)
    out = torch.full((48, 272), float("nan"), dtype=torch.float32)

    def layer(a, sa, out):
        fp8gemm.gemm(a, b, sa, sb, out=out)
        return out * 2

    doubled = torch.compile(layer, backend="aot_eager", fullgraph=True)(a, sa, out)
    assert conformance.relative_error(doubled / 2, oracle(a, b, sa, sb)) < 1e-5


# opcheck's test_schema compares inputs with mul, which CPU torch lacks for FP8; the rest apply.
OPCHECKS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def test_opcheck_of_registered_ops():
    a, b, sa, sb = _inputs(seed=2)
    torch.library.opcheck(
        torch.ops.fp8gemm.gemm.default, (a, b, sa, sb, torch.bfloat16, "reference"), test_utils=OPCHECKS
    )
    out = torch.empty(48, 272, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fp8gemm.gemm_out.default, (a, b, sa, sb, out, "reference"), test_utils=OPCHECKS)


def test_fake_tensor_shapes_and_errors_at_trace_time():
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, sa, sb = _inputs(seed=3)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fa, fb, fsa, fsb = (mode.from_tensor(t) for t in (a, b, sa, sb))
        out = torch.ops.fp8gemm.gemm(fa, fb, fsa, fsb, torch.float32, "")
        assert out.shape == (48, 272) and out.dtype == torch.float32
        with pytest.raises(ValueError, match="a_scale must be"):
            torch.ops.fp8gemm.gemm(fa, fb, fsa[:, :1], fsb, torch.bfloat16, "")


def test_empty_m_returns_empty():
    a, b, sa, sb = _inputs(m=0)
    assert fp8gemm.gemm(a, b, sa, sb).shape == (0, 272)


def test_kxm_layout_adapter():
    a, b, sa, sb = _inputs(seed=4)
    args = fp8gemm.from_kxm_layout(a.t().contiguous(), b.t().contiguous(), sa.t().contiguous(), sb.t().contiguous())
    out = torch.empty(48, 272, dtype=torch.float32)
    fp8gemm.gemm(*args, out=out)
    assert conformance.relative_error(out, oracle(a, b, sa, sb)) < 1e-5
    with pytest.raises(ValueError, match="K differs"):
        fp8gemm.from_kxm_layout(a.t(), b[:, :128].t(), sa.t(), sb.t())


def test_cli_check_passes_on_reference(capsys):
    assert main(["check", "--random", "2", "--device", "cpu"]) == 0
    assert "0 failure(s)" in capsys.readouterr().out


def test_cli_rejects_a_backend_that_is_not_installed(capsys):
    assert main(["check", "--device", "cpu", "--backend", "nope"]) == 2
    assert "--backend='nope' is not an installed backend" in capsys.readouterr().err


def test_python_dash_m_entry():
    run = subprocess.run(
        [sys.executable, "-m", "fp8gemm", "info", "--json", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["selected"]["name"] == "reference"


def test_import_says_what_torch_to_install(monkeypatch):
    """Without torch, or with one older than the metadata's floor, the import names the install commands."""
    import importlib.metadata
    import re

    requirement = next(r for r in importlib.metadata.requires("fp8gemm-core") if r.startswith("torch"))
    assert tuple(map(int, re.search(r">=\s*([\d.]+)", requirement).group(1).split("."))) == fp8gemm.TORCH_FLOOR
    monkeypatch.setattr(torch, "__version__", "2.3.1+cu121")
    with pytest.raises(ImportError, match=r"fp8gemm needs torch >= 2.4.*rocm6.3.*Found torch 2.3.1"):
        fp8gemm._require_torch()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"conda install -c conda-forge pytorch"):
        fp8gemm._require_torch()
