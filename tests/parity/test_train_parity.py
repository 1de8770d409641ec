"""The trainer against the Python oracles (the issue's acceptance tests).

- 20 full fine-tuning steps of a small random Llama saved by transformers: per-step losses equal
  transformers + torch.optim.AdamW + transformers' schedule + clip_grad_norm_ within 1e-4
  relative (same initial weights, same batches, fp32, dropout 0). Also with gradient
  accumulation (each micro-batch's loss weighted by its share of the step's label tokens, as the
  transformers Trainer does with num_items_in_batch).
- LoRA: the same against peft, with both sides starting from the adapter peft initialised.
- The adapter we save loads with PeftModel.from_pretrained and gives our logits.
- Resume: 10 steps equal 5 steps + a stop with a checkpoint + resume + 5 steps, exactly.

The engine side runs through tessera-train-probe (tests/tools/train_probe.cpp).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

VOCAB = 96
BATCHES = 20
BATCH_SIZE = 2
LENGTH = 12
REL_TOL = 1e-4

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from train_probe import counting_batches, probe_path, run_probe  # noqa: E402

SCHEDULES = {
    "constant": lambda opt, warmup, total: get_constant_schedule_with_warmup(opt, warmup),
    "linear": get_linear_schedule_with_warmup,
    "cosine": get_cosine_schedule_with_warmup,
}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )
    model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("llama")
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """20 batches of a learnable pattern, some rows right-padded (train_probe.counting_batches)."""
    return counting_batches(tmp_path_factory.mktemp("batches"), BATCHES, BATCH_SIZE, LENGTH, VOCAB)


def trainer_param_groups(model, params, weight_decay):
    """transformers' Trainer grouping (Trainer.create_optimizer): weight decay for the names
    Trainer.get_decay_parameter_names returns, none for biases and norm weights."""
    from transformers import Trainer

    decay_names = set(Trainer.get_decay_parameter_names(None, model))
    wanted = {id(p) for p in params}
    named = [(n, p) for n, p in model.named_parameters() if id(p) in wanted]
    assert len(named) == len(params)
    return [{"params": [p for n, p in named if n in decay_names], "weight_decay": weight_decay},
            {"params": [p for n, p in named if n not in decay_names], "weight_decay": 0.0}]


def reference_losses(model, params, batches, steps, lr, schedule, warmup, weight_decay,
                     max_grad_norm, accumulation=1):
    _, ids, mask, labels = batches
    model.train()
    opt = torch.optim.AdamW(trainer_param_groups(model, params, weight_decay), lr=lr,
                            betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    sched = SCHEDULES[schedule](opt, warmup, steps)
    losses, norms, lrs = [], [], []
    batch = 0
    for _ in range(steps):
        total = 0.0
        # The transformers Trainer's num_items_in_batch: every label token of the step counts
        # alike, whichever micro-batch it is in.
        step = [(batch + k) % BATCHES for k in range(accumulation)]
        batch += accumulation
        counted = [int((labels[i][:, 1:] != -100).sum()) for i in step]
        for i, n in zip(step, counted):
            out = model(input_ids=ids[i], attention_mask=mask[i], labels=labels[i])
            (out.loss * n / sum(counted)).backward()
            total += out.loss.item() * n / sum(counted)
        lrs.append(opt.param_groups[0]["lr"])
        norms.append(torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item())
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    return losses, norms, lrs


def peft_start(base, config, folder):
    """peft's model for `config` with lora_B drawn non-zero (peft starts it at zero, which would
    leave B·A untested at the first step), saved to `folder`; returns the model and the adapter
    file tessera-train-probe --lora-init takes."""
    from peft import get_peft_model

    peft_model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    peft_model.save_pretrained(folder)
    return peft_model, folder / "adapter_model.safetensors"


def assert_close(ours, theirs, what, rel=REL_TOL):
    assert len(ours) == len(theirs), what
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= rel * abs(b), f"{what}: step {step + 1}: ours {a!r} vs reference {b!r}"


@pytest.mark.parametrize(
    "schedule,warmup,accumulation,weight_decay",
    [("cosine", 3, 1, 0.01), ("linear", 2, 2, 0.0), ("constant", 4, 1, 0.1)],
)
def test_full_finetune_matches_transformers_adamw(llama_dir, batches, tmp_path, schedule, warmup,
                                                  accumulation, weight_decay):
    steps, lr, clip = 20, 1e-2, 1.0
    report = run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", "--lr", lr,
                       "--schedule", schedule, "--warmup", warmup, "--weight-decay", weight_decay,
                       "--max-grad-norm", clip, "--grad-accum", accumulation,
                       "--final-weights", tmp_path / "w.safetensors")
    model = LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    losses, norms, lrs = reference_losses(model, list(model.parameters()), batches, steps, lr,
                                          schedule, warmup, weight_decay, clip, accumulation)
    assert losses[-1] < losses[0] * 0.9, "the reference run did not learn; the test would be weak"
    assert_close(report["losses"], losses, "loss")
    assert_close(report["grad_norms"], norms, "grad_norm", rel=1e-3)
    assert_close(report["lrs"], lrs, "lr", rel=1e-12)
    # Final weights under their HF names agree too.
    ours = load_file(str(tmp_path / "w.safetensors"))
    theirs = dict(model.named_parameters())
    assert set(ours) == set(theirs)
    for name, value in ours.items():
        diff = (value - theirs[name].detach()).abs().max().item()
        assert diff < 1e-4, f"{name}: max abs diff {diff}"


def test_lora_matches_peft_and_adapter_loads_in_peft(llama_dir, batches, tmp_path):
    from peft import LoraConfig, PeftModel

    steps, lr, clip, rank, alpha = 20, 2e-2, 1.0, 4, 8
    torch.manual_seed(5)
    base = LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                        target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model, init_file = peft_start(base, config, tmp_path / "init")

    report = run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", "--method", "lora",
                       "--lora-rank", rank, "--lora-alpha", alpha, "--lora-init", init_file,
                       "--lr", lr, "--schedule", "linear", "--warmup", 2, "--max-grad-norm", clip,
                       "--save-adapter", tmp_path / "adapter", "--logits",
                       tmp_path / "logits.safetensors")
    _, ids, mask, labels = batches
    with torch.no_grad():  # the losses an untrained adapter gives, batch by batch
        frozen = [peft_model(input_ids=ids[i], attention_mask=mask[i], labels=labels[i]).loss.item()
                  for i in range(steps)]
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    assert len(trainable) == 2 * 2 * 2
    losses, norms, _ = reference_losses(peft_model, trainable, batches, steps, lr, "linear", 2,
                                        0.0, clip)
    # A random tiny base learns little through adapters in 20 steps, so instead of "the loss
    # fell", check that training moved the trajectory far beyond the tolerance.
    moved = max(abs(a - b) / b for a, b in zip(losses, frozen))
    assert moved > 100 * REL_TOL, f"the adapters barely changed the losses ({moved})"
    assert_close(report["losses"], losses, "LoRA loss")
    assert_close(report["grad_norms"], norms, "LoRA grad_norm", rel=1e-3)

    adapter = tmp_path / "adapter"
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == rank and cfg["lora_alpha"] == alpha
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    names = set(load_file(str(adapter / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names

    fresh = LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, adapter)
    loaded.eval()
    with torch.no_grad():
        theirs = loaded(input_ids=ids[0], attention_mask=mask[0]).logits
        trained = peft_model.eval()(input_ids=ids[0], attention_mask=mask[0]).logits
        merged = loaded.merge_and_unload()(input_ids=ids[0], attention_mask=mask[0]).logits
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    valid = mask[0].bool()
    assert (ours - theirs)[valid].abs().max().item() < 1e-4
    assert (merged - theirs)[valid].abs().max().item() < 1e-4
    # Our trained adapter is peft's trained adapter (same trajectory, loose bound).
    assert (ours - trained)[valid].abs().max().item() < 1e-3


def test_resume_continues_exactly(llama_dir, batches, tmp_path):
    common = ["--lr", 3e-3, "--schedule", "cosine", "--warmup", 2, "--weight-decay", 0.01,
              "--grad-accum", 3]  # 3 micro-batches per step: the stop lands mid-epoch
    full = run_probe(llama_dir, batches[0], 10, tmp_path / "full.json", *common)
    run = tmp_path / "run"
    first = run_probe(llama_dir, batches[0], 10, tmp_path / "a.json", *common, "--out-dir", run,
                      "--save-every", 2, "--keep-last", 2, "--stop-after", 5)
    assert first["status"] == "stopped" and first["steps_done"] == 5
    kept = sorted(p.name for p in run.iterdir())
    assert kept == ["checkpoint-4", "checkpoint-5"], kept
    # A torn newer save (killed before its manifest) is ignored on resume.
    (run / "checkpoint-9.tmp-0000").mkdir()
    (run / "checkpoint-9.tmp-0000" / "model.safetensors").write_bytes(b"\0" * 7)
    events = tmp_path / "events.jsonl"
    second = run_probe(llama_dir, batches[0], 10, tmp_path / "b.json", *common, "--out-dir", run,
                       "--resume", run, "--events", events)
    assert second["start_step"] == 5 and second["status"] == "completed"
    assert first["losses"] + second["losses"] == full["losses"]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(e["type"] == "log" and "checkpoint-9.tmp-0000" in e["message"] for e in lines)
    metrics = [e for e in lines if e["type"] == "metric"]
    assert [m["step"] for m in metrics] == list(range(6, 11))
    memory = [e for e in lines if e["type"] == "memory"]
    assert memory and memory[-1]["by_category"]["optimizer"] > 0
    assert any(e["type"] == "checkpoint" and e["step"] == 10 for e in lines)


@pytest.mark.parametrize("delay", [0.0, 0.013, 0.029])
def test_kill_during_training_then_resume(llama_dir, batches, tmp_path, delay):
    """kill -9 at an arbitrary moment (in a step or in the middle of a save, with a checkpoint
    every step): the resume finds the newest complete checkpoint and continues exactly."""
    import signal
    import time

    steps = 40
    common = ["--lr", 3e-3, "--schedule", "linear", "--warmup", 3]
    full = run_probe(llama_dir, batches[0], steps, tmp_path / "full.json", *common)
    run = tmp_path / "run"
    cmd = [str(probe_path()), "--model", str(llama_dir), "--batches", str(batches[0]),
           "--steps", str(steps), "--report", str(tmp_path / "killed.json"), *map(str, common),
           "--out-dir", str(run), "--save-every", "1", "--keep-last", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoint-3").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed.json").exists(), "the run finished before the kill"
    resumed = run_probe(llama_dir, batches[0], steps, tmp_path / "resumed.json", *common,
                        "--out-dir", run, "--resume", run)
    start = resumed["start_step"]
    assert 3 <= start < steps and resumed["status"] == "completed"
    assert resumed["losses"] == full["losses"][start:]


def test_gpt2_full_finetune_decays_as_the_trainer(tmp_path, batches):
    """Weight decay 0.1 on GPT-2: biases, and the weights of its LayerNorm modules (ln_1, ln_2,
    ln_f, excluded by type, not by name), get none, as the Trainer's grouping says."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    torch.manual_seed(5)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model_dir = tmp_path / "gpt2"
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # norms away from 1 / biases away from 0, so decaying them would show
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.5)
    model.save_pretrained(model_dir, safe_serialization=True)
    no_decay = {n for n, _ in model.named_parameters()} - set(
        Trainer.get_decay_parameter_names(None, model))
    assert "transformer.h.0.ln_1.weight" in no_decay and "transformer.ln_f.weight" in no_decay
    steps, lr, clip, wd = 12, 1e-2, 1.0, 0.1
    report = run_probe(model_dir, batches[0], steps, tmp_path / "r.json", "--lr", lr,
                       "--schedule", "constant", "--weight-decay", wd, "--max-grad-norm", clip,
                       "--final-weights", tmp_path / "w.safetensors")
    model = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32)
    losses, _, _ = reference_losses(model, list(model.parameters()), batches, steps, lr,
                                    "constant", 0, wd, clip)
    assert_close(report["losses"], losses, "GPT-2 full loss with weight decay")
    # Decaying a bias or norm weight of ~0.5 would move it by ~lr·wd·0.5·steps = 6e-3; Adam on
    # near-zero gradients amplifies float noise to ~2e-4 on a few elements. 1e-3 tells them apart.
    ours = load_file(str(tmp_path / "w.safetensors"))
    for name, value in model.named_parameters():
        if name in ours:
            diff = (ours[name] - value.detach()).abs().max().item()
            assert diff < 1e-3, f"{name}: max abs diff {diff}"


def test_gpt2_lora_conv1d_matches_peft(tmp_path, batches):
    """GPT-2's Conv1D stores W as [in, out] (PEFT's fan_in_fan_out): the c_attn adapters train
    like peft's and load back into peft."""
    from peft import LoraConfig, PeftModel
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(config).save_pretrained(model_dir, safe_serialization=True)
    steps, lr, rank, alpha = 12, 2e-2, 4, 16
    base = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=["c_attn"],
                        fan_in_fan_out=True, task_type="CAUSAL_LM")
    peft_model, init_file = peft_start(base, config, tmp_path / "init")
    report = run_probe(model_dir, batches[0], steps, tmp_path / "r.json", "--method", "lora",
                       "--lora-rank", rank, "--lora-alpha", alpha, "--lora-init", init_file, "--lr", lr,
                       "--schedule", "constant", "--save-adapter", tmp_path / "adapter",
                       "--logits", tmp_path / "logits.safetensors")
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    losses, _, _ = reference_losses(peft_model, trainable, batches, steps, lr, "constant", 0, 0.0,
                                    1.0)
    assert_close(report["losses"], losses, "GPT-2 LoRA loss")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["fan_in_fan_out"] is True and cfg["target_modules"] == ["c_attn"]
    fresh = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    _, ids, mask, _ = batches
    with torch.no_grad():
        theirs = loaded(input_ids=ids[0], attention_mask=mask[0]).logits
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    assert (ours - theirs)[mask[0].bool()].abs().max().item() < 1e-4


def test_activation_checkpointing_keeps_the_trajectory(llama_dir, batches, tmp_path):
    """Per-layer recomputation (training.activation_checkpointing) changes memory, not numbers:
    the losses equal a plain run within 1e-6 relative and transformers within the usual bound."""
    steps, lr = 10, 1e-2
    common = ["--lr", lr, "--schedule", "cosine", "--warmup", 2, "--grad-accum", 2]
    plain = run_probe(llama_dir, batches[0], steps, tmp_path / "plain.json", *common)
    recomputed = run_probe(llama_dir, batches[0], steps, tmp_path / "ckpt.json", *common,
                           "--activation-checkpointing")
    assert_close(recomputed["losses"], plain["losses"], "checkpointed loss", rel=1e-6)
    assert_close(recomputed["grad_norms"], plain["grad_norms"], "checkpointed grad_norm", rel=1e-6)
    model = LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    losses, _, _ = reference_losses(model, list(model.parameters()), batches, steps, lr, "cosine",
                                    2, 0.0, 1.0, accumulation=2)
    assert_close(recomputed["losses"], losses, "checkpointed loss vs transformers")


def test_lora_dropout_adapter_loads_in_peft(llama_dir, batches, tmp_path):
    """lora_dropout > 0 trains (finite, moving losses), is written into adapter_config.json, and
    in eval mode (dropout off) the saved adapter gives our logits in peft. With activation
    checkpointing on too, the replayed dropout masks give the very same run."""
    from peft import PeftModel

    steps = 8
    common = ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8, "--lora-dropout", 0.2,
              "--lr", 3e-2, "--schedule", "constant", "--seed", 7]
    report = run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", *common,
                       "--save-adapter", tmp_path / "adapter", "--logits",
                       tmp_path / "logits.safetensors")
    assert all(map(lambda x: x == x and abs(x) < 1e6, report["losses"]))
    recomputed = run_probe(llama_dir, batches[0], steps, tmp_path / "c.json", *common,
                           "--activation-checkpointing")
    assert_close(recomputed["losses"], report["losses"], "LoRA dropout + checkpointing", rel=1e-6)
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["lora_dropout"] == 0.2
    adapter = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert all(v.abs().max().item() > 0 for k, v in adapter.items() if "lora_B" in k)
    fresh = LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    _, ids, mask, _ = batches
    with torch.no_grad():
        theirs = loaded(input_ids=ids[0], attention_mask=mask[0]).logits
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    assert (ours - theirs)[mask[0].bool()].abs().max().item() < 1e-4


def test_activation_checkpointing_lowers_peak_rss(tmp_path):
    """A deeper, longer model (8 layers, 4 x 512 tokens): peak RSS of a training run with
    activation checkpointing is clearly below the plain run's."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=512,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model_dir = tmp_path / "deep"
    LlamaForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (1, 4, 512), generator=g)
    save_file({"input_ids": ids}, str(tmp_path / "long.safetensors"))
    rss = {}
    for name, extra in (("plain", []), ("checkpointed", ["--activation-checkpointing"])):
        report = run_probe(model_dir, tmp_path / "long.safetensors", 2, tmp_path / f"{name}.json",
                           "--threads", 1, *extra)
        rss[name] = report["peak_rss_bytes"]
    print(f"peak RSS: plain {rss['plain'] / 2**20:.1f} MiB, "
          f"checkpointed {rss['checkpointed'] / 2**20:.1f} MiB")
    assert rss["plain"] > 0
    # The plain run keeps ~8 layers of activations (hundreds of MiB here), the checkpointed one
    # about one layer's worth.
    assert rss["checkpointed"] < rss["plain"] - 64 * 2**20, rss
