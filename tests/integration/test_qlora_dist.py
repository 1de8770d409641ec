"""QLoRA (issue 27) under the strategies that take a quantized base.

- One job as 2 processes (`tessera-cli launch`) with `ddp`, `zero` stage 2 and `gemini` (sharded
  chunks; the quantized Linears held beside them on every rank), LoRA on the tiny Llama's base
  quantized to NF4 with double-quantized absmax (every rank quantizes the same checkpoint the same
  way), against the same job in one process with gradient accumulation 2: the same losses and the
  same merged export (each tensor within 1e-5 of the one-process run's, relative to its norm;
  float32 sums of two micro-batches' gradients: measured equal bit for bit).
- `gemini` in one process with half the parameter chunks and all the optimizer state on disk: the
  same losses and export as `single`.
- `auto` over 2 processes plans one of them, with the quantized base.
- Named `hybrid` with a quantized base is refused by name before any rank starts ("not supported
  yet", the hint naming the strategies that take one), exit 2.
"""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from test_launch import cli, events_of, job, losses_of, run_job, workdir  # noqa: F401 (workdir: fixture)

LOSS_BOUND = 1e-5
EXPORT_BOUND = 1e-5


def qlora_job(workdir, name, strategy, accumulation, options=None):
    path = job(workdir, name, strategy=strategy, steps=4, accumulation=accumulation, eval_every=0)
    spec = json.loads(path.read_text())
    spec["method"] = {"type": "lora", "rank": 8, "alpha": 16, "quantize": "nf4", "double_quant": True}
    spec["strategy"]["options"].update(options or {})
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def one_process(workdir):
    run_job(qlora_job(workdir, "qlora-single", "single", 2), 1)
    return workdir / "qlora-single"


def same_run(out, one_process, what):
    """`out`'s losses and merged export equal the one-process run's (returns its events)."""
    events = events_of(out / "events.jsonl")
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert any("linear weights to nf4 (double-quantized absmax)" in m for m in logs), logs
    expected, got = losses_of(events_of(one_process / "events.jsonl")), losses_of(events)
    assert len(expected) == len(got) == 4, (expected, got)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, expected))
    print(f"QLoRA {what} vs one process with accumulation 2: losses {worst:.2e} relative")
    assert worst <= LOSS_BOUND, (got, expected)
    ours, reference = load_file(str(out / "model" / "model.safetensors")), \
        load_file(str(one_process / "model" / "model.safetensors"))
    assert ours.keys() == reference.keys()
    export = max(float(np.linalg.norm(ours[k] - reference[k]) / max(np.linalg.norm(reference[k]), 1e-30))
                 for k in reference)
    print(f"  merged export: {export:.2e} relative (worst tensor)")
    assert export <= EXPORT_BOUND
    return events


@pytest.mark.parametrize("strategy,options", [("ddp", {}), ("zero", {"stage": 2}), ("gemini", {})])
def test_two_ranks_equal_one_process_with_accumulation_two(workdir, one_process, strategy, options):
    name = f"qlora-{strategy}-2"
    run_job(qlora_job(workdir, name, strategy, 1, options), 2)
    out = workdir / name
    # Trained as 2 processes: the checkpoint says so (zero's and gemini's state sharded over them).
    manifest = json.loads((out / "checkpoint-4" / "manifest.json").read_text())
    assert manifest["world_size"] == 2, manifest
    assert manifest["state_layout"] == ("replicated" if strategy == "ddp" else "sharded"), manifest
    same_run(out, one_process, f"{strategy} on 2 ranks")


def test_gemini_with_chunks_on_disk_equals_single(workdir, one_process):
    name = "qlora-gemini-disk"
    run_job(qlora_job(workdir, name, "gemini", 2, {"offload_param_frac": 0.5, "offload_optim_frac": 1.0}), 1)
    events = same_run(workdir / name, one_process, "gemini with chunks on disk")
    disk = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"]
    assert disk and disk[-1]["by_category"]["weights"] > 0, disk[-1:]  # the chunks did go to disk


def test_auto_over_two_processes_plans_a_strategy_that_takes_the_quantized_base(workdir):
    r = cli("plan", qlora_job(workdir, "qlora-auto", "auto", 1), "--nproc", 2, "--json")
    assert r.returncode == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    assert settings["strategy"] in ("ddp", "zero", "gemini"), settings
    assert settings["quantize"] == "nf4" and settings["double_quant"], settings


@pytest.mark.parametrize("strategy,options", [("hybrid", {"tp_size": 2})])
def test_strategies_without_a_quantized_base_are_refused_by_name(workdir, strategy, options):
    r = cli("launch", "--nproc", 2, qlora_job(workdir, f"qlora-{strategy}", strategy, 1, options))
    assert r.returncode == 2, r.stderr
    # Before any rank started: no rank read the data or wrote the run's job.json.
    assert "training and" not in r.stderr and not (workdir / f"qlora-{strategy}" / "job.json").exists()
    assert f'under strategy "{strategy}" is not supported yet' in r.stderr, r.stderr
    assert "hint: use strategy single, gemini, ddp or zero" in r.stderr, r.stderr
