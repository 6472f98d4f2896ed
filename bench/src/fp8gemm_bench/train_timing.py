"""The training benchmarks' timing: ``Timer`` (warm-up, then each call alone between CUDA events, the median) and
``time_cases`` (the case loop that keeps a report current and resumable), shared by ``--train`` and ``--train --moe``."""

from __future__ import annotations

import statistics
import time

import torch

ITERS = 10
WARMUP_CALLS = 3
WARMUP_SECONDS = 0.2
SPLIT_CALLS = 20
SPLIT_SLEEP_CYCLES = 400_000_000  # ~0.2 s at an H100/H200's clock: longer than 20 calls take to queue


class Timer:
    """Seconds per call of ``fn``: warm-up (``warmup_calls`` and ``warmup_seconds``), then ``iters`` calls each timed
    alone (CUDA events on a GPU, the wall clock elsewhere); the median, and every sample in ``last``."""

    def __init__(self, device, iters: int = ITERS, warmup_calls: int = WARMUP_CALLS,
                 warmup_seconds: float = WARMUP_SECONDS):  # fmt: skip
        self.device, self.iters = torch.device(device), iters
        self.warmup_calls, self.warmup_seconds = warmup_calls, warmup_seconds
        self.last: list[float] = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn) -> float:
        start, calls = time.perf_counter(), 0
        while calls < self.warmup_calls or time.perf_counter() - start < self.warmup_seconds:
            fn()
            calls += 1
            self._sync()
        if self.device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.iters)]  # fmt: skip
            for begin, end in events:
                begin.record()
                fn()
                end.record()
            self._sync()
            self.last = [begin.elapsed_time(end) * 1e-3 for begin, end in events]
        else:
            self.last = []
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                self.last.append(time.perf_counter() - t0)
        return statistics.median(self.last)

    def split(self, fn, calls: int = SPLIT_CALLS) -> tuple[float, float] | None:
        """(host, GPU) seconds per call of ``fn`` on a GPU, each apart: ``calls`` calls queued behind a sleep kernel, the
        wall clock of queueing them (the host's pace: no call waits for the GPU) and the CUDA events around them (the
        GPU's, its work back to back). None off a GPU, or when the sleep ended before the last call was queued."""
        if self.device.type != "cuda":
            return None
        self._sync()
        torch.cuda._sleep(SPLIT_SLEEP_CYCLES)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - start) / calls
        held = not begin.query()  # the GPU was still asleep: every call was queued before any ran
        end.record()
        self._sync()
        return (host, begin.elapsed_time(end) * 1e-3 / calls) if held else None


def gradient_errors_once(report: dict, earlier: dict | None, compute, line, progress, checkpoint) -> None:
    """``report["gradient_errors"]``: the earlier report's (its setup already checked by ``earlier_rows``), else
    ``compute()``, each row shown as ``line(row)``; the report is checkpointed then, so a run cut short before its
    first timed case keeps them and a resumed one does not compute them again."""
    report["gradient_errors"] = (earlier or {}).get("gradient_errors")
    if report["gradient_errors"]:
        return
    report["gradient_errors"] = compute()
    for row in report["gradient_errors"]:
        progress(line(row))
    if checkpoint:
        checkpoint(report)


def time_cases(cases: list, report: dict, time_case, summarize, show, checkpoint) -> None:
    """Time every case whose label is not among ``report``'s rows (``time_case(index, case) -> row``), showing,
    summarizing and checkpointing after each; then the rows in case order and the report complete."""
    rows, labels = report["rows"], [c.label for c in cases]
    for i, case in enumerate(cases):
        if any(r["label"] == case.label for r in rows):
            continue
        rows.append(time_case(i, case))
        show(rows[-1])
        report["summary"] = summarize(rows)
        if checkpoint:
            checkpoint(report)
    rows.sort(key=lambda r: labels.index(r["label"]))
    report["summary"] = summarize(rows)
    del report["partial"]
