"""The studio's runs database survives its writer being killed (issue 15): the writer
(tessera-runs-db-writer: the studio's RunsStore, WAL mode, one writer thread, a busy timeout)
commits a run row and ten metric rows per batch and says so after each commit; it is killed
with SIGKILL at a random moment KILLS times (default 300 in the suite; TESSERA_RUNS_DB_KILLS overrides),
each new writer reopening the same file. Then SQLite's own `PRAGMA integrity_check` is ok, every
batch a writer said was committed is there whole (its run row and all ten metric rows), and no
batch is there in part."""
import os
import random
import sqlite3
import subprocess
import time

WRITER = os.environ["TESSERA_RUNS_DB_WRITER"]
KILLS = int(os.environ.get("TESSERA_RUNS_DB_KILLS", "300"))


def test_kill_9_during_inserts_loses_no_committed_row(tmp_path):
    db = tmp_path / "runs.sqlite"
    rng = random.Random(15)
    committed, after_a_commit = set(), 0
    for kill in range(KILLS):
        # Each writer numbers its batches from a range of its own: no run id is written twice.
        writer = subprocess.Popen([WRITER, str(db), str(kill * 1_000_000)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        out = b""
        while b"ready\n" not in out:  # raw reads: nothing the writer says is held in a buffer
            chunk = os.read(writer.stdout.fileno(), 4096)
            assert chunk, f"the writer ended before it was ready (exit {writer.wait()})"
            out += chunk
        # Within a few batches: the kill lands in a transaction, a commit, or between them.
        time.sleep(rng.uniform(0.0, 0.015))
        writer.kill()
        while chunk := os.read(writer.stdout.fileno(), 4096):
            out += chunk
        writer.stdout.close()
        assert writer.wait() == -9
        said = [int(line.split()[1]) for line in out.decode().splitlines() if line.startswith("committed ")]
        committed.update(said)
        after_a_commit += 1 if said else 0

    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    runs = {row[0] for row in con.execute("SELECT id FROM runs")}
    counts = dict(con.execute("SELECT run_id, COUNT(*) FROM metrics GROUP BY run_id"))
    missing = [n for n in committed if f"run-{n}" not in runs or counts.get(f"run-{n}") != 10]
    assert not missing, f"committed batches lost or partial: {missing[:10]}"
    partial = [r for r in runs if counts.get(r, 0) != 10]
    assert not partial, f"batches there in part: {partial[:10]}"
    assert after_a_commit >= KILLS // 4, "too few kills landed after a commit to show anything"
    print(f"{KILLS} kills ({after_a_commit} after at least one commit): {len(committed)} batches said committed, "
          f"all found whole; {len(runs)} runs in the database, all whole")
