"""Checkpoint manifests carry a standard checksum (issue 15, finding 7): XXH3-128, named in the
manifest, equal to what the `xxhash` package (the reference implementation's Python binding)
computes for every file; manifests written before it (the engine's old "fnv1a64" field) still
verify and resume; a file changed on disk after the save (same size) makes resume skip that
checkpoint for the previous one, naming the file and the algorithm."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))


def cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600)


def legacy_fnv(data: bytes) -> str:
    # The engine's checksum before XXH3: FNV-1a 64 started from 1469598103934665603.
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("checksum")
    make_tiny_llama(d / "model")
    write_text_dataset(d / "text.jsonl")
    out = d / "run"
    r = cli("finetune", "--model", d / "model", "--data", d / "text.jsonl", "--steps", 4, "--batch-size", 4,
            "--save-every", 2, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def manifest_of(checkpoint):
    return json.loads((checkpoint / "manifest.json").read_text())


def resume(run_dir, steps):
    job = json.loads((run_dir / "job.json").read_text())
    job["training"]["steps"] = steps
    job["output"]["dir"] = str(run_dir)  # a copy's job.json still names the original folder
    job_path = run_dir.parent / f"job-{steps}.json"
    job_path.write_text(json.dumps(job))
    return cli("run", job_path, "--resume", run_dir, "--events", "-")


def resumed_from(result):
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    metrics = [e["step"] for e in events if e.get("type") == "metric" and "loss" in e]
    return metrics[0] - 1 if metrics else None


def test_manifest_names_xxh3_128_and_the_reference_agrees(run_dir):
    checkpoints = sorted(run_dir.glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in checkpoints:
        manifest = manifest_of(checkpoint)
        assert manifest["checksum"] == "xxh3_128"
        names = sorted(p.name for p in checkpoint.iterdir() if p.name != "manifest.json")
        assert sorted(f["name"] for f in manifest["files"]) == names
        for f in manifest["files"]:
            data = (checkpoint / f["name"]).read_bytes()
            assert f["size"] == len(data)
            assert "fnv1a64" not in f
            assert f["xxh3_128"] == xxhash.xxh3_128_hexdigest(data), f["name"]


def test_a_changed_file_is_skipped_naming_it(tmp_path, run_dir):
    copy = tmp_path / "run"
    subprocess.run(["cp", "-a", run_dir, copy], check=True)
    manifest = manifest_of(copy / "checkpoint-4")
    victim = max(manifest["files"], key=lambda f: f["size"])["name"]
    path = copy / "checkpoint-4" / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size: only the checksum can tell
    path.write_bytes(bytes(data))
    r = resume(copy, 6)
    assert r.returncode == 0, r.stderr
    assert f"{victim} does not match its checksum (xxh3_128)" in r.stdout + r.stderr
    assert resumed_from(r) == 2


def with_legacy_manifests(tmp_path, run_dir, name):
    copy = tmp_path / name
    subprocess.run(["cp", "-a", run_dir, copy], check=True)
    for checkpoint in sorted(copy.glob("checkpoint-*")):
        manifest = manifest_of(checkpoint)
        del manifest["checksum"]
        for f in manifest["files"]:
            del f["xxh3_128"]
            f["fnv1a64"] = legacy_fnv((checkpoint / f["name"]).read_bytes())
        (checkpoint / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy


def test_a_manifest_written_before_xxh3_still_resumes(tmp_path, run_dir):
    copy = with_legacy_manifests(tmp_path, run_dir, "legacy")
    r = resume(copy, 6)
    assert r.returncode == 0, r.stderr
    assert resumed_from(r) == 4

    # The old checksum is still checked, not just accepted.
    copy = with_legacy_manifests(tmp_path, run_dir, "legacy-wrong")
    manifest = manifest_of(copy / "checkpoint-4")
    manifest["files"][0]["fnv1a64"] = "0" * 16
    (copy / "checkpoint-4" / "manifest.json").write_text(json.dumps(manifest, indent=2))
    r = resume(copy, 6)
    assert r.returncode == 0, r.stderr
    assert f"{manifest['files'][0]['name']} does not match its checksum (fnv1a64)" in r.stdout + r.stderr
    assert resumed_from(r) == 2
