"""The zero plugin across real local processes (tessera-ddp-tool with PLUGIN zero, one process per
rank, torchrun's variables set by hand): ZeRO stage 1 and 2 on 2 and 4 ranks, full and LoRA, end
with the weights, losses and gradient norms of the `single` plugin trained in one process with
gradient accumulation W over the same micro-batches (every rank bit for bit equal to rank 0);
memory() per rank shows the sharded sizes, checked against the tensors the plugin holds and
against single's optimizer bytes and ddp's gradient bytes for the same model; a rank killed
mid-training is named by the others. The launch of a whole job with zero, its checkpoints across
layouts and the export are tests/integration/test_zero_checkpoint.py."""
import json
import signal
import time

import pytest

from test_dist import TIMEOUT_S, NAMING_S, tool  # noqa: F401  (tool: skips outside ctest)
from test_ddp import BUCKET_BYTES, assert_equals_single
from test_ddp import launch  # noqa: F401  (the fixture starting DdpRanks)

# Per-rank optimizer bytes are 1/W of single's within 5% (the issue's bound): a tensor of n
# elements gives each rank ⌈n / W⌉ or fewer, so only the rounding of tiny tensors (norm weights,
# LoRA's are multiples of W) moves it.
SHARE_BOUND = 0.05


def run_zero(launch, world, steps, accumulation, method, stage, precision="fp32"):
    bucket = BUCKET_BYTES if method == "full" else 4096
    ranks = launch(world, steps, accumulation, bucket, method, precision, "zero",
                   json.dumps({"stage": stage}), timeout_s=60)
    codes = ranks.wait(range(world), within_s=90)
    assert codes == {rank: 0 for rank in range(world)}, ranks.describe()
    reports = [json.loads(ranks.output(rank)) for rank in range(world)]
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        assert report["identical_to_rank0"], f"rank {rank}'s weights differ from rank 0's"
    return reports


def check_memory(reports, world, stage):
    first = reports[0]
    held_shares = 0
    for report in reports:
        held, during = report["held"], report["during_step"]
        assert held["stage"] == stage
        # memory() is what the plugin holds: m and v of its shares, the gradient buffers alive.
        assert during["optimizer"] == held["moment_bytes"] == held["checkpoint_optimizer_bytes"]
        assert held["moment_bytes"] == 2 * 4 * held["shard_elements"]
        assert held["checkpoint_weight_bytes"] == 4 * held["shard_elements"]
        assert during["gradients"] == held["gradient_bytes"]
        held_shares += held["shard_elements"]
        share = held["moment_bytes"] / first["single_optimizer_bytes"]
        assert abs(share * world - 1.0) <= SHARE_BOUND, (report["rank"], share)
        gradient_share = during["gradients"] / first["ddp_gradient_bytes"]
        if stage == 2:
            # Only this rank's share of the gradients outlives backward.
            assert abs(gradient_share * world - 1.0) <= SHARE_BOUND, (report["rank"], gradient_share)
        else:
            assert gradient_share >= 1.0  # stage 1 keeps whole (padded) gradient buckets
    # The shares cover every element once.
    assert held_shares == first["held"]["total_elements"]
    print(f"  per rank: optimizer {first['held']['moment_bytes']} B of single's "
          f"{first['single_optimizer_bytes']} B, gradients {first['during_step']['gradients']} B "
          f"of ddp's {first['ddp_gradient_bytes']} B")


@pytest.mark.parametrize("world,stage,method,accumulation", [
    (2, 1, "full", 1), (2, 2, "full", 2), (4, 1, "full", 1), (4, 2, "full", 1),
    (2, 2, "lora", 1), (4, 1, "lora", 1)])
def test_zero_equals_single_with_accumulation(launch, world, stage, method, accumulation):
    steps = 3
    reports = run_zero(launch, world, steps, accumulation, method, stage)
    first = reports[0]
    assert_equals_single(first, f"zero {stage}, world {world}, {method}, accumulation {accumulation}")
    assert min(first["grad_norms"]) > first["max_grad_norm"]  # clipping acted, on the global norm
    check_memory(reports, world, stage)
    for report in reports:
        # One collective per bucket per reducing backward: stage 1 on the last micro-batch, stage
        # 2 on every one; the first bucket is on its way before the last gradient exists.
        per_step = 1 if stage == 1 else accumulation
        assert report["all_reduces"] == steps * per_step * len(report["buckets"])
        if method == "full":
            assert report["launched_s"][0] < report["last_gradient_s"], report


def test_bf16_stage2_ranks_stay_identical(launch):
    reports = run_zero(launch, 2, 3, 1, "full", 2, precision="bf16")
    first = reports[0]
    print(f"bf16: weights {first['max_rel_diff']:.2e}, losses {first['loss_rel_diff']:.2e}")
    assert first["loss_rel_diff"] <= 1e-3
    assert first["max_rel_diff"] <= 0.05
    # bf16 adds the float32 masters of this rank's shares to the weights.
    held = first["held"]
    assert first["during_step"]["weights"] == 2 * held["total_elements"] + 4 * held["shard_elements"]


def test_killed_rank_is_named(launch):
    world, victim = 2, 1
    ranks = launch(world, 0, 1, BUCKET_BYTES, "full", "fp32", "zero", json.dumps({"stage": 2}))
    deadline = time.monotonic() + 60
    while not all("step 3\n" in ranks.output(rank) for rank in range(world)):
        assert time.monotonic() < deadline, ranks.describe()
        assert all(p.poll() is None for p in ranks.processes), ranks.describe()
        time.sleep(0.05)
    ranks.processes[victim].send_signal(signal.SIGKILL)
    codes = ranks.wait([0], within_s=TIMEOUT_S + NAMING_S + 2.0)
    assert codes == {0: 3}, ranks.describe()
    error = ranks.output(0, "err")
    assert f"failed_rank={victim}\n" in error, ranks.describe()
    assert f"rank {victim} on " in error and f"(pid {ranks.processes[victim].pid})" in error
