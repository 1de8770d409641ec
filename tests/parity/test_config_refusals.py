"""A config.json that asks for more than the machine has, or whose heads do not split its hidden
size, is refused before anything of the model is built (issue 15, findings 1 and 3).

A tiny llama (transformers' LlamaConfig, saved, then its config.json edited) is given with
num_hidden_layers 1e9, vocab_size 1e12, intermediate_size 2^62 (its parameter count overflows
64 bits) and hidden_size 96 with 7 heads. For each, `finetune` (strategy single and gemini with
its disk tier), `eval`, `generate` and `export` exit 2 within seconds with a small peak RSS (the
child's own, from wait4), and stderr names config.json, the field and its value; the size cases
also the parameter count and the memory there is.

Before the check these were OOM-killed, hung allocating, or exited 1 with LibTorch's message
("rotary embedding: head_dim 13 must be positive and even" for the heads). The children run
under an address-space limit so that a regression fails the test instead of the machine.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from peak_rss import run_with_peak_rss  # noqa: E402
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))

# A refusal reads config.json and /proc/meminfo: LibTorch's start-up is most of its time and
# memory. Generous for a loaded machine, far below what building any of these models takes.
REFUSAL_SECONDS = 30
REFUSAL_PEAK_RSS = 1 << 30
# The children's address space: far above a refusal's, far below this machine's memory.
CHILD_ADDRESS_SPACE = 8 << 30


def run_measured(args, timeout=60):
    """Runs the CLI; returns (exit code, stderr, seconds, the CLI's peak RSS in bytes)."""
    start = time.monotonic()
    code, err, peak = run_with_peak_rss([CLI, *args], timeout=timeout, address_space=CHILD_ADDRESS_SPACE)
    return code, err, time.monotonic() - start, peak


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("config_refusals")
    make_tiny_llama(d / "model", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    write_text_dataset(d / "data.jsonl")  # enough blocks of --max-length tokens to reach the model
    return d


def variant(base, name, edits):
    """The tiny model's folder with config.json edited (its other files linked)."""
    folder = base / name
    if not folder.exists():
        folder.mkdir()
        for f in (base / "model").iterdir():
            if f.name != "config.json":
                (folder / f.name).symlink_to(f)
        config = json.loads((base / "model" / "config.json").read_text())
        config.update(edits)
        config = {k: v for k, v in config.items() if v is not None}  # None: the field left out
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


# (edits to config.json, what stderr must name). JSON writes 1e9 and 1e12 as floats here (as
# some hand-edited files do) and 2^62 as an integer.
CASES = {
    "layers_1e9": ({"num_hidden_layers": 1e9}, ["num_hidden_layers 1000000000"]),
    "vocab_1e12": ({"vocab_size": 1e12}, ["vocab_size 1000000000000"]),
    "intermediate_2_62": ({"intermediate_size": 2 ** 62},
                          [f"intermediate_size {2 ** 62}", "64-bit"]),
    # transformers writes head_dim; without it, head_dim is hidden_size / num_attention_heads.
    "heads_7_of_96": ({"hidden_size": 96, "num_attention_heads": 7, "num_key_value_heads": 7, "head_dim": None},
                      ["num_attention_heads 7 does not divide hidden_size 96"]),
}
SIZE_CASES = {"layers_1e9", "vocab_1e12", "intermediate_2_62"}

COMMANDS = {
    "run_single": lambda m, d, out: ["finetune", "--model", m, "--data", d, "--max-length", 32, "--steps", 1,
                                     "--strategy", "single", "--out", out],
    "run_gemini": lambda m, d, out: ["finetune", "--model", m, "--data", d, "--max-length", 32, "--steps", 1,
                                     "--strategy", "gemini", "--strategy-options", '{"offload_optim_frac": 1.0}',
                                     "--out", out],
    "eval": lambda m, d, out: ["eval", "--model", m, "--data", d],
    "generate": lambda m, d, out: ["generate", "--model", m, "--prompt", "What is 2 plus 3?",
                                   "--max-new-tokens", 4],
    "export": lambda m, d, out: ["export", "--model", m, "--out", out],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_building(base, tmp_path, case, command):
    edits, named = CASES[case]
    model = variant(base, case, edits)
    code, stderr, seconds, peak = run_measured(COMMANDS[command](model, base / "data.jsonl", tmp_path / "out"))
    print(f"{case} {command}: exit {code} in {seconds:.1f} s, peak RSS {peak / 2 ** 20:.0f} MiB")
    assert code == 2, stderr
    assert seconds < REFUSAL_SECONDS, stderr
    assert peak < REFUSAL_PEAK_RSS, f"peak RSS {peak / 2 ** 20:.0f} MiB: {stderr}"
    assert str(model / "config.json") in stderr, stderr
    for needle in named:
        assert needle in stderr, stderr
    assert "hint:" in stderr, stderr
    if case in SIZE_CASES:
        # The figure (the parameter count) and the memory there is.
        assert re.search(r"makes a model of [0-9.e]+ parameters", stderr), stderr
        assert re.search(r"the [0-9.]+ [KMGT]iB of memory", stderr), stderr
        if command == "run_gemini":
            assert "free on disk under" in stderr, stderr
    else:
        assert "head_dim 13" not in stderr, stderr
        assert "the nearest: 6 or 8" in stderr, stderr


def test_an_offload_dir_that_cannot_be_made_is_the_specs_fault(base, tmp_path):
    """gemini's offload_dir through a file: exit 2 naming the option (it was exit 1, as if the
    system had refused a write)."""
    (tmp_path / "a-file").write_text("not a folder")
    options = json.dumps({"offload_optim_frac": 1.0, "offload_dir": str(tmp_path / "a-file" / "offload")})
    code, stderr, _, _ = run_measured(["finetune", "--model", base / "model", "--data", base / "data.jsonl",
                                       "--max-length", 32, "--steps", 1, "--strategy", "gemini",
                                       "--strategy-options", options, "--out", tmp_path / "out"])
    assert code == 2, stderr
    assert "strategy.options.offload_dir" in stderr and "hint:" in stderr, stderr


def test_sequences_past_the_models_positions_are_warned_of(base, tmp_path):
    """A rotary model whose config.json says 16 positions, trained on blocks of 32 tokens: it
    trains (rotary embeddings reach past them) and the run says once that those positions were
    never trained (it said nothing)."""
    model = variant(base, "positions_16", {"max_position_embeddings": 16})
    events = tmp_path / "events.jsonl"
    code, stderr, _, _ = run_measured(["finetune", "--model", model, "--data", base / "data.jsonl",
                                       "--max-length", 32, "--steps", 1, "--out", tmp_path / "out",
                                       "--events", events])
    assert code == 0, stderr
    warned = [e["message"] for e in map(json.loads, events.read_text().splitlines())
              if e.get("type") == "log" and e.get("level") == "warning" and "max_position_embeddings" in e.get("message", "")]
    assert len(warned) == 1 and "dataset.max_length 32 exceeds the model's max_position_embeddings 16" in warned[0], warned


def spec_of(finetune_args, tmp_path):
    """The job spec `finetune` builds from these arguments, written to a file for `plan`."""
    printed = subprocess.run([CLI, "finetune", *map(str, finetune_args), "--print-job"], capture_output=True,
                             text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    spec = tmp_path / "job.json"
    spec.write_text(printed.stdout)
    return spec


@pytest.fixture(scope="module")
def gpt2(base):
    """A tiny GPT-2 (learned positions, 16 of them; Conv1D weights) with the llama's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel
    folder = base / "gpt2"
    if not folder.exists():
        vocab = json.loads((base / "model" / "config.json").read_text())["vocab_size"]
        GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=16, n_embd=32, n_layer=1, n_head=2)).save_pretrained(folder)
        for f in (base / "model").iterdir():
            if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
                (folder / f.name).symlink_to(f)
    return folder


@pytest.mark.parametrize("strategy", ["auto", "single"])
def test_packed_blocks_past_learned_positions_are_refused(base, gpt2, tmp_path, strategy):
    """Packed text makes every block max_length long: past GPT-2's 16 learned positions the first
    step would stop (it did, after loading and tokenizing). The plan and the run refuse it first,
    naming dataset.max_length."""
    job = ["--model", gpt2, "--data", base / "data.jsonl", "--max-length", 32, "--steps", 1,
           "--strategy", strategy, "--out", tmp_path / "out"]
    code, err, _, _ = run_measured(["finetune", *job])
    assert code == 2 and "dataset.max_length 32: packed text makes every block this long" in err, err
    assert "set dataset.max_length to 16 at most" in err
    code, err, _, _ = run_measured(["plan", spec_of(job, tmp_path)])
    assert code == 2 and "dataset.max_length 32: packed text" in err, err


def test_quantizing_conv1d_weights_is_refused_before_the_data(base, gpt2, tmp_path):
    """QLoRA on GPT-2 (Conv1D weights, which the engine does not quantize): the plan had approved
    it, and the run failed after reading and tokenizing the data."""
    job = ["--model", gpt2, "--data", base / "data.jsonl", "--max-length", 16, "--steps", 1,
           "--method", "lora", "--quantize", "nf4", "--out", tmp_path / "out"]
    events = tmp_path / "events.jsonl"
    code, err, _, _ = run_measured(["finetune", *job, "--events", events])
    assert code == 2 and "GPT-2's Conv1D" in err and "method.quantize" in err, err
    assert not any(e.get("phase") == "read" for e in map(json.loads, events.read_text().splitlines())
                   if e.get("type") == "progress"), "refused before the data is read"
    code, err, _, _ = run_measured(["plan", spec_of(job, tmp_path)])
    assert code == 2 and "GPT-2's Conv1D" in err, err


def test_a_batch_larger_than_the_data_is_warned_of(base, tmp_path):
    """A step that asks for more sequences than the data has trains, and says so (it was
    silent)."""
    events = tmp_path / "events.jsonl"
    code, stderr, _, _ = run_measured(["finetune", "--model", base / "model", "--data", base / "data.jsonl",
                                       "--max-length", 32, "--steps", 1, "--batch-size", 4096,
                                       "--out", tmp_path / "out", "--events", events])
    assert code == 0, stderr
    warned = [e["message"] for e in map(json.loads, events.read_text().splitlines())
              if e.get("type") == "log" and e.get("level") == "warning" and "fewer than a step's" in e.get("message", "")]
    assert len(warned) == 1 and "fewer than a step's 4096" in warned[0], warned


def test_model_that_fits_still_runs(base, tmp_path):
    """The check refuses only what cannot fit: the tiny model itself evaluates."""
    code, stderr, _, _ = run_measured(["eval", "--model", base / "model", "--data", base / "data.jsonl"])
    assert code == 0, stderr


def test_simulated_memory_is_the_budget(base, tmp_path):
    """`run --simulate-host-memory` is the memory the check weighs: a budget of 1 MiB refuses even
    the tiny model's training state (about 1.6 MiB in fp32 with AdamW)."""
    spec = {"version": 1, "model": {"path": str(base / "model")}, "dataset": {"train": [str(base / "data.jsonl")], "max_length": 32},
            "method": {"type": "full"}, "training": {"steps": 1}, "strategy": {"name": "single"},
            "output": {"dir": str(tmp_path / "out")}}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    code, stderr, _, _ = run_measured(["run", tmp_path / "job.json", "--simulate-host-memory", "1MiB"])
    assert code == 2, stderr
    assert "simulated" in stderr and "1.0 MiB of memory" in stderr, stderr
    assert str(base / "model" / "config.json") in stderr, stderr
