"""A job spec with model.hub_id: `tessera-cli run` fetches the model into the shared HF cache from a
local Hub-speaking server (tests/pylib/hub_server.py) with `progress` events of phase `download`,
then trains; offline it uses the cache, or fails naming what is missing."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo, client_env, walk_cache  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    r = subprocess.run([CLI, "demo", "--out", d / "demo", "--no-train"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d / "demo"


def job_file(demo, tmp_path, name, model, dataset):
    """The demo's job spec, 2 steps, with `model` and the dataset fields `dataset` (no train or
    validation files but those given), written to tmp_path/name.json."""
    spec = json.loads((demo / "job.json").read_text())
    spec["model"] = model
    kept = {k: v for k, v in spec["dataset"].items() if k not in ("train", "validation")}
    spec["dataset"] = {**kept, **dataset}
    spec["training"].update(steps=2, save_every=0, eval_every=0)
    spec["output"] = {"dir": str(tmp_path / name)}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def write_spec(demo, tmp_path, name):
    return job_file(demo, tmp_path, name, {"hub_id": "org/demo"}, {"train": [str(demo / "train.jsonl")]})


def run(spec, env):
    return subprocess.run([CLI, "run", spec], capture_output=True, text=True, timeout=600, env=env)


def events_of(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_hub_id_downloads_then_trains_and_offline_uses_the_cache(demo, tmp_path):
    files = {p.name: p.read_bytes() for p in (demo / "base").iterdir()}
    with HubServer() as hub:
        hub.add(Repo("org/demo", files))
        cache = tmp_path / "cache"

        offline = run(write_spec(demo, tmp_path, "offline-empty"), client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert offline.returncode == 2 and "org/demo" in offline.stderr and "not in the cache" in offline.stderr

        r = run(write_spec(demo, tmp_path, "online"), client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        events = events_of(tmp_path / "online")
        download = [e for e in events if e["type"] == "progress" and e["phase"] == "download"]
        total = sum(map(len, files.values()))
        assert download and download[-1]["done"] == download[-1]["total"] == total
        # The terminal shows the download as it goes, as `hub download` does (the run showed
        # nothing until its steps began), and the tokenizing after it.
        assert re.search(r"^download: .* of .* \(100%\)$", r.stderr, re.M), r.stderr
        assert re.search(r"^tokenize: (\d+)/\1 rows \(100%\)$", r.stderr, re.M), r.stderr
        assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
        snapshot = next(iter(walk_cache(cache)["models--org--demo"].values()))
        assert snapshot == files

        served = len(hub.log)
        r = run(write_spec(demo, tmp_path, "offline"), client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 0, r.stderr
        assert len(hub.log) == served, "offline asked the server nothing"

        # A cache missing the weights: the error names the file.
        blob = (cache / "models--org--demo" / "snapshots").glob("*/model.safetensors")
        next(blob).unlink()
        r = run(write_spec(demo, tmp_path, "offline-missing"), client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 2 and "model.safetensors" in r.stderr and "missing" in r.stderr, r.stderr


def dataset_spec(demo, tmp_path, name, **dataset):
    return job_file(demo, tmp_path, name, {"path": str(demo / "base")}, dataset)


def test_dataset_hub_id_picks_splits_by_name_or_pattern(demo, tmp_path):
    train = (demo / "train.jsonl").read_bytes()
    lines = train.splitlines(keepends=True)
    with HubServer() as hub:
        hub.add(Repo("org/strings", {"data/train-00000.jsonl": b"".join(lines[: len(lines) // 2]),
                                     "data/train-00001.jsonl": b"".join(lines[len(lines) // 2:]),
                                     "data/validation.jsonl": b"".join(lines[:20]),
                                     "data/test.jsonl": b"".join(lines[-20:]),
                                     "README.md": b"# strings\n"}, repo_type="dataset"))
        cache = tmp_path / "cache"

        # By split names: both train shards for training, the validation file for validation.
        r = run(dataset_spec(demo, tmp_path, "by-name", hub_id="org/strings"), client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        events = events_of(tmp_path / "by-name")
        assert any("2 training and 1 validation files" in e.get("message", "") for e in events), events[:5]
        assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
        fetched = next(iter(walk_cache(cache)["datasets--org--strings"].values()))
        assert set(fetched) == {"data/train-00000.jsonl", "data/train-00001.jsonl", "data/validation.jsonl",
                                "README.md"}

        # Patterns choose instead (the test split never trains unless asked for).
        r = run(dataset_spec(demo, tmp_path, "by-pattern", hub_id="org/strings", train=["data/train-00001.*"],
                             validation=["data/test.jsonl"]), client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        assert any("1 training and 1 validation files" in e.get("message", "")
                   for e in events_of(tmp_path / "by-pattern"))

        r = run(dataset_spec(demo, tmp_path, "no-match", hub_id="org/strings", train=["*.parquet"]),
                client_env(hub, cache))
        assert r.returncode == 2 and "dataset.train matches none" in r.stderr and "data/test.jsonl" in r.stderr

        # Offline, from what the cache holds.
        served = len(hub.log)
        r = run(dataset_spec(demo, tmp_path, "offline", hub_id="org/strings", train=["data/train-*"]),
                client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 0, r.stderr
        assert len(hub.log) == served, "offline asked the server nothing"

        # Patterns need no card: a cache holding only the training files serves them offline.
        cache = tmp_path / "cache-no-card"
        r = subprocess.run([CLI, "hub", "download", "org/strings", "--dataset", "--include", "data/train-*"],
                           capture_output=True, text=True, timeout=120, env=client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        assert "README.md" not in next(iter(walk_cache(cache)["datasets--org--strings"].values()))
        r = run(dataset_spec(demo, tmp_path, "offline-no-card", hub_id="org/strings", train=["data/train-*"]),
                client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 0, r.stderr
        # Without patterns the layout needs the card, and the error says so.
        r = run(dataset_spec(demo, tmp_path, "offline-layout", hub_id="org/strings"),
                client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 2 and "README.md" in r.stderr and "not in the cache" in r.stderr, r.stderr


def parquet(rows):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


CARD = b"""---
configs:
- config_name: small
  default: true
  data_files:
  - split: train
    path: small/train.jsonl
  - split: validation
    path: small/dev.jsonl
- config_name: other
  data_files: other/*.jsonl
---
# Two configs
"""


def test_dataset_config_from_the_card_or_the_conversion_branch_trains(demo, tmp_path):
    lines = (demo / "train.jsonl").read_bytes().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines[:300]]
    with HubServer() as hub:
        hub.add(Repo("org/configs", {"README.md": CARD, "small/train.jsonl": b"".join(lines[:200]),
                                     "small/dev.jsonl": b"".join(lines[200:220]),
                                     "other/part-1.jsonl": b"".join(lines[300:500]),
                                     "other/part-2.jsonl": b"".join(lines[500:700]),
                                     "unused/train.jsonl": b"".join(lines[:10])}, repo_type="dataset"))
        hub.add(Repo("org/scripted", {"README.md": b"# a loading script\n", "scripted.py": b"pass\n"}, repo_type="dataset",
                     branches={"refs/convert/parquet": {"default/train/0000.parquet": parquet(rows[:150]),
                                                        "default/train/0001.parquet": parquet(rows[150:280]),
                                                        "default/validation/0000.parquet": parquet(rows[280:])}}))
        cache = tmp_path / "cache"

        # No dataset.config: the card's default config, its train and validation splits.
        r = run(dataset_spec(demo, tmp_path, "default-config", hub_id="org/configs"), client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        events = events_of(tmp_path / "default-config")
        assert any("config small (from its card): 1 training and 1 validation files" in e.get("message", "")
                   for e in events), events[:6]
        assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
        fetched = next(iter(walk_cache(cache)["datasets--org--configs"].values()))
        assert set(fetched) == {"README.md", "small/train.jsonl", "small/dev.jsonl"}, "only the config's files"

        # dataset.config names another one.
        r = run(dataset_spec(demo, tmp_path, "other-config", hub_id="org/configs", config="other"),
                client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        events = events_of(tmp_path / "other-config")
        assert any("config other (from its card): 2 training and 0 validation files" in e.get("message", "")
                   for e in events)
        assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
        r = run(dataset_spec(demo, tmp_path, "no-config", hub_id="org/configs", config="nope"), client_env(hub, cache))
        assert r.returncode == 2 and 'dataset.config "nope" is not one of its configs (small, other)' in r.stderr

        # Offline, the same choice from the cache (the card was cached with the files).
        served = len(hub.log)
        r = run(dataset_spec(demo, tmp_path, "offline-config", hub_id="org/configs", config="other"),
                client_env(hub, cache, HF_HUB_OFFLINE=1))
        assert r.returncode == 0, r.stderr
        assert len(hub.log) == served, "offline asked the server nothing"

        # A dataset with only a loading script trains from the Hub's Parquet conversion.
        r = run(dataset_spec(demo, tmp_path, "converted", hub_id="org/scripted"), client_env(hub, cache))
        assert r.returncode == 0, r.stderr
        events = events_of(tmp_path / "converted")
        assert any("config default (from its parquet conversion): 2 training and 1 validation files at "
                   "refs/convert/parquet" in e.get("message", "") for e in events), events[:6]
        assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
        branch = hub.repos[("dataset", "org/scripted")].branches["refs/convert/parquet"]
        assert (cache / "datasets--org--scripted" / "refs" / "refs" / "convert" / "parquet").read_text() == branch.sha
        assert walk_cache(cache)["datasets--org--scripted"][branch.sha] == branch.files
