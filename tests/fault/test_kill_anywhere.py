"""kill -9 anywhere (issue 15): a fine-tune is killed with SIGKILL at a random moment — while it
loads, in a step, while a checkpoint is written or old ones pruned, during the export — then
finished the way a user would (`run --resume`, or a fresh start when no checkpoint was complete
yet), and checked against an uninterrupted run of the same job:

- resume finds the newest complete checkpoint (the resumed run starts right after a saved step);
- every step's loss (the last one recorded for it) equals the uninterrupted run's within 1e-6
  relative (resume is exact);
- nothing temporary is left in the run folder (no *.tmp*, no .old- folder) nor in the offload
  folder;
- the exported model loads in transformers and its weights equal the uninterrupted run's export.

The moments cycle through three aims: anywhere (uniform over the uninterrupted run's time), while
a checkpoint is being written (as soon as its `checkpoint-N.tmp-*` folder appears, for a save
chosen at random), and right after one is committed (as soon as `checkpoint-N` appears: the
commit's fsync and the pruning of older ones follow). The same for `gemini` with the optimizer
state on disk (every step writes its chunks back, so uniform moments land there most often), and for a 2-rank ddp job launched with
`tessera-cli launch --nproc 2` where one rank, chosen at random, is killed (every rank stops; the
job resumes on 2 ranks). TESSERA_FAULT_KILLS kills per configuration (default 3, the short form CI
runs); tests/fault/run.sh --kills N runs the long form. TESSERA_FAULT_SEED picks the moments."""
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import xxhash
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
KILLS = int(os.environ.get("TESSERA_FAULT_KILLS", "3"))
SEED = int(os.environ.get("TESSERA_FAULT_SEED", "15"))
ENV = {**os.environ, "TESSERA_DIST_TIMEOUT_S": "10", "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S": "60",
       "OMP_NUM_THREADS": "1"}
STEPS = 10


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fault")
    make_tiny_llama(d / "model", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    write_text_dataset(d / "data.jsonl")
    return d


def job_spec(workdir, out, strategy):
    spec = {
        "version": 1,
        "model": {"path": str(workdir / "model")},
        "dataset": {"train": str(workdir / "data.jsonl"), "format": "text"},
        "method": {"type": "full"},
        "training": {"steps": STEPS, "batch_size": 4, "learning_rate": 1e-3, "save_every": 2, "seed": 3},
        "output": {"dir": str(out)},
        "strategy": strategy,
    }
    return spec


CONFIGS = {
    "single": ({"name": "single"}, 1),
    "gemini-disk": ({"name": "gemini", "options": {"offload_optim_frac": 1.0}}, 1),
    "ddp-2-ranks": ({"name": "ddp"}, 2),
}


def command(job_path, nproc, resume=None):
    base = [CLI, "run", str(job_path)] if nproc == 1 else [CLI, "launch", "--nproc", str(nproc), str(job_path)]
    return base + (["--resume", str(resume)] if resume else [])


def write_job(workdir, out, name):
    strategy, nproc = CONFIGS[name]
    spec = job_spec(workdir, out, json.loads(json.dumps(strategy)))
    if name == "gemini-disk":
        spec["strategy"]["options"]["offload_dir"] = str(out.parent / (out.name + "-offload"))
    path = out.parent / (out.name + ".json")
    path.write_text(json.dumps(spec))
    return path, nproc


def losses_by_step(out):
    losses = {}
    for line in (out / "events.jsonl").read_text().splitlines():
        if not line.endswith("}"):
            continue
        e = json.loads(line)
        if e["type"] == "metric" and "loss" in e:
            losses[e["step"]] = e["loss"]  # the last one recorded for the step
    return losses


def complete_checkpoints(out):
    """Steps of the checkpoints whose manifest lists files that are all there with their size and
    XXH3-128 (checked here, independently of the engine)."""
    steps = []
    for folder in out.glob("checkpoint-*") if out.exists() else []:
        step = folder.name.split("-", 1)[1]
        if not step.isdigit() or not (folder / "manifest.json").is_file():
            continue
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except ValueError:
            continue
        if all((folder / f["name"]).is_file() and (folder / f["name"]).stat().st_size == f["size"]
               and xxhash.xxh3_128_hexdigest((folder / f["name"]).read_bytes()) == f["xxh3_128"]
               for f in manifest["files"]):
            steps.append(int(step))
    return sorted(steps)


def resumed_at(out):
    """The step the last resume started from, as the run logged it (None: it never resumed)."""
    step = None
    for line in (out / "events.jsonl").read_text().splitlines():
        if line.endswith("}"):
            e = json.loads(line)
            if e["type"] == "log" and e["message"].startswith("resumed from "):
                step = int(e["message"].rsplit(" ", 1)[1])
    return step


AIMS = ("anywhere", "checkpoint write", "after commit")
SAVES = list(range(2, STEPS + 1, 2))  # save_every 2


def wait_for_aim(out, aim, save, proc, deadline):
    """Polls the run folder until the aimed moment (or `deadline` for "anywhere"); False when the
    run ended first."""
    prefix = f"checkpoint-{save}"
    while proc.poll() is None:
        if aim == "anywhere":
            if time.monotonic() >= deadline:
                return True
        else:
            try:
                names = [entry.name for entry in os.scandir(out)]
            except FileNotFoundError:
                names = []
            if aim == "checkpoint write" and any(n.startswith(prefix + ".tmp-") for n in names):
                return True
            if aim == "after commit" and prefix in names:
                return True
        time.sleep(0.0005)
    return False


def children_of(pid):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def leftovers(folder):
    if not folder.exists():
        return []
    return [p for p in folder.rglob("*") if ".tmp" in p.name or ".old-" in p.name or p.name.startswith("tessera-offload-")]


@pytest.fixture(scope="module")
def references(workdir, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    refs = {}
    for name in CONFIGS:
        out = root / name
        job, nproc = write_job(workdir, out, name)
        started = time.monotonic()
        r = subprocess.run(command(job, nproc), capture_output=True, text=True, timeout=600, env=ENV)
        assert r.returncode == 0, r.stderr
        refs[name] = {"losses": losses_by_step(out), "seconds": time.monotonic() - started,
                      "weights": load_file(out / "model" / "model.safetensors")}
        assert sorted(refs[name]["losses"]) == list(range(1, STEPS + 1))
    return refs


def finish(job, nproc, out):
    """What a user does after a crash: resume from the run folder, or start again when no
    checkpoint was complete yet. Returns the step the run resumed from (0: started again)."""
    r = subprocess.run(command(job, nproc, resume=out), capture_output=True, text=True, timeout=600, env=ENV)
    if r.returncode == 2 and ("holds no valid checkpoint" in r.stderr or "is not a folder" in r.stderr):
        r = subprocess.run(command(job, nproc), capture_output=True, text=True, timeout=600, env=ENV)
        assert r.returncode == 0, r.stderr
        return 0
    assert r.returncode == 0, r.stderr
    return None


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kill_9_anywhere_then_resume(workdir, tmp_path, references, name):
    rng = random.Random(f"{SEED}-{name}")
    ref = references[name]
    resumed_from = []
    hits = {aim: 0 for aim in AIMS}
    for kill in range(KILLS):
        aim = AIMS[kill % len(AIMS)]
        save = rng.choice(SAVES)
        out = tmp_path / f"{name}-{kill}"
        job, nproc = write_job(workdir, out, name)
        proc = subprocess.Popen(command(job, nproc), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=ENV, start_new_session=True)
        started = time.monotonic()
        deadline = started + rng.uniform(0.0, ref["seconds"])
        hits[aim] += wait_for_aim(out, aim, save, proc, deadline)
        moment = time.monotonic() - started
        if nproc == 1:
            victim = proc.pid
        else:  # one rank, chosen at random, of those running now (launch itself when none)
            ranks = children_of(proc.pid)
            victim = rng.choice(ranks) if ranks else proc.pid
        try:
            os.kill(victim, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=120)
        complete = complete_checkpoints(out)
        started_again = finish(job, nproc, out)
        losses = losses_by_step(out)
        if started_again is None:
            # Resume took the newest checkpoint that was complete when the run was killed.
            assert complete and resumed_at(out) == max(complete), (complete, resumed_at(out))
            resumed_from.append(max(complete))
        else:
            assert not complete, f"started again although {complete} were complete"
            resumed_from.append(0)
        assert sorted(losses) == list(range(1, STEPS + 1)), f"kill {kill} ({aim}) at {moment:.2f} s"
        for step, loss in ref["losses"].items():
            assert losses[step] == pytest.approx(loss, rel=1e-6, abs=0), \
                f"kill {kill} at {moment:.2f} s: step {step} loss {losses[step]} against {loss}"
        left = leftovers(out) + leftovers(out.parent / (out.name + "-offload"))
        assert not left, f"kill {kill} at {moment:.2f} s left {left}"
        exported = AutoModelForCausalLM.from_pretrained(out / "model")
        weights = load_file(out / "model" / "model.safetensors")
        assert weights.keys() == ref["weights"].keys()
        for key, tensor in ref["weights"].items():
            torch.testing.assert_close(weights[key], tensor, rtol=1e-6, atol=1e-7, msg=f"{key} after kill {kill}")
        assert exported.config.num_hidden_layers == 2
        shutil.rmtree(out)
    print(f"{name}: {KILLS} kills ({', '.join(f'{aim}: {n} hit' for aim, n in hits.items())}); "
          f"resumed from checkpoints {resumed_from}")
