"""Preference tuning end to end (issue 27): `tessera-cli` on a JSONL of pairs.

- DPO with LoRA through `finetune --preference dpo`: every step's metric carries the preference
  figures, the margin grows and the chosen completions win more pairs than at the start, and the
  exports load (the adapter in peft, the merged model in transformers).
- DPO with full fine-tuning on 2 processes (`ddp`, `zero` stage 2, sharded `gemini`) equals one
  process with gradient accumulation 2: losses and rewards (the reference a frozen copy on every
  rank); so does `gemini` in one process with half its parameter chunks and all its optimizer
  state on disk, and DPO with LoRA under it (the reference: the chunked base with the adapters
  off) equals LoRA under `single`, as does KTO with LoRA (its mismatched rows and KL estimate).
- KTO with LoRA on unpaired examples (prompt, completion, label): the log of how many are
  desirable and, out of the KTO paper's balance, the weights that would restore it; per step the
  desirable and undesirable counts and the KL estimate (0 at the start, floored at 0).
- Resume is exact: 4 steps equal 2 steps, a checkpoint and 2 more.
- Refusals: pairs without method.preference, method.preference on text, hybrid by name (before
  any rank starts), a field of another loss.
"""
import json

import pytest
import torch

from test_launch import cli, events_of, run_job, workdir  # noqa: F401 (workdir: fixture)

BOUND = 1e-5


@pytest.fixture(scope="module")
def pairs(workdir):
    path = workdir / "pairs.jsonl"
    rows = [{"prompt": f"What is {a} plus {b}?", "chosen": f" {a + b}", "rejected": f" {a + b + 3}"}
            for a in range(8) for b in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pair_job(workdir, pairs, name, strategy="single", steps=4, accumulation=1, method=None, **options):
    spec = {
        "version": 1,
        "model": {"path": str(workdir / "model")},
        "dataset": {"train": str(pairs)},
        "method": method or {"type": "full", "preference": {"loss": "dpo", "beta": 0.5}},
        "training": {"steps": steps, "batch_size": 4, "gradient_accumulation": accumulation,
                     "learning_rate": 1e-3, "schedule": "constant", "seed": 7},
        "strategy": {"name": strategy, "options": {"device": "cpu", **options}},
        "output": {"dir": str(workdir / name)},
    }
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def preference_of(events):
    return [e["preference"] for e in events if e["type"] == "metric" and "preference" in e]


def losses_of(events):
    return [e["loss"] for e in events if e["type"] == "metric" and "loss" in e]


def finetune_lora(workdir, data, loss, out, strategy="single", options=None):
    """`finetune --preference LOSS` with LoRA, 16 steps of 8 examples; returns its events.
    Under single the frozen head is loaded as gemini holds it: left in its file (the default on
    the CPU) it is read by blocks of the vocabulary, equal to the loaded one only within rounding,
    and the gemini cases compare with these runs at 1e-5 (parity_preference covers the default)."""
    if strategy == "single":
        options = {"frozen_tables": "memory", **(options or {})}
    r = cli("finetune", "--model", workdir / "model", "--data", data, "--method", "lora", "--lora-rank", 8,
            "--preference", loss, "--beta", 0.5, "--steps", 16, "--batch-size", 8, "--lr", 2e-2,
            "--strategy", strategy, "--strategy-options", json.dumps({"device": "cpu", **(options or {})}),
            "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr
    return events_of(out / "events.jsonl")


@pytest.fixture(scope="module")
def dpo_lora(workdir, pairs):
    return finetune_lora(workdir, pairs, "dpo", workdir / "dpo-lora")


def same_figures(events, expected, what):
    """Every step's loss and preference figures within BOUND of `expected`'s."""
    want, got = losses_of(expected), losses_of(events)
    assert len(want) == len(got) > 0
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{what}: losses {worst:.2e} relative")
    assert worst <= BOUND, (got, want)
    for ours, theirs in zip(preference_of(events), preference_of(expected), strict=True):
        for key in ("pairs", "desirable", "undesirable"):
            assert ours.get(key) == theirs.get(key), key
        keys = ["reward_chosen", "reward_rejected", "reward_margin", "log_prob_chosen"]
        for key in keys + (["kl"] if "kl" in theirs else []):
            assert ours[key] == pytest.approx(theirs[key], rel=BOUND, abs=1e-7), key


def test_dpo_lora_learns_the_chosen_completions_and_exports(workdir, dpo_lora):
    out = workdir / "dpo-lora"
    events = dpo_lora
    figures = preference_of(events)
    assert len(figures) == 16 and all(f["pairs"] == 8 for f in figures), figures[:2]
    first, last = figures[0], figures[-1]
    # LoRA starts at the base (B = 0): the policy is its reference, every reward 0.
    assert first["reward_margin"] == 0.0 and first["reward_chosen"] == 0.0
    assert last["reward_margin"] > 0.1, last
    assert last["reward_accuracy"] >= 0.75, last
    for f in figures:  # margin = chosen − rejected; rewards are β × log-ratios
        assert f["reward_margin"] == pytest.approx(f["reward_chosen"] - f["reward_rejected"], abs=1e-6)
    logs = " ".join(e["message"] for e in events if e["type"] == "log")
    assert "format preference" in logs, logs
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
    PeftModel.from_pretrained(base, out / "adapter")
    AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32)


@pytest.fixture(scope="module")
def unpaired(workdir):
    data = workdir / "unpaired.jsonl"
    # 24 desirable, 8 undesirable: out of the KTO paper's balance with equal weights.
    rows = [{"prompt": f"What is {a} plus {b}?", "completion": f" {a + b + (a % 4 == 0) * 3}",
             "label": a % 4 != 0} for a in range(8) for b in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.fixture(scope="module")
def kto_lora(workdir, unpaired):
    return finetune_lora(workdir, unpaired, "kto", workdir / "kto-lora")


def test_kto_lora_learns_from_unpaired_examples(kto_lora):
    events = kto_lora
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert "kto: 24 desirable and 8 undesirable training examples" in logs, logs
    # Eq. 8: desirable_weight × 24 / (undesirable_weight × 8) should be in [1, 4/3].
    assert any("desirable_weight in [0.33, 0.44] or undesirable_weight in [2.25, 3.00]" in m for m in logs), logs
    figures = preference_of(events)
    assert len(figures) == 16
    assert all(f["desirable"] + f["undesirable"] == 8 and "reward_accuracy" not in f for f in figures)
    # LoRA starts at its reference (B = 0): every reward and the KL estimate 0; then the policy
    # moves away from it (the estimate is floored at 0). KTOTrainer parity is parity_preference's.
    assert figures[0]["reward_margin"] == 0.0 and figures[0]["kl"] == 0.0
    assert all(f["kl"] >= 0.0 for f in figures) and max(f["kl"] for f in figures) > 0.01, figures
    for f in figures:  # KTO's margin is the difference of the two means
        assert f["reward_margin"] == pytest.approx(f["reward_chosen"] - f["reward_rejected"], abs=1e-9)


@pytest.fixture(scope="module")
def one_process(workdir, pairs):
    run_job(pair_job(workdir, pairs, "dpo-single", accumulation=2), 1, timeout=300)
    return events_of(workdir / "dpo-single" / "events.jsonl")


@pytest.mark.parametrize("strategy,options", [("ddp", {}), ("zero", {"stage": 2}), ("gemini", {})])
def test_two_ranks_equal_one_process_with_accumulation_two(workdir, pairs, one_process, strategy, options):
    name = f"dpo-{strategy}-2"
    run_job(pair_job(workdir, pairs, name, strategy, **options), 2, timeout=300)
    events = events_of(workdir / name / "events.jsonl")
    assert len(losses_of(events)) == 4
    same_figures(events, one_process, f"DPO {strategy} on 2 ranks vs one process with accumulation 2")


GEMINI_ON_DISK = {"offload_param_frac": 0.5, "offload_optim_frac": 1.0}


def test_gemini_with_chunks_on_disk_equals_single(workdir, pairs, one_process):
    name = "dpo-gemini-disk"
    run_job(pair_job(workdir, pairs, name, "gemini", accumulation=2, **GEMINI_ON_DISK), 1, timeout=300)
    events = events_of(workdir / name / "events.jsonl")
    same_figures(events, one_process, "DPO full, gemini with chunks on disk vs single")
    disk = [e for e in events if e["type"] == "memory" and e["tier"] == "disk"]
    assert disk and disk[-1]["by_category"]["weights"] > 0, disk[-1:]  # the chunks did go to disk


def test_gemini_lora_compares_with_the_chunked_base(workdir, pairs, dpo_lora):
    events = finetune_lora(workdir, pairs, "dpo", workdir / "dpo-lora-gemini", "gemini", GEMINI_ON_DISK)
    same_figures(events, dpo_lora, "DPO LoRA, gemini with chunks on disk vs single")


def test_kto_under_gemini_equals_single(workdir, unpaired, kto_lora):
    """KTO's mismatched rows and KL estimate through gemini's chunks: the same figures."""
    events = finetune_lora(workdir, unpaired, "kto", workdir / "kto-lora-gemini", "gemini", GEMINI_ON_DISK)
    same_figures(events, kto_lora, "KTO LoRA, gemini with chunks on disk vs single")


def test_resume_is_exact(workdir, pairs, one_process):
    spec = pair_job(workdir, pairs, "dpo-resume", steps=2, accumulation=2)
    run_job(spec, 1, timeout=300)
    whole = json.loads(spec.read_text())
    whole["training"]["steps"] = 4
    spec.write_text(json.dumps(whole))
    run_job(spec, 1, resume=workdir / "dpo-resume" / "checkpoint-2", timeout=300)
    events = events_of(workdir / "dpo-resume" / "events.jsonl")
    assert losses_of(events)[-2:] == losses_of(one_process)[-2:]
    assert preference_of(events)[-1] == preference_of(one_process)[-1]


def test_refusals_name_the_field(workdir, pairs):
    text = workdir / "text.jsonl"
    text.write_text(json.dumps({"text": "1 and 2 make 3"}) + "\n")
    no_method = pair_job(workdir, pairs, "no-method", method={"type": "lora"})
    r = cli("run", no_method)
    assert r.returncode == 2 and "holds preference pairs" in r.stderr and "method.preference" in r.stderr, r.stderr
    spec = json.loads(pair_job(workdir, pairs, "on-text").read_text())
    spec["dataset"]["train"] = str(text)
    (workdir / "on-text.json").write_text(json.dumps(spec))
    r = cli("run", workdir / "on-text.json")
    assert r.returncode == 2 and "trains on preference pairs" in r.stderr, r.stderr
    r = cli("launch", "--nproc", 2, pair_job(workdir, pairs, "dpo-hybrid", "hybrid", tp_size=2))
    assert r.returncode == 2 and 'under strategy "hybrid" is not supported yet' in r.stderr, r.stderr
    assert "use strategy single, gemini, ddp or zero" in r.stderr, r.stderr
    assert not (workdir / "dpo-hybrid" / "job.json").exists()
    wrong = pair_job(workdir, pairs, "wrong-field", method={"type": "full", "preference": {"loss": "dpo",
                                                                                          "simpo_gamma": 1}})
    r = cli("run", wrong)
    assert r.returncode == 2 and "method.preference.simpo_gamma applies to simpo" in r.stderr, r.stderr


def test_qlora_dpo_compares_with_the_quantized_base(workdir, pairs):
    out = workdir / "dpo-qlora"
    r = cli("finetune", "--model", workdir / "model", "--data", pairs, "--method", "lora", "--lora-rank", 8,
            "--quantize", "nf4", "--preference", "dpo", "--beta", 0.5, "--steps", 6, "--batch-size", 8,
            "--lr", 2e-2, "--strategy", "single", "--strategy-options", '{"device": "cpu"}', "--out", out,
            timeout=300)
    assert r.returncode == 0, r.stderr
    events = events_of(out / "events.jsonl")
    assert any("linear weights to nf4" in e["message"] for e in events if e["type"] == "log")
    figures = preference_of(events)
    # The reference is the quantized base with the adapters off: the start's rewards are 0.
    assert len(figures) == 6 and figures[0]["reward_margin"] == 0.0
    assert abs(figures[-1]["reward_margin"]) > 1e-4, figures[-1]


def test_a_named_reference_is_the_one_compared_with(workdir, pairs, one_process):
    """The model folder named as the reference is the start itself: the same losses and rewards
    as the default reference, exactly; a reference with another vocabulary is refused."""
    spec = pair_job(workdir, pairs, "dpo-named", accumulation=2,
                    method={"type": "full", "preference": {"loss": "dpo", "beta": 0.5,
                                                           "reference": str(workdir / "model")}})
    run_job(spec, 1, timeout=300)
    events = events_of(workdir / "dpo-named" / "events.jsonl")
    assert losses_of(events) == losses_of(one_process)
    assert preference_of(events) == preference_of(one_process)
    logs = " ".join(e["message"] for e in events if e["type"] == "log")
    assert "preference reference: " + str(workdir / "model") in logs, logs
    other = workdir / "other-vocab"
    other.mkdir(exist_ok=True)
    config = json.loads((workdir / "model" / "config.json").read_text())
    config["vocab_size"] += 8
    (other / "config.json").write_text(json.dumps(config))
    for f in (workdir / "model").glob("*.safetensors"):
        (other / f.name).write_bytes(f.read_bytes())
    bad = pair_job(workdir, pairs, "dpo-other", method={"type": "full", "preference": {
        "loss": "dpo", "reference": str(other)}})
    r = cli("run", bad)
    assert r.returncode == 2 and "has a vocabulary of" in r.stderr, r.stderr
    # `plan` refuses it too, and a reference that is no model folder is named by its field.
    r = cli("plan", bad)
    assert r.returncode == 2 and "has a vocabulary of" in r.stderr, r.stderr
    missing = pair_job(workdir, pairs, "dpo-missing", method={"type": "full", "preference": {
        "loss": "dpo", "reference": str(workdir / "no-such-model")}})
    for command in ("run", "plan"):
        r = cli(command, missing)
        assert r.returncode == 2 and "method.preference.reference" in r.stderr, (command, r.stderr)


def test_evaluation_reports_the_preference_figures(workdir, pairs):
    spec = json.loads(pair_job(workdir, pairs, "dpo-eval", steps=2).read_text())
    spec["dataset"]["validation_split"] = 0.25
    spec["training"]["eval_every"] = 1
    (workdir / "dpo-eval.json").write_text(json.dumps(spec))
    r = run_job(workdir / "dpo-eval.json", 1, timeout=300)
    # The console says what a preference evaluation measures (it has no perplexity).
    lines = [line for line in r.stderr.splitlines() if line.startswith("eval at step")]
    assert lines and all("reward margin" in line and "reward accuracy" in line for line in lines), r.stderr
    assert not any("perplexity" in line for line in lines), lines
    evals = [e for e in events_of(workdir / "dpo-eval" / "events.jsonl")
             if e["type"] == "metric" and "eval_loss" in e]
    assert evals, "no evaluation"
    for e in evals:  # 8 of the 32 pairs held out
        figures = e["eval_preference"]
        assert figures["pairs"] == 8, figures
        assert figures["reward_margin"] == pytest.approx(figures["reward_chosen"] - figures["reward_rejected"],
                                                         abs=1e-5)
