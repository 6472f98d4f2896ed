"""fp8gemm_bench.models' summary: each variant's speed over bf16 and over ``convert`` per batch, in CUDA graphs and
under torch.compile, against the targets docs/benchmarks.md names; logits' errors and the routes' bitwise equality."""

from __future__ import annotations

HF_ROUTES = ("hf-fp8-local", "hf-fp8-python")  # the two kernel routes: the same Python, bitwise equal logits
TARGETS = {"hf_fp8_vs_convert_min": 0.95, "hf_fp8_vs_bf16_min": 1.0, "moe_convert_vs_bf16_min": 1.0}
TIMINGS = ("cuda_graph", "torch_compile")  # the second's keys carry " (torch.compile)"


def rel(a, b) -> float:
    d = (a.double() - b.double()).norm().item()
    n = b.double().norm().item()
    return d / n if n else d


def _batch_key(batch: str) -> tuple[int, ...]:
    return tuple(map(int, batch.split("x")))


def _target(per_batch: dict, target: float | None, strict: bool = False) -> dict:
    got = {b: v for b, v in per_batch.items() if v is not None}
    out: dict = {"per_batch": got}
    if target is not None:
        out["target"] = f"{'>' if strict else '>='} {target} at every batch"
        out["met"] = all((v > target if strict else v >= target) for v in got.values()) if got else None
    return out


def _speeds(model: str, times: dict) -> dict:
    """times: variant -> batch -> us. Every ratio the targets name, per batch (slower time / faster time)."""
    batches = sorted({k for t in times.values() for k in t}, key=_batch_key)

    def speed(fast, slow, batch):
        t = times.get(fast, {}), times.get(slow, {})
        return t[1][batch] / t[0][batch] if batch in t[0] and batch in t[1] else None

    s: dict = {}
    for route in (*HF_ROUTES, "hf-fp8-experts"):
        if times.get(route):
            s[f"{route} speed over convert"] = _target({b: speed(route, "convert", b) for b in batches},
                                                       TARGETS["hf_fp8_vs_convert_min"])  # fmt: skip
            s[f"{route} speed over bf16"] = _target({b: speed(route, "bf16", b) for b in batches},
                                                    TARGETS["hf_fp8_vs_bf16_min"], strict=True)  # fmt: skip
    convert = {b: speed("convert", "bf16", b) for b in batches}
    s["convert speed over bf16"] = _target(convert, TARGETS["moe_convert_vs_bf16_min"] if "moe" in model else None,
                                           strict=True)  # fmt: skip
    if times.get("hf-fp8-experts"):
        s["hf-fp8-experts speed over hf-fp8-python"] = _target(
            {b: speed("hf-fp8-experts", "hf-fp8-python", b) for b in batches}, None
        )
    return s


def summarize(results: dict) -> dict:
    out: dict = {}
    for model, variants in results.items():
        s: dict = {}
        for timing in TIMINGS:
            times = {v: r.get("times_us", {}).get(timing) or {} for v, r in variants.items()}
            if timing == "cuda_graph":  # a CPU run has wall times only
                times = {v: t or variants[v].get("times_us", {}).get("wall_cpu", {}) for v, t in times.items()}
            suffix = "" if timing == "cuda_graph" else " (torch.compile)"
            if any(times.values()):
                s.update({k + suffix: v for k, v in _speeds(model, times).items()})
        s["logits_rel_err_vs_bf16"] = {v: r.get("logits_rel_err_vs_bf16") for v, r in variants.items() if v != "bf16"}
        s["routes_bitwise_equal"] = variants.get("hf-fp8-python", {}).get("logits_bitwise_equal_to_local_route")
        if "hf-fp8-experts" in variants:
            experts = variants["hf-fp8-experts"]
            s["hf-fp8-experts logits"] = {k: experts.get(k) for k in ("logits_rel_err_vs_hf_fp8_python",
                                                                      "logits_bitwise_equal_to_convert")}  # fmt: skip
        out[model] = s
    return out
