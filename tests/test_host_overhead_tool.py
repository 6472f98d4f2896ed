"""ci/host_overhead.py on the null backend: every way of calling linear runs and is timed (in a fresh interpreter:
the tool replaces the registry's discovery for its whole process)."""

from __future__ import annotations

import re
import subprocess
import sys

from isa import ROOT


def test_null_backend_times_every_call_path():
    run = subprocess.run([sys.executable, str(ROOT / "ci" / "host_overhead.py"), "--null", "--shape", "8,256,256",
                          "--calls", "20"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    times = dict(re.findall(r"^  (\S.*?)\s+([\d.]+) us/call$", run.stdout, re.M))
    assert set(times) == {"F.linear (bf16)", "fp8gemm.linear", "torch.ops.fp8gemm.linear", "compiled F.linear (bf16)",
                          "compiled fp8gemm.linear", "fused_experts"}, run.stdout  # fmt: skip
    assert all(float(t) > 0 for t in times.values())
