"""A download killed anywhere (issue 15): `tessera-cli hub download` against the local Hub server
(tests/pylib/hub_server.py) is killed with SIGKILL at a random moment KILLS times (default 20 in the suite;
TESSERA_FAULT_DOWNLOAD_KILLS), each time into a fresh cache, then run again to completion. While
each killed download runs, the cache's snapshots/ folder is watched: every entry that appears
there is already whole (a link to a blob of the file's full size), never a partial file. After the
second run the cache is consistent (tests/pylib/hub_server.walk_cache: relative links into
blobs/, LFS blobs that hash to their names, no .incomplete or temporary file left) and
huggingface_hub, offline, reads the snapshot as complete with every file's bytes."""
import os
import random
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo, client_env, walk_cache  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
KILLS = int(os.environ.get("TESSERA_FAULT_DOWNLOAD_KILLS", "20"))
RATE = 1_500_000  # bytes/s per connection: the files take about a second, most of a download


def repository_files():
    rng = random.Random(7)
    files = {f"model-0000{i}-of-00003.safetensors": rng.randbytes(1_500_000 + 4096 * i) for i in range(1, 4)}
    files["config.json"] = b'{"model_type": "llama"}'
    files["tokenizer.json"] = b'{"version": "1.0"}' + b" " * 20000
    return files


@pytest.fixture(scope="module")
def hub():
    with HubServer() as server:
        server.add(Repo("org/sharded", repository_files()))
        server.faults["slow_bytes_per_s"] = RATE
        yield server


def snapshot_entries_are_whole(cache, sizes):
    snapshots = cache / "models--org--sharded" / "snapshots"
    if not snapshots.exists():
        return
    for entry in snapshots.rglob("*"):
        try:
            mode = os.lstat(entry).st_mode
        except FileNotFoundError:
            continue  # renamed into place (or away) since the listing
        if stat.S_ISDIR(mode):
            continue
        name = "/".join(entry.relative_to(snapshots).parts[1:])  # snapshots/<commit>/<path>
        # A link made under a temporary name and renamed into place is as whole as its target.
        name = re.sub(r"\.tmp\.\d+\.\d+$", "", name)
        assert stat.S_ISLNK(mode), f"{entry} is a file, not a link into blobs/"
        try:
            link = os.readlink(entry)
        except FileNotFoundError:
            continue  # a temporary name renamed into place since lstat
        target = (entry.parent / link).resolve()
        assert target.parent.name == "blobs" and target.exists(), f"{entry} -> {link}"
        assert target.stat().st_size == sizes[name], f"{name} visible with {target.stat().st_size} bytes"


def test_a_download_killed_anywhere_resumes_to_a_complete_cache(hub, tmp_path):
    from huggingface_hub import snapshot_download

    files = repository_files()
    sizes = {name: len(data) for name, data in files.items()}
    started = time.monotonic()
    r = subprocess.run([CLI, "hub", "download", "org/sharded"], capture_output=True, text=True, timeout=120,
                       env=client_env(hub, tmp_path / "reference"))
    assert r.returncode == 0, r.stderr
    whole = time.monotonic() - started
    rng = random.Random(15)
    killed_with_partial = 0
    for kill in range(KILLS):
        cache = tmp_path / f"cache-{kill}"
        proc = subprocess.Popen([CLI, "hub", "download", "org/sharded"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=client_env(hub, cache))
        deadline = time.monotonic() + rng.uniform(0.0, whole)
        while time.monotonic() < deadline and proc.poll() is None:
            snapshot_entries_are_whole(cache, sizes)
            time.sleep(0.002)
        proc.kill()
        proc.wait()
        snapshot_entries_are_whole(cache, sizes)
        blobs = cache / "models--org--sharded" / "blobs"
        killed_with_partial += bool(blobs.exists() and any(p.name.endswith(".incomplete") for p in blobs.iterdir()))

        hub.faults.pop("slow_bytes_per_s")  # the resume need not be slow to show what it does
        try:
            r = subprocess.run([CLI, "hub", "download", "org/sharded"], capture_output=True, text=True,
                               timeout=120, env=client_env(hub, cache))
        finally:
            hub.faults["slow_bytes_per_s"] = RATE
        assert r.returncode == 0, f"kill {kill}: {r.stderr}"
        (snapshot,) = walk_cache(cache)["models--org--sharded"].values()
        assert snapshot == files
        # huggingface_hub, offline, finds the snapshot complete.
        folder = Path(snapshot_download("org/sharded", cache_dir=cache, local_files_only=True))
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    assert killed_with_partial > 0, "no kill landed during a file's transfer: the download is too quick"
    print(f"{KILLS} kills ({killed_with_partial} left a partial .incomplete blob), whole download {whole:.2f} s")
