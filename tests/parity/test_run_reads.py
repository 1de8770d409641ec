"""One run reads its input model once: `tessera-cli run` parses config.json once and opens each
safetensors file of the model folder (and the shard index) once, whatever stages the job goes
through (the planner, loading, the LoRA merge's fp32 base) — but for the shard holding a frozen
input embedding that LoRA leaves in its file, opened once more for its row reads. Measured independently of the
engine: the process's open calls, traced by strace. The export's self-check reopens the files it
wrote; only the input folder's files are counted."""
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_tokenizer import byte_level_bpe  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))


def strace_unavailable():
    if shutil.which("strace") is None:
        return "strace is not installed (installer/bootstrap.sh installs it)"
    r = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return "strace cannot trace here (ptrace not permitted): " + r.stderr.strip()
    return None


pytestmark = pytest.mark.skipif(strace_unavailable() is not None, reason=str(strace_unavailable()))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("reads")
    corpus = [f"What is {a} plus {b}? {a + b}" for a in range(20) for b in range(20)]
    fast = byte_level_bpe(corpus, 300)
    model_dir = d / "model"
    fast.save_pretrained(model_dir)
    torch.manual_seed(0)
#Small shards, so the index and several files are read.
    LlamaForCausalLM(LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
                                 pad_token_id=2)).save_pretrained(model_dir, max_shard_size="100KB")
    assert len(list(model_dir.glob("*.safetensors"))) > 1
    with open(d / "data.jsonl", "w") as f:
        for line in corpus[:64]:
            f.write(json.dumps({"text": line}) + "\n")
    return d


def opens_under(trace: Path, folder: Path) -> Counter:
    """Paths under `folder` that the traced processes opened (every attempt), by file name."""
    pattern = re.compile(r'\bopen(?:at2?)?\((?:[^,"]+, )?"([^"]*)"')
    counts = Counter()
    for line in trace.read_text(errors="replace").splitlines():
        m = pattern.search(line)
        if m and Path(m.group(1)).parent == folder:
            counts[Path(m.group(1)).name] += 1
    return counts


@pytest.mark.parametrize("case", [
    ["--method", "full", "--precision", "fp32", "--strategy", "single"],
#bf16 LoRA : the merge reads the checkpoint's fp32 base; "auto": the planner reads the folder.
    ["--method", "lora", "--precision", "bf16", "--strategy", "auto"],
], ids=["full-single", "lora-bf16-auto"])
def test_run_reads_config_and_checkpoint_once(workdir, case, tmp_path):
    model_dir = (workdir / "model").resolve()
    out = tmp_path / "run"
    args = ["finetune", "--model", model_dir, "--data", workdir / "data.jsonl", "--steps", 2, "--batch-size", 4,
            "--max-length", 32, "--out", out, *case, "--print-job"]
    job = subprocess.run([CLI, *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    (tmp_path / "job.json").write_text(job.stdout)
    trace = tmp_path / "trace.txt"
    r = subprocess.run(["strace", "-f", "-qq", "-s", "4096", "-e", "trace=open,openat,openat2", "-o", str(trace),
                        CLI, "run", str(tmp_path / "job.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"

    opened = opens_under(trace, model_dir)
    assert opened["config.json"] == 1, opened
    weights = sorted(p.name for p in model_dir.glob("*.safetensors"))
    # LoRA under single leaves the frozen input embedding and output head in their files and
    # opens the shard that holds each once more, for the row reads (pread) that outlive the load's
    # mapping; the run says so in its log.
    expected = {name: 1 for name in weights}
    left_in_file = [e["message"].split(" ")[0] for e in events
                    if e["type"] == "log" and "stays in the checkpoint file" in e["message"]]
    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for name in left_in_file:
        expected[weight_map[name]] += 1
    if case[1] == "lora":
        assert left_in_file == ["model.embed_tokens.weight", "lm_head.weight"], events
    assert {
name: opened[name] for name in weights} == expected, opened
    assert opened["model.safetensors.index.json"] == 1, opened
    assert opened["tokenizer.json"] >= 1, "the trace sees the run's opens"
