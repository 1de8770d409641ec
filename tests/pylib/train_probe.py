"""What the trainer's parity tests share (tests/parity/test_train_parity.py, test_qlora_parity.py,
test_preference_parity.py, tests/gpu): tessera-train-probe, the engine side they drive, and the
fixed token batches both sides train on."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file


def probe_path() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    path = Path(tools) / "tessera-train-probe"
    assert path.exists(), f"{path} is missing; build the tessera-train-probe target"
    return path


def run_probe(model_dir, batch_file, steps, report, *extra):
    """Runs the probe for `steps` steps; returns its report (losses, grad_norms, lrs, ...)."""
    cmd = [str(probe_path()), "--model", str(model_dir), "--batches", str(batch_file),
           "--steps", str(steps), "--report", str(report), *map(str, extra)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd}\nstdout:{done.stdout}\nstderr:{done.stderr}"
    return json.loads(Path(report).read_text())


def counting_batches(folder, count, batch_size, length, vocab):
    """`count` batches of a learnable pattern (counting up from a random start, so a few steps
    visibly lower the loss), with right padding in some rows (labels -100 there), saved to
    folder/batches.safetensors. Returns (path, input_ids, attention_mask, labels)."""
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, vocab, (count, batch_size, 1), generator=g)
    ids = (start + torch.arange(length)) % vocab
    mask = torch.ones_like(ids)
    for i in range(0, count, 3):
        cut = 4 + i % 7
        mask[i, 1, cut:] = 0
        ids[i, 1, cut:] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    path = Path(folder) / "batches.safetensors"
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels}, str(path))
    return path, ids, mask, labels


def save_pair_batch(folder, chosen, rejected, pad_id):
    """One batch of pairs in the probe's layout: [chosen rows, rejected rows] of (ids, labels)
    lists, right-padded with `pad_id`, labels -100 on padding."""
    rows = chosen + rejected
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((1, len(rows), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((1, len(rows), length), dtype=torch.int64)
    labels = torch.full((1, len(rows), length), -100, dtype=torch.int64)
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[0, i, :len(row_ids)] = torch.tensor(row_ids)
        mask[0, i, :len(row_ids)] = 1
        labels[0, i, :len(row_ids)] = torch.tensor(row_labels)
    path = Path(folder) / "pairs.safetensors"
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels}, str(path))
    return path
