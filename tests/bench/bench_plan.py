"""The planner against a grid of layouts measured on this machine (issue 26): for each strategy a
job can run here (2 processes, and single's one), `tessera-cli plan --nproc N` before any run of it (a fresh cache:
no measured step to calibrate from, the CPU's rate measured once) against the run itself.

A generated llama (~21M parameters: hidden 512, 4 layers, vocabulary 8000, the model of
tests/integration/test_plan_ranks.py), packed text blocks of SEQ tokens, fp32, 16 sequences per
optimizer step whatever the layout (single: one process, micro-batches of 4 × 4 accumulation
steps; ddp / zero / gemini: 2 ranks × micro-batches of 4 × 2; hybrid: one replica, micro-batches
of 4 × 4), WARMUP + STEPS steps:

  single (1 process), ddp, zero1, zero2, gemini (sharded), hybrid tp 2, hybrid pp 2

Printed per layout: the planned seconds per step ÷ the measured (the median step of the metric
events after the warm-up; goal within 0.7 … 1.3), and the planned per-rank peak ÷ the largest
VmHWM of its ranks, polled every 10 ms while they run (goal within 0.85 … 1.15); then what `auto`
picks for the same job at 2 processes and its measured step ÷ the fastest layout's of 2 (goal <=
1.1). Goals are
printed, not asserted: it fails only when a run or a plan fails. One run at a time, alone on the
machine. Environment: BENCH_PLAN_STEPS (measured steps, default 5), BENCH_PLAN_WARMUP (default 2).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "pylib"))
import bench_dist  # noqa: E402  (announce)
from plan_model import make_plan_model  # noqa: E402
from proc_status import children_of, status_bytes  # noqa: E402

CLI = bench_dist.CLI
SEQ = 128
WARMUP = int(os.environ.get("BENCH_PLAN_WARMUP", "2"))
STEPS = int(os.environ.get("BENCH_PLAN_STEPS", "5"))
SEQUENCES = 16  # per optimizer step, every layout
# (name, strategy, options, accumulation, processes)
GRID = [
    ("single", "single", {}, 4, 1),
    ("ddp", "ddp", {}, 2, 2),
    ("zero1", "zero", {"stage": 1}, 2, 2),
    ("zero2", "zero", {"stage": 2}, 2, 2),
    ("gemini", "gemini", {}, 2, 2),
    ("hybrid-tp2", "hybrid", {"tp_size": 2, "pp_size": 1}, 4, 2),
    ("hybrid-pp2", "hybrid", {"tp_size": 1, "pp_size": 2}, 4, 2),
]


def write_job(folder, name, strategy, options, accumulation):
    spec = {"version": 1, "model": {"path": str(folder / "model")},
            "dataset": {"train": str(folder / "text.jsonl"), "format": "text", "max_length": SEQ,
                        "packing": True},
            "training": {"steps": WARMUP + STEPS, "batch_size": 4, "gradient_accumulation": accumulation,
                         "learning_rate": 1e-4, "schedule": "constant", "log_every": 1, "save_every": 0},
            "strategy": {"name": strategy, "options": {"device": "cpu", **options} if strategy != "auto" else {}},
            "output": {"dir": str(folder / name)}}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def plan_of(path, env, processes=2):
    r = subprocess.run([CLI, "plan", str(path), "--nproc", str(processes), "--json"], capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: plan of {path.name} exited with {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def run_measuring(path, env, processes=2):
    """`launch --nproc N`; returns (the median step seconds after the warm-up, the largest VmHWM of
    its ranks)."""
    proc = subprocess.Popen([CLI, "launch", "--nproc", str(processes), str(path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    peaks = {}
    while proc.poll() is None:
        # The ranks, and the launcher itself (it trains in-process at --nproc 1; a small process
        # beside its ranks otherwise).
        for child in [proc.pid, *children_of(proc.pid)]:
            hwm = status_bytes(child, "VmHWM")
            if hwm is not None:
                peaks[child] = max(peaks.get(child, 0), hwm)
        time.sleep(0.01)
    if proc.returncode != 0:
        raise SystemExit(f"FAIL: {path.name} exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
    spec = json.loads(path.read_text())
    events = [json.loads(line) for line in (Path(spec["output"]["dir"]) / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e.get("type") == "metric" and "loss" in e and "tokens_per_s" in e]
    tokens = SEQUENCES * SEQ
    seconds = [tokens / m["tokens_per_s"] for m in metrics[WARMUP:]]
    if not seconds or not peaks:
        raise SystemExit(f"FAIL: {path.name}: no measured steps or ranks")
    return statistics.median(seconds), max(peaks.values())


def key_of(plan):
    s = plan["settings"]
    if s["strategy"] == "zero":
        return f"zero{s['zero_stage']}"
    if s["strategy"] == "hybrid":
        return f"hybrid-tp{s['tp_size']}" if s["pp_size"] == 1 else f"hybrid-pp{s['pp_size']}"
    return s["strategy"]


def main():
    bench_dist.announce("bench_plan")
    with tempfile.TemporaryDirectory(prefix="tessera-bench-plan-") as tmp:
        folder = Path(tmp)
        parameters = make_plan_model(folder, lines=400)
        # A cache of its own: no step of these jobs measured before, so every plan is the cost
        # model's (the runs below record theirs there, after every plan is made).
        env = dict(os.environ, XDG_CACHE_HOME=str(folder / "cache"), TESSERA_DIST_TIMEOUT_S="120")
        print(f"  llama {parameters / 1e6:.1f}M parameters, {SEQUENCES} x {SEQ} tokens per step, fp32, "
              f"{WARMUP} warm-up + {STEPS} measured steps; load average {os.getloadavg()[0]:.2f}")
        plans = {name: plan_of(write_job(folder, name, strategy, options, accumulation), env, processes)
                 for name, strategy, options, accumulation, processes in GRID}
        auto = plan_of(write_job(folder, "auto", "auto", {}, 2), env)
        print(f"  ddp's plan: {plans['ddp']['time']['source']}")
        measured = {}
        for name, strategy, options, accumulation, processes in GRID:
            measured[name] = run_measuring(folder / f"{name}.json", env, processes)
        print(f"  {'layout':<11} {'plan s':>7} {'meas s':>7} {'plan÷meas':>9} {'plan MiB':>9} {'VmHWM MiB':>9} "
              f"{'plan÷meas':>9}")
        time_ok = memory_ok = 0
        for name, *_ in GRID:
            plan = plans[name]
            seconds, peak = measured[name]
            planned_s = plan["time"]["seconds_per_step"]
            planned_peak = plan["memory"][0]["peak"]
            t, m = planned_s / seconds, planned_peak / peak
            time_ok += 0.7 <= t <= 1.3
            memory_ok += 0.85 <= m <= 1.15
            print(f"  {name:<11} {planned_s:7.3f} {seconds:7.3f} {t:9.2f} {planned_peak / 2**20:9.0f} "
                  f"{peak / 2**20:9.0f} {m:9.2f}")
        print(f"  step time within 30%: {time_ok} of {len(GRID)} layouts; peak within 15%: {memory_ok} of {len(GRID)}")
        # auto planned 2 processes: the fastest of the layouts of 2
        fastest = min((n for n, *_, processes in GRID if processes == 2), key=lambda n: measured[n][0])
        chosen = key_of(auto)
        if chosen in measured:
            ratio = measured[chosen][0] / measured[fastest][0]
            print(f"  auto picks {chosen}: its step {measured[chosen][0]:.3f} s ÷ the fastest measured "
                  f"({fastest}, {measured[fastest][0]:.3f} s) = {ratio:.2f} (goal <= 1.1)")
        else:
            print(f"  auto picks {chosen}, not in the grid; the fastest measured is {fastest}")


if __name__ == "__main__":
    main()
