"""dataset.skip_bad_rows: `tessera-cli run` says how many rows it skipped in each place, the rows
that do not parse, the training share's and the validation share's, and trains on the others.
The bad rows are planted at positions whose share is known here: the split is computed by an
implementation of data/split.h's algorithm of this file's own (std::mt19937_64 written out)."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))

MASK = (1 << 64) - 1


class MT19937_64:
    """The 64-bit Mersenne Twister as the C++ standard defines std::mt19937_64."""

    def __init__(self, seed):
        self.mt = [seed & MASK]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK)
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for i in range(312):
                y = (self.mt[i] & ~((1 << 31) - 1) & MASK) | (self.mt[(i + 1) % 312] & ((1 << 31) - 1))
                self.mt[i] = self.mt[(i + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK


def validation_share(n, fraction, seed):
    """The row indices data::split_rows holds out: the first ceil(fraction * n) of a Fisher-Yates
    shuffle from the end, drawn by rejection below 2^64 - (2^64 mod bound)."""
    rng = MT19937_64(seed)
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = MASK - (1 << 64) % bound
        while True:
            r = rng()
            if r <= limit:
                break
        j = r % bound
        order[i], order[j] = order[j], order[i]
    held = -(-int(fraction * n * 1000) // 1000)  # ceil, exact for the fractions used here
    return set(order[:held])


def test_the_generator_is_the_standard_one():
    rng = MT19937_64(5489)  # the standard's check: the 10000th value of a default-seeded engine
    for _ in range(9999):
        rng()
    assert rng() == 9981545732273789042


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo") / "demo"
    r = subprocess.run([CLI, "demo", "--out", d, "--no-train"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d


def demo_rows(demo, n):
    return (demo / "train.jsonl").read_text().splitlines()[:n]


def missing_output(row):
    """The row without its output column: the example builder rejects it (InvalidInput)."""
    return json.dumps({"instruction": json.loads(row)["instruction"]})


def run_job(demo, tmp_path, name, dataset, seed):
    spec = json.loads((demo / "job.json").read_text())
    spec["dataset"] = {**spec["dataset"], "validation": [], "validation_split": 0.0,
                       "packing": False, "skip_bad_rows": True, **dataset}
    spec["training"].update(steps=2, save_every=0, eval_every=0, batch_size=8, warmup_steps=0,
                            seed=seed)
    spec["output"] = {"dir": str(tmp_path / name)}
    job = tmp_path / f"{name}.json"
    job.write_text(json.dumps(spec))
    r = subprocess.run([CLI, "run", job], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]
    return [e["message"] for e in events if e["type"] == "log"]


def skipped(logs, prefix):
    """The count of the `prefix: N rows skipped: …` warning (0 when there is none) and its text."""
    found = [m for m in logs if m.startswith(prefix + ": ")]
    assert len(found) <= 1, found
    if not found:
        return 0, ""
    count = re.match(re.escape(prefix) + r": (\d+) rows? skipped", found[0])
    assert count, found[0]
    return int(count.group(1)), found[0]


def sequences(logs):
    line = next(m for m in logs if re.fullmatch(r"\d+ training and \d+ validation sequences", m))
    return tuple(int(x) for x in re.findall(r"\d+", line))


def planted_dataset(demo, path, fraction, seed):
    """40 demo rows: one line that is not JSON (left out when read, before the split of the other
    39), and 5 rows without their output column, 2 in the validation share of `seed` and 3 in the
    training share."""
    rows = demo_rows(demo, 40)
    unreadable_at = 5
    readable = rows[:unreadable_at] + rows[unreadable_at + 1:]
    held = validation_share(len(readable), fraction, seed)
    assert len(held) == 10
    bad = sorted(held)[:2] + sorted(set(range(len(readable))) - held)[:3]
    for i in bad:
        readable[i] = missing_output(readable[i])
    lines = readable[:unreadable_at] + ['{"instruction": "first abc", "output":'] + readable[unreadable_at:]
    path.write_text("\n".join(lines) + "\n")
    return bad


def test_bad_rows_in_the_validation_share_are_counted(demo, tmp_path):
    data = tmp_path / "planted.jsonl"
    bad = planted_dataset(demo, data, 0.25, seed=11)
    logs = run_job(demo, tmp_path, "split", {"train": [str(data)], "validation_split": 0.25}, seed=11)
    count, text = skipped(logs, "unreadable rows")
    assert count == 1 and "planted.jsonl:6" in text, logs
    assert skipped(logs, "training rows")[0] == 3, logs
    count, text = skipped(logs, "validation rows")
    assert count == 2, logs
    assert "column 'output' (output) is missing" in text
    assert sequences(logs) == (29 - 3, 10 - 2)

    # Another seed holds out other rows: the counts follow the split of the run's seed.
    held = validation_share(39, 0.25, 7)
    in_validation = len(held & set(bad))
    assert in_validation != 2, "seed 7 should move a bad row to the other share"
    logs = run_job(demo, tmp_path, "seed7", {"train": [str(data)], "validation_split": 0.25}, seed=7)
    assert skipped(logs, "training rows")[0] == 5 - in_validation, logs
    assert skipped(logs, "validation rows")[0] == in_validation, logs
    assert sequences(logs) == (29 - (5 - in_validation), 10 - in_validation)


def test_validation_files_bad_rows_are_counted(demo, tmp_path):
    rows = demo_rows(demo, 30)
    train, validation = rows[:20], rows[20:]
    train[4] = missing_output(train[4])
    validation[1] = missing_output(validation[1])
    validation[7] = missing_output(validation[7])
    validation[3] = '{"instruction": '
    (tmp_path / "train.jsonl").write_text("\n".join(train) + "\n")
    (tmp_path / "validation.jsonl").write_text("\n".join(validation) + "\n")
    logs = run_job(demo, tmp_path, "files", {"train": [str(tmp_path / "train.jsonl")],
                                             "validation": [str(tmp_path / "validation.jsonl")]},
                   seed=7)
    assert skipped(logs, "training rows")[0] == 1
    count, text = skipped(logs, "unreadable validation rows")
    assert count == 1 and "validation.jsonl:4" in text
    assert skipped(logs, "validation rows")[0] == 2
    assert sequences(logs) == (19, 7)
