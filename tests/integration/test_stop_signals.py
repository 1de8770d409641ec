"""Signals honoured in every stage (issue 15, finding 2): SIGINT and SIGTERM used to be ignored
until loading ended. Outside the training steps there is nothing to checkpoint, so `run` ends
at once; `export` ends at once too. Each case checks the exit code (128 + the signal), that the
process ended within STOP_BOUND_S of the signal, that the stage really was under way when the
signal came, and that nothing appears under a final name (no checkpoint, no model folder, no
export); the export's staged folder, left by the dead process, is removed by the next export."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
STOP_BOUND_S = 2.0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    make_tiny_llama(d / "model")
    # Enough rows that reading and tokenizing them takes seconds (about 5 s on a 2-core machine).
    with open(d / "big.jsonl", "w") as f:
        for i in range(600_000):
            f.write(json.dumps({"text": f"{i % 97} and {i % 89} make {(i % 97) + (i % 89)}"}) + "\n")
    # A model whose export (write, reload, logits check) takes a few seconds.
    make_tiny_llama(d / "large", hidden=1024, intermediate=2816, layers=8, heads=8, kv_heads=8)
    return d


def events_of(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(predicate, timeout=60, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc is None or proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    pytest.fail("timed out")


def stop(proc, sig):
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return time.monotonic() - sent, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_stops_at_once_while_reading_the_data(workdir, tmp_path, sig):
    out, events = tmp_path / "run", tmp_path / "events.jsonl"
    proc = subprocess.Popen([CLI, "finetune", "--model", workdir / "model", "--data", workdir / "big.jsonl",
                             "--steps", "5", "--out", out, "--events", events],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The load phase has begun (its progress event) and lasts seconds: stop a moment into it.
    wait_for(lambda: any(e["type"] == "progress" and e.get("phase") == "load" for e in events_of(events)), proc=proc)
    time.sleep(0.3)
    took, err = stop(proc, sig)
    assert proc.returncode == 128 + sig, err
    assert took < STOP_BOUND_S, f"{took:.2f} s from the signal to the exit"
    seen = events_of(events)
    assert not any(e["type"] == "metric" for e in seen), "the signal came after training began"
    assert not any(e["type"] == "progress" and e.get("phase") == "load" and e.get("done") == 1 for e in seen)
    assert "nothing to checkpoint" in err
    assert not list(out.glob("checkpoint-*")) and not (out / "model").exists()
    assert {p.name for p in out.iterdir()} <= {"job.json", "plan.json"}  # written whole before loading


def test_export_stops_at_once_and_its_staged_folder_is_removed_later(workdir, tmp_path):
    dest = tmp_path / "exported"
    proc = subprocess.Popen([CLI, "export", "--model", workdir / "large", "--out", dest],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    staged = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".exported.tmp-")]  # noqa: E731
    wait_for(lambda: staged(), proc=proc)
    took, err = stop(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    assert took < STOP_BOUND_S, f"{took:.2f} s from the signal to the exit"
    assert not dest.exists(), "a half-written export under the name asked for"
    left = staged()
    assert left, "the export ended before the signal: make the model larger"
    # The next export into the same folder removes what the dead process left, and completes.
    r = subprocess.run([CLI, "export", "--model", workdir / "model", "--out", dest], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in left)
    assert f"removed {left[0]}" in r.stderr


def test_a_resume_cuts_off_an_event_torn_by_a_kill(workdir, tmp_path):
    # A run killed while writing an event leaves a partial last line; the resumed run appends to
    # the same stream, so it first cuts that incomplete event off (every line stays one event)
    # and says how many bytes went.
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"{a} and {b} make {a + b}"}) + "\n"
                             for a in range(10) for b in range(10)))
    out = tmp_path / "run"
    r = subprocess.run([CLI, "finetune", "--model", workdir / "model", "--data", small, "--steps", "2",
                        "--save-every", "1", "--out", out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    stream = out / "events.jsonl"
    torn = b'{"v":1,"type":"metric","step":3,"lo'
    with open(stream, "ab") as f:
        f.write(torn)
    job = json.loads((out / "job.json").read_text())
    job["training"]["steps"] = 3
    (tmp_path / "job.json").write_text(json.dumps(job))
    r = subprocess.run([CLI, "run", tmp_path / "job.json", "--resume", out], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = stream.read_bytes().split(b"\n")
    assert lines[-1] == b""
    events = [json.loads(line) for line in lines[:-1]]  # every line is a whole event
    warnings = [e["message"] for e in events if e["type"] == "log" and e["level"] == "warning"]
    assert any(f"the last {len(torn)} bytes, that incomplete event, were dropped" in w for w in warnings), warnings
    assert [e["step"] for e in events if e["type"] == "metric" and "loss" in e] == [1, 2, 3]


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_a_fault_reports_its_stack_and_kills_the_process_as_it_would(workdir, tmp_path, sig):
    # A crash on a machine one cannot reach (a lent GPU, a user's) must say where it happened. The
    # signal is sent here while the data loads, as a fault would raise it; the process writes its
    # stack to stderr and still dies of that signal (the exit status a parent or a shell expects).
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen([CLI, "finetune", "--model", workdir / "model", "--data", workdir / "big.jsonl",
                             "--steps", "5", "--out", tmp_path / "run", "--events", events],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(e["type"] == "progress" and e.get("phase") == "load" for e in events_of(events)), proc=proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -sig, err
    header = f"tessera-cli: fatal signal {signal.Signals(sig).name} ("
    assert header in err, err
    report = err[err.index(header):].splitlines()
    assert "this is a bug in Tessera" in report[-1], report
    frames = report[1:-1]
    assert len(frames) >= 3, report
    # Frames in tessera-cli itself, as PROGRAM(+0xOFFSET): the offset names the function with
    # addr2line and the same binary (README: "The GPU").
    ours = [f for f in frames if f.startswith(f"{Path(CLI).resolve()}(+0x") or f.startswith(f"{CLI}(+0x")]
    assert ours, frames
    addr2line = shutil.which("addr2line")
    if addr2line:
        offsets = [f.split("(+")[1].split(")")[0] for f in ours]
        named = subprocess.run([addr2line, "-f", "-C", "-e", CLI, *offsets], capture_output=True, text=True).stdout
        functions = named.splitlines()[0::2]
        assert any(name != "??" for name in functions), named
