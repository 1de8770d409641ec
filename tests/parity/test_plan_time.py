"""The plan's time estimate against the measured wall time of a real `tessera-cli run` of the
same job, at the same moment. The run records its measured step time (steps 2-21, the first
apart) in the step-time store; a plan made right after it is calibrated from that record and must
give the run's training time within 30%, and the dashboard's ETA at step 21 must agree with the
plan's remaining time within 30%. The uncalibrated estimate (FLOPs at the profile's rate plus a
per-op overhead) describes an idle machine, so it is held against the run's quickest tenth of
steps, within a factor of 3 times the machine's load per core (the 1-minute load average over the
cores, at least 1): idle, the demo's steps (measured when its model had 4 layers, not today's 2) took 0.17-0.19 s at batch 64 against 0.15 s
estimated, 0.017-0.03 s at batch 8 against 0.029 s; with other builds keeping the 2-core
machine's load at 5-6, the quickest steps at batch 32 took 0.17-0.34 s against 0.081 s, and the
whole run 10x the estimate, which no estimate made before the run can know. A job of half the batch is planned from the same record
scaled by the cost model, and run: the planned ratio of the two step times must match the ratio of
the runs' quickest steps within 1.75x times the load per core (measured x0.55-0.57 against
x0.46-0.53 of the quickest tenths; x2.3 once, when the load rose between the two runs; on
2026-12-05, AMD EPYC, planned x0.69-0.70 against quickest steps of x0.45-0.74 in 13 runs alone,
8-16 ms steps whose per-step overhead the cost model puts higher than this machine has it, so
1.5x failed 2 of them). A plan that did not scale with the batch (x1.0) fails against the
typical x0.50-0.55."""
import json
import os
import subprocess
from pathlib import Path

import pytest

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
CALIBRATED_TOLERANCE = 0.30
# The uncalibrated figure is labelled "rough" in the studio; the bound catches the old 40x error
# (every sequence taken as max_length long) without failing on a busy CI machine, where a
# neighbouring test slows the quickest steps by up to ~4x (measured 0.10 at load 5 on 2 cores).
UNCALIBRATED_FACTOR = 6.0
SCALED_FACTOR = 1.75


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan_time")
    # Its own cache folder: the store starts empty and the user's is left alone. libgomp's default
    # wait policy, as a user runs: the suite's OMP_WAIT_POLICY=PASSIVE (for tests that share the
    # cores; this one runs alone) made the demo's steps at batch 32 take 0.11-0.13 s against
    # 0.033 s by default here, so the quickest tenth fell 6x below the idle machine's cost model.
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["XDG_CACHE_HOME"] = str(d / "cache")
    subprocess.run([CLI, "demo", "--no-train", "--out", str(d / "demo")], check=True, env=env,
                   capture_output=True, timeout=300)
    return d, env


def job(d, name, steps, batch):
    spec = json.loads((d / "demo" / "job.json").read_text())
    spec["training"].update(steps=steps, batch_size=batch, eval_every=0, save_every=0, log_every=1)
    spec["output"]["dir"] = str(d / name)
    path = d / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def plan_time(path, env):
    return plan_of(path, env)["time"]


def plan_of(path, env):
    out = subprocess.run([CLI, "plan", str(path), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_events(path, env):
    """Runs the job; returns its events and the time its loading ended."""
    events = path.with_suffix(".events.jsonl")
    out = subprocess.run([CLI, "run", str(path), "--events", str(events)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    ev = [json.loads(line) for line in events.read_text().splitlines()]
    return ev, next(e["t"] for e in ev if e["type"] == "progress" and e["phase"] == "load" and e["done"] == 1)


def run_and_time(path, env):
    """Runs the job; returns (its events, each step's wall time in order, the training's wall
    time: from the end of loading to the last step's progress event)."""
    ev, loaded = run_events(path, env)
    ends = [loaded] + [e["t"] for e in ev if e["type"] == "progress" and e["phase"] == "train"]
    assert any(e["type"] == "log" and "recorded in" in e["message"] for e in ev), "no step time recorded"
    return ev, [b - a for a, b in zip(ends, ends[1:])], ends[-1] - loaded


def quick(steps):
    """The quickest tenth of the steps after the first: the machine's pace when nothing else ran,
    which is what the cost model describes."""
    rest = sorted(steps[1:])
    return sum(rest[:max(1, len(rest) // 10)]) / max(1, len(rest) // 10)


def test_calibrated_plan_within_30_percent_of_the_run(demo):
    d, env = demo
    steps = 25
    spec = job(d, "calibrate", steps=steps, batch=32)
    before = plan_time(spec, env)
    assert not before["calibrated"] and before["source"].startswith("estimated from the CPU's")
    ev, step_times, measured = run_and_time(spec, env)
    assert not next(e for e in ev if e["type"] == "plan")["time"]["calibrated"]
    after = plan_time(spec, env)
    assert after["calibrated"] and after["calibration_exact"]
    assert after["source"].startswith("calibrated from run calibrate's first 21 steps"), after["source"]
    print(f"\n{steps} steps: measured {measured:.2f} s, calibrated plan {after['total_seconds']:.2f} s, "
          f"uncalibrated plan {before['total_seconds']:.2f} s; steps after the first: quickest tenth "
          f"{quick(step_times):.3f} s against the cost model's {before['modelled_seconds_per_step']:.3f} s")
    # The wizard's figure for this job, planned now, against what the run took.
    assert abs(after["total_seconds"] - measured) <= CALIBRATED_TOLERANCE * measured
    # The dashboard's ETA once the record was written (step 21) against the plan's remaining time.
    eta = next(e["eta_s"] for e in ev if e["type"] == "progress" and e["phase"] == "train" and e["done"] == 21)
    remaining = after["seconds_per_step"] * (steps - 21)
    assert abs(eta - remaining) <= CALIBRATED_TOLERANCE * remaining, (eta, remaining)
    # Uncalibrated: the cost model describes an idle machine; against the quickest steps, with
    # the bound widened by how many times over the machine's cores were asked for meanwhile
    # (with 5.8 runnable tasks on 2 cores its quickest steps took 2.7-4x their idle time).
    ratio = before["modelled_seconds_per_step"] / quick(step_times)
    busy = max(1.0, os.getloadavg()[0] / os.cpu_count())
    assert 1 / (UNCALIBRATED_FACTOR * busy) <= ratio <= UNCALIBRATED_FACTOR, (ratio, busy)

    # Half the batch: the record scaled by the cost model's ratio, which must match the ratio of
    # the two runs' quickest steps.
    half = job(d, "half", steps=steps, batch=16)
    scaled = plan_time(half, env)
    assert scaled["calibrated"] and not scaled["calibration_exact"]
    assert scaled["source"].startswith("scaled from a similar run"), scaled["source"]
    _, half_steps, measured_half = run_and_time(half, env)
    # The two runs ran at different moments: their quickest steps are the nearest to the same
    # (idle) machine, and the bound widens with the load as above.
    planned_ratio = scaled["seconds_per_step"] / after["seconds_per_step"]
    measured_ratio = min(half_steps[1:]) / min(step_times[1:])
    busy = max(1.0, os.getloadavg()[0] / os.cpu_count())
    print(f"batch 16: measured {measured_half:.2f} s, scaled plan {scaled['total_seconds']:.2f} s; step time "
          f"against batch 32: planned x{planned_ratio:.2f}, quickest steps x{measured_ratio:.2f}, load per core "
          f"{busy:.1f}")
    assert 1 / (SCALED_FACTOR * busy) <= planned_ratio / measured_ratio <= SCALED_FACTOR * busy
    # Its own measurement now replaces the scaled one.
    assert plan_time(half, env)["calibration_exact"]


def test_time_follows_the_datas_length_not_max_length(demo):
    """The demo's rows are about 22 tokens: batches are padded to their longest row, so a
    max_length of 256 costs what 32 does (the plan assumed 256 tokens a sequence before: 0.397 s
    a step at max_length 512, where the run took 0.03-0.07 s)."""
    d, env = demo
    short = plan_time(job(d, "short", steps=10, batch=8), env)
    spec = json.loads((d / "short.json").read_text())
    spec["dataset"]["max_length"] = 256
    (d / "long.json").write_text(json.dumps(spec))
    out = subprocess.run([CLI, "plan", str(d / "long.json"), "--json"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert abs(plan["time"]["modelled_seconds_per_step"] / short["modelled_seconds_per_step"] - 1) < 0.05
    assert any("tokens per sequence: measured by tokenizing the first" in r for r in plan["reasons"]), plan["reasons"]


def test_corrupt_store_is_ignored_with_a_warning(demo):
    d, env = demo
    store = d / "cache" / "tessera" / "step_times.json"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text('{"records": [')
    out = subprocess.run([CLI, "plan", str(job(d, "corrupt", steps=10, batch=8)), "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert not plan["time"]["calibrated"]
    assert any(r.startswith("warning: " + str(store)) for r in plan["reasons"]), plan["reasons"]


def test_total_includes_the_evaluations(demo):
    """With a validation set the run evaluates every eval_every steps and after the last; the
    plan's total counts those evaluations (it counted the steps alone: half the rows held out
    made the run take several times the plan's total). Calibrated from a run of the same job
    without evaluations, the total must give the run's training time, evaluations included,
    within 30%."""
    d, env = demo
    steps = 25
    base = json.loads(job(d, "no-eval", steps=steps, batch=8).read_text())
    base["dataset"].update(validation_split=0.5)
    base["dataset"].pop("validation", None)
    Path(d / "no-eval.json").write_text(json.dumps(base))
    run_and_time(d / "no-eval.json", env)  # records the step time
    spec = dict(base, output=dict(base["output"], dir=str(d / "with-eval")))
    spec["training"] = dict(base["training"], eval_every=8)
    path = d / "with-eval.json"
    path.write_text(json.dumps(spec))
    planned = plan_time(path, env)
    assert planned["calibrated"], planned["source"]
    assert planned["evaluations"] == 4, planned  # steps 8, 16 and 24, and after the last
    assert planned["evaluation_batches"] > 0 and planned["seconds_per_evaluation"] > 0, planned
    # The run without evaluations along the way still evaluated once at its end: its batches'
    # time is in its record, which the plan of this job takes (by the cost model alone, a small
    # model's evaluation came out 1.4-1.6x the run's).
    reasons = plan_of(path, env)["reasons"]
    assert any("evaluations of" in r and "as run no-eval measured" in r for r in reasons), reasons
    ev, loaded = run_events(path, env)
    ends = [e for e in ev if e["type"] == "progress" and e["phase"] == "eval" and e["done"] == e["total"]]
    assert len(ends) == planned["evaluations"], ends
    assert ends[0]["total"] == planned["evaluation_batches"], (ends[0], planned)
    measured = ends[-1]["t"] - loaded
    steps_alone = planned["total_seconds"] - planned["evaluations"] * planned["seconds_per_evaluation"]
    print(f"\n{steps} steps and {len(ends)} evaluations: measured {measured:.2f} s, plan {planned['total_seconds']:.2f} s "
          f"({steps_alone:.2f} s of steps, {planned['seconds_per_evaluation']:.3f} s an evaluation)")
    assert abs(planned["total_seconds"] - measured) <= CALIBRATED_TOLERANCE * measured, (planned, measured)
