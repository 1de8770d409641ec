"""Bad input never costs the user's data (issue 15): a run folder with checkpoints and an export is
hashed file by file (XXH3-128), then each refusal below is made against it — each must exit 2 —
and the folder is hashed again: every checkpoint, the export, job.json and plan.json are byte for
byte as they were, and the event stream only grew (a resume records its error; what was there is
a prefix of what is there).

- a new run with bad data into the folder (`finetune --out RUN`): refused because the folder holds
  a run (before, it replaced job.json and truncated the event stream, then failed on the data)
- a resume whose job reads a file that is not text (a PNG renamed .jsonl)
- a resume with a job spec that has an unknown field
- an export onto the run's model folder without --force, and with --force from a model whose
  config.json asks for 1e9 layers
- a forced export onto the run folder itself, which holds the model being exported
- the demo into the run's folder (it writes its own files and replaces its run there)
- eval of a checkpoint folder, which is not a model folder
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def hashes(folder):
    return {p.relative_to(folder).as_posix(): xxhash.xxh3_128_hexdigest(p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keep")
    make_tiny_llama(d / "model")
    write_text_dataset(d / "text.jsonl")
    (d / "picture.jsonl").write_bytes(PNG)
    out = d / "run"
    r = cli("finetune", "--model", d / "model", "--data", d / "text.jsonl", "--steps", 2, "--save-every", 1,
            "--out", out)
    assert r.returncode == 0, r.stderr
    assert (out / "checkpoint-2").is_dir() and (out / "model" / "model.safetensors").is_file()
    return out


def job_variant(run_dir, tmp_path, change):
    job = json.loads((run_dir / "job.json").read_text())
    change(job)
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(job))
    return path


def test_refusals_leave_the_run_folder_as_it_was(run_dir, tmp_path):
    before = hashes(run_dir)
    events_before = (run_dir / "events.jsonl").read_bytes()
    picture = run_dir.parent / "picture.jsonl"

    refusals = {}
    refusals["new run with bad data into the run's folder"] = cli(
        "finetune", "--model", run_dir.parent / "model", "--data", picture, "--steps", 2, "--out", run_dir)
    refusals["resume reading a PNG as data"] = cli(
        "run", job_variant(run_dir, tmp_path, lambda j: j["dataset"].update(train=[str(picture)])),
        "--resume", run_dir)
    refusals["resume with an unknown field"] = cli(
        "run", job_variant(run_dir, tmp_path, lambda j: j["training"].update(lerning_rate=0.1)), "--resume", run_dir)
    refusals["export onto the run's model"] = cli("export", "--model", run_dir / "model", "--out", run_dir / "model")
    absurd = tmp_path / "absurd"
    shutil.copytree(run_dir / "model", absurd)
    config = json.loads((absurd / "config.json").read_text())
    config["num_hidden_layers"] = 1_000_000_000
    (absurd / "config.json").write_text(json.dumps(config))
    refusals["forced export of a 1e9-layer model"] = cli("export", "--model", absurd, "--out", run_dir / "model",
                                                          "--force")
    # --out a folder that holds the model: replacing it would delete the model and the run beside it.
    refusals["forced export onto the folder holding the model"] = cli("export", "--model", run_dir / "model",
                                                                       "--out", run_dir, "--force")
    # The demo writes its files and replaces its run in --out: a run's folder is not the demo's.
    refusals["demo into the run's folder"] = cli("demo", "--out", run_dir, "--no-train")
    # A checkpoint is not a model folder: said so (it was exit 1, "cannot open config.json").
    refusals["eval of a checkpoint"] = cli("eval", "--model", run_dir / "checkpoint-2", "--data",
                                           run_dir.parent / "text.jsonl")
    for what, r in refusals.items():
        assert r.returncode == 2, f"{what}: exit {r.returncode}: {r.stderr}"
    assert "holds the model being exported" in refusals["forced export onto the folder holding the model"].stderr
    assert "which is not the demo's" in refusals["demo into the run's folder"].stderr
    assert "a training checkpoint" in refusals["eval of a checkpoint"].stderr
    assert f"the run's model is beside it in {run_dir / 'model'}" in refusals["eval of a checkpoint"].stderr
    assert "already holds a run (checkpoint-1, checkpoint-2, model/)" in \
        refusals["new run with bad data into the run's folder"].stderr
    assert f"--resume {run_dir}" in refusals["new run with bad data into the run's folder"].stderr

    after = hashes(run_dir)
    changed = [name for name in before if name != "events.jsonl" and after.get(name) != before[name]]
    assert not changed, f"changed by a refusal: {changed}"
    added = sorted(set(after) - set(before))
    assert not added, f"left by a refusal: {added}"
    assert (run_dir / "events.jsonl").read_bytes().startswith(events_before), "the event stream lost events"
