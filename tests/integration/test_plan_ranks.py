"""The planner over several processes (issue 12): `tessera-cli plan --nproc 2` against a real
2-rank run.

- ddp at 2 ranks: the plan's per-rank weights, optimizer state and float32 gradient buckets
  equal what each rank's `memory` events report (within 2%), and each rank's peak RSS (VmHWM,
  polled while the ranks run) is within 25% of the plan's per-rank peak (the tolerance of
  tests/parity/test_plan_estimate.py for one process).
- gemini (sharded) at 2 ranks: the plan's per-rank weights without the chunks it gathers whole
  (`by_category.gathered_chunks`, released at every update), and its optimizer state, equal each
  rank's `memory` events (within 2%; the events come after an update, which also drops the
  gradients: those are only checked not to exceed the plan's); each rank's VmHWM is within
  RSS_TOLERANCE of the plan's peak; the plan's reduce-scatter and all-gather bytes per step against the
  `metric` events' `traffic` from step 2 on (step 1 traces the order of chunk uses), within
  COMMUNICATION_BYTES_TOLERANCE.
- gemini at 2 ranks with offload_optim_frac 1.0 (each rank's optimizer shards in its own folder
  under offload_dir): the same host checks (the plan's host optimizer state is 0, and so is each
  rank's reported one), and the plan's per-rank disk tier (optimizer, and weights: the float32
  masters of bf16 runs) equals each rank's `disk` memory event and the bytes of the files in the
  rank's `tessera-offload-<pid>` folder (polled while it runs), exactly; and the same with half of
  each rank's parameter shards on disk too (offload_param_frac 0.5: the disk tier's weights).
- hybrid at 2 ranks (tp 2, or 2 pipeline stages): each rank's weights, buckets and optimizer
  state against the plan's figures for its stage (within 2%), its VmHWM against the stage's
  planned peak (25%), and its tensor group's ring bytes and pipeline sends per step against the
  plan's (the sends exactly); its step time within a factor of 2 of the measured one, and once
  run, a plan of the same job takes the step rank 0 recorded (within 2% of the mean the metric
  events give for the steps after the first).
- The plan's communication time per step against an all_reduce of the same bytes in the same
  buckets timed by PyTorch's own torch.distributed (Gloo, 2 processes): within a factor of 2.
- `auto` at --nproc 2 picks ddp and says why in words (what a rank holds, the budget it fits in,
  why the others are not chosen); `launch --nproc 2` runs it (no longer refused), and under a
  budget where batch 8 does not fit a rank the plan trains micro-batches of 4 with 2 accumulation
  steps, says so in the plan and logs a warning.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from plan_model import make_plan_model  # noqa: E402
from proc_status import children_of, status_bytes  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
ENV = {**os.environ, "TESSERA_DIST_TIMEOUT_S": "30", "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S": "60"}
CATEGORY_TOLERANCE = 0.02
# Each rank's VmHWM against the plan's peak. bench_plan holds the 15% goal (run alone); here the
# ranks share ctest's machine, where rank 0's VmHWM varies by 8% from run to run, so the guard is
# 25% for every strategy. Sharded gemini's plan once over-counted (1.19 - 1.25: it added the
# float32 gradient chunks being filled to the whole forward's activations) and was held to 1.30;
# since issue 26's per-strategy cost models it measures 1.07 - 1.14 (2026-12-04, AMD EPYC), so the
# exception is gone.
RSS_TOLERANCE = 0.25
COMMUNICATION_FACTOR = 2.0
BUCKET_BYTES = 25 << 20  # ddp's default bucket_size
COMMUNICATION_BYTES_TOLERANCE = 0.01


def cli(*args, timeout=120, env=None):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env or ENV)


def events_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    # The model of tests/parity/test_plan_estimate.py (~21M parameters): weights, gradients,
    # buckets, optimizer state and activations are each a visible share of a rank's peak.
    d = tmp_path_factory.mktemp("plan-ranks")
    make_plan_model(d)
    return d


def job(workdir, name, strategy, max_length=128, **options):
    spec = {"version": 1, "model": {"path": str(workdir / "model")},
            "dataset": {"train": str(workdir / "text.jsonl"), "format": "text", "max_length": max_length},
            "training": {"steps": 3, "batch_size": 8, "learning_rate": 1e-4, "log_every": 1},
            "strategy": {"name": strategy, "options": {"device": "cpu", **options} if strategy != "auto" else {}},
            "output": {"dir": str(workdir / name)}}
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def spec_steps(path):
    return json.loads(Path(path).read_text())["training"]["steps"]


def plan_of(path, *extra, env=None):
    r = cli("plan", path, "--nproc", 2, "--json", *extra, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def folder_bytes(folder):
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except OSError:
        return None


def launch_measuring_rss(*args, offload_dir=None):
    """Runs `tessera-cli launch` and polls its ranks' peak RSS (VmHWM) every 10 ms; returns
    (returncode, stderr, {pid: peak bytes} in the order the ranks started). With `offload_dir`,
    also the most bytes of the files in each rank's disk-tier folder (`tessera-offload-<pid>`,
    removed when the run ends): (returncode, stderr, peaks, {pid: bytes})."""
    proc = subprocess.Popen([CLI, "launch", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=ENV, text=True)
    peaks, files = {}, {}
    while proc.poll() is None:
        for child in children_of(proc.pid):
            hwm = status_bytes(child, "VmHWM")
            if hwm is not None:
                peaks[child] = max(peaks.get(child, 0), hwm)
            if offload_dir is not None:
                size = folder_bytes(Path(offload_dir) / f"tessera-offload-{child}")
                if size is not None:
                    files[child] = max(files.get(child, 0), size)
        time.sleep(0.01)
    if offload_dir is not None:
        return proc.returncode, proc.stderr.read(), peaks, files
    return proc.returncode, proc.stderr.read(), peaks


@pytest.mark.parametrize("strategy,options", [("ddp", {}), ("zero", {"stage": 2})], ids=["ddp", "zero2"])
def test_rank_memory_matches_the_plan(workdir, strategy, options):
    name = strategy + "".join(str(v) for v in options.values())
    spec = job(workdir, name, strategy, **options)
    plan = plan_of(spec)
    assert plan["strategy"] == strategy and plan["ranks"]["processes"] == 2 and plan["ranks"]["per_rank"]
    tier = plan["memory"][0]
    assert tier["tier"] == "host"
    assert tier["budget"] == plan["ranks"]["host_usable"] // 2, "each of 2 ranks has half the machine"
    planned = tier["by_category"]
    trainable = plan["parameters"]["trainable"]
    if strategy == "ddp":
        assert planned["gradient_buckets"] == 4 * trainable
    else:
        assert planned["optimizer"] == 4 * trainable, "AdamW's two float32 moments of half the parameters"

    code, err, peaks = launch_measuring_rss("--nproc", 2, spec)
    assert code == 0, err
    memory = [e for e in events_of(workdir / name / "events.jsonl") if e["type"] == "memory" and e["tier"] == "host"]
    assert memory, "no memory events"
    for report in memory[-1]["ranks"]:
        measured = report["by_category"]
        # After a step autograd's gradients are cleared: ddp's buckets alone hold gradients.
        checked = [("weights", planned["weights"]), ("optimizer", planned["optimizer"])]
        if strategy == "ddp":
            checked.append(("gradients", planned["gradient_buckets"]))
        else:
            assert measured["gradients"] <= planned["gradients"] * (1 + CATEGORY_TOLERANCE), (report, planned)
        for category, expected in checked:
            ratio = measured[category] / expected
            print(f"rank {report['rank']} {category}: planned {expected}, reported {measured[category]}")
            assert abs(ratio - 1) <= CATEGORY_TOLERANCE, (report["rank"], category, expected, measured[category])

    # The ranks in the order they started: rank 0 (which exports), then rank 1.
    assert len(peaks) == 2, peaks
    rank0, rank1 = (peaks[pid] for pid in sorted(peaks))
    floor = 180 << 20  # plan::kRuntimeFloorBytes
    others = max(tier["training_peak"], tier["load_peak"], floor)  # rank 1 does not export
    for rank, measured, expected in ((0, rank0, tier["peak"]), (1, rank1, others)):
        ratio = expected / measured
        print(f"rank {rank}: planned peak {expected / 2**20:.0f} MiB, measured VmHWM {measured / 2**20:.0f} MiB, "
              f"ratio {ratio:.2f}")
        assert abs(ratio - 1) <= RSS_TOLERANCE, (rank, expected, measured, tier)


@pytest.mark.parametrize("offload", ["", "optimizer", "parameters"],
                         ids=["in_ram", "optimizer_on_disk", "parameters_on_disk"])
def test_gemini_rank_memory_and_traffic_match_the_plan(workdir, offload):
    name = "gemini" + (f"-{offload}" if offload else "")
    offload_dir = workdir / (name + "-disk")
    options = {"offload_optim_frac": 1.0, "offload_dir": str(offload_dir)} if offload else {}
    if offload == "parameters":
        options["offload_param_frac"] = 0.5
    spec = job(workdir, name, "gemini", **options)
    plan = plan_of(spec)
    assert plan["strategy"] == "gemini" and plan["ranks"]["processes"] == 2 and plan["ranks"]["per_rank"]
    assert plan["settings"]["micro_batch"] == 8 and plan["settings"]["gradient_accumulation"] == 1, plan["settings"]
    tier = plan["memory"][0]
    assert tier["tier"] == "host" and tier["budget"] == plan["ranks"]["host_usable"] // 2
    planned = tier["by_category"]
    trainable = plan["parameters"]["trainable"]
    if offload:
        # Every rank's optimizer shards on disk (all chunks at 1.0): none left on the host; each
        # rank's files hold the moments of half of every chunk, and beside them its reduced
        # gradient shards, each file rounded up to 4 KiB.
        assert planned["optimizer"] == 0, planned
        disk = plan["memory"][1]
        assert disk["tier"] == "disk" and len(plan["memory"]) == 2, plan["memory"]
        on_disk = disk["by_category"]
        assert 4 * trainable <= on_disk["optimizer"] <= 4 * trainable * 1.001 + 64 * 4096, (on_disk, trainable)
        assert 2 * trainable <= on_disk["gradients"] <= 2 * trainable * 1.001 + 64 * 4096, (on_disk, trainable)
        assert (on_disk["optimizer"] + on_disk["weights"] + on_disk["gradients"]) % 4096 == 0, on_disk
        # fp32: no masters, so the disk tier's weights are the parameter shards (if any), each
        # read when its chunk is gathered (forward and backward: micro-batch 8, no accumulation)
        # and, being trainable, read and written back in the update.
        shards = on_disk["weights"]
        assert (shards > 0) == (offload == "parameters"), on_disk
        if shards:
            assert 0.25 * 4 * trainable / 2 <= shards <= 0.75 * 4 * trainable / 2 + 64 * 4096, (on_disk, trainable)
        # The gradient shards: written once final, read back by the update (but the one of the
        # chunk whose optimizer shard is read during backward, with no parameter shard on disk:
        # the update takes it from memory). The parameter shards: read by the gathers the chunk
        # cache's replay makes (at least once a step, at most in the forward and again in the
        # backward), and by the update.
        kept = plan["time"]["disk_gradient_read_ahead_bytes"]
        assert (kept > 0) == (offload != "parameters"), plan["time"]
        reads = plan["time"]["disk_read_bytes_per_step"] + kept - on_disk["optimizer"] - on_disk["gradients"]
        assert 2 * shards <= reads <= 3 * shards, (reads, shards)
        assert plan["time"]["disk_write_bytes_per_step"] == on_disk["optimizer"] + on_disk["gradients"] + shards
        overlap = "parameter chunks are read in every forward" if shards else "overlaps the optimizer update"
        assert any(r.startswith("disk I/O per step of each rank") and overlap in r
                   for r in plan["reasons"]) or any("disk speed was not measured" in r for r in plan["reasons"])
    else:
        # Moments of half of every chunk, each padded to an even number of elements.
        assert 4 * trainable <= planned["optimizer"] <= 4 * trainable * 1.001, (planned, trainable)
        assert len(plan["memory"]) == 1, plan["memory"]
    assert 0 < planned["gathered_chunks"] < planned["weights"]
    assert 0 < planned["gradient_buckets"] < planned["gradients"]
    assert plan["reasons"][0].startswith("strategy gemini: each rank holds 1/2 of the parameters"), plan["reasons"][0]

    if offload:
        code, err, peaks, files = launch_measuring_rss("--nproc", 2, spec, offload_dir=offload_dir)
    else:
        code, err, peaks = launch_measuring_rss("--nproc", 2, spec)
    assert code == 0, err
    events = events_of(workdir / name / "events.jsonl")
    memory = [e for e in events if e["type"] == "memory" and e["tier"] == "host"]
    assert memory, "no memory events"
    at_rest = planned["weights"] - planned["gathered_chunks"]
    for report in memory[-1]["ranks"]:
        measured = report["by_category"]
        assert measured["gradients"] <= planned["gradients"], (report, planned)
        for category, expected in (("weights", at_rest), ("optimizer", planned["optimizer"])):
            print(f"rank {report['rank']} {category}: planned {expected}, reported {measured[category]}")
            if expected == 0:
                assert measured[category] == 0, (report["rank"], category, measured[category])
                continue
            ratio = measured[category] / expected
            assert abs(ratio - 1) <= CATEGORY_TOLERANCE, (report["rank"], category, expected, measured[category])

    if offload:
        # Each rank's disk tier: the plan's per-rank files equal what the rank reports and the
        # bytes of the files in its folder (polled while it ran), exactly.
        disk_events = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"]
        assert disk_events, "no disk memory events"
        # Rank 0's traffic per step against the plan's, over the whole run: the update runs
        # behind the next forward, so which report a read lands before depends on timing (the
        # median of the deltas between reports read a chunk more in one run of four), while the
        # totals do not. The last report comes after the last update; before the first step each
        # rank writes its optimizer shards (zero moments) and parameter shards to disk once.
        steps = spec_steps(spec)
        first, last = disk_events[0]["traffic"], disk_events[-1]["traffic"]
        planned_read, planned_written = (plan["time"][k] for k in ("disk_read_bytes_per_step",
                                                                   "disk_write_bytes_per_step"))
        print(f"rank 0 disk over {steps} steps: read {last['read_bytes']}, written {last['written_bytes']} "
              f"(first report {first['read_bytes']} / {first['written_bytes']}); planned a step "
              f"{planned_read} / {planned_written}")
        initial = on_disk["optimizer"] + on_disk["weights"]
        assert last["written_bytes"] == steps * planned_written + initial, (last, plan["time"], on_disk)
        # Reads: every gradient and optimizer shard once a step, and with parameter shards on
        # disk the gathers' reads, which follow the order of chunk uses, not timing.
        assert last["read_bytes"] == steps * planned_read, (last, plan["time"])
        reports = sorted(disk_events[-1]["ranks"], key=lambda r: r["rank"])
        assert [r["rank"] for r in reports] == [0, 1], reports
        assert len(files) == 2, files
        for report, pid in zip(reports, sorted(files)):
            print(f"rank {report['rank']} disk: planned optimizer {on_disk['optimizer']} weights {on_disk['weights']}, "
                  f"reported {report['by_category']['optimizer']} / {report['by_category']['weights']} "
                  f"(used {report['used']}), files {files[pid]}")
            for category in ("optimizer", "weights", "gradients"):
                assert report["by_category"][category] == on_disk[category], (category, report, on_disk)
            assert report["used"] == files[pid] == (
                on_disk["optimizer"] + on_disk["weights"] + on_disk["gradients"]), (report, files, on_disk)

    assert len(peaks) == 2, peaks
    rank0, rank1 = (peaks[pid] for pid in sorted(peaks))
    floor = 180 << 20  # plan::kRuntimeFloorBytes
    others = max(tier["training_peak"], tier["load_peak"], floor)  # rank 1 does not export
    for rank, measured, expected in ((0, rank0, tier["peak"]), (1, rank1, others)):
        ratio = expected / measured
        print(f"rank {rank}: planned peak {expected / 2**20:.0f} MiB, measured VmHWM {measured / 2**20:.0f} MiB, "
              f"ratio {ratio:.2f}")
        assert abs(ratio - 1) <= RSS_TOLERANCE, (rank, expected, measured, tier)

    # Bytes per step, in ring bytes (docs/events.md): the reduce-scatters of the gradients and
    # the all-gathers of the chunks; the trainer's own gather of losses and times (N x 32 bytes,
    # (N-1)/N of it) and the clipping norm's all_reduce are not the plan's.
    communication = plan["time"]["communication"]
    metrics = [e for e in events if e["type"] == "metric" and "loss" in e]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        traffic = m["traffic"]
        scattered = traffic["reduce_scatter"]["ring_bytes"]
        gathered = traffic["all_gather"]["ring_bytes"] - 32
        print(f"step {m['step']}: reduce_scatter {scattered} (planned {communication['gradient_bytes']}), "
              f"all_gather {gathered} (planned {communication['all_gather_bytes']}), "
              f"ratio {gathered / communication['all_gather_bytes']:.3f}")
        assert abs(scattered / communication["gradient_bytes"] - 1) <= 0.001, (m, communication)
        if m["step"] > 1:
            assert abs(gathered / communication["all_gather_bytes"] - 1) <= COMMUNICATION_BYTES_TOLERANCE, (
                m, communication)
            total = traffic["ring_bytes"] - traffic["broadcast"]["ring_bytes"]
            assert abs(total / communication["bytes_per_step"] - 1) <= COMMUNICATION_BYTES_TOLERANCE, (
                m, communication)


@pytest.mark.parametrize("layout", [{"tp_size": 2, "pp_size": 1}, {"tp_size": 1, "pp_size": 2}],
                         ids=["tp2", "pp2"])
def test_hybrid_rank_memory_and_traffic_match_the_plan(workdir, layout):
    """hybrid at 2 ranks, tensor-parallel or 2 pipeline stages: each rank's weights, float32
    gradient buckets and optimizer state as its memory events report them against the plan's
    figures for its stage (within 2%), each rank's VmHWM against its stage's planned peak (25%),
    and the bytes per step its groups moved (the metric events' tensor and pipeline traffic)
    against the plan's."""
    name = "hybrid-" + "-".join(f"{k[:2]}{v}" for k, v in layout.items())
    path = job(workdir, name, "hybrid", **layout)
    spec = json.loads(path.read_text())
    # Packed blocks of max_length: every micro-batch is 4 x 128 tokens, as the plan counts them.
    spec["dataset"]["packing"] = True
    # 7 steps: a run records its step time from 5 steps after the first on.
    spec["training"].update({"batch_size": 4, "gradient_accumulation": 2, "save_every": 0, "steps": 7})
    path.write_text(json.dumps(spec))
    plan = plan_of(path)
    assert plan["strategy"] == "hybrid" and plan["ranks"]["processes"] == 2, plan["strategy"]
    assert plan["settings"]["micro_batch"] == 4 and plan["settings"]["gradient_accumulation"] == 2
    hybrid = plan["ranks"]["hybrid"]
    stages = hybrid["stages"]
    assert len(stages) == layout["pp_size"] and hybrid["dp_size"] == 1, hybrid
    tier = plan["memory"][0]
    # The plan's per-rank figures are the heavier stage's.
    heaviest = max(stages, key=lambda s: s["training_peak"])
    assert tier["training_peak"] == heaviest["training_peak"], (tier, heaviest)
    if layout["pp_size"] == 2:
        assert [s["layers"] for s in stages] == ["layers 0-2", "layers 3"], stages
        assert hybrid["bubble"] == pytest.approx(1 / 3), hybrid
        assert any("2 pipeline stages balanced by cost" in r for r in plan["reasons"]), plan["reasons"]

    code, err, peaks = launch_measuring_rss("--nproc", 2, path)
    assert code == 0, err
    events = events_of(workdir / name / "events.jsonl")
    memory = [e for e in events if e["type"] == "memory" and e["tier"] == "host"]
    assert memory, "no memory events"
    for report in memory[-1]["ranks"]:
        planned = stages[report["mesh"]["pp"]]["by_category"]
        measured = report["by_category"]
        # After a step autograd's gradients are cleared: the buckets alone hold gradients.
        for category, expected in (("weights", planned["weights"]), ("optimizer", planned["optimizer"]),
                                   ("gradients", planned["gradient_buckets"])):
            ratio = measured[category] / expected
            print(f"rank {report['rank']} (stage {report['mesh']['pp']}) {category}: planned {expected}, "
                  f"reported {measured[category]}, ratio {ratio:.4f}")
            assert abs(ratio - 1) <= CATEGORY_TOLERANCE, (report, category, expected)

    # Rank 0 writes the checkpoints (the whole state gathered: save_peak) and exports (the plan's
    # peak); rank 1's peak is its stage's training or loading.
    assert len(peaks) == 2, peaks
    floor = 180 << 20  # plan::kRuntimeFloorBytes
    assert tier["save_peak"] > tier["training_peak"], tier
    for rank, pid in enumerate(sorted(peaks)):
        stage = stages[rank if layout["pp_size"] == 2 else 0]
        expected = tier["peak"] if rank == 0 else max(stage["training_peak"], tier["load_peak"], floor)
        ratio = expected / peaks[pid]
        print(f"rank {rank}: planned peak {expected / 2**20:.0f} MiB, measured VmHWM "
              f"{peaks[pid] / 2**20:.0f} MiB, ratio {ratio:.2f}")
        assert abs(ratio - 1) <= RSS_TOLERANCE, (rank, expected, peaks[pid], stage)

    # Rank 0's groups, per step: the tensor group's ring bytes (Megatron's all-reduces; the
    # plan's count leaves out nothing but the losses' gather, so within 10% above), the pipeline
    # stage 0's sends (its activations, exactly).
    metrics = [e for e in events if e["type"] == "metric" and "loss" in e]
    assert [m["step"] for m in metrics] == list(range(1, 8))
    # Rank 0 recorded the run's step (the slowest rank's) under 2 processes: the plan of the same
    # job now takes it whole, the mean of the steps after the first.
    tokens_per_step = 4 * 128 * 2
    measured = [tokens_per_step / m["tokens_per_s"] for m in metrics]
    replanned = plan_of(path)
    print(f"step time: planned {plan['time']['seconds_per_step']:.3f} s before the run (the cost model: "
          f"{plan['time']['source']}), measured {[round(t, 3) for t in measured]}, planned after it "
          f"{replanned['time']['seconds_per_step']:.3f} s ({replanned['time']['source']})")
    # Before the run (the cost model at the profile's measured product rate, or an earlier run's
    # step): within a factor of 2 of the measured mean.
    expected = sum(measured[1:]) / len(measured[1:])
    assert 1 / COMMUNICATION_FACTOR <= plan["time"]["seconds_per_step"] / expected <= COMMUNICATION_FACTOR, (
        plan["time"], measured)
    assert replanned["time"]["calibrated"] and replanned["time"]["calibration_exact"], replanned["time"]
    assert "with 2 processes" in replanned["time"]["source"], replanned["time"]["source"]
    assert abs(replanned["time"]["seconds_per_step"] / expected - 1) <= 0.02, (replanned["time"], measured)
    for m in metrics:
        if layout["tp_size"] == 2:
            measured, planned = m["tensor_traffic"]["ring_bytes"], stages[0]["tensor_traffic"]["ring_bytes"]
            print(f"step {m['step']}: tensor ring bytes {measured}, planned {planned:.0f}, "
                  f"ratio {measured / planned:.4f}")
            assert 0.999 <= measured / planned <= 1.1, (m["tensor_traffic"], stages[0])
        else:
            sent, planned = m["pipeline_traffic"]["send"]["bytes"], stages[0]["pipeline_traffic"]["send_bytes"]
            print(f"step {m['step']}: stage 0 sent {sent} bytes, planned {planned:.0f}")
            assert sent == planned, (m["pipeline_traffic"], stages[0])
            assert m["pipeline_traffic"]["send"]["calls"] == stages[0]["pipeline_traffic"]["sends"]


ALL_REDUCE_SCRIPT = r"""
import os, sys, time, statistics, torch, torch.distributed as dist
rank, port, elements, bucket = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
buckets = [torch.ones(min(bucket, elements - i)) for i in range(0, elements, bucket)]
def step():
    dist.barrier()
    start = time.perf_counter()
    for b in buckets:
        dist.all_reduce(b)
    return time.perf_counter() - start
step()
times = [step() for _ in range(5)]
if rank == 0:
    print(statistics.median(times))
dist.destroy_process_group()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_communication_time_matches_a_measured_all_reduce(workdir, tmp_path):
    # A profile cache of its own: the plan measures the link now, beside the all-reduce it is
    # checked against (the shared cache keeps a link measured up to a day ago, perhaps while the
    # machine was busy: planned 2.4x a quiet all-reduce once).
    fresh_profile = {**ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    plan = plan_of(job(workdir, "comm", "ddp"), env=fresh_profile)
    communication = plan["time"]["communication"]
    trainable = plan["parameters"]["trainable"]
    # 2(W-1)/W of the float32 gradients at W = 2: the gradients' bytes, in 25 MiB buckets.
    assert communication["bytes_per_step"] == communication["gradient_bytes"] == 4 * trainable
    assert communication["calls"] == -(-4 * trainable // BUCKET_BYTES)
    assert communication["seconds_per_step"] > 0, "the link was measured, so the time includes it"
    assert "127.0.0.1" in communication["link"]
    port = str(free_port())
    args = [str(trainable), str(BUCKET_BYTES // 4)]
    ranks = [subprocess.Popen([sys.executable, "-c", ALL_REDUCE_SCRIPT, str(r), port, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outputs = [r.communicate(timeout=120) for r in ranks]
    assert all(r.returncode == 0 for r in ranks), outputs
    measured = float(outputs[0][0])
    planned = communication["seconds_per_step"]
    print(f"communication per step: planned {planned * 1000:.1f} ms, torch.distributed all_reduce of "
          f"{4 * trainable / 2**20:.1f} MiB in {communication['calls']} buckets {measured * 1000:.1f} ms")
    assert 1 / COMMUNICATION_FACTOR <= planned / measured <= COMMUNICATION_FACTOR, (planned, measured)


def test_auto_at_two_processes_picks_ddp_and_explains(workdir):
    # 256 tokens a sequence: activations a share of a rank's peak that halving the micro-batch
    # saves more of than zero's shards do (at 128 the loss, holding no whole logits, is too small).
    spec = job(workdir, "auto", "auto", max_length=256)
    plan = plan_of(spec)
    assert plan["strategy"] == "ddp" and plan["settings"]["strategy"] == "ddp"
    first = plan["reasons"][0]
    assert first.startswith("strategy ddp: each rank holds the whole model"), first
    assert "per rank, within the" in first and "÷ 2 ranks" in first, first
    assert any(r.startswith("zero") or "zero stage" in r for r in plan["reasons"]), plan["reasons"]
    assert [c["strategy"] for c in plan["strategies"]][0] == "ddp" and plan["strategies"][0]["fits"]
    text = cli("plan", spec, "--nproc", 2)
    assert text.returncode == 0 and "processes:     2" in text.stdout and "communication:" in text.stdout, text.stdout

    # A budget where batch 8 does not fit a rank with any strategy that keeps whole layers (zero
    # stage 2 holds the least) but micro-batch 4 fits ddp: the plan halves the micro-batch (same
    # sequences per step), says so, and the run warns. hybrid's layouts are weighed too (listed
    # among the strategies) but taken only where no such strategy fits.
    assert {(c["tp_size"], c["pp_size"]) for c in plan["strategies"] if c["strategy"] == "hybrid"} == {(2, 1), (1, 2)}
    # ddp at micro-batch 4 with 2 accumulation steps, planned as such (with accumulation autograd's
    # gradients are all held when the last backward starts, without they move into the buckets).
    halved = job(workdir, "ddp-m4", "ddp", max_length=256)
    spec_m4 = json.loads(halved.read_text())
    spec_m4["training"].update(batch_size=4, gradient_accumulation=2)
    halved.write_text(json.dumps(spec_m4))
    ddp4 = plan_of(halved)["memory"][0]["training_peak"]
    least8 = min(c["peak_per_rank"] for c in plan["strategies"] if c["strategy"] != "hybrid")
    assert ddp4 < least8, (ddp4, plan["strategies"])
    per_rank = (ddp4 + least8) // 2 / 0.9
    budget = f"{int(2 * per_rank)}"
    tight = plan_of(spec, "--simulate-host-memory", budget)
    assert tight["settings"]["micro_batch"] == 4 and tight["settings"]["gradient_accumulation"] == 2, tight
    assert tight["strategy"] == "ddp"
    r = cli("launch", "--nproc", 2, spec, "--simulate-host-memory", budget)
    assert r.returncode == 0, r.stderr
    events = events_of(workdir / "auto" / "events.jsonl")
    planned = [e for e in events if e["type"] == "plan"]
    assert len(planned) == 1 and planned[0]["applied"] and planned[0]["strategy"] == "ddp", planned
    assert any("micro-batch 4 with 2 accumulation steps" in r for r in planned[0]["reasons"]), planned[0]["reasons"]
    warnings = [e["message"] for e in events if e["type"] == "log" and e.get("level") == "warning"]
    assert any("micro-batches of 4 with 2 accumulation steps instead of batch_size 8" in w for w in warnings), warnings
    assert json.loads((workdir / "auto" / "plan.json").read_text())["strategy"] == "ddp"
    assert [e for e in events if e["type"] == "done"][-1]["status"] == "completed"


def training_peak_rss(path):
    """`launch --nproc 2` of `path` with glibc returning large frees to the system at once (so
    RSS follows what is allocated); the largest RSS of a rank between the first step's start and
    the last metric event (the steps, not the checkpoint or the export after them)."""
    env = {**ENV, "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.Popen([CLI, "launch", "--nproc", "2", str(path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, text=True)
    samples = []
    while proc.poll() is None:
        for child in children_of(proc.pid):
            rss = status_bytes(child, "VmRSS")
            if rss is not None:
                samples.append((time.time(), rss))
        time.sleep(0.005)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    events = events_of(Path(json.loads(Path(path).read_text())["output"]["dir"]) / "events.jsonl")
    metrics = [e["t"] for e in events if e["type"] == "metric"]
    # The first step starts after the dataset's log lines; the samples up to its end count.
    start = max(e["t"] for e in events if e["type"] == "log" and "training" in e.get("message", "") and
                "sequences" in e.get("message", ""))
    return max(rss for t, rss in samples if start <= t <= max(metrics))


def test_sequence_parallel_holds_fewer_activations(workdir):
    """hybrid tp 2 with and without sequence_parallel, micro-batches of 8 × 512 tokens: the
    training steps' peak RSS is lower with it (the layers' inputs, residuals and norms on half the
    positions: measured 1228 against 1303 MiB here), and the plan's activations say so too."""
    peaks, planned = {}, {}
    for sp in (False, True):
        name = f"hybrid-tp2-sp{int(sp)}"
        path = job(workdir, name, "hybrid", tp_size=2, sequence_parallel=sp)
        spec = json.loads(path.read_text())
        spec["dataset"].update({"packing": True, "max_length": 512})
        spec["training"].update({"batch_size": 8, "steps": 2, "save_every": 0})
        path.write_text(json.dumps(spec))
        plan = plan_of(path)
        planned[sp] = plan["memory"][0]["by_category"]["activations"]
        assert plan["settings"]["sequence_parallel"] == sp
        peaks[sp] = training_peak_rss(path)
        print(f"sequence_parallel {sp}: training peak RSS {peaks[sp] / 2**20:.0f} MiB, planned activations "
              f"{planned[sp] / 2**20:.0f} MiB")
    assert peaks[True] <= peaks[False] - (30 << 20), peaks
    assert planned[True] < planned[False]
    assert any("sequence parallelism" in r for r in plan["reasons"]), plan["reasons"]
