"""gemini sharded over the data-parallel group (ZeRO-3) across real local processes
(tessera-ddp-tool with PLUGIN gemini, one process per rank, torchrun's variables set by hand):
on 2 and 4 ranks, full and LoRA, the weights, losses and gradient norms end equal to the `single`
plugin trained in one process with gradient accumulation W over the same micro-batches (every
rank bit for bit equal to rank 0); memory() per rank is the shards' sizes, checked against the
buffers the plugin holds at the same moment, and the optimizer bytes are 1/W of single's; chunks
are gathered before use, released after (never all at once) and gathered ahead along the traced
order; a rank killed mid-training is named by the others."""
import json
import shutil
import signal
import subprocess
import time

import pytest

from test_dist import TIMEOUT_S, NAMING_S, tool  # noqa: F401  (tool: skips outside ctest)
from test_ddp import FP32_BOUND, assert_equals_single
from test_ddp import launch  # noqa: F401  (the fixture starting DdpRanks)

SHARE_BOUND = 0.05  # per-rank optimizer bytes are 1/W of single's within 5% (the issue's bound)
# 64 KiB chunks: the tiny Llama's 107k parameters in 8 chunks, so that only some are gathered at a
# time (the plugin keeps at most 4 whole).
SMALL_CHUNKS = {"chunk_size": 65536}
MAX_GATHERED = 4


def run_gemini(launch, world, steps, accumulation, method, options, precision="fp32"):
    ranks = launch(world, steps, accumulation, 0, method, precision, "gemini",
                   json.dumps(options), timeout_s=60)
    codes = ranks.wait(range(world), within_s=90)
    assert codes == {rank: 0 for rank in range(world)}, ranks.describe()
    reports = [json.loads(ranks.output(rank)) for rank in range(world)]
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        assert report["identical_to_rank0"], f"rank {rank}'s weights differ from rank 0's"
        assert report["gemini"]["world_size"] == world
    return reports


def check_memory(reports, world, steps, accumulation, precision="fp32"):
    first = reports[0]
    element = 4 if precision == "fp32" else 2
    covered = 0
    for report in reports:
        held, during = report["gemini"], report["during_step"]
        # memory() after the last backward is what the plugin holds then, counted from its
        # buffers: the parameter shards, the chunks gathered whole, the masters (bf16); the
        # reduced gradient shards (no whole gradient chunk outlives backward); m and v.
        assert during["weights"] == (held["parameter_shard_bytes"] + held["gathered_bytes"]
                                     + held["master_bytes"]), report
        assert during["gradients"] == held["gradient_bytes"] == 4 * held["trainable_shard_elements"]
        assert during["optimizer"] == held["moment_bytes"] == held["checkpoint_optimizer_bytes"]
        assert held["moment_bytes"] == 2 * 4 * held["trainable_shard_elements"]
        assert held["checkpoint_weight_bytes"] == 4 * held["trainable_shard_elements"]
        # Every chunk is split into W equal shards (padded to a multiple of W).
        assert held["chunk_elements"] == world * held["shard_elements"]
        assert held["parameter_shard_bytes"] == element * held["shard_elements"]
        share = held["moment_bytes"] / first["single_optimizer_bytes"]
        assert abs(share * world - 1.0) <= SHARE_BOUND, (report["rank"], share)
        covered += held["trainable_shard_elements"]
    # The shards cover every trainable element once.
    assert covered == first["gemini"]["trainable_elements"]
    print(f"  per rank: optimizer {first['gemini']['moment_bytes']} B of single's "
          f"{first['single_optimizer_bytes']} B; weights {first['during_step']['weights']} B "
          f"({first['gemini']['gathered_bytes']} B gathered of "
          f"{element * first['gemini']['chunk_elements']} B in {first['gemini']['chunks']} chunks);"
          f" {first['gemini']['all_gathers']} all-gathers ({first['gemini']['prefetched']} ahead),"
          f" {first['gemini']['reduce_scatters']} reduce-scatters")


@pytest.mark.parametrize("world,method,accumulation,options", [
    (2, "full", 1, SMALL_CHUNKS), (4, "full", 2, SMALL_CHUNKS),
    (2, "lora", 1, {}), (4, "lora", 1, {})])
def test_sharded_gemini_equals_single_with_accumulation(launch, world, method, accumulation,
                                                        options):
    steps = 3
    reports = run_gemini(launch, world, steps, accumulation, method, options)
    first = reports[0]
    assert_equals_single(first, f"gemini sharded, world {world}, {method}, accumulation {accumulation}")
    assert min(first["grad_norms"]) > first["max_grad_norm"]  # clipping acted, on the global norm
    check_memory(reports, world, steps, accumulation)
    for report in reports:
        held = report["gemini"]
        # Gathered before use and released after: at most the cache's chunks whole at once (a
        # bound on bytes of 4 average chunks failed once the cache held the order's next chunks,
        # larger than the average), never every chunk.
        assert held["gathered_chunks"] <= MAX_GATHERED, held
        assert held["gathered_bytes"] < 4 * held["chunk_elements"]
        # From the second step on, chunks are gathered ahead along the first step's order.
        assert held["prefetched"] > 0
        if method == "full":  # every chunk is trainable: one reduce-scatter each per backward
            assert held["reduce_scatters"] == steps * accumulation * held["chunks"]


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_group_of_one_holds_each_chunk_once(launch, method):
    """One process: its group of one gathers a chunk as the shard's own memory and
    adds the gradients up in the step's shard, so after the last backward memory() holds the
    parameters, the gradients and the moments once each, counted from its buffers: nothing
    gathered apart, no collective, and `single`'s weights, losses and norms with accumulation 2."""
    steps, accumulation = 3, 2
    reports = run_gemini(launch, 1, steps, accumulation, method, SMALL_CHUNKS if method == "full" else {})
    first = reports[0]
    assert_equals_single(first, f"gemini sharded, group of one, {method}")
    check_memory(reports, 1, steps, accumulation)
    held, during = first["gemini"], first["during_step"]
    assert held["gathered_bytes"] == 0, held
    assert during["weights"] == held["parameter_shard_bytes"] == 4 * held["chunk_elements"], during
    assert held["all_gathers"] == held["reduce_scatters"] == held["prefetched"] == 0, held


def test_bf16_ranks_stay_identical(launch):
    reports = run_gemini(launch, 2, 3, 1, "full", SMALL_CHUNKS, precision="bf16")
    first = reports[0]
    print(f"bf16: weights {first['max_rel_diff']:.2e}, losses {first['loss_rel_diff']:.2e}")
    assert first["loss_rel_diff"] <= 1e-3
    assert first["max_rel_diff"] <= 0.05
    check_memory(reports, 2, 3, 1, precision="bf16")
    # bf16 keeps float32 masters of this rank's shards beside the bf16 shards.
    assert first["gemini"]["master_bytes"] == 4 * first["gemini"]["trainable_shard_elements"]


# --- the optimizer shards in the disk tier (offload_optim_frac) ----------------------------------

# Chunk sizes giving several trainable chunks, so that a share of 0.5 puts some but not all of
# them on disk: 64 KiB for the full model; "auto" for LoRA, whose search makes at least 8 chunks
# of the adapters (the frozen base is chunked apart).
OFFLOAD_CHUNKS = {"full": SMALL_CHUNKS, "lora": {}}
IO_ALIGNMENT = 4096  # the disk tier rounds each file up to this (O_DIRECT)
# An optimizer shard on disk pads each of its float32 arrays (m and v; the gradient shard beside
# it likewise) to whole 2048-element blocks, so that the update reads and writes it in aligned
# slices (memory::kUpdateSliceAlignment).
SLICE_PADDING = 2048 * 4


def assert_reads(measured, every_file_each_update, held):
    """The disk tier's bytes read before the last step's update, against each update so far
    reading every optimizer and gradient file (and `every_file_each_update` counting the reads
    between micro-batches too): each update whose first chunk was read ahead (every one but the
    last, pending) took that chunk's gradient shard from memory, and the last backward's read
    ahead of its optimizer file may be done or still on its way."""
    kept = max(held["read_aheads"] - 1, 0) * held["read_ahead_gradient_file_bytes"]
    expected = every_file_each_update - kept
    pending = held["read_ahead_optimizer_file_bytes"]
    assert measured in (expected, expected + pending), (measured, expected, pending, held)


def offload_run(launch, tmp_path, world, steps, method, fraction, precision="fp32"):
    folder = tmp_path / f"offload-{method}-{fraction}-{precision}"
    options = {**OFFLOAD_CHUNKS[method], "offload_optim_frac": fraction,
               "offload_dir": str(folder)}
    reports = run_gemini(launch, world, steps, 1, method, options, precision)
    # Each rank's scratch folder is its own and goes with the plugin.
    folders = {r["disk_during_step"]["folder"] for r in reports}
    assert len(folders) == world and all(f.startswith(str(folder)) for f in folders), folders
    assert not list(folder.glob("tessera-offload-*")), "the scratch folders outlive the run"
    return reports


@pytest.mark.parametrize("method,fraction", [
    ("full", 1.0), ("full", 0.5), ("lora", 1.0), ("lora", 0.5)])
def test_offloaded_optimizer_shards_equal_single(launch, tmp_path, method, fraction):
    # 2 ranks with a share of each rank's optimizer shards on disk train as single does with
    # accumulation 2; each rank's disk tier holds exactly the files in its folder, and its RAM
    # optimizer bytes drop by the moments it put there.
    world, steps = 2, 3
    in_memory = run_gemini(launch, world, steps, 1, method, OFFLOAD_CHUNKS[method])
    reports = offload_run(launch, tmp_path, world, steps, method, fraction)
    first = reports[0]
    assert_equals_single(first, f"gemini sharded, {method}, offload_optim_frac {fraction}")
    chosen = set()
    for report, baseline in zip(reports, in_memory):
        held, disk, during = report["gemini"], report["disk_during_step"], report["during_step"]
        all_moments = 2 * 4 * held["trainable_shard_elements"]
        assert baseline["during_step"]["optimizer"] == all_moments
        # RAM: the moments of the shards left in memory, less by exactly what went to disk, but
        # the shard read back during the last backward for the update behind the next forward
        # (full fine-tuning: the first chunk that update takes).
        ahead = held["read_ahead_moment_bytes"]
        assert (ahead > 0) == (method == "full"), held
        assert during["optimizer"] == held["moment_bytes"]
        assert during["optimizer"] == all_moments - held["offloaded_moment_bytes"] + ahead
        share = held["offloaded_moment_bytes"] / all_moments
        if fraction == 1.0:
            assert during["optimizer"] == ahead and share == 1.0
        else:
            assert 0.0 < share < 1.0 and abs(share - fraction) <= 0.25, share
        # Disk: what the tier reports is what its files take on disk: optimizer state (fp32: no
        # masters) — the moments — and beside each such shard the step's reduced gradient
        # shard, written once final (after the last micro-batch), each array padded to whole
        # slice blocks. In RAM no gradient of those chunks is left after the backward.
        assert disk["file_bytes"] == disk["used"] == disk["optimizer"] + disk["gradients"], disk
        assert disk["optimizer"] > 0 and disk["weights"] == 0, disk
        padding = disk["optimizer"] - held["offloaded_moment_bytes"]
        assert 0 <= padding < 2 * SLICE_PADDING * held["offloaded_chunks"], disk
        assert held["offloaded_gradient_bytes"] * 2 == held["offloaded_moment_bytes"], held
        padding = disk["gradients"] - held["offloaded_gradient_bytes"]
        assert 0 <= padding < SLICE_PADDING * held["offloaded_chunks"], disk
        # The read-ahead chunk's gradient shard, written, stays in memory for its update.
        assert held["read_ahead_gradient_bytes"] == ahead / 2, held
        assert during["gradients"] == held["gradient_bytes"] == (
            4 * held["trainable_shard_elements"] - held["offloaded_gradient_bytes"] + ahead / 2), (during, held)
        # Streamed through every update: measured before the last step's update, each optimizer
        # file was written at the start and by every update so far, each gradient file by every
        # backward; both read by every update so far, but the gradient file of the chunk read ahead
        # (the update takes it from memory). That chunk's optimizer file is read during the last
        # backward: that read may still be on its way.
        assert disk["bytes_written"] == steps * disk["used"], disk
        assert_reads(disk["bytes_read"], (steps - 1) * disk["used"], held)
        # The checkpoint streams the shards on disk: it holds every rank's whole moments.
        assert held["checkpoint_optimizer_bytes"] == all_moments
        # Measured before the last step's update: each update so far ran behind the next
        # forward, but LoRA's: its adapters are gathered after every update, so they are
        # updated at once.
        if method == "full":
            assert held["pipelined_chunks"] == held["offloaded_chunks"] > 0, held
            assert held["updates_behind"] == steps - 1, held
        else:
            assert held["pipelined_chunks"] == 0 and held["updates_behind"] == 0, held
        chosen.add(held["offloaded_chunks"])
        print(f"  rank {report['rank']}: optimizer in RAM {during['optimizer']} B (was "
              f"{all_moments} B), on disk {disk['optimizer']} B in {held['offloaded_chunks']} "
              f"files = {disk['file_bytes']} B measured in {disk['folder']}")
    assert len(chosen) == 1, "every rank puts the same chunks on disk"


def test_offloaded_gradient_shards_with_accumulation(launch, tmp_path):
    # Three micro-batches a step: after each backward the gradient shards of the chunks whose
    # optimizer shards are on disk go there, and the next micro-batch reads each back before it
    # adds its own, so between micro-batches no such gradient is in RAM. Counted exactly from the
    # tier's traffic, measured after the last backward of the last step (before its update).
    world, steps, accumulation = 2, 3, 3
    folder = tmp_path / "offload-accumulation"
    options = {**SMALL_CHUNKS, "offload_optim_frac": 1.0, "offload_dir": str(folder)}
    reports = run_gemini(launch, world, steps, accumulation, "full", options)
    assert_equals_single(reports[0], f"gemini sharded, offload_optim_frac 1, accumulation {accumulation}")
    for report in reports:
        held, disk, during = report["gemini"], report["disk_during_step"], report["during_step"]
        assert held["offloaded_gradient_bytes"] == 4 * held["trainable_shard_elements"] > 0, held
        # (but the shard of the chunk read ahead, kept for the update once written)
        assert held["read_ahead_gradient_bytes"] > 0, held
        assert during["gradients"] == held["gradient_bytes"] == held["read_ahead_gradient_bytes"], (during, held)
        optimizer, gradients = disk["optimizer"], disk["gradients"]
        assert disk["used"] == optimizer + gradients == disk["file_bytes"], disk
        # Written: the optimizer files at the start and by each update so far; the gradient
        # files by every backward. Read: both by each update so far, the gradient files by every
        # backward but a step's first.
        assert disk["bytes_written"] == steps * optimizer + steps * accumulation * gradients, disk
        assert_reads(disk["bytes_read"], (steps - 1) * (optimizer + gradients) + (
            steps * (accumulation - 1) * gradients), held)


def test_offloaded_bf16_masters_on_disk(launch, tmp_path):
    reports = offload_run(launch, tmp_path, 2, 3, "full", 0.5, precision="bf16")
    first = reports[0]
    assert first["loss_rel_diff"] <= 1e-3
    assert first["max_rel_diff"] <= 0.05
    for report in reports:
        held, disk = report["gemini"], report["disk_during_step"]
        # The float32 masters of the shards on disk count as weights there, not in RAM.
        assert held["offloaded_master_bytes"] * 2 == held["offloaded_moment_bytes"] > 0
        assert held["read_ahead_master_bytes"] * 2 == held["read_ahead_moment_bytes"] > 0, held
        assert held["master_bytes"] + held["offloaded_master_bytes"] == (
            4 * held["trainable_shard_elements"] + held["read_ahead_master_bytes"])
        assert disk["weights"] == held["offloaded_master_bytes"]
        assert disk["file_bytes"] == disk["used"] == disk["weights"] + disk["optimizer"] + disk["gradients"]
        assert disk["gradients"] >= held["offloaded_gradient_bytes"] > 0, (disk, held)
        assert report["during_step"]["weights"] == (
            held["parameter_shard_bytes"] + held["gathered_bytes"] + held["master_bytes"])


def test_a_full_offload_disk_names_the_folder(launch, tmp_path):
    # A tmpfs too small for the ranks' optimizer shards: the rank whose write fails exits with
    # the disk tier's error naming the folder; no rank goes on.
    mount = tmp_path / "small"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}): needs root with "
                    "CAP_SYS_ADMIN")
    try:
        options = {**SMALL_CHUNKS, "offload_optim_frac": 1.0, "offload_dir": str(mount)}
        ranks = launch(2, 2, 1, 0, "full", "fp32", "gemini", json.dumps(options), timeout_s=10)
        codes = ranks.wait(range(2), within_s=60)
        assert all(code != 0 for code in codes.values()), ranks.describe()
        errors = [ranks.output(rank, "err") for rank in range(2)]
        named = [e for e in errors if f"offload folder {mount} is full" in e]
        assert named, errors
        print(f"  {named[0].splitlines()[0]}")
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# --- the parameter shards in the disk tier (offload_param_frac) ----------------------------------

@pytest.mark.parametrize("method,precision", [("full", "fp32"), ("lora", "fp32"), ("full", "bf16")])
def test_offloaded_parameter_shards_equal_single(launch, tmp_path, method, precision):
    # 2 ranks with half of each rank's parameter shards (and for full fine-tuning, all of its
    # optimizer shards) on disk train as single does with accumulation 2; the parameter shards
    # in RAM drop by exactly what went to disk, which is in the tier's files.
    world, steps = 2, 3
    folder = tmp_path / f"param-offload-{method}-{precision}"
    # 8 chunks in either precision (64 KiB of fp32, 32 KiB of bf16), so that some are released
    # (at most 4 are gathered) and their shards leave RAM.
    options = {"chunk_size": 65536 if precision == "fp32" else 32768, "offload_param_frac": 0.5,
               "offload_dir": str(folder)}
    if method == "full":
        options["offload_optim_frac"] = 1.0
    reports = run_gemini(launch, world, steps, 1, method, options, precision)
    first = reports[0]
    if precision == "fp32":
        assert_equals_single(first, f"gemini sharded, {method}, offload_param_frac 0.5")
    else:
        assert first["moved"] > 1e-3
        assert first["loss_rel_diff"] <= 1e-3 and first["max_rel_diff"] <= 0.05
    element = 4 if precision == "fp32" else 2
    chosen = set()
    for report in reports:
        held, disk, during = report["gemini"], report["disk_during_step"], report["during_step"]
        all_shards = element * held["shard_elements"]
        share = held["offloaded_parameter_bytes"] / all_shards
        assert 0.0 < share < 1.0 and abs(share - 0.5) <= 0.25, share
        # RAM: the shards left in memory (those of gathered chunks are read back while gathered).
        assert held["parameter_shard_bytes"] < all_shards, (held, during)
        assert during["weights"] == (held["parameter_shard_bytes"] + held["gathered_bytes"]
                                     + held["master_bytes"]), report
        # Disk: the parameter shards count as weights, each file rounded up to the I/O alignment,
        # and the tier's report is what its files take.
        masters_on_disk = held["offloaded_master_bytes"]
        padding = disk["weights"] - masters_on_disk - held["offloaded_parameter_bytes"]
        files = held["offloaded_parameter_chunks"] + held["offloaded_chunks"]
        assert 0 <= padding < IO_ALIGNMENT * held["offloaded_parameter_chunks"], disk
        assert disk["file_bytes"] == disk["used"] == (
            disk["weights"] + disk["optimizer"] + disk["gradients"]), disk
        assert disk["bytes_read"] > 0 and files > 0
        chosen.add(held["offloaded_parameter_chunks"])
        print(f"  rank {report['rank']}: parameter shards in RAM {held['parameter_shard_bytes']} B "
              f"of {all_shards} B, on disk {held['offloaded_parameter_bytes']} B in "
              f"{held['offloaded_parameter_chunks']} files; tier {disk['file_bytes']} B measured")
    assert len(chosen) == 1, "every rank puts the same chunks on disk"
    assert not list(folder.glob("tessera-offload-*")), "the scratch folders outlive the run"


@pytest.mark.parametrize("budget", ["64GiB", "1MiB"], ids=["roomy", "tight"])
def test_auto_placement_keeps_what_the_budget_allows(launch, tmp_path, budget):
    # Placement auto: every parameter shard has its file; after the first step each rank keeps in
    # memory as many shards as its share of host_budget leaves beside its measured peak — all of
    # them under a roomy budget, only those of the gathered chunks (4) under a tight one. The
    # losses equal single's either way.
    world, steps = 2, 3
    folder = tmp_path / f"auto-{budget}"
    options = {**SMALL_CHUNKS, "placement": "auto", "host_budget": budget,
               "offload_dir": str(folder)}
    reports = run_gemini(launch, world, steps, 1, "full", options)
    first = reports[0]
    assert first["max_rel_diff"] <= FP32_BOUND and first["loss_rel_diff"] <= FP32_BOUND
    for report in reports:
        held, disk = report["gemini"], report["disk_during_step"]
        # Every chunk's shard on disk (fp32: no masters; the optimizer stays in memory).
        assert held["offloaded_parameter_bytes"] == 4 * held["shard_elements"], held
        assert disk["file_bytes"] == disk["used"] == disk["weights"] > 0, disk
        assert held["parameter_shard_bytes"] == held["cached_parameter_bytes"]
        print(f"  rank {report['rank']}, host_budget {budget}: {held['cached_parameter_bytes']} B of "
              f"{held['offloaded_parameter_bytes']} B of shards in memory (limit "
              f"{held['cached_parameter_limit']} of {held['offloaded_parameter_chunks']} chunks)")
        if budget == "64GiB":
            assert held["cached_parameter_limit"] == held["offloaded_parameter_chunks"] == held["chunks"]
            assert held["cached_parameter_bytes"] == held["offloaded_parameter_bytes"]
        else:
            assert held["cached_parameter_limit"] == MAX_GATHERED < held["chunks"]
            assert held["cached_parameter_bytes"] < held["offloaded_parameter_bytes"]


def test_auto_placement_refuses_a_fixed_parameter_share(launch):
    ranks = launch(2, 1, 1, 0, "full", "fp32", "gemini",
                   json.dumps({"placement": "auto", "offload_param_frac": 0.5}))
    codes = ranks.wait(range(2), within_s=60)
    assert codes == {0: 4, 1: 4}, ranks.describe()  # the tool exits 4 on an error
    error = ranks.output(0, "err")
    assert "offload_param_frac" in error and "auto" in error, error


def test_killed_rank_is_named(launch):
    world, victim = 2, 1
    ranks = launch(world, 0, 1, 0, "full", "fp32", "gemini", json.dumps(SMALL_CHUNKS))
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


# --- whole jobs through `tessera-cli launch`: checkpoints across layouts and the export --------

from test_launch import cli, events_of, job, losses_of, run_job, workdir  # noqa: E402,F401 (fixture)
from safetensors.numpy import load_file  # noqa: E402

# The same micro-batches per step in float32, summed in another order: the last bits differ.
LOSS_BOUND = 1e-5


def gemini_job(workdir, name, steps, strategy, accumulation, out=None, eval_every=0):
    path = job(workdir, name, strategy=strategy, steps=steps, accumulation=accumulation,
               eval_every=eval_every)
    spec = json.loads(path.read_text())
    # 12 of the 64 rows validate: 6 evaluation batches, which 4 ranks share unevenly (a rank past
    # the end still runs a forward, as the sharded chunks are gathered by every rank).
    spec["dataset"]["validation_split"] = 0.1875
    if out is not None:
        spec["output"]["dir"] = str(out)
    path.write_text(json.dumps(spec))
    return path


def test_checkpoint_at_2_ranks_resumes_on_1_and_on_4(workdir):
    # Steps 1-2: gemini sharded on 2 ranks (accumulation 2); 3-4: gemini in one process
    # (accumulation 4); 5-6: gemini sharded on 4 ranks (accumulation 1, an evaluation every 3
    # steps: every rank gathers in each forward). Each resumes from the last layout's checkpoint;
    # every step's loss equals an uninterrupted `single` run's with accumulation 4.
    reference = gemini_job(workdir, "gemini-reference", 6, "single", 4)
    run_job(reference, 1)
    out = workdir / "gemini-chain"
    run_job(gemini_job(workdir, "gemini-chain", 2, "gemini", 2), 2)
    first = out / "checkpoint-2"
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["state_layout"] == "sharded" and manifest["world_size"] == 2
    kept = workdir / "gemini-checkpoint-2"  # the later stages prune it from the run folder
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(first, kept)
    first = kept
    run_job(gemini_job(workdir, "gemini-chain", 4, "gemini", 4, out=out), 1, resume=out)
    run_job(gemini_job(workdir, "gemini-chain", 6, "gemini", 1, out=out, eval_every=3), 4,
            resume=out)
    expected = losses_of(events_of(workdir / "gemini-reference" / "events.jsonl"))
    events = events_of(out / "events.jsonl")
    got = losses_of(events)
    assert len(expected) == 6 and len(got) == 6, (expected, got)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, expected))
    print(f"losses gemini 2 ranks -> 1 -> 4 ranks vs single: {worst:.2e} relative")
    assert worst <= LOSS_BOUND, (got, expected)
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert any("saved by 2 processes, this run has 1" in m for m in logs), logs
    assert any("saved by 1 process, this run has 4" in m for m in logs), logs
    evaluations = [e for e in events if e["type"] == "metric" and "eval_loss" in e]
    assert len(evaluations) >= 2, "the 4-rank stage evaluates at step 6 and at the end"

    # The 2-rank checkpoint resumes on `single` too, with the same losses as the chain.
    on_single = workdir / "gemini-on-single"
    run_job(gemini_job(workdir, "gemini-on-single", 4, "single", 4), 1, resume=first)
    resumed = losses_of(events_of(on_single / "events.jsonl"))
    assert len(resumed) == 2
    for a, b in zip(resumed, got[2:4]):
        assert abs(a - b) / abs(b) <= LOSS_BOUND, (resumed, got)

    # The export gathers the shards: the 4-rank run's model equals, byte for byte, what `single`
    # exports from the same (4-rank, sharded) checkpoint.
    exported = load_file(str(out / "model" / "model.safetensors"))
    again = workdir / "gemini-export-single"
    run_job(gemini_job(workdir, "gemini-export-single", 6, "single", 4), 1,
            resume=out / "checkpoint-6")
    reference_export = load_file(str(again / "model" / "model.safetensors"))
    assert exported.keys() == reference_export.keys()
    for key, value in reference_export.items():
        assert value.tobytes() == exported[key].tobytes(), f"{key} differs"


def test_offloaded_checkpoint_at_2_ranks_resumes_on_single(workdir):
    # Steps 1-2: gemini on 2 ranks (accumulation 1 each) with every optimizer shard and half of
    # the parameter shards on disk (the checkpoint reads both from their files, the export
    # gathers from them); 3-4: `single` (accumulation 2) from its checkpoint. Every loss equals
    # an uninterrupted `single` run's with accumulation 2. The 2-rank run's disk events list each
    # rank's own tier.
    reference = gemini_job(workdir, "offload-reference", 4, "single", 2)
    run_job(reference, 1)
    out = workdir / "offload-2-ranks"
    spec_path = gemini_job(workdir, "offload-2-ranks", 2, "gemini", 1)
    spec = json.loads(spec_path.read_text())
    spec["strategy"]["options"].update({"offload_optim_frac": 1.0, "offload_param_frac": 0.5,
                                        "chunk_size": 65536,
                                        "offload_dir": str(workdir / "offload-scratch")})
    spec["training"]["log_every"] = 1
    spec_path.write_text(json.dumps(spec))
    run_job(spec_path, 2)
    events = events_of(out / "events.jsonl")
    disk_events = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"]
    host_events = [e for e in events if e["type"] == "memory" and e["tier"] == "host"]
    assert disk_events and host_events, "no memory events"
    for disk, host in zip(disk_events, host_events):
        assert [r["rank"] for r in disk["ranks"]] == [0, 1]
        for rank_disk, rank_host in zip(disk["ranks"], host["ranks"]):
            # Every optimizer shard on disk: none in RAM, all of it (moments and the padding of
            # the files) in the rank's tier, beside the parameter shards (weights) and, once a
            # backward has written them, the gradient shards.
            assert rank_host["by_category"]["optimizer"] == 0, host
            assert rank_disk["by_category"]["optimizer"] > 0 and rank_disk["by_category"]["weights"] > 0, disk
            assert sum(rank_disk["by_category"][k] for k in ("optimizer", "weights", "gradients")) == (
                rank_disk["used"]), disk
        assert disk["ranks"][0]["used"] == disk["used"]
    print("  disk tier per rank: " + ", ".join(
        f"rank {r['rank']} {r['used']} B" for r in disk_events[-1]["ranks"]))
    checkpoint = out / "checkpoint-2"
    assert json.loads((checkpoint / "manifest.json").read_text())["world_size"] == 2
    resumed = workdir / "offload-on-single"
    run_job(gemini_job(workdir, "offload-on-single", 4, "single", 2), 1, resume=checkpoint)
    expected = losses_of(events_of(workdir / "offload-reference" / "events.jsonl"))
    got = losses_of(events) + losses_of(events_of(resumed / "events.jsonl"))
    assert len(expected) == 4 and len(got) == 4, (expected, got)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, expected))
    print(f"losses gemini 2 ranks (optimizer and parameters on disk) -> single vs single: {worst:.2e} relative")
    assert worst <= LOSS_BOUND, (got, expected)
