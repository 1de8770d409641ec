"""Where a training step's time goes, from a Chrome trace of LibTorch's profiler (Kineto): ours
(tessera-train-probe --profile) and the peer's (torch.profiler's export_chrome_trace) read the
same way, so tests/gpu/bench_gpu.py can set them side by side.

On a GPU it counts the device's work: each kernel, copy and memset by category (GEMM, attention,
optimizer, norms / softmax / loss, elementwise, copies and casts, collectives, other), the time
the device was busy (the union of those intervals, as streams can overlap) and the window from
the first to the last of them. Without device events (a CPU run) it counts the operators that
are not inside another operator of their thread, by the same categories.

    python tests/gpu/trace_summary.py TRACE.json STEPS
"""
import json
import re
import sys

# The first pattern that matches a kernel's or operator's name gives its category. Attention comes
# before GEMM (flash kernels name their GEMMs), the optimizer before elementwise (its foreach
# kernels are multi-tensor elementwise ones).
CATEGORIES = [
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention"),
    ("gemm", r"gemm|xmma|cutlass|nvjet|cublas|\bmm\b|addmm|\bbmm\b|matmul|linear|"
             r"\bMm|Addmm|Bmm"),
    ("optimizer", r"adam|multi_tensor|foreach|optimizer"),
    ("norm, softmax, loss", r"norm|softmax|nll|cross_entropy|reduce|\bsum\b|\bmean\b|rsqrt"),
    ("copies and casts", r"copy|memcpy|memset|\bcast|\bto\b|_to_copy|CatArray|\bcat\b|contiguous"),
    ("collectives", r"nccl|gloo|all_reduce|allreduce|all_gather|reduce_scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|\bmul\b|\badd\b|silu|gelu|\bneg\b|"
                    r"\bdiv\b|\bpow\b|where|masked|index|embedding|dropout|Mul|Add|Silu"),
]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def category(name):
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE if label != "gemm" else 0):
            return label
    if name.startswith("Memcpy") or name.startswith("Memset"):
        return "copies and casts"
    return "other"


def union_length(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def outermost(events):
    """The operators not inside another operator of the same thread."""
    kept = []
    by_thread = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread in by_thread.values():
        end = None
        for e in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            if end is None or e["ts"] >= end:
                kept.append(e)
                end = e["ts"] + e["dur"]
    return kept


def summarize(trace, steps, top=12):
    """trace: the parsed Chrome trace (a dict with traceEvents, or the list); steps: how many steps
    it recorded. Milliseconds per step by category, busy and window per step, the top names."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    device = [e for e in timed if e.get("cat") in DEVICE_CATS]
    source = "device kernels and copies" if device else "cpu operators"
    counted = device if device else outermost([e for e in timed if e.get("cat") == "cpu_op"])
    if not counted:
        raise ValueError("the trace holds no device events and no cpu operators")
    per_category, per_name = {}, {}
    for e in counted:
        name = e["name"]
        label = category(name) if e.get("cat") == "kernel" or not device else "copies and casts"
        per_category[label] = per_category.get(label, 0.0) + e["dur"]
        count_ms = per_name.setdefault(name, [0, 0.0])
        count_ms[0] += 1
        count_ms[1] += e["dur"]
    window = max(e["ts"] + e["dur"] for e in counted) - min(e["ts"] for e in counted)
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in counted])
    ms = 1e-3 / steps  # trace times are microseconds
    names = sorted(per_name.items(), key=lambda item: -item[1][1])[:top]
    return {
        "source": source,
        "steps": steps,
        "window_ms_per_step": window * ms,
        "busy_ms_per_step": busy * ms,
        "busy_fraction": busy / window if window > 0 else 0.0,
        "ms_per_step": {k: v * ms for k, v in sorted(per_category.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:120], "calls_per_step": c / steps, "ms_per_step": t * ms}
                for n, (c, t) in names],
    }


def read_summary(path, steps):
    with open(path) as f:
        return summarize(json.load(f), steps)


def table(sides):
    """Markdown rows, one per category, for {side name: summary}."""
    labels = []
    for s in sides.values():
        labels += [k for k in s["ms_per_step"] if k not in labels]
    head = "| ms per step | " + " | ".join(sides) + " |"
    rows = [head, "|---" * (len(sides) + 1) + "|"]
    for label in labels:
        rows.append(f"| {label} | " + " | ".join(
            f"{s['ms_per_step'].get(label, 0.0):.1f}" for s in sides.values()) + " |")
    rows.append("| busy (union) | " + " | ".join(
        f"{s['busy_ms_per_step']:.1f}" for s in sides.values()) + " |")
    rows.append("| window | " + " | ".join(
        f"{s['window_ms_per_step']:.1f}" for s in sides.values()) + " |")
    return rows


if __name__ == "__main__":
    summary = read_summary(sys.argv[1], int(sys.argv[2]))
    print("\n".join(table({"trace": summary})))
    for row in summary["top"]:
        print(f"{row['ms_per_step']:9.2f} ms {row['calls_per_step']:6.1f}x  {row['name']}")
