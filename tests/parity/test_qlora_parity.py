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
    if fmt == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=fmt,
                              bnb_4bit_compute_dtype=torch.float32)


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
            out[name] = (module.weight.data.reshape(-1), module.weight.quant_state.absmax)
        elif isinstance(module, bnb.nn.Linear8bitLt):
            out[name] = (module.weight.data.reshape(-1), module.weight.SCB)
    return out


@pytest.mark.parametrize("fmt", ["nf4", "fp4", "int8"])
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
                       "--quantize", fmt, "--lora-rank", rank, "--lora-alpha", alpha,
                       "--lora-targets", "q_proj,v_proj,down_proj",
                       "--lora-init", tmp_path / "init" / "adapter_model.safetensors",
                       "--lr", lr, "--schedule", "linear", "--warmup", 2,
                       "--max-grad-norm", clip, "--save-adapter", tmp_path / "adapter",
                       "--logits", tmp_path / "logits.safetensors",
                       "--quantized-weights", tmp_path / "q.safetensors")

    # The stored form, byte for byte: 7 Linears per layer, the head kept dense as transformers
    # keeps it.
    theirs = bnb_codes_and_scales(peft_model.base_model.model)
    ours = load_file(str(tmp_path / "q.safetensors"))
    assert len(theirs) == 2 * 7 and "lm_head" not in " ".join(theirs)
    assert sorted(k.rsplit(".weight.", 1)[0] for k in ours if k.endswith(".codes")) == sorted(
        k.removeprefix("base_model.model.").replace(".base_layer", "") for k in theirs)
    for name, (codes, scales) in theirs.items():
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        our_codes = ours[key + ".weight.codes"].reshape(-1)
        if codes.dtype == torch.int8:
            our_codes = our_codes.view(torch.int8)
        assert torch.equal(our_codes, codes), f"{key}: codes differ"
        assert torch.equal(ours[key + ".weight.scales"], scales.float()), f"{key}: scales differ"

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
