"""The GPU suite's pytest setup: the order its tests run in, and a line per finished test in
$TESSERA_GPU_CHECK_RESULTS (run.sh sets it), so that a suite stopped at the call's limit still
tells the report what failed and why."""
import json
import os

# The GPU check's time is scarce and the suite may be stopped at its deadline: what has never run
# on a GPU runs first, what passed there before (session 23: every family's logits equal to
# transformers) last. Substrings of test names, earliest first; the rest keep the file's order
# between them (pytest-xdist hands tests out in this order).
RUN_FIRST = [
    "busy_gpu",         # gemini's device tier under a small budget (one worker builds its fixture)
    "two_ranks",        # every multi-rank strategy on CUDA (never run on a GPU)
    "gemini_device_tier",
    "strategy_on_the_gpu",
    "zero_offload",
    "device_auto",
    "qlora",
    "dequantize",
    "dpo",
    "host_waits",       # how often a step waits for the GPU (a figure for the speed goal)
    "memory_events",
    "fp16",
    "recomputation",
    "finetune",
    "lora",
    "eval",
    "generation",
]
RUN_LAST = ["logits", "trace_summary", "report_names", "benchmark_times"]


def _rank(item):
    name = item.name
    for i, key in enumerate(RUN_FIRST):
        if key in name:
            return i
    for i, key in enumerate(RUN_LAST):
        if key in name:
            return len(RUN_FIRST) + 1 + i
    return len(RUN_FIRST)


def pytest_configure(config):
    # pytest-xdist's marker, registered where xdist is not installed (the suite run on the CPU).
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker")


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the file's order within a rank
    results = os.environ.get("TESSERA_GPU_CHECK_RESULTS")
    # Every worker collects the same tests: one writes them down (the report lists those that
    # never finished).
    if results and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        with open(results + ".collected", "w") as f:
            f.write("\n".join(item.nodeid for item in items) + "\n")


def pytest_runtest_logreport(report):
    results = os.environ.get("TESSERA_GPU_CHECK_RESULTS")
    # Under pytest-xdist the controller gets every worker's reports: it alone writes.
    if not results or "PYTEST_XDIST_WORKER" in os.environ:
        return
    if report.when != "call" and report.passed:
        return
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "duration": round(report.duration, 2),
            "xfail": bool(getattr(report, "wasxfail", "")),
            "longrepr": report.longreprtext[-4000:] if report.failed or report.skipped else "",
            "stdout": report.capstdout[-3000:]}
    with open(results, "a") as f:
        f.write(json.dumps(line) + "\n")
