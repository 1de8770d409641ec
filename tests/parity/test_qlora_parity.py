"""QLoRA against peft + bitsandbytes on the CPU (issue 27).

A small random Llama (dimensions multiples of bitsandbytes' 64-value blocks) is loaded by
transformers with a BitsAndBytesConfig (nf4, fp4 or LLM.int8) and given peft LoRA adapters; the
engine trains the same adapters on the same base through tessera-train-probe --quantize. Checked:

- the quantized weights: our codes and scales equal bitsandbytes' (packed nibbles and absmax per
  block; int8 values and SCB per row), byte for byte;
- the trajectory: per-step losses within 1e-4 relative, gradient norms within 1e-3;
- the adapter we save loads on the bitsandbytes base in peft and gives our logits;
- end to end, `tessera-cli finetune --method lora --quantize nf4`: the plan names QLoRA, the run
  quantizes the base, and its export (the peft adapter and the merged model: the base as it was
  trained on, dequantized, plus the delta) gives peft's logits on the bitsandbytes base.

bitsandbytes computes in training as a dequantized weight times the input; its eval-mode CPU
paths differ (a bf16 repacking for 4-bit, activation quantization for int8), so the reference
logits are taken in train mode (dropout 0) under no_grad, where it computes as in training.
"""
import json
import os
import subprocess
from pathlib import Path

import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama, write_text_dataset  # noqa: E402
from train_probe import counting_batches, run_probe  # noqa: E402

VOCAB = 96
BATCHES = 12
BATCH_SIZE = 2
LENGTH = 12
REL_TOL = 1e-4


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False,
                         attention_dropout=0.0)
    out = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return counting_batches(tmp_path_factory.mktemp("batches"), BATCHES, BATCH_SIZE, LENGTH, VOCAB)


def bnb_config(fmt):
    """fmt: nf4 | fp4 | int8, or nf4-dq: nf4 with double-quantized absmax."""
    if fmt == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=fmt.removesuffix("-dq"),
                              bnb_4bit_use_double_quant=fmt.endswith("-dq"),
                              bnb_4bit_compute_dtype=torch.float32)


def quantize_flags(fmt):
    """The probe's flags for bnb_config(fmt)."""
    return ["--quantize", fmt.removesuffix("-dq")] + (["--double-quant"] if fmt.endswith("-dq") else [])


def quantized_base(llama_dir, fmt):
    return LlamaForCausalLM.from_pretrained(llama_dir, quantization_config=bnb_config(fmt),
                                            device_map="cpu", dtype=torch.float32)


def reference_losses(model, params, batches, steps, lr, warmup, max_grad_norm):
    """transformers Trainer's loop for LoRA parameters (no weight decay): AdamW, a linear
    schedule with warmup, gradient clipping."""
    from transformers import get_linear_schedule_with_warmup

    _, ids, mask, labels = batches
    model.train()
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, warmup, steps)
    losses, norms = [], []
    for step in range(steps):
        i = step % BATCHES
        out = model(input_ids=ids[i], attention_mask=mask[i], labels=labels[i])
        out.loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item())
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses, norms


def assert_close(ours, theirs, what, rel=REL_TOL):
    assert len(ours) == len(theirs), what
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= rel * abs(b), f"{what}: step {step + 1}: ours {a!r} vs peft {b!r}"


def bnb_codes_and_scales(model):
    """Each quantized Linear's stored form as bitsandbytes keeps it (peft's wrappers hold them as
    their base_layer)."""
    import bitsandbytes as bnb

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            parts = {"codes": module.weight.data.reshape(-1)}
            if state.nested:  # the names tessera-train-probe --quantized-weights writes
                parts.update(absmax_codes=state.absmax, absmax_scales=state.state2.absmax,
                             absmax_code=state.state2.code, absmax_offset=state.offset.reshape(1))
            else:
                parts["scales"] = state.absmax
            out[name] = parts
        elif isinstance(module, bnb.nn.Linear8bitLt):
            out[name] = {"codes": module.weight.data.reshape(-1), "scales": module.weight.SCB}
    return out


def assert_stored_forms_equal(ours, theirs):
    """Our quantized weights (tessera-train-probe --quantized-weights) against bitsandbytes'
    (bnb_codes_and_scales), byte for byte."""
    assert sorted(k.rsplit(".weight.", 1)[0] for k in ours if k.endswith(".codes")) == sorted(
        k.removeprefix("base_model.model.").replace(".base_layer", "") for k in theirs)
    for name, parts in theirs.items():
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        for part, value in parts.items():
            mine = ours[f"{key}.weight.{part}"]
            if part == "codes":
                mine = mine.reshape(-1)
                if value.dtype == torch.int8:
                    mine = mine.view(torch.int8)
            else:
                value = value.float()
            assert torch.equal(mine, value), f"{key}: {part} differ"


@pytest.mark.parametrize("fmt", ["nf4", "fp4", "int8", "nf4-dq"])
def test_qlora_matches_peft_on_bitsandbytes(llama_dir, batches, tmp_path, fmt):
    from peft import LoraConfig, PeftModel, get_peft_model

    steps, lr, clip, rank, alpha = 12, 2e-2, 1.0, 4, 8
    torch.manual_seed(5)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                        target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(quantized_base(llama_dir, fmt), config)
    with torch.no_grad():  # lora_B non-zero, so that B·A counts from the first step
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    peft_model.save_pretrained(tmp_path / "init")

    report = run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", "--method", "lora",
                       *quantize_flags(fmt), "--lora-rank", rank, "--lora-alpha", alpha,
                       "--lora-targets", "q_proj,v_proj,down_proj",
                       "--lora-init", tmp_path / "init" / "adapter_model.safetensors",
                       "--lr", lr, "--schedule", "linear", "--warmup", 2,
                       "--max-grad-norm", clip, "--save-adapter", tmp_path / "adapter",
                       "--logits", tmp_path / "logits.safetensors",
                       "--quantized-weights", tmp_path / "q.safetensors")

    # The stored form, byte for byte: 7 Linears per layer, the head kept dense as transformers
    # keeps it.
    theirs = bnb_codes_and_scales(peft_model.base_model.model)
    assert len(theirs) == 2 * 7 and "lm_head" not in " ".join(theirs)
    assert_stored_forms_equal(load_file(str(tmp_path / "q.safetensors")), theirs)

    _, ids, mask, labels = batches
    # Train mode throughout: in eval mode without gradients bitsandbytes repacks a 4-bit weight
    # in place for its bf16 CPU kernel (on CPUs with avx512_bf16), and training would go on with it.
    peft_model.train()
    with torch.no_grad():
        frozen = [peft_model(input_ids=ids[i], attention_mask=mask[i], labels=labels[i]).loss.item()
                  for i in range(steps)]
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    assert len(trainable) == 2 * 3 * 2
    losses, norms = reference_losses(peft_model, trainable, batches, steps, lr, 2, clip)
    moved = max(abs(a - b) / b for a, b in zip(losses, frozen))
    assert moved > 100 * REL_TOL, f"the adapters barely changed the losses ({moved})"
    assert_close(report["losses"], losses, f"{fmt} QLoRA loss")
    assert_close(report["grad_norms"], norms, f"{fmt} QLoRA grad_norm", rel=1e-3)

    # The adapter we saved, on a fresh bitsandbytes base in peft, gives our logits.
    loaded = PeftModel.from_pretrained(quantized_base(llama_dir, fmt), tmp_path / "adapter")
    loaded.train()  # bitsandbytes' training-mode compute (dropout is 0); see the docstring
    with torch.no_grad():
        reference = loaded(input_ids=ids[0], attention_mask=mask[0]).logits
    logits = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    valid = mask[0].bool()
    scale = reference[valid].abs().max().item()
    diff = (logits - reference)[valid].abs().max().item()
    assert diff <= REL_TOL * scale, f"{fmt}: logits differ by {diff} (largest {scale})"


def test_qlora_job_trains_and_exports_what_peft_computes(tmp_path):
    cli = os.environ.get("TESSERA_CLI")
    if not cli:
        pytest.skip("TESSERA_CLI is not set (run through ctest)")
    from peft import PeftModel

    model_dir = tmp_path / "model"
    make_tiny_llama(model_dir, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    write_text_dataset(tmp_path / "text.jsonl")
    out, events = tmp_path / "run", tmp_path / "events.jsonl"
    done = subprocess.run([cli, "finetune", "--model", model_dir, "--data", tmp_path / "text.jsonl",
                           "--format", "text", "--method", "lora", "--quantize", "nf4",
                           "--lora-rank", "4", "--steps", "6", "--batch-size", "4", "--max-length",
                           "32", "--lr", "1e-2", "--out", out,
                           "--events", events], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in events.read_text().splitlines()]
    plan = next(r for r in records if r["type"] == "plan")
    assert "QLoRA (rank 4, nf4 base)" in json.dumps(plan), plan
    assert plan["settings"]["quantize"] == "nf4"
    logs = [r.get("message", "") for r in records if r["type"] == "log"]
    assert any("quantized 14 linear weights to nf4" in m for m in logs), logs
    losses = [r["loss"] for r in records if r["type"] == "metric" and "loss" in r]
    assert len(losses) == 6 and all(l == l for l in losses)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor([tokenizer("3 and 4 make 7")["input_ids"]])
    peft_model = PeftModel.from_pretrained(quantized_base(model_dir, "nf4"), out / "adapter")
    peft_model.train()  # bitsandbytes' training-mode compute (dropout is 0)
    with torch.no_grad():
        reference = peft_model(input_ids=ids).logits
        merged = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32).eval()(
            input_ids=ids).logits
    scale = reference.abs().max().item()
    assert (merged - reference).abs().max().item() <= REL_TOL * scale
    # The adapter moved away from zero: the merged model is not the dequantized base alone.
    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert all(v.abs().max().item() > 0 for k, v in adapter.items() if "lora_B" in k)


def lora_init(llama_dir, folder, rank, alpha, targets):
    """peft LoRA adapters with B non-zero (so that B·A counts from the first step), saved."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                        task_type="CAUSAL_LM")
    model = get_peft_model(LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    return folder / "adapter_model.safetensors"


@pytest.mark.parametrize("fmt", ["nf4-dq", "fp4", "int8"])
def test_qlora_trains_on_a_bitsandbytes_checkpoint(llama_dir, batches, tmp_path, fmt):
    """A folder transformers saved quantized (config.json's quantization_config, the weights as
    bitsandbytes stores them: packed codes with absmax, quant_map and quant_state, nested absmax
    when double-quantized; int8 with SCB) trains LoRA on its base as stored: the same stored
    form, losses, gradient norms and logits as quantizing the dense model on load, and our
    adapter on the checkpoint loaded by transformers + peft gives our logits."""
    from peft import PeftModel

    stored = tmp_path / "bnb"
    quantized_base(llama_dir, fmt).save_pretrained(stored)
    assert "quantization_config" in json.loads((stored / "config.json").read_text())
    init = lora_init(llama_dir, tmp_path / "init", 4, 8, ["q_proj", "v_proj", "down_proj"])
    common = ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8,
              "--lora-targets", "q_proj,v_proj,down_proj", "--lora-init", init, "--lr", 2e-2]
    runs = {}
    for name, model_dir, flags in (("stored", stored, []), ("on_load", llama_dir, quantize_flags(fmt))):
        out = tmp_path / name
        runs[name] = run_probe(model_dir, batches[0], 4, tmp_path / f"{name}.json", *common, *flags,
                               "--save-adapter", out / "adapter", "--logits", out / "logits.safetensors",
                               "--quantized-weights", out / "q.safetensors")
    assert runs["stored"]["losses"] == runs["on_load"]["losses"]
    assert runs["stored"]["grad_norms"] == runs["on_load"]["grad_norms"]
    forms = [load_file(str(tmp_path / name / "q.safetensors")) for name in runs]
    assert forms[0].keys() == forms[1].keys() and len(forms[0]) >= 2 * 14
    assert all(torch.equal(forms[0][k], forms[1][k]) for k in forms[0])
    logits = [load_file(str(tmp_path / name / "logits.safetensors"))["logits"] for name in runs]
    assert torch.equal(logits[0], logits[1])

    _, ids, mask, _ = batches
    loaded = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(stored, device_map="cpu"),
                                       tmp_path / "stored" / "adapter")
    loaded.train()  # bitsandbytes' training-mode compute (dropout is 0); see the docstring
    with torch.no_grad():
        reference = loaded(input_ids=ids[0], attention_mask=mask[0]).logits
    valid = mask[0].bool()
    scale = reference[valid].abs().max().item()
    diff = (logits[0] - reference)[valid].abs().max().item()
    assert diff <= REL_TOL * scale, f"{fmt}: logits differ by {diff} (largest {scale})"


def test_a_bitsandbytes_checkpoint_is_a_qlora_base_and_other_formats_are_refused(tmp_path):
    """The CLI on a quantized folder: LoRA trains on the stored base (the plan says QLoRA, the run
    says what it read) and the export is a dense model that transformers loads and that computes
    what peft does on the checkpoint; full fine-tuning, another method.quantize and a GPTQ
    checkpoint are refused by name before anything trains; `tessera-cli export` of the quantized
    folder writes its dequantized base."""
    cli = os.environ.get("TESSERA_CLI")
    if not cli:
        pytest.skip("TESSERA_CLI is not set (run through ctest)")
    import shutil

    from peft import PeftModel

    dense = tmp_path / "dense"
    make_tiny_llama(dense, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    stored = tmp_path / "stored"
    quantized_base(dense, "nf4-dq").save_pretrained(stored)
    for f in dense.iterdir():  # the tokenizer's files
        if not (stored / f.name).exists():
            shutil.copy(f, stored / f.name)
    data = tmp_path / "text.jsonl"
    write_text_dataset(data)

    def finetune(model_dir, out, *flags):
        return subprocess.run([cli, "finetune", "--model", model_dir, "--data", data, "--format",
                               "text", "--steps", "4", "--batch-size", "4", "--max-length", "32",
                               "--out", out, "--events", tmp_path / f"{out.name}.jsonl", *flags],
                              capture_output=True, text=True, timeout=600)

    full = finetune(stored, tmp_path / "full", "--method", "full")
    assert full.returncode == 2 and "nf4 (bitsandbytes, double-quantized absmax)" in full.stderr
    assert "method.type" in full.stderr and "lora" in full.stderr, full.stderr
    other = finetune(stored, tmp_path / "other", "--method", "lora", "--quantize", "fp4")
    assert other.returncode == 2 and "method.quantize \"fp4\"" in other.stderr, other.stderr
    gptq = tmp_path / "gptq"
    shutil.copytree(dense, gptq)
    config = json.loads((gptq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (gptq / "config.json").write_text(json.dumps(config))
    refused = finetune(gptq, tmp_path / "g", "--method", "lora")
    assert refused.returncode == 2, refused.stderr
    assert "GPTQ" in refused.stderr and "not supported yet" in refused.stderr, refused.stderr

    out = tmp_path / "run"
    done = finetune(stored, out, "--method", "lora", "--lora-rank", "4", "--lr", "1e-2")
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    plan = next(r for r in records if r["type"] == "plan")
    assert "QLoRA (rank 4, nf4 base)" in json.dumps(plan), plan
    assert plan["settings"]["quantize"] == "nf4" and plan["settings"]["double_quant"] is True
    logs = [r.get("message", "") for r in records if r["type"] == "log"]
    assert any("read 14 linear weights stored nf4 (bitsandbytes, double-quantized absmax)" in m
               for m in logs), logs
    assert "quantization_config" not in json.loads((out / "model" / "config.json").read_text())

    tokenizer = AutoTokenizer.from_pretrained(dense)
    ids = torch.tensor([tokenizer("3 and 4 make 7")["input_ids"]])
    peft_model = PeftModel.from_pretrained(
        LlamaForCausalLM.from_pretrained(stored, device_map="cpu"), out / "adapter")
    peft_model.train()  # bitsandbytes' training-mode compute (dropout is 0)
    with torch.no_grad():
        reference = peft_model(input_ids=ids).logits
        merged = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32).eval()(
            input_ids=ids).logits
        with peft_model.disable_adapter():
            base = peft_model(input_ids=ids).logits
    scale = reference.abs().max().item()
    assert (merged - reference).abs().max().item() <= REL_TOL * scale
    assert (base - reference).abs().max().item() > 100 * REL_TOL * scale  # the adapter counts

    exported = tmp_path / "exported"
    done = subprocess.run([cli, "export", "--model", stored, "--out", exported],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        dense_logits = LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()(
            input_ids=ids).logits
    assert (dense_logits - base).abs().max().item() <= REL_TOL * base.abs().max().item()
