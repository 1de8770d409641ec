"""The `gemini` strategy against `single`: chunked parameters and optimizer state on the host or on
disk must not change what is learned. For llama, qwen2 and gpt2, fp32 and bf16, full and LoRA,
with everything on the host, half the parameters and optimizer state on disk, all the optimizer
state on disk, and everything on disk in small chunks (blocks fetch their parameters in forward
and again before backward, evicting others): 20 steps of `tessera-cli run`
under gemini give the losses of the same job under single within 1e-5 relative (weight decay on,
so the Trainer's no-decay split for biases and norms is exercised on both sides). Checkpoints
move between the two plugins (single → gemini → single) and continue the same trajectory; the
offload folder holds what the chunks need while training and is gone afterwards; options that are
not supported yet are refused with exit 2 naming the option."""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from memory_cgroup import CgroupUnavailable, MemoryCgroup  # noqa: E402
from tiny_tokenizer import byte_level_bpe  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
STEPS = 20
REL = 1e-5


def cli(*args, env=None):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=900, env=env)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemini")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(200)]
    fast = byte_level_bpe(lines, 600)
    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    # The weights are drawn as the models are built: seeded first, every session trains the same
    # models (a seed after building them left each session its own random ones).
    torch.manual_seed(0)
    families = {
        "llama": LlamaForCausalLM(LlamaConfig(vocab_size=600, hidden_size=64, intermediate_size=160,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128, **ids)),
        # qwen2: biases on q/k/v (no decay for them), tied embeddings.
        "qwen2": Qwen2ForCausalLM(Qwen2Config(vocab_size=600, hidden_size=64, intermediate_size=160,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128, tie_word_embeddings=True, **ids)),
        # gpt2: LayerNorm modules (no decay by type), Conv1D layout, tied head.
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=600, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                           eos_token_id=1)),
    }
    for name, model in families.items():
        model.save_pretrained(d / name)
        fast.save_pretrained(d / name)
    with open(d / "text.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line}) + "\n")
    return d


PRINTED_JOBS = {}


def printed_job(workdir, name, *flags):
    """The job `tessera-cli finetune FLAGS --print-job` prints, its output folder `name`: asked of
    the CLI once per FLAGS (their paths name the module's workdir), as jobs that differ only in
    their output folder share the rest (one process less per run)."""
    key = tuple(map(str, flags))
    if key not in PRINTED_JOBS:
        r = cli("finetune", *flags, "--out", workdir / "printed", "--print-job")
        assert r.returncode == 0, r.stderr
        PRINTED_JOBS[key] = r.stdout
    spec = json.loads(PRINTED_JOBS[key])
    spec["output"]["dir"] = str(workdir / name)
    return spec


def spec_for(workdir, family, name, strategy, options=None, method="full", precision="fp32", steps=STEPS,
             extra=(), training=None):
    """The job `tessera-cli finetune` writes, with weight decay and warm-up on, the strategy and
    `training` (a dict of job-spec training fields) over it; saved as `name`.json."""
    spec = printed_job(workdir, name, "--model", workdir / family, "--data", workdir / "text.jsonl",
                       "--format", "text", "--max-length", 32, "--batch-size", 4, "--steps", steps, "--lr", 3e-3,
                       "--method", method, "--precision", precision, *extra)
    spec["training"]["weight_decay"] = 0.1
    spec["training"]["warmup_steps"] = 2
    spec["training"].update(training or {})
    spec["strategy"] = {"name": strategy, "options": dict(options or {})}
    if strategy == "single":
        # The reference loads LoRA's frozen head as gemini does: left in its file (the default on
        # the CPU) the head is read by blocks of the vocabulary, equal to the loaded one only
        # within rounding, and these tests hold gemini to single exactly.
        spec["strategy"]["options"].setdefault("frozen_tables", "memory")
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def checkpointed_spec(workdir, name, strategy, options=None, resume=None, steps=15, save_every=5,
                      keep_last=5, precision="bf16"):
    """A llama job saving every `save_every` steps (the last `keep_last` kept), resumed from
    `resume` if given."""
    path = spec_for(workdir, "llama", name, strategy, options, steps=steps, precision=precision,
                    extra=("--save-every", save_every))
    spec = json.loads(path.read_text())
    spec["training"]["keep_last"] = keep_last
    if resume:
        spec["output"]["resume"] = str(resume)
    path.write_text(json.dumps(spec))
    return path


def run(spec_path, *extra, env=None):
    events = spec_path.with_suffix(".events.jsonl")
    r = cli("run", spec_path, "--events", events, *extra, env=env)
    assert r.returncode == 0, f"{spec_path.name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    out = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    losses = {e["step"]: e["loss"] for e in out if e["type"] == "metric" and "loss" in e}
    return losses, out


def assert_same_losses(ours, reference, label):
    assert sorted(ours) == sorted(reference), f"{label}: steps differ"
    worst = 0.0
    for step, ref in reference.items():
        worst = max(worst, abs(ours[step] - ref) / max(abs(ref), 1e-12))
    print(f"{label}: max relative loss difference {worst:.2e} over {len(reference)} steps")
    assert worst <= REL, f"{label}: losses differ by {worst:.2e} relative (bound {REL})"


# Each family in both precisions and both methods, and each precision with each method (six of
# the twelve combinations: every placement runs in each, so the other six add time, not paths).
@pytest.mark.parametrize("family, precision, method", [
    ("llama", "fp32", "full"), ("llama", "bf16", "lora"), ("qwen2", "bf16", "full"),
    ("qwen2", "fp32", "lora"), ("gpt2", "fp32", "lora"), ("gpt2", "bf16", "full"),
])
def test_gemini_follows_single(workdir, family, precision, method):
    base = f"{family}-{precision}-{method}"
    reference, _ = run(spec_for(workdir, family, f"{base}-single", "single", method=method, precision=precision))
    assert len(reference) == STEPS
    placements = {
        "host": {},
        "half": {"offload_param_frac": 0.5, "offload_optim_frac": 0.5},
        "optim": {"offload_optim_frac": 1.0},
        "disk": {"offload_param_frac": 1.0, "offload_optim_frac": 1.0, "chunk_size": "160KiB"},
        "auto": {"placement": "auto", "offload_optim_frac": 0.5, "chunk_size": "160KiB"},
    }
    for name, options in placements.items():
        tag = f"{base}-gemini-{name}"
        losses, _ = run(spec_for(workdir, family, tag, "gemini", {"placement": "static", "chunk_size": "auto",
                                                                 **options},
                                 method=method, precision=precision))
        assert_same_losses(losses, reference, tag)
        offload = workdir / tag / "offload"
        assert not offload.exists() or not any(offload.iterdir()), "the offload folder outlived the run"


@pytest.mark.parametrize("family, precision", [("llama", "fp32"), ("gpt2", "bf16")])
def test_the_update_behind_the_forward_waits_for_its_chunks(workdir, family, precision):
    """With the parameters in memory and the optimizer state on disk (full fine-tuning: LoRA's
    adapters, in no block, are updated in step()), the update of its chunks runs behind the next
    forward, each block waiting for the chunks of its own parameters. On a
    disk made slow (every transfer 4 ms late, a test-only setting) the forward reaches blocks whose
    chunks are still being updated: a block that did not wait would compute with the old values.
    The losses are single's within 1e-5, with gradient accumulation (two forwards per step),
    recomputation (each block entered again in backward) and evaluations between steps."""
    training = {"gradient_accumulation": 2, "activation_checkpointing": True, "eval_every": 3}
    base = f"behind-{family}-{precision}"

    def with_evaluation(path):
        spec = json.loads(path.read_text())
        spec["dataset"]["validation_split"] = 0.1
        path.write_text(json.dumps(spec))
        return path

    def evaluations(events):
        return {e["step"]: e["eval_loss"] for e in events if e["type"] == "metric" and "eval_loss" in e}

    reference, single_events = run(with_evaluation(
        spec_for(workdir, family, f"{base}-single", "single", precision=precision, steps=8, training=training)))
    spec = with_evaluation(spec_for(workdir, family, base, "gemini", {"offload_optim_frac": 1.0, "chunk_size": "160KiB"},
                                    precision=precision, steps=8, training=training))
    env = dict(os.environ, TESSERA_TEST_SLOW_DISK_MS="4")
    losses, events = run(spec, env=env)
    logs = " ".join(e.get("message", "") for e in events if e["type"] == "log")
    assert "runs behind the next forward" in logs, "the update was not pipelined"
    # The first chunk's optimizer shard is read during the last micro-batch's backward and
    # updated from memory, its gradient shard kept there.
    assert "is read from disk during backward" in logs, "nothing was read ahead"
    assert_same_losses(losses, reference, f"{base}: update behind the forward, slow disk")
    # An evaluation between steps reads the parameters while the last update may still run.
    assert sorted(evaluations(events)) == [3, 6, 8], evaluations(events)
    assert_same_losses(evaluations(events), evaluations(single_events), f"{base}: evaluations")


def test_two_ranks_wait_for_the_update_behind_the_forward(workdir):
    """2 ranks of gemini with their optimizer shards on a slow disk (as above): each
    rank's update runs behind its next forward and each block waits for its own chunks, while
    both ranks gather ahead alike (a gather ahead skipped on one rank only would pair different
    chunks in the collectives). The losses are those of the same 2-rank job with the shards in
    memory, whose update runs in step(), within 1e-5, with accumulation and recomputation."""
    training = {"gradient_accumulation": 2, "activation_checkpointing": True}

    def launch_2(name, options, env=None):
        spec = spec_for(workdir, "llama", name, "gemini", {"chunk_size": "160KiB", **options}, steps=8,
                        training=training)
        events_path = spec.with_suffix(".events.jsonl")
        r = cli("launch", "--nproc", 2, spec, "--events", events_path, env=env)
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
        events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
        return {e["step"]: e["loss"] for e in events if e["type"] == "metric" and "loss" in e}, events

    reference, _ = launch_2("behind-ranks-memory", {})
    losses, events = launch_2("behind-ranks-disk", {"offload_optim_frac": 1.0},
                              env=dict(os.environ, TESSERA_TEST_SLOW_DISK_MS="4"))
    logs = " ".join(e.get("message", "") for e in events if e["type"] == "log")
    assert "runs behind the next forward" in logs, "the update was not pipelined"
    assert_same_losses(losses, reference, "2 ranks: update behind the forward, slow disk")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_parameters_on_disk_with_recomputation_and_accumulation(workdir, method):
    """Every parameter chunk on disk, small chunks (several per layer, more than the cache holds),
    activation checkpointing (each layer's forward runs again inside backward and fetches its
    chunks there) and two micro-batches per step: fp32 losses equal `single`'s (fp32: the smallest
    chunks that hold the embedding give five parameter chunks, one more than the cache keeps).
    The disk tier holds the parameters (weights category ≥ the model's bytes); full fine-tuning
    reads chunks back and writes the updated ones every step with at most the cache's four
    chunks in memory between steps; LoRA never writes its frozen base back."""
    def spec(name, strategy, options):
        return spec_for(workdir, "llama", name, strategy, options, method=method, steps=6,
                        training={"gradient_accumulation": 2, "batch_size": 2, "activation_checkpointing": True})

    reference, _ = run(spec(f"params-{method}-single", "single", {}))
    gemini_spec = spec(f"params-{method}-gemini", "gemini", {"offload_param_frac": 1.0, "chunk_size": "160KiB"})
    planned = cli("plan", gemini_spec, "--json")
    assert planned.returncode == 0, planned.stderr
    plan_time = json.loads(planned.stdout)["time"]
    losses, events = run(gemini_spec)
    assert_same_losses(losses, reference, f"parameters on disk, {method}")
    model_bytes = sum(t.numel() * 4 for t in LlamaForCausalLM.from_pretrained(workdir / "llama").state_dict().values())
    disks = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"]
    assert disks[-1]["by_category"]["weights"] >= model_bytes * 0.9, (disks[-1], model_bytes)
    # One disk event before training, then one after each step.
    chunk = 160 * 1024
    steps = len(disks) - 1
    read = (disks[-1]["traffic"]["read_bytes"] - disks[0]["traffic"]["read_bytes"]) / steps
    written = (disks[-1]["traffic"]["written_bytes"] - disks[0]["traffic"]["written_bytes"]) / steps
    print(f"{method}: per step read {read / chunk:.2f} and wrote {written / chunk:.2f} chunks; the plan "
          f"{plan_time['disk_read_bytes_per_step'] / chunk:.2f} and {plan_time['disk_write_bytes_per_step'] / chunk:.2f}")
    # The plan's disk traffic per step against the run's: it writes what the run writes, and its
    # replay of the chunk cache reads what the cache no longer holds (five chunks through four,
    # twice a step, with recomputation). Counting two reads a micro-batch it said 2x the run's;
    # replaying blocks with a layer's norms used once it read a chunk more (1.11x full, 1.16x
    # LoRA); with each norm before its linears, LoRA's first norm out of backward, and the cache
    # treating a chunk's uses in a row as one (the plugin read 9 chunks a step, now 7), the same
    # (10.00 and 5.95 chunks a step, 2026-12-07). The run's first step evicts least recently used
    # chunks: 5% for it.
    assert plan_time["disk_write_bytes_per_step"] == written, (plan_time, written)
    assert abs(plan_time["disk_read_bytes_per_step"] - read) <= 0.05 * read, (plan_time, read)
    host = [e for e in events if e["type"] == "memory" and e["tier"] == "host"][-1]
    if method == "full":
        # Five chunks through a cache of four: each step reads back at least one and writes back
        # the updated ones; between steps only the cache is in memory.
        assert read >= chunk and written >= chunk, (read, written)
        assert host["by_category"]["weights"] <= 4 * chunk < disks[-1]["by_category"]["weights"], host
    else:
        # The frozen base is never written back; the adapters' chunk stays in memory.
        assert written == 0, written
    # The export: streamed, every tensor read back and compared — from the chunks on disk for
    # full fine-tuning, the base from the checkpoint plus the adapter's delta for LoRA (each merged
    # weight checked against both first); either way the same tensors as `single`'s, and
    # transformers loads it.
    logs = " ".join(e.get("message", "") for e in events if e["type"] == "log")
    assert "reading every tensor back" in logs, logs
    assert ("adapted weight(s) equal base + delta" in logs) == (method == "lora"), logs
    ours = load_file(workdir / f"params-{method}-gemini" / "model" / "model.safetensors")
    theirs = load_file(workdir / f"params-{method}-single" / "model" / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    LlamaForCausalLM.from_pretrained(workdir / f"params-{method}-gemini" / "model")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gradient_accumulation_through_disk_gradient_chunks(workdir, precision):
    """Three micro-batches per step with small chunks all on disk: each chunk's gradients are
    written back during a backward and read again (added to) by the next, and a chunk whose
    tensors get no gradient in a micro-batch is written back partly filled; the losses still equal
    `single`'s."""
    def spec(name, strategy, options):
        return spec_for(workdir, "llama", name, strategy, options, precision=precision, steps=6,
                        training={"gradient_accumulation": 3, "batch_size": 2})

    reference, _ = run(spec(f"accum-{precision}-single", "single", {}))
    losses, events = run(spec(f"accum-{precision}-gemini", "gemini",
                              {"offload_optim_frac": 1.0, "chunk_size": "160KiB"}))
    assert_same_losses(losses, reference, f"accumulation 3, {precision}")
    disk = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"][-1]
    gradients = disk["by_category"]["gradients"]
    assert gradients > 0 and disk["traffic"]["written_bytes"] > 6 * 3 * gradients * 0.5, disk


def test_checkpoints_move_between_single_and_gemini(workdir):
    """One 15-step bf16 job: single straight through (checkpoints at 5, 10, 15); gemini with every
    parameter and optimizer chunk on disk resumed from single's checkpoint-5; single resumed from gemini's
    checkpoint-10. Both continuations give the straight run's losses."""
    def job(name, strategy, options=None, resume=None):
        return checkpointed_spec(workdir, name, strategy, options, resume)

    straight, _ = run(job("move-single", "single"))
    middle, _ = run(job("move-gemini", "gemini", {"offload_optim_frac": 1.0, "offload_param_frac": 1.0,
                                                  "chunk_size": "160KiB"},
                        resume=workdir / "move-single" / "checkpoint-5"))
    last, _ = run(job("move-back", "single", resume=workdir / "move-gemini" / "checkpoint-10"))
    assert_same_losses({s: middle[s] for s in range(6, 16)}, {s: straight[s] for s in range(6, 16)},
                       "gemini from single's checkpoint")
    assert_same_losses({s: last[s] for s in range(11, 16)}, {s: straight[s] for s in range(11, 16)},
                       "single from gemini's checkpoint")


@pytest.mark.parametrize("options, field", [
    ({"placement": "dynamic"}, "strategy.options.placement"),
    ({"placement": "auto", "offload_param_frac": 0.5}, "strategy.options.offload_param_frac"),
    ({"offload_param_frac": -0.5}, "strategy.options.offload_param_frac"),
    ({"offload_optim_frac": 1.5}, "strategy.options.offload_optim_frac"),
    ({"offload_optim": 1.0}, "strategy.options.offload_optim"),
    ({"chunk_size": "lots"}, "strategy.options.chunk_size"),
])
def test_options_not_supported_are_refused(workdir, options, field):
    spec = spec_for(workdir, "llama", "refused", "gemini", options)
    r = cli("run", spec)
    assert r.returncode == 2, r.stderr
    assert field in r.stderr, r.stderr


def test_a_full_offload_disk_names_the_folder(workdir, tmp_path):
    """A tmpfs too small for the optimizer chunks: exit with an error naming the folder."""
    mount = tmp_path / "small"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    try:
        spec = spec_for(workdir, "llama", "full-disk", "gemini", {"offload_optim_frac": 1.0, "offload_dir": str(mount)})
        r = cli("run", spec)
        assert r.returncode != 0
        assert str(mount) in r.stderr and "full" in r.stderr, r.stderr
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def random_llama(workdir, name, **config):
    """A llama with random weights (seed 0), hidden 512, and the small tokenizer, saved as `name`:
    (folder, parameters, tensors)."""
    d = workdir / name
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                         num_key_value_heads=8, max_position_embeddings=128, bos_token_id=0,
                                         eos_token_id=1, pad_token_id=2, **config))
    model.save_pretrained(d)
    for f in (workdir / "llama").iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (d / f.name).write_bytes(f.read_bytes())
    return d, model.num_parameters(), len(list(model.parameters()))


@pytest.fixture(scope="module")
def medium_llama(workdir):
    """A 21M-parameter llama with the small tokenizer: (folder, parameters, tensors)."""
    return random_llama(workdir, "mem-model", vocab_size=8000, num_hidden_layers=4)


@pytest.mark.parametrize("precision, options", [
    # the update pipelined behind the next forward, its slices on a worker
    ("fp32", {"offload_optim_frac": 1.0}),
    # masters beside the moments; half the parameter shards on disk, read whole around their
    # chunk's slices
    ("bf16", {"offload_optim_frac": 1.0, "offload_param_frac": 0.5}),
])
def test_the_update_streams_shards_larger_than_a_slice(workdir, medium_llama, precision, options):
    """One process on the 21M-parameter llama (chunks of up to 64 MiB: a shard is several of the
    update's 2M-element slices): with its optimizer shards on disk the
    update reads, updates and writes them a slice at a time (each array padded to whole 2048-element
    blocks in its file), and trains to `single`'s weights to the bit, 3 steps; in bf16 its gradient shards go to disk in bf16."""
    folder = medium_llama[0]
    name = f"sliced-{precision}-{len(options)}"
    reference, _ = run(spec_for(workdir, "llama", f"{name}-single", "single", precision=precision, steps=3,
                                extra=("--model", folder)))
    ours, events = run(spec_for(workdir, "llama", name, "gemini", options, precision=precision, steps=3,
                                extra=("--model", folder)))
    assert_same_losses(ours, reference, f"{name}: optimizer shards on disk in slices")
    disk = [e for e in events if e["type"] == "memory" and e.get("tier") == "disk"]
    assert disk and max(e["by_category"]["optimizer"] for e in disk) >= 8 * medium_llama[1], disk[-1:]
    # The gradient shards on disk: one process's bf16 sums in bf16 (2 bytes a parameter, half
    # the I/O), fp32's in float32; each array padded to whole 2048-element blocks and 4 KiB.
    per, params, tensors = (2 if precision == "bf16" else 4), medium_llama[1], medium_llama[2]
    gradients = max(e["by_category"]["gradients"] for e in disk)
    assert per * params <= gradients <= per * params + (2048 * per + 4096) * tensors, (gradients, params)
    mine = load_file(workdir / name / "model" / "model.safetensors")
    theirs = load_file(workdir / f"{name}-single" / "model" / "model.safetensors")
    for key, tensor in theirs.items():
        assert torch.equal(mine[key], tensor), key


def test_memory_per_tier_is_what_the_chunks_hold(workdir, medium_llama):
    """A 21M-parameter llama, fp32 full fine-tuning, 3 steps: with the optimizer state on the host
    the host tier's `optimizer` is the Adam moments (8 bytes per parameter, the parameter count
    from transformers); with all of it on disk the disk tier holds those bytes and the gradient
    chunks (4 bytes per parameter), each up to one 4 KiB page per chunk, the host's `optimizer` is
    0, every step writes the gradients and the optimizer state and reads the optimizer state and
    the gradients (but those written last, still in memory), and the process's resident set
    during training (RSS, measured by the trainer) is lower by most of the moved bytes."""
    _, params, tensors = medium_llama
    moments = 8 * params
    gradients = 4 * params

    def memory_events(name, frac):
        path = medium_spec(workdir, medium_llama, name, {"offload_optim_frac": frac})
        # A fixed mmap threshold: freed activation buffers go back to the kernel at once, so the
        # resident set at a step boundary is what is live (glibc otherwise keeps them cached,
        # tens of MB that differ from run to run).
        _, events = run(path, env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072"))
        return [e for e in events if e["type"] == "memory"]

    host_only = memory_events("mem-host", 0.0)
    on_disk = memory_events("mem-disk", 1.0)
    last_host = [e for e in host_only if e["tier"] == "host"][-1]
    assert last_host["by_category"]["optimizer"] == moments
    assert not [e for e in host_only if e["tier"] == "disk"], "no disk tier without offload"

    disk = [e for e in on_disk if e["tier"] == "disk"]
    assert disk, "no disk tier reported"
    last_disk = disk[-1]
    on_disk_optimizer = last_disk["by_category"]["optimizer"]
    on_disk_gradients = last_disk["by_category"]["gradients"]
    assert moments <= on_disk_optimizer <= moments + 4096 * tensors, last_disk
    assert gradients <= on_disk_gradients <= gradients + 4096 * tensors, last_disk
    assert last_disk["used"] == on_disk_optimizer + on_disk_gradients, last_disk
    traffic = last_disk["traffic"]
    steps_done = 3
    assert traffic["written_bytes"] == (steps_done + 1) * on_disk_optimizer + steps_done * on_disk_gradients, \
        "per step one write of the optimizer state and of the gradients, + the first optimizer write"
    assert steps_done * on_disk_optimizer < traffic["read_bytes"] <= steps_done * last_disk["used"], traffic
    last_host_disk_run = [e for e in on_disk if e["tier"] == "host"][-1]
    assert last_host_disk_run["by_category"]["optimizer"] == 0
    # Reported after the update, when no gradient is held any more.
    assert last_host_disk_run["by_category"]["gradients"] == 0
    saved = last_host["used"] - last_host_disk_run["used"]
    print(f"RSS during training: host-only {last_host['used'] >> 20} MiB, on disk "
          f"{last_host_disk_run['used'] >> 20} MiB; moved {moments >> 20} MiB, RSS lower by {saved >> 20} MiB")
    assert saved >= 0.7 * moments, "the resident set did not drop by the moved optimizer state"


KILL_REFERENCE = {}


@pytest.mark.parametrize("delay", [0.0, 0.011, 0.023, 0.037])
def test_kill_during_write_back_or_checkpoint_then_resume(workdir, delay):
    """gemini with every optimizer chunk on disk and a checkpoint every step: kill -9 at an
    arbitrary moment (chunk write-back, checkpoint writing, compute) and resume from the newest
    complete checkpoint: the losses equal an uninterrupted run, and the killed process's offload
    folder is removed by the resumed run."""
    import signal
    import time

    # Many small chunks (many writes), in one offload folder for the killed and the resumed run.
    options = {"offload_optim_frac": 1.0, "chunk_size": "256KiB",
               "offload_dir": str(workdir / f"kill-offload-{delay}")}

    def job(name, resume=None):
        return checkpointed_spec(workdir, name, "gemini", options, resume, steps=12, save_every=1,
                                 keep_last=2)

    # The uninterrupted run's losses do not depend on the offload folder: one for every delay.
    if "straight" not in KILL_REFERENCE:
        KILL_REFERENCE["straight"], _ = run(job(f"kill-straight-{delay}"))
    straight = KILL_REFERENCE["straight"]
    name = f"kill-{delay}"
    spec = job(name)
    out = workdir / name
    proc = subprocess.Popen([CLI, "run", str(spec), "--events", str(spec.with_suffix(".events.jsonl"))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "checkpoint-3").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    stale = workdir / f"kill-offload-{delay}" / f"tessera-offload-{proc.pid}"
    assert stale.exists(), "the killed run had no offload folder"
    done = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit())
    assert done, "no complete checkpoint survived"
    resumed, _ = run(job(f"{name}-resumed", resume=out / f"checkpoint-{done[-1]}"))
    assert min(resumed) == done[-1] + 1
    assert_same_losses(resumed, {s: straight[s] for s in resumed}, f"resumed after kill -9 at +{delay}s")
    assert not stale.exists(), "the killed run's offload folder was left behind"


def medium_spec(workdir, medium_llama, name, options, steps=3):
    spec = printed_job(workdir, name, "--model", medium_llama[0], "--data", workdir / "text.jsonl", "--format", "text",
                       "--max-length", 32, "--batch-size", 2, "--steps", steps)
    spec["strategy"] = {"name": "gemini", "options": options}
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_host_budget_too_small_is_refused_before_loading(workdir, medium_llama):
    path = medium_spec(workdir, medium_llama, "budget-small", {"host_budget": "300MiB"})
    events = path.with_suffix(".events.jsonl")
    r = cli("run", path, "--events", events)
    assert r.returncode == 2, r.stderr
    assert "strategy.options.host_budget" in r.stderr and "needs about" in r.stderr, r.stderr
    assert "weights" in r.stderr and "optimizer state" in r.stderr, r.stderr
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert not any(e["type"] in ("metric", "memory") for e in lines), "it loaded before refusing"
    # `plan` refuses it the same way (it approved the job against the machine's memory before).
    planned = cli("plan", path)
    assert planned.returncode == 2, planned.stdout
    assert "strategy.options.host_budget" in planned.stderr and "needs about" in planned.stderr, \
        planned.stderr


def test_training_stays_inside_its_host_budget(workdir, medium_llama):
    """host_budget is what the whole process may use: the job with all optimizer state on disk
    runs inside a memory cgroup limited to exactly that budget without being killed, while the
    same job with the state in RAM is refused before loading under the same budget."""
    probe = medium_spec(workdir, medium_llama, "budget-probe", {"offload_optim_frac": 1.0})
    budget = int(host_peak_planned(probe) / 0.9) + (32 << 20)
    in_ram = medium_spec(workdir, medium_llama, "budget-in-ram", {"host_budget": budget})
    r = cli("run", in_ram)
    # The hint names the setting that fits: the optimizer state on disk.
    assert r.returncode == 2 and "offload_optim_frac" in r.stderr, r.stderr

    path = medium_spec(workdir, medium_llama, "budget-disk", {"offload_optim_frac": 1.0, "host_budget": budget})
    run_inside_budget(path, budget)


def host_peak_planned(path):
    r = cli("plan", path, "--json")
    assert r.returncode == 0, r.stderr
    return next(t for t in json.loads(r.stdout)["memory"] if t["tier"] == "host")["peak"]


def run_inside_budget(path, budget):
    """Runs the job in a memory cgroup of `budget` bytes: not killed, exit 0, and the host
    memory it reported never above the budget. Returns its events."""
    try:
        group = MemoryCgroup(f"tessera-test-{os.getpid()}", budget)
    except CgroupUnavailable as e:
        pytest.skip(str(e))
    events = path.with_suffix(".events.jsonl")
    try:
        proc = group.run([CLI, "run", path, "--events", events], timeout=900)
        killed, peak = group.oom_kills(), group.peak_bytes()
    finally:
        group.remove()
    print(f"{path.stem}: host_budget {budget >> 20} MiB (cgroup v{group.version}): exit {proc.returncode}, "
          f"OOM kills {killed}, cgroup peak {'-' if peak is None else peak >> 20} MiB (page cache included)")
    assert killed == 0 and proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert max(e["used"] for e in lines if e["type"] == "memory" and e.get("tier") == "host") <= budget
    return lines


@pytest.fixture(scope="module")
def deep_llama(workdir):
    """A 40M-parameter llama of twelve narrow layers (the largest tensor 2.8 MB): parameter chunks
    of 4 MiB make the four cached ones a small share of the 160 MB of fp32 weights."""
    return random_llama(workdir, "deep-model", vocab_size=2000, num_hidden_layers=12)


def test_parameters_on_disk_fit_a_budget_the_optimizer_offload_cannot(workdir, deep_llama):
    """With the parameters on disk too, the whole run — loading, training and the export, which
    then streams from the chunks — fits a budget under which the job with only the optimizer
    state on disk is refused (and the refusal names offload_param_frac); inside a cgroup of that
    budget it completes and exports the model transformers loads."""
    options = {"offload_optim_frac": 1.0, "offload_param_frac": 1.0, "chunk_size": "4MiB"}
    budget = int(host_peak_planned(medium_spec(workdir, deep_llama, "params-probe", options)) / 0.9) + (32 << 20)
    optimizer_only = medium_spec(workdir, deep_llama, "params-refused",
                                 {"offload_optim_frac": 1.0, "chunk_size": "4MiB", "host_budget": budget})
    r = cli("run", optimizer_only)
    assert r.returncode == 2 and "offload_param_frac" in r.stderr, r.stderr
    path = medium_spec(workdir, deep_llama, "params-budget", {**options, "host_budget": budget})
    events = run_inside_budget(path, budget)
    assert any("reading every tensor back" in e.get("message", "") for e in events if e["type"] == "log")
    LlamaForCausalLM.from_pretrained(workdir / "params-budget" / "model")

    # Placement auto under the same budget: after the first step its cache of parameter chunks
    # grows into what the budget leaves, so later steps read less than static's four chunks did;
    # it stays inside the cgroup all the same.
    auto = medium_spec(workdir, deep_llama, "params-auto",
                       {"placement": "auto", "offload_optim_frac": 1.0, "chunk_size": "4MiB",
                        "host_budget": budget}, steps=4)
    static = medium_spec(workdir, deep_llama, "params-static", {**options, "host_budget": budget}, steps=4)

    def reads_after_first_step(lines):
        disk = [e for e in lines if e["type"] == "memory" and e["tier"] == "disk"]
        # One disk event before training, then one after each step.
        return disk[-1]["traffic"]["read_bytes"] - disk[2]["traffic"]["read_bytes"]

    auto_reads = reads_after_first_step(run_inside_budget(auto, budget))
    static_reads = reads_after_first_step(run_inside_budget(static, budget))
    print(f"steps 2-4 read {auto_reads >> 20} MiB under placement auto, {static_reads >> 20} MiB under static")
    assert auto_reads < static_reads
