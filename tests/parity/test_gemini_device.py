"""Gemini's device tier, on the simulated device (engine/train/device_tier.h: host memory with a
byte budget, its own copy thread, NaN in a copy's destination until its event): parameter chunks
on the device, kept in host memory or on disk and brought up block by block (prefetched in the traced
order, evicted under the budget), optimizer chunks updated on the device (torch's ops) or in host
memory or on disk (the CPU Adam, gradients copied down as they arrive): 20 steps of
`tessera-cli run` give the losses of the same job under `single` within 1e-5 relative, full and
LoRA, fp32 and bf16, on one process and on 2 ranks. The `memory` events' device tier is what the chunks hold, counted from
transformers' parameter count; a budget too small ends with exit 2 naming the tier, the chunk and
the figures; without the tests' variable the simulated device is refused."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from test_gemini import assert_same_losses, checkpointed_spec, cli, run, spec_for, workdir  # noqa: F401 (fixture)

SIMULATED = dict(os.environ, TESSERA_SIMULATED_DEVICE="1")

PLACEMENTS = {
    # everything on the device: the device Adam on every chunk
    "device": {},
    # half the parameters in host memory, streamed through a small cache; the optimizer split
    # between the device, host memory and disk (the hybrid Adam)
    "hybrid": {"host_param_frac": 0.5, "host_optim_frac": 0.4, "offload_optim_frac": 0.3,
               "chunk_size": "160KiB"},
    # every parameter chunk fetched from host memory and every update on the host
    "host": {"host_param_frac": 1.0, "host_optim_frac": 1.0, "chunk_size": "160KiB"},
    # parameter chunks in all three tiers: a third on disk (read into host memory, copied up,
    # copied back and written when changed), a third in host memory, a third on the device
    "disk": {"offload_param_frac": 0.35, "host_param_frac": 0.35, "host_optim_frac": 0.5,
             "offload_optim_frac": 0.25, "chunk_size": "160KiB"},
}


# Every parameter shard, its optimizer state and gradients in host memory (the device
# holds the gathered chunks and the gradient chunks being reduced).
HOST_SHARDS = {"host_param_frac": 1.0, "host_optim_frac": 1.0}


def device_options(extra, budget="64MiB"):
    return {"device": "simulated", "device_budget": budget, **extra}


# Each family, precision and method appears twice (the pairs cover llama and gpt2 in fp32 and
# bf16, full and LoRA; every combination of the three would double the time for no new path).
@pytest.mark.parametrize("family, precision, method", [
    ("llama", "fp32", "full"), ("gpt2", "bf16", "full"), ("llama", "bf16", "lora"), ("gpt2", "fp32", "lora"),
])
def test_device_tier_follows_single(workdir, family, precision, method):
    base = f"dev-{family}-{precision}-{method}"
    reference, _ = run(spec_for(workdir, family, f"{base}-single", "single", method=method, precision=precision))
    for name, options in PLACEMENTS.items():
        spec = spec_for(workdir, family, f"{base}-{name}", "gemini", device_options(options), method=method,
                        precision=precision)
        ours, events = run(spec, env=SIMULATED)
        assert_same_losses(ours, reference, f"{base} {name}")
        device = [e for e in events if e["type"] == "memory" and e.get("tier") == "device"]
        assert device and all(e["device"] == "simulated" and e["simulated"] for e in device), base
        assert all(e["budget"] == 64 << 20 for e in device), device[-1]  # device_budget
        moved = device[-1]["traffic"]["to_device_bytes"]
        if name == "device":
            assert moved == 0, f"{base} {name}: chunks moved though all live on the device"
        else:
            # Streamed parameter chunks came up more than once per step (forward, backward).
            assert moved > 20 * 2 * 1024, f"{base} {name}: only {moved} bytes came to the device"
        # The CPU Adam of shards whose parameters and optimizer state are both in host memory
        # (every shard under "host"; "hybrid" may place none so) runs behind the next forward in
        # full fine-tuning (LoRA's adapters are gathered after every update); not with
        # parameter shards on disk, nor with every shard on the device.
        logs = [e.get("message", "") for e in events if e["type"] == "log"]
        behind = [m for m in logs if "(the CPU Adam's) runs behind the next forward" in m]
        if method == "full" and name == "host":
            assert behind, f"{base} {name}: the update was not pipelined"
        elif method == "lora" or name in ("device", "disk"):
            assert not behind, f"{base} {name}: {behind}"
        if "offload_optim_frac" in options and method == "full":  # LoRA's adapters: one chunk
            assert any(e.get("tier") == "disk" for e in events if e["type"] == "memory"), base
        if name == "disk":
            # A third of the parameter chunks live in files of the disk tier (counted from
            # transformers' parameter count) and were read back as blocks needed them.
            params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(workdir / family).parameters())
            element = 2 if precision == "bf16" else 4
            disk = [e for e in events if e["type"] == "memory" and e.get("tier") == "disk"][-1]
            assert disk["by_category"]["weights"] >= 0.25 * params * element, (disk, params)
            if method == "full":  # LoRA's streamed chunks fit the device's cache: read once
                assert disk["traffic"]["read_bytes"] >= 20 * 0.25 * params * element, disk["traffic"]
            else:
                assert disk["traffic"]["read_bytes"] > 0, disk["traffic"]


@pytest.mark.parametrize("quantize", ["nf4", "int8"])
def test_qlora_on_the_device_tier_follows_single(workdir, quantize):
    """QLoRA under gemini's device tier: the quantized base computes where the chunks do (the
    simulated device computes in host memory, so there; on a GPU the plugin moves it there, run
    by tests/gpu/run.sh), the chunks streamed and updated by the hybrid Adam: the losses of the
    same QLoRA job under `single`. The host tier of the memory events holds the base's codes and
    scales, which the log's figure gives."""
    extra = ("--quantize", quantize) + (("--double-quant",) if quantize == "nf4" else ())
    base = f"dev-qlora-{quantize}"
    reference, _ = run(spec_for(workdir, "llama", f"{base}-single", "single", method="lora", extra=extra))
    options = device_options(PLACEMENTS["hybrid"])
    ours, events = run(spec_for(workdir, "llama", f"{base}-gemini", "gemini", options, method="lora", extra=extra),
                       env=SIMULATED)
    assert_same_losses(ours, reference, f"{base} hybrid placement")
    logs = [e["message"] for e in events if e["type"] == "log"]
    quantized = next(m for m in logs if m.startswith("quantized ") and f"linear weights to {quantize}" in m)
    memory = [e for e in events if e["type"] == "memory"]
    device = [e for e in memory if e.get("tier") == "device"]
    assert device and device[-1]["simulated"], memory[-2:]
    host = memory[memory.index(device[-1]) + 1]
    assert host["tier"] == "host", host
    figure, unit = quantized.split("(")[-1].rstrip(")").split()
    base_bytes = float(figure) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[unit]
    assert host["by_category"]["weights"] >= 0.99 * base_bytes, (quantized, host["by_category"])


def test_device_tier_holds_what_the_chunks_hold(workdir):
    """Everything on the device, fp32, full: the tier holds the parameter chunks (every
    parameter, rounded up to whole chunks) and the optimizer chunks (m and v of every trainable
    parameter), and nothing else: its categories add up to its used bytes."""
    spec = spec_for(workdir, "llama", "dev-account", "gemini", device_options({}), steps=3)
    _, events = run(spec, env=SIMULATED)
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(workdir / "llama").parameters())
    device = [e for e in events if e["type"] == "memory" and e.get("tier") == "device"][-1]
    host = [e for e in events if e["type"] == "memory" and e.get("tier") == "host"][-1]
    cats = device["by_category"]
    assert cats["optimizer"] == params * 8, cats
    # Chunks waste their tails (whole tensors per chunk, and a model this small still gets 8
    # chunks to stream): under a quarter here.
    assert params * 4 <= cats["weights"] <= params * 4 * 1.25, cats
    assert cats["weights"] + cats["optimizer"] + cats["gradients"] == device["used"], device
    assert device["total"] == 64 << 20
    # The host tier holds none of the chunks.
    assert host["by_category"]["weights"] == 0 and host["by_category"]["optimizer"] == 0, host


def test_a_device_budget_too_small_ends_with_exit_2(workdir):
    spec = spec_for(workdir, "llama", "dev-small", "gemini", device_options({}, budget="256KiB"), steps=2)
    r = cli("run", spec, env=SIMULATED)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "simulated: out of memory for" in r.stderr and "256.0 KiB" in r.stderr, r.stderr[-2000:]


def test_the_simulated_device_is_for_tests_only(workdir):
    spec = spec_for(workdir, "llama", "dev-refused", "gemini", device_options({}), steps=2)
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_SIMULATED_DEVICE"}
    r = cli("run", spec, env=env)
    assert r.returncode == 2
    assert 'strategy.options.device is "simulated"' in r.stderr, r.stderr[-2000:]


def assert_checkpoints_move_both_ways(workdir, prefix, strategy, options, label, precision="bf16"):
    """`strategy` with `options` on the simulated device resumed from single's checkpoint-5, and
    single resumed from its checkpoint-10, continue single's straight 15 steps."""
    def job(name, strategy, options=None, resume=None):
        return checkpointed_spec(workdir, name, strategy, options, resume, precision=precision)

    straight, _ = run(job(f"{prefix}-single", "single"))
    middle, _ = run(job(f"{prefix}-{strategy}", strategy, options,
                        resume=workdir / f"{prefix}-single" / "checkpoint-5"), env=SIMULATED)
    last, _ = run(job(f"{prefix}-back", "single", resume=workdir / f"{prefix}-{strategy}" / "checkpoint-10"))
    assert_same_losses({s: middle[s] for s in range(6, 16)}, {s: straight[s] for s in range(6, 16)},
                       f"{label} from single's checkpoint")
    assert_same_losses({s: last[s] for s in range(11, 16)}, {s: straight[s] for s in range(11, 16)},
                       f"single from {label}'s checkpoint")


def test_device_tier_checkpoints_resume_the_same_trajectory(workdir):
    """Checkpoints of the device tier hold what single's do: a hybrid run resumed from single's
    checkpoint-5, and single resumed from the hybrid run's checkpoint-10, continue single's
    straight 15 steps (bf16: masters on the device and in host memory)."""
    assert_checkpoints_move_both_ways(workdir, "dev-move", "gemini", device_options(PLACEMENTS["hybrid"]),
                                      "the device tier")


def launch_2(spec, env=None):
    events_path = spec.with_suffix(".events.jsonl")
    r = cli("launch", "--nproc", 2, spec, "--events", events_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    return {e["step"]: e["loss"] for e in events if e["type"] == "metric" and "loss" in e}, events


def trainable_parameters(workdir, method, lora_run="dev-ranks-lora-cpu"):
    """Full: transformers' parameter count; LoRA: the adapter file `lora_run` exported."""
    if method == "full":
        return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(workdir / "llama").parameters())
    adapter = workdir / lora_run / "adapter" / "adapter_model.safetensors"
    return sum(t.numel() for t in load_file(adapter).values())


@pytest.mark.parametrize("method", ["full", "lora"])
def test_two_ranks_gather_their_chunks_into_device_memory(workdir, method):
    """`gemini` sharded over 2 ranks with the device tier, as on GPUs: each rank copies its
    parameter shard up, the all-gather fills the chunk in device memory, the gradient chunk is
    reduce-scattered there and only the rank's shard of it comes down (the shards, their
    gradients and the optimizer stay in host memory, here with part of the optimizer on disk):
    20 steps give the losses of the same 2-rank job on the CPU exactly (which
    integration_gemini_sharded holds to `single`); the device tier holds the gathered chunks, the
    shards on their way up and the gradient chunks, and nothing else; and what came down is each
    step's half of the trainable parameters' gradients (counted from transformers' parameter
    count and the adapter's file)."""
    placement = {"offload_optim_frac": 0.5, "chunk_size": "160KiB"}
    reference, _ = launch_2(spec_for(workdir, "llama", f"dev-ranks-{method}-cpu", "gemini", placement,
                                     method=method))
    ours, events = launch_2(spec_for(workdir, "llama", f"dev-ranks-{method}", "gemini",
                                     device_options({**HOST_SHARDS, **placement, "host_optim_frac": 0.5},
                                                    budget="4MiB"), method=method),
                            env=SIMULATED)
    assert_same_losses(ours, reference, f"2 ranks, device tier, {method}")
    device = [e for e in events if e["type"] == "memory" and e.get("tier") == "device"]
    assert device and all(e["device"] == "simulated" for e in device), device[:1]
    # At most the gathered chunks (four, and LoRA's adapters kept whole) of 160 KiB or less and
    # their shards on the way up.
    assert all(e["by_category"]["weights"] <= 6 * 160 * 1024 * 1.5 for e in device), device[-1]
    # Used is what the chunks hold, give or take one shard on its way up: Gloo's thread lets go
    # of a finished all-gather's input a moment after the collective is done.
    held = lambda m: m["by_category"]["weights"] + m["by_category"]["gradients"]  # noqa: E731
    for report in [e for e in device] + [r for e in device for r in e["ranks"]]:
        assert held(report) <= report["used"] <= held(report) + 80 * 1024, report
    assert all(e["by_category"]["optimizer"] == 0 for e in device), device[-1]
    # Down: rank 0's shard of every trainable chunk's gradients, each of the 20 steps (the chunks'
    # padded tails: under 5 %, and LoRA's one chunk of adapters padded to an even count).
    down = device[-1]["traffic"]["to_host_bytes"]  # rank 0's
    expected = 20 * trainable_parameters(workdir, method) * 4 / 2
    assert expected <= down <= expected * 1.05, (down, expected)


def test_two_ranks_on_a_device_with_accumulation_recomputation_and_bf16(workdir):
    """The same 2-rank device tier in bf16 with three micro-batches per step (the later
    micro-batches' gradient shards copied down into buffers and added on the host) and
    activation checkpointing (each layer's chunks gathered again inside backward): the losses
    of the 2-rank job on the CPU exactly, and the exported model equal to its tensor for
    tensor (gathered from the ranks' host shards for the export)."""
    def spec(name, options):
        return spec_for(workdir, "llama", name, "gemini", options, precision="bf16", steps=6,
                        training={"gradient_accumulation": 3, "batch_size": 2, "activation_checkpointing": True})

    placement = {"chunk_size": "160KiB"}
    reference, _ = launch_2(spec("dev-ranks-acc-cpu", placement))
    ours, _ = launch_2(spec("dev-ranks-acc", device_options({**placement, **HOST_SHARDS}, budget="4MiB")),
                       env=SIMULATED)
    assert_same_losses(ours, reference, "2 ranks, device tier, bf16, accumulation 3, recomputation")
    mine = load_file(workdir / "dev-ranks-acc" / "model" / "model.safetensors")
    theirs = load_file(workdir / "dev-ranks-acc-cpu" / "model" / "model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), name


@pytest.mark.parametrize("method", ["full", "lora"])
def test_one_process_follows_single_in_every_placement(workdir, method):
    """One process (a group of one), on the CPU and on the simulated device with its shards on the
    device, in host memory, or split (the hybrid Adam: part of the optimizer shards updated on the
    device, part on the host, part streamed from disk), with three micro-batches and
    recomputation: `single`'s losses (fp32, 1e-5 relative) and its exported model within float
    rounding. A group of one gathers a chunk as its shard's own memory where the shard is where it
    computes: on the CPU the weights in host memory are the parameters' bytes once, not twice, and
    with everything on the device nothing crosses to or from it."""
    def spec(name, strategy, options):
        return spec_for(workdir, "llama", name, strategy, options, method=method, steps=6,
                        training={"gradient_accumulation": 3, "batch_size": 2, "activation_checkpointing": True})

    reference, _ = run(spec(f"dev-solo-{method}-single", "single", {}))
    for name, options, env in [("cpu", {"chunk_size": "160KiB"}, None),
                               ("device", device_options({"chunk_size": "160KiB"}, budget="8MiB"), SIMULATED),
                               ("host", device_options({"chunk_size": "160KiB", **HOST_SHARDS}, budget="4MiB"),
                                SIMULATED),
                               ("hybrid", device_options(PLACEMENTS["hybrid"], budget="8MiB"), SIMULATED)]:
        ours, events = run(spec(f"dev-solo-{method}-{name}", "gemini", options), env=env)
        assert_same_losses(ours, reference, f"one process, {name}, {method}")
        memory = [e for e in events if e["type"] == "memory"]
        device = [e for e in memory if e.get("tier") == "device"]
        # Only the simulated runs have a device tier.
        assert bool(device) == (name != "cpu")
        if name == "cpu" and method == "full":
            weights = {e["by_category"]["weights"] for e in memory if e.get("tier") == "host"}
            assert weights == {4 * trainable_parameters(workdir, "full")}, weights
        if name == "device":
            # The shards are the chunks, the optimizer and gradient shards beside them: nothing
            # moved, no optimizer state in host memory, the moments of every trainable parameter
            # (rounded up to whole chunks) on the device.
            traffic = device[-1]["traffic"]
            assert traffic["to_device_bytes"] == traffic["to_host_bytes"] == 0, traffic
            assert all(e["by_category"]["optimizer"] == 0 for e in memory if e.get("tier") == "host")
            moments = max(e["by_category"]["optimizer"] for e in device)
            trainable = trainable_parameters(workdir, method, f"dev-solo-{method}-single")
            assert 8 * trainable <= moments <= 8 * trainable * 1.05, (moments, trainable)
        if name == "hybrid" and method == "full":  # (LoRA's adapters: a chunk or two)
            # Each tier updates its share: moments on the device, in host memory and on disk.
            for tier in ("device", "host", "disk"):
                assert max(e["by_category"]["optimizer"] for e in memory if e.get("tier") == tier) > 0, tier
            assert device[-1]["traffic"]["to_device_bytes"] > 0 and device[-1]["traffic"]["to_host_bytes"] > 0
        mine = load_file(workdir / f"dev-solo-{method}-{name}" / "model" / "model.safetensors")
        theirs = load_file(workdir / f"dev-solo-{method}-single" / "model" / "model.safetensors")
        for key, tensor in theirs.items():
            differs = (mine[key] - tensor).abs()
            assert torch.allclose(mine[key], tensor, rtol=1e-4, atol=1e-6), \
                (f"{name}: {key}: max |difference| {differs.max().item():.3e} at {divmod(differs.argmax().item(), tensor.shape[-1])} "
                 f"(single's value there {tensor.flatten()[differs.argmax()].item():.6e}); losses {ours} against {reference}")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_ranks_keep_their_shards_on_the_device(workdir, precision):
    """2 ranks with their shards on the device (the default there, as ZeRO-3 on GPUs), and with
    the hybrid split (half the parameter shards in host memory, the optimizer shards between the
    device, host memory and disk): the losses of the same 2-rank job on the CPU (1e-5 relative;
    torch's fused AdamW on the device shards, the CPU Adam on the others). With everything on
    the device, each rank's device holds its shard of every parameter (and its float32 masters
    in bf16) and the moments of its shard of every trainable parameter, and nothing crosses to
    or from the host (the chunks gather on the device); the hybrid split moves values both ways."""
    placement = {"chunk_size": "160KiB"}
    reference, _ = launch_2(spec_for(workdir, "llama", f"dev-ranks-shards-{precision}-cpu", "gemini", placement,
                                     precision=precision, steps=6))
    params = trainable_parameters(workdir, "full")
    element = 2 if precision == "bf16" else 4
    # (In bf16 chunks of half the bytes hold as many elements: the hybrid's shares split alike.)
    hybrid = {**PLACEMENTS["hybrid"], "chunk_size": "80KiB" if precision == "bf16" else "160KiB"}
    for name, options in [("device", placement), ("hybrid", hybrid)]:
        ours, events = launch_2(spec_for(workdir, "llama", f"dev-ranks-shards-{precision}-{name}", "gemini",
                                         device_options(options, budget="8MiB"), precision=precision, steps=6),
                                env=SIMULATED)
        assert_same_losses(ours, reference, f"2 ranks, shards on the device ({name}, {precision})")
        device = [e for e in events if e["type"] == "memory" and e.get("tier") == "device"]
        # (The training state goes before the export: the largest figures are the training's.)
        host_moments = max(e["by_category"]["optimizer"] for e in events
                           if e["type"] == "memory" and e.get("tier") == "host")
        traffic = device[-1]["traffic"]
        moments = max(e["by_category"]["optimizer"] for e in device)
        if name == "device":
            assert traffic["to_device_bytes"] == traffic["to_host_bytes"] == 0, traffic
            assert host_moments == 0
            # Rank 0's half of every chunk (padded: within 5 %).
            assert 8 * params / 2 <= moments <= 8 * params / 2 * 1.05, (moments, params)
            shards = element * params / 2 + (4 * params / 2 if precision == "bf16" else 0)
            weights = min(e["by_category"]["weights"] for e in device)
            assert shards <= weights, (weights, shards)
        else:
            assert traffic["to_device_bytes"] > 0 and traffic["to_host_bytes"] > 0, traffic
            assert 0 < moments < 8 * params / 2 and host_moments > 0, (moments, host_moments)
        # The device holds what the plugin counts (give or take a shard on its way up).
        for report in device + [r for e in device for r in e["ranks"]]:
            held = sum(report["by_category"][k] for k in ("weights", "gradients", "optimizer"))
            assert held <= report["used"] <= held + 80 * 1024, report


@pytest.mark.parametrize("budget, all_move, optimizer, method", [
    # the optimizer shards on the device (fp32 shards in host memory are copied up for their update)
    ("8MiB", True, {}, "full"), ("2400KiB", False, {}, "full"),
    # in host memory: the moved shards' float32 masters come (the CPU Adam writes new values up)
    ("4MiB", True, {"host_optim_frac": 1.0}, "full"),
    # LoRA's adapter chunks, kept whole, are gathered again from their moved shards
    ("8MiB", True, {}, "lora"),
])
def test_two_ranks_on_a_device_with_placement_auto(workdir, budget, all_move, optimizer, method):
    """Placement auto with a device on 2 ranks: every parameter shard starts in host memory (none
    on disk), and after the first step as many move to the device as its measured peak leaves
    room for in the budget: all of them in 8 MiB, some in 2400 KiB (the first step peaks near 1.8 MiB). The losses of the same 2-rank
    job on the CPU; host memory's parameter bytes drop by the shards that moved (the log says how
    many), and once all have moved nothing goes up any more."""
    placement = {"placement": "auto", "chunk_size": "160KiB"}
    name = f"dev-ranks-auto-{budget}-{len(optimizer)}-{method}"
    reference, _ = launch_2(spec_for(workdir, "llama", f"{name}-cpu", "gemini", placement, steps=6, method=method))
    ours, events = launch_2(spec_for(workdir, "llama", name, "gemini",
                                     device_options({**placement, **optimizer}, budget=budget), steps=6,
                                     method=method),
                            env=SIMULATED)
    assert_same_losses(ours, reference, f"2 ranks, device tier, placement auto, {budget}")
    memory = [e for e in events if e["type"] == "memory"]
    assert not any(e["by_category"]["weights"] for e in memory if e.get("tier") == "disk")
    moved = [e["message"] for e in events if e["type"] == "log" and "placement auto" in e.get("message", "")]
    assert len(moved) == 1, moved
    count, of = (int(w) for w in moved[0].split(": ")[1].split()[:3:2])
    assert (count == of) if all_move else (0 < count < of), moved[0]
    # Host memory keeps the parameter shards that did not move (rank 0's half of every chunk
    # before the first step): none when all did.
    shards = 4 * trainable_parameters(workdir, "full") / 2
    masters = shards if optimizer else 0  # fp32 masters beside host moments once shards move
    host = [e["by_category"]["weights"] for e in memory if e.get("tier") == "host"]
    if method == "lora":  # the base and the adapters: every shard moved, nothing else to count
        assert host[-1] == 0, host
        return
    assert shards <= host[0] <= shards * 1.05, (host, shards)
    if all_move and optimizer:
        # The masters, and the CPU Adam's staging from the first update on the device: two
        # buffers of the largest shard (half of a 160 KiB chunk).
        staging = host[-1] - masters
        assert 0 < staging <= 2 * 160 * 1024 // 2, (host, shards)
    else:
        assert (host[-1] == masters) if all_move else (0 < host[-1] < shards), (host, shards)
    device = [e for e in memory if e.get("tier") == "device"]
    # The first step copied shards up for its gathers; with all of them on the device, each later
    # step sends up only what the CPU Adam made (every shard's new values), or nothing.
    went_up = [e["traffic"]["to_device_bytes"] for e in device]
    later = [b - a for a, b in zip(went_up[1:], went_up[2:])]
    assert went_up[1] > 0 and later, went_up
    if all_move and optimizer:
        # The CPU Adam runs behind the next forward and sends each shard's new values up as it
        # goes: a step's memory event finds part of its update sent (none in the step the shards
        # moved), the run's last one all of them — every shard's new values once per update.
        assert sum(later) == len(later) * shards, (went_up, later, shards)
        assert all(0 <= d <= 2 * shards for d in later), (went_up, later, shards)
    elif all_move:
        assert all(d == 0 for d in later), (went_up, shards)
    else:
        assert all(d > 0 for d in later), went_up


@pytest.mark.parametrize("method", ["full", "lora"])
def test_device_tier_with_recomputation_accumulation_and_export(workdir, method):
    """The hybrid split with activation checkpointing (each layer's forward runs again inside
    backward and brings its chunks up again) and three micro-batches per step (host gradients
    added on the host after the first is copied down): `single`'s losses, and the exported model
    (read from the device and from host memory) equal to `single`'s tensor for tensor."""
    def spec(name, strategy, options):
        return spec_for(workdir, "llama", name, strategy, options, method=method, steps=6,
                        training={"gradient_accumulation": 3, "batch_size": 2, "activation_checkpointing": True})

    reference, _ = run(spec(f"dev-recompute-{method}-single", "single", {}))
    losses, _ = run(spec(f"dev-recompute-{method}-gemini", "gemini", device_options(PLACEMENTS["hybrid"])),
                    env=SIMULATED)
    assert_same_losses(losses, reference, f"device tier, recomputation, accumulation 3, {method}")
    ours = load_file(workdir / f"dev-recompute-{method}-gemini" / "model" / "model.safetensors")
    theirs = load_file(workdir / f"dev-recompute-{method}-single" / "model" / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("budget, moved_shards", [("4MiB", 5), ("2800KiB", 0)])
def test_auto_placement_keeps_what_the_measured_peak_leaves_room_for(workdir, budget, moved_shards):
    """Placement auto with a device: every parameter shard starts in host memory, and after the
    first step as many move to the device as the budget leaves room for beside its measured peak
    (2.3 MiB: the optimizer shards, the gradient shards, and the chunks gathered up from host
    memory, four of 160 KiB, whose copies a moved shard no longer needs: here moving any of the
    five shards needs room for all of them). Those moved stay: with room for all five nothing comes
    up after the second step; with room for none the chunks keep streaming; either way inside the
    budget, with single's losses."""
    reference, _ = run(spec_for(workdir, "llama", f"dev-auto-{budget}-single", "single", steps=6))
    options = device_options({"placement": "auto", "chunk_size": "160KiB"}, budget=budget)
    ours, events = run(spec_for(workdir, "llama", f"dev-auto-{budget}", "gemini", options, steps=6), env=SIMULATED)
    assert_same_losses(ours, reference, f"auto placement, device budget {budget}")
    device = [e for e in events if e["type"] == "memory" and e.get("tier") == "device"]
    moved = [e["traffic"]["to_device_bytes"] for e in device]
    assert all(e["peak"] <= e["total"] for e in device), device[-1]
    logs = " ".join(e.get("message", "") for e in events if e["type"] == "log")
    assert f"{moved_shards} of 5 parameter shards in host memory move to simulated" in logs, logs
    if moved_shards == 5:
        assert moved[-1] == moved[-3] > 0, moved  # the last steps brought nothing up
    else:
        assert moved[-1] > moved[-3], moved


def test_out_of_device_memory_saves_the_last_step_and_exits_2(workdir):
    """The device runs out of memory in the middle of a run (the simulated device fails its 45th
    allocation, in step 5: every parameter shard lives in host memory and its chunk is gathered up
    for each use, so steps allocate): the run ends
    with exit 2, a message naming the device, the chunk, the figures, what the device held by
    category and the checkpoint, the plan's change for a device as much smaller as the run needed
    more, and a checkpoint of the last whole step that, resumed, gives the uninterrupted run's
    losses."""
    options = device_options({"host_param_frac": 1.0, "host_optim_frac": 1.0, "chunk_size": "160KiB"})
    reference, _ = run(spec_for(workdir, "llama", "dev-oom-straight", "gemini", options, steps=8), env=SIMULATED)
    spec = spec_for(workdir, "llama", "dev-oom", "gemini", options, steps=8)
    r = cli("run", spec, env=dict(SIMULATED, TESSERA_SIMULATED_DEVICE_FAIL_AT="45"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "simulated: out of memory for gathered chunk" in r.stderr, r.stderr[-2000:]
    assert "the device held weights" in r.stderr, r.stderr[-2000:]
    # The event stream says what it was (the studio and scripts tell it from a bad input by it).
    stream = [json.loads(line) for line in (workdir / "dev-oom" / "events.jsonl").read_text().splitlines()]
    error = next(e for e in stream if e["type"] == "error")
    assert error["code"] == "out_of_memory" and "simulated: out of memory" in error["message"], error
    # The hint: the plan made again for a device as much smaller as the run needed more than the
    # plan's estimate (planner-side in test_plan's aDeviceShortfallGetsThePlansChangeThatFits).
    hint = r.stderr[r.stderr.index("hint: "):]
    print(r.stderr[r.stderr.index("error: "):])
    assert "the device needed at least" in hint and "the plan's estimate for this job" in hint, hint
    assert "the plan's smallest change that fits" in hint or "nothing fits" in hint, hint
    saved = sorted((workdir / "dev-oom").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert saved, r.stderr[-2000:]
    last = int(saved[-1].name.split("-")[1])
    assert 1 <= last < 8 and f"step {last} is saved in" in r.stderr, (last, r.stderr[-2000:])
    path = spec_for(workdir, "llama", "dev-oom-resumed", "gemini", options, steps=8)
    resumed_spec = json.loads(path.read_text())
    resumed_spec["output"]["resume"] = str(saved[-1])
    path.write_text(json.dumps(resumed_spec))
    resumed, _ = run(path, env=SIMULATED)
    assert_same_losses({s: resumed[s] for s in range(last + 1, 9)}, {s: reference[s] for s in range(last + 1, 9)},
                       f"resumed from checkpoint-{last} after the out-of-memory")


def test_out_of_device_memory_in_the_update_names_the_checkpoint_before(workdir):
    """The device runs out of memory in a step's update (the simulated device fails the 25th
    allocation made for an update: fp32 parameter shards in host memory with their optimizer
    state on the device, so each update copies a shard up): the masters and moments may be
    partly new, so nothing is saved then; the run ends with exit 2 naming the update, the
    newest checkpoint saved before (every 2 steps) and the plan's change, and that checkpoint,
    resumed, gives the uninterrupted run's losses."""
    options = device_options({"host_param_frac": 1.0, "chunk_size": "160KiB"})
    reference, _ = run(spec_for(workdir, "llama", "dev-oom-update-straight", "gemini", options, steps=8),
                       env=SIMULATED)
    spec = spec_for(workdir, "llama", "dev-oom-update", "gemini", options, steps=8, extra=("--save-every", 2))
    r = cli("run", spec, env=dict(SIMULATED, TESSERA_SIMULATED_DEVICE_FAIL_AT="25",
                                  TESSERA_SIMULATED_DEVICE_FAIL_WHAT="for its update"))
    assert r.returncode == 2, r.stderr[-2000:]
    error = r.stderr[r.stderr.index("error: "):]
    print(error)
    assert "for its update" in error and "'s update: simulated: out of memory" in error, error
    assert "nothing is saved at the failure" in error, error
    failed = int(error.split("training stopped in step ")[1].split("'")[0])
    saved = sorted(int(p.name.split("-")[1]) for p in (workdir / "dev-oom-update").glob("checkpoint-*"))
    assert saved and saved[-1] < failed, (saved, failed)
    assert f"resume from step {saved[-1]}, saved in" in error, error
    assert "hint: " in r.stderr
    path = spec_for(workdir, "llama", "dev-oom-update-resumed", "gemini", options, steps=8)
    resumed_spec = json.loads(path.read_text())
    resumed_spec["output"]["resume"] = str(workdir / "dev-oom-update" / f"checkpoint-{saved[-1]}")
    path.write_text(json.dumps(resumed_spec))
    resumed, _ = run(path, env=SIMULATED)
    steps = range(saved[-1] + 1, 9)
    assert_same_losses({s: resumed[s] for s in steps}, {s: reference[s] for s in steps},
                       f"resumed from checkpoint-{saved[-1]} after the out-of-memory in the update")


@pytest.mark.parametrize("homes", [{"host_param_frac": 1.0}, {"offload_param_frac": 0.5, "host_param_frac": 0.5}])
def test_fp32_checkpoint_reads_parameters_from_the_device_and_host_memory(workdir, homes):
    """fp32 with the optimizer on the device and every parameter chunk homed in host memory (or
    half of them on disk): the checkpoint's weights are the parameter chunks themselves (no
    masters of their own), read from the device for those there now and from host memory or
    their files for the others (those on the device with changes copied down and written
    first); `single` resumed from it continues `single`'s straight run."""
    tag = "disk" if "offload_param_frac" in homes else "host"

    def job(name, strategy, options=None, resume=None):
        return checkpointed_spec(workdir, name, strategy, options, resume, steps=10, precision="fp32")

    straight, _ = run(job(f"dev-fp32-single-{tag}", "single"))
    run(job(f"dev-fp32-gemini-{tag}", "gemini", device_options({**homes, "chunk_size": "160KiB"})), env=SIMULATED)
    resumed, _ = run(job(f"dev-fp32-back-{tag}", "single", resume=workdir / f"dev-fp32-gemini-{tag}" / "checkpoint-5"))
    assert_same_losses({s: resumed[s] for s in range(6, 11)}, {s: straight[s] for s in range(6, 11)},
                       f"single from the device tier's fp32 checkpoint ({tag})")


# The parameter shards on the device, their optimizer state in host memory: the CPU Adam's new
# values go up through host staging, two buffers of the largest shard used in turn.
STAGED = {"host_optim_frac": 1.0, "chunk_size": "160KiB"}


@pytest.mark.parametrize("placement", ["device", "host", "disk", "staged"])
def test_the_plan_of_the_device_tier_matches_the_run(workdir, placement):
    """`tessera-cli plan` of a job on the simulated device (planned as a GPU of its budget) puts
    the optimizer state and the parameter chunks in the tiers the run's memory events find them
    in: the Adam moments exactly (8 bytes per parameter, all on the device or all in host memory),
    the weights within the chunks' tails (the run rounds tensors up to whole chunks). With the
    shards on the device and their optimizer state in host memory, the host's weights are the
    float32 masters and the staging of the CPU Adam's new values on their way up: two buffers of
    the largest shard (160 KiB chunks here), not every shard's values."""
    options = STAGED if placement == "staged" else PLACEMENTS[placement]
    spec = spec_for(workdir, "llama", f"dev-plan-{placement}", "gemini", device_options(options), steps=3)
    planned = cli("plan", spec, "--json", env=SIMULATED)
    assert planned.returncode == 0, planned.stderr
    tiers = {t["tier"]: t for t in json.loads(planned.stdout)["memory"]}
    assert tiers["device"]["device"] == "simulated" and tiers["device"]["simulated"], tiers
    assert tiers["device"]["budget"] == 64 << 20
    _, events = run(spec, env=SIMULATED)
    memory = [e for e in events if e["type"] == "memory"]
    measured = {tier: [e for e in memory if e.get("tier") == tier][-1]["by_category"]
                for tier in ("device", "host")}
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(workdir / "llama").parameters())
    if placement == "disk":
        # Parameter chunks and optimizer chunks in all three tiers: the disk tier's files (the
        # parameter chunks, the optimizer chunks' masters and moments) as planned, within whole
        # chunks (the run places whole 160 KiB chunks of a 640 KiB model: up to half a chunk
        # more or less than the share) and the files' alignment; the moments of each tier as
        # planned, within whole chunks.
        disk = [e for e in memory if e.get("tier") == "disk"][-1]["by_category"]
        for category in ("weights", "optimizer"):
            ratio = disk[category] / tiers["disk"]["by_category"][category]
            print(f"disk: {category} measured {disk[category]} ÷ planned "
                  f"{tiers['disk']['by_category'][category]} = {ratio:.3f}")
            assert 0.8 <= ratio <= 1.5, (disk, tiers["disk"]["by_category"])
        for tier in ("device", "host"):
            planned_optimizer = tiers[tier]["by_category"]["optimizer"]
            print(f"disk: {tier} optimizer measured {measured[tier]['optimizer']} ÷ planned {planned_optimizer}")
            assert abs(measured[tier]["optimizer"] - planned_optimizer) <= 0.2 * 8 * params
        return
    home = "device" if placement == "device" else "host"
    for tier in ("device", "host"):
        plan_optimizer = tiers[tier]["by_category"]["optimizer"]
        print(f"{placement}: {tier} optimizer planned {plan_optimizer}, measured {measured[tier]['optimizer']}")
        assert plan_optimizer == measured[tier]["optimizer"] == (8 * params if tier == home else 0)
    if placement == "staged":
        # The first memory event (before any update) finds the masters alone; from the first
        # update on, the staging is kept: two buffers of the largest shard (a 160 KiB chunk).
        staged = [e["by_category"]["weights"] for e in memory if e.get("tier") == "host"]
        masters = staged[0]
        assert 4 * params <= masters <= 4 * params * 1.25, (staged, params)
        assert staged[1:] == [staged[-1]] * (len(staged) - 1), staged
        print(f"staged: masters {masters}, staging {staged[-1] - masters} for {4 * params} bytes of values")
        staging = staged[-1] - masters
        assert staging % 2 == 0 and 0 < staging <= 2 * 160 * 1024 < 4 * params, (staged, params)
        measured["host"]["weights"] = max(staged)
    plan_weights = tiers[home]["by_category"]["weights"]
    ratio = measured[home]["weights"] / plan_weights
    print(f"{placement}: {home} weights measured {measured[home]['weights']} ÷ planned {plan_weights} = {ratio:.3f}")
    assert 1.0 <= ratio <= 1.25, (measured[home], tiers[home]["by_category"])


def test_the_plan_of_two_ranks_on_a_device_matches_the_run(workdir):
    """`tessera-cli plan --nproc 2` of the sharded device tier puts the gathered chunks and the
    gradient chunks on each rank's device and the shards with their optimizer state in host
    memory, as the run's memory events find them: no optimizer state on the device, the host's
    moments of rank 0's shard exactly, and the device's peak over the run (chunks gathered at
    once, their shards on the way up, gradient chunks being reduced) inside the plan's training
    peak of the device and above 0.6 of it; what went up and what came down each step is rank
    0's shard of every chunk (the plan's host weights)."""
    placement = {"chunk_size": "160KiB", **HOST_SHARDS}
    spec = spec_for(workdir, "llama", "dev-ranks-plan", "gemini", device_options(placement, budget="4MiB"),
                    steps=3)
    planned = cli("plan", spec, "--nproc", 2, "--json", env=SIMULATED)
    assert planned.returncode == 0, planned.stderr
    tiers = {t["tier"]: t for t in json.loads(planned.stdout)["memory"]}
    assert tiers["device"]["simulated"] and tiers["device"]["device"].startswith("simulated"), tiers["device"]
    _, events = launch_2(spec, env=SIMULATED)
    memory = [e for e in events if e["type"] == "memory"]
    device = [e for e in memory if e.get("tier") == "device"]
    host = [e for e in memory if e.get("tier") == "host"][-1]["by_category"]
    assert tiers["device"]["by_category"]["optimizer"] == 0
    assert all(e["by_category"]["optimizer"] == 0 for e in device)
    assert tiers["host"]["by_category"]["optimizer"] == host["optimizer"] > 0, (tiers["host"], host)
    peak = max(e["peak"] for e in device)
    planned_peak = tiers["device"]["training_peak"]
    print(f"device peak: measured {peak} ÷ planned {planned_peak} = {peak / planned_peak:.3f}")
    assert 0.6 * planned_peak <= peak <= planned_peak, (peak, tiers["device"])
    shards = tiers["host"]["by_category"]["weights"]  # fp32: no masters apart
    assert device[-1]["traffic"]["to_device_bytes"] == device[-1]["traffic"]["to_host_bytes"] == 3 * shards


@pytest.mark.parametrize("placement", ["device", "hybrid"])
def test_the_plan_of_two_ranks_with_shards_on_the_device_matches_the_run(workdir, placement):
    """`tessera-cli plan --nproc 2` with the shards on the device (the default), or split by the
    hybrid shares, places each rank's shards as the plugin does: the optimizer state it plans on
    the device, in host memory and on disk is what the run's memory events find there, byte for
    byte, and the device's peak over the run inside the plan's training peak and above 0.6 of
    it."""
    options = {"chunk_size": "160KiB"} if placement == "device" else PLACEMENTS["hybrid"]
    spec = spec_for(workdir, "llama", f"dev-ranks-plan-{placement}", "gemini",
                    device_options(options, budget="8MiB"), steps=3)
    planned = cli("plan", spec, "--nproc", 2, "--json", env=SIMULATED)
    assert planned.returncode == 0, planned.stderr
    tiers = {t["tier"]: t for t in json.loads(planned.stdout)["memory"]}
    _, events = launch_2(spec, env=SIMULATED)
    memory = [e for e in events if e["type"] == "memory"]
    for tier in ("device", "host", "disk"):
        measured = max((e["by_category"]["optimizer"] for e in memory if e.get("tier") == tier), default=0)
        plan = tiers[tier]["by_category"]["optimizer"] if tier in tiers else 0
        print(f"{placement}: {tier} optimizer planned {plan}, measured {measured}")
        assert plan == measured, (tier, plan, measured)
    assert max(e["by_category"]["optimizer"] for e in memory if e.get("tier") == "device") > 0
    peak = max(e["peak"] for e in memory if e.get("tier") == "device")
    planned_peak = tiers["device"]["training_peak"]
    print(f"{placement}: device peak measured {peak} ÷ planned {planned_peak} = {peak / planned_peak:.3f}")
    assert 0.6 * planned_peak <= peak <= planned_peak, (peak, tiers["device"])


def test_a_named_job_that_runs_out_in_a_step_trains_with_the_hints_change(workdir):
    """A named gemini runs as written even where its plan says it does not fit: with a device
    budget above what loading puts there (the resident parameter chunks, the device's optimizer
    share) and below the step's peak (streamed chunks and gradients too), it runs out in step 1.
    The error's hint is the plan's smallest change that fits, which `tessera-cli plan` of the job
    shows too; the job with that change trains inside the same budget."""
    budget = 1_200_000  # loading puts 0.9 MiB there; the plan's step peak is 1.6 MiB
    options = device_options(PLACEMENTS["hybrid"], budget=budget)
    spec = spec_for(workdir, "llama", "dev-short", "gemini", options, steps=3)
    planned = cli("plan", spec, "--json", env=SIMULATED)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    # The plan says it does not fit as written (and plans a change).
    assert any("does not fit" in reason for reason in plan["reasons"]), plan["reasons"]
    r = cli("run", spec, env=SIMULATED)
    assert r.returncode == 2, r.stderr[-2000:]
    print(r.stderr[r.stderr.index("error: "):])
    assert "training stopped in step 1" in r.stderr, r.stderr[-2000:]
    hint = r.stderr[r.stderr.index("hint: "):]
    assert "is more than the device's" in hint and "the plan's smallest change that fits" in hint, hint
    settings = plan["settings"]
    changed = json.loads(spec.read_text())
    changed["precision"] = settings["precision"]
    changed["training"]["batch_size"] = settings["micro_batch"]
    changed["training"]["gradient_accumulation"] = settings["gradient_accumulation"]
    changed["training"]["activation_checkpointing"] = settings["activation_checkpointing"]
    for key in ("host_optim_frac", "host_param_frac", "offload_optim_frac", "offload_param_frac"):
        if abs(settings[key] - options.get(key, 0.0)) > 1e-9:
            assert f"{key} {options.get(key, 0.0):g} → {settings[key]:g}" in hint, (key, hint)
            changed["strategy"]["options"][key] = settings[key]
    changed["output"]["dir"] = str(workdir / "dev-short-changed")
    path = workdir / "dev-short-changed.json"
    path.write_text(json.dumps(changed))
    losses, events = run(path, env=SIMULATED)
    assert len(losses) == 3
    peak = max(e["peak"] for e in events if e["type"] == "memory" and e.get("tier") == "device")
    print(f"the changed job: device peak {peak} of {budget}")
    assert peak <= budget


def test_a_rank_out_of_device_memory_names_the_plans_change_and_the_checkpoint_to_resume(workdir):
    """2 ranks of the sharded device tier, every shard in host memory, saving every 2 steps; the
    simulated device of each rank fails its 45th allocation, in step 3. A rank cannot save there
    (its peers wait in their collectives), so `launch` ends with exit 2 and the rank's error names
    the device and the chunk, the checkpoint saved before (step 2) to resume from, and as its hint
    the plan of the 2 ranks made again for a device as much smaller as the run needed more; the
    job resumed from that checkpoint gives the uninterrupted run's losses."""
    options = device_options({"chunk_size": "160KiB", **HOST_SHARDS}, budget="4MiB")
    straight = checkpointed_spec(workdir, "dev-ranks-oom-straight", "gemini", options, steps=8, save_every=2,
                                 precision="fp32")
    reference, _ = launch_2(straight, env=SIMULATED)
    spec = checkpointed_spec(workdir, "dev-ranks-oom", "gemini", options, steps=8, save_every=2, precision="fp32")
    r = cli("launch", "--nproc", 2, spec, "--events", spec.with_suffix(".events.jsonl"),
            env=dict(SIMULATED, TESSERA_SIMULATED_DEVICE_FAIL_AT="45"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "simulated: out of memory for gathered chunk" in r.stderr, r.stderr[-3000:]
    saved = workdir / "dev-ranks-oom" / "checkpoint-2"
    assert f"resume from step 2, saved in {saved}" in r.stderr, r.stderr[-3000:]
    hint = r.stderr[r.stderr.index("hint: "):]
    assert "the plan's estimate for this job" in hint, hint
    assert "the plan's smallest change that fits" in hint or "nothing fits" in hint, hint
    resumed = checkpointed_spec(workdir, "dev-ranks-oom-resumed", "gemini", options, resume=saved, steps=8,
                                save_every=2, precision="fp32")
    ours, _ = launch_2(resumed, env=SIMULATED)
    assert_same_losses({s: ours[s] for s in range(3, 9)}, {s: reference[s] for s in range(3, 9)},
                       "2 ranks resumed from the checkpoint the out-of-memory named")
