"""GGUF export (`tessera-cli export --format gguf`) read back with the `gguf` package (PyPI) and,
where `llama-cpp-python` is importable, run by llama.cpp against transformers.

Models: tiny random llama / mistral / qwen2 / gpt2 created here with transformers, weights
re-drawn with std 0.15 so that the logits are far from constant and a misplaced row shows. Each
family has its own tokenizer style, so every tokenizer path of the writer is read back:
  llama    SentencePiece-style BPE with byte fallback (tokenizer.ggml.model "llama"), BOS added,
           llama3 rope scaling (written as rope_freqs.weight), a chat template
  mistral  byte-level BPE split as Llama 3 ("llama-bpe"), BOS added; intermediate_size 80, so
           ffn_down's rows are not whole q8_0 blocks (written F16 in a q8_0 file)
  qwen2    byte-level BPE split as Qwen2 ("qwen2") after NFC; tied embeddings, q/k/v biases, and
           a model vocab_size 8 larger than the tokenizer ([PAD<id>] tokens)
  gpt2     GPT-2's byte-level BPE ("gpt-2"); Conv1D weights, learned positions

Checked, for every family and every type (f32, f16, bf16, q8_0):
  - the tensor set and types: 1-D tensors (norms, biases, rope_freqs) and position_embd are F32,
    q8_0 rows that are not whole blocks of 32 are F16, everything else the file type;
  - every tensor equals transformers' weight after the documented rearrangement (llama and
    mistral: q/k rows regrouped per head from HF's rotate-half order to GGML's adjacent pairs,
    w.reshape(heads, 2, head_dim/2, in).transpose(1, 2); gpt2: Conv1D weights transposed):
    F32 bit for bit, F16 and BF16 bit for bit equal to torch's round-to-nearest-even conversion,
    Q8_0 byte for byte equal to gguf.quants.quantize (the numpy port of ggml's reference) and,
    dequantized, within |x − x̂| ≤ amax/254 + amax/2048 of the block's amax (half a step, plus
    the f16 rounding of the scale times 127);
  - the metadata llama.cpp reads, with the config's values;
  - the tokenizer: tokens by id, token types, merges equal to tokenizer.json's, scores ordering
    merges, special ids, add_bos / add_eos as the tokenizer adds them, the chat template.
With llama-cpp-python (installer/bootstrap.sh builds it; skipped with the reason otherwise):
llama.cpp's token ids for a prompt equal transformers' (its tokenizer is ours), and its logits
for those ids are within 1e-4 · max|logits| of transformers' in f32 (1e-3 for gpt2, whose GELU
llama.cpp reads from a float16 table) and 0.1 · max|logits| in q8_0, with the same argmax at every
position in f32 and at 80% of them in q8_0 (measured: see the printed figures).
Refused with exit 2 and a message naming the cause: bert, an unknown pre-tokenizer, an existing
file without --force, a folder as --out, --gguf-type without --format gguf; nothing is left
behind.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import normalizers, processors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from random_weights import randomize  # noqa: E402
from tiny_tokenizer import byte_level_bpe, sentencepiece_bpe  # noqa: E402

import gguf  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TYPES = ["f32", "f16", "bf16", "q8_0"]
FAMILIES = ["llama", "mistral", "qwen2", "gpt2"]
Q = gguf.GGMLQuantizationType
FILE_TYPE_CODE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
TENSOR_TYPE = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}
# max |llama.cpp − transformers| logits ÷ max |transformers logits|. f32: llama.cpp computes in
# float32 but for GELU, which its CPU code reads from a float16 table (gpt2). q8_0: the weights'
# rounding (bound above) and llama.cpp's, which also rounds activations to q8_0 for the matmuls.
LOGITS_REL_BOUND = {("f32", "gpt2"): 1e-3, "f32": 1e-4, "q8_0": 0.1}

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] }}"
                 "{% endfor %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tessera writes GGUF files that llama.cpp, Ollama and LM Studio load.",
    "Numbers: 12 + 30 = 42, and 1234 * 5 = 6170.",
    "Héllo wörld, ça va? Ünïcode text in a tiny corpus.",
    "Once upon a time there was a tiny llama who liked to count tokens.",
] * 20
PROMPT = "The quick brown fox counts 42 tokens, ça va?"


def cli(*args, expect=0):
    path = os.environ.get("TESSERA_CLI")
    if not path:
        pytest.skip("TESSERA_CLI is not set (run through ctest)")
    proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == expect, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


def decoder_kwargs(tok, **extra):
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    kw.update(extra)
    return kw


def build_family(name, folder):
    if name == "llama":
        tok = sentencepiece_bpe(CORPUS, 420)
        tok.chat_template = CHAT_TEMPLATE
        model = LlamaForCausalLM(LlamaConfig(**decoder_kwargs(
            tok, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64})))
    elif name == "mistral":
        tok = byte_level_bpe(CORPUS, 320, split_pattern=LLAMA3_PATTERN)
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
        model = MistralForCausalLM(MistralConfig(**decoder_kwargs(
            tok, intermediate_size=80, tie_word_embeddings=False, sliding_window=None)))
    elif name == "qwen2":
        tok = byte_level_bpe(CORPUS, 320, split_pattern=QWEN2_PATTERN, normalizer=normalizers.NFC())
        model = Qwen2ForCausalLM(Qwen2Config(**decoder_kwargs(
            tok, vocab_size=len(tok) + 8, tie_word_embeddings=True, rope_theta=50000.0)))
    else:
        tok = byte_level_bpe(CORPUS, 320)
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    randomize(model, 700 + FAMILIES.index(name))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """family → {"dir": model folder, type: (gguf path, the CLI's JSON report)}."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for i, family in enumerate(FAMILIES):
        torch.manual_seed(600 + i)
        folder = build_family(family, root / family)
        out[family] = {"dir": folder}
        for t in TYPES:
            path = root / f"{family}-{t}.gguf"
            proc = cli("export", "--model", folder, "--out", path, "--format", "gguf",
                       "--gguf-type", t, "--json")
            out[family][t] = (path, json.loads(proc.stdout))
            assert "export: tensor 1/" in proc.stderr  # progress on stderr
    return out


def hf_model(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def regroup_rotary(w, heads):
    """HF's rotate-half rows of each head → GGML's adjacent pairs (llama.cpp's "llama" RoPE)."""
    shape = w.shape
    return w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).transpose(1, 2).reshape(shape)


def llama3_factors(cfg):
    rope = cfg["rope_parameters"]
    dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * np.pi * rope["rope_theta"] ** (i / dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


DECODER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                 "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
GPT2_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def expected_tensors(family, folder):
    """GGUF name → float32 array in PyTorch order, from transformers' parameters."""
    model = hf_model(folder)
    cfg = json.loads((folder / "config.json").read_text())
    out = {}
    for name, p in model.named_parameters():
        w = p.detach().float()
        if family == "gpt2":
            if name == "transformer.wte.weight":
                key = "token_embd.weight"
            elif name == "transformer.wpe.weight":
                key = "position_embd.weight"
            elif name.startswith("transformer.ln_f."):
                key = "output_norm." + name.rsplit(".", 1)[1]
            else:
                m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)", name)
                key = f"blk.{m[1]}.{GPT2_NAMES[m[2]]}.{m[3]}"
                if m[3] == "weight" and m[2] not in ("ln_1", "ln_2"):
                    w = w.t()  # Conv1D [in, out] → [out, in]
        else:
            if name == "model.embed_tokens.weight":
                key = "token_embd.weight"
            elif name == "model.norm.weight":
                key = "output_norm.weight"
            elif name == "lm_head.weight":
                key = "output.weight"
            else:
                m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
                key = f"blk.{m[1]}.{DECODER_NAMES[m[2]]}.{m[3]}"
                if family in ("llama", "mistral") and m[2] == "self_attn.q_proj":
                    w = regroup_rotary(w, cfg["num_attention_heads"])
                if family in ("llama", "mistral") and m[2] == "self_attn.k_proj":
                    w = regroup_rotary(w, cfg["num_key_value_heads"])
        out[key] = w.contiguous()
    if family == "llama":
        out["rope_freqs.weight"] = torch.from_numpy(llama3_factors(cfg))
    return out


def expected_type(name, w, gguf_type):
    if w.dim() <= 1 or name.endswith("_norm.weight") or name == "position_embd.weight":
        return Q.F32
    if gguf_type == "q8_0" and w.shape[-1] % 32 != 0:
        return Q.F16
    return TENSOR_TYPE[gguf_type]


def field(reader, key):
    f = reader.fields.get(key)
    assert f is not None, f"{key} is missing"
    return f.contents()


@pytest.mark.parametrize("gguf_type", TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tensor_equals_ours(family, gguf_type, exported):
    path, report = exported[family][gguf_type]
    expected = expected_tensors(family, exported[family]["dir"])
    reader = gguf.GGUFReader(path)
    assert sorted(t.name for t in reader.tensors) == sorted(expected)
    counts = {}
    worst_q8 = 0.0
    for t in reader.tensors:
        want = expected[t.name]
        assert t.tensor_type == expected_type(t.name, want, gguf_type), t.name
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        assert list(t.shape) == list(reversed(want.shape)), t.name  # GGUF dims innermost first
        if t.tensor_type == Q.F32:
            assert np.array_equal(np.asarray(t.data).reshape(want.shape), want.numpy()), t.name
        elif t.tensor_type == Q.F16:
            ours = np.asarray(t.data).view(np.uint16).reshape(want.shape)
            assert np.array_equal(ours, want.half().view(torch.int16).numpy().view(np.uint16)), t.name
        elif t.tensor_type == Q.BF16:
            ours = np.asarray(t.data).view(np.uint16).reshape(want.shape)
            assert np.array_equal(ours, want.bfloat16().view(torch.int16).numpy().view(np.uint16)), t.name
        else:
            reference = gguf.quants.quantize(want.numpy(), Q.Q8_0)
            assert np.array_equal(np.asarray(t.data).reshape(reference.shape), reference), t.name
            blocks = want.numpy().reshape(-1, 32)
            back = gguf.quants.dequantize(np.asarray(t.data), Q.Q8_0).reshape(-1, 32)
            amax = np.abs(blocks).max(axis=1, keepdims=True)
            bound = amax / 254 + amax / 2048
            err = np.abs(back - blocks)
            assert (err <= bound).all(), f"{t.name}: q8_0 error {err.max()} over its bound"
            worst_q8 = max(worst_q8, float((err / np.maximum(amax, 1e-30)).max()))
    assert counts == report["tensors_by_type"]
    assert report["parameters"] == sum(w.numel() for w in expected.values())
    if gguf_type == "q8_0":
        print(f"{family} q8_0: worst |x - x^| / amax = {worst_q8:.5f} (bound {1/254 + 1/2048:.5f})")


@pytest.mark.parametrize("gguf_type", TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_metadata_llama_cpp_reads(family, gguf_type, exported):
    path, report = exported[family][gguf_type]
    folder = exported[family]["dir"]
    cfg = json.loads((folder / "config.json").read_text())
    reader = gguf.GGUFReader(path)
    arch = "gpt2" if family == "gpt2" else "qwen2" if family == "qwen2" else "llama"
    assert reader.fields["GGUF.version"].contents() == 3
    assert field(reader, "general.architecture") == arch == report["architecture"]
    assert field(reader, "general.name") == path.stem
    assert field(reader, "general.file_type") == FILE_TYPE_CODE[gguf_type]
    assert field(reader, "general.alignment") == 32
    assert all(t.data_offset % 32 == 0 for t in reader.tensors)
    assert field(reader, "general.quantization_version") == 2
    if family == "gpt2":
        want = {"context_length": cfg["n_positions"], "embedding_length": cfg["n_embd"],
                "block_count": cfg["n_layer"], "feed_forward_length": 4 * cfg["n_embd"],
                "attention.head_count": cfg["n_head"], "attention.head_count_kv": cfg["n_head"],
                "vocab_size": cfg["vocab_size"]}
        assert field(reader, "gpt2.attention.layer_norm_epsilon") == pytest.approx(
            cfg["layer_norm_epsilon"], rel=1e-6)
        assert not any(k.startswith("gpt2.rope") for k in reader.fields)
    else:
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        want = {"context_length": cfg["max_position_embeddings"],
                "embedding_length": cfg["hidden_size"], "block_count": cfg["num_hidden_layers"],
                "feed_forward_length": cfg["intermediate_size"],
                "attention.head_count": cfg["num_attention_heads"],
                "attention.head_count_kv": cfg["num_key_value_heads"],
                "rope.dimension_count": head_dim, "vocab_size": cfg["vocab_size"]}
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
        assert field(reader, f"{arch}.rope.freq_base") == pytest.approx(theta, rel=1e-6)
        assert field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(
            cfg["rms_norm_eps"], rel=1e-6)
    for key, value in want.items():
        assert field(reader, f"{arch}.{key}") == value, key
        assert reader.fields[f"{arch}.{key}"].types == [gguf.GGUFValueType.UINT32], key


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_equals_tokenizer_json(family, exported):
    folder = exported[family]["dir"]
    path, report = exported[family]["q8_0"]
    doc = json.loads((folder / "tokenizer.json").read_text())
    cfg = json.loads((folder / "config.json").read_text())
    hf_tok = AutoTokenizer.from_pretrained(folder)
    reader = gguf.GGUFReader(path)
    by_id = {i: t for t, i in doc["model"]["vocab"].items()}
    added = {a["id"]: a for a in doc["added_tokens"]}
    by_id.update({i: a["content"] for i, a in added.items()})
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == cfg["vocab_size"] == report["tokenizer"]["tokens"]
    assert tokens == [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    types = field(reader, "tokenizer.ggml.token_type")
    for i, kind in enumerate(types):
        if i not in by_id:
            assert kind == gguf.TokenType.UNUSED
        elif i in added:
            assert kind == (gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif family == "llama" and re.fullmatch(r"<0x[0-9A-F]{2}>", by_id[i]):
            assert kind == gguf.TokenType.BYTE
        else:
            assert kind == gguf.TokenType.NORMAL, (i, by_id[i])
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    if family == "llama":
        assert field(reader, "tokenizer.ggml.model") == "llama"
        assert "tokenizer.ggml.merges" not in reader.fields
        assert field(reader, "tokenizer.ggml.add_space_prefix") is True
        scores = field(reader, "tokenizer.ggml.scores")
        ids = doc["model"]["vocab"]
        first = {}  # a merge's token scores −(rank + 1) of the first merge that makes it
        for rank, m in enumerate(merges):
            first.setdefault(m.replace(" ", ""), rank)
        assert all(scores[ids[t]] == -(r + 1) for t, r in first.items())
    else:
        assert field(reader, "tokenizer.ggml.model") == "gpt2"
        pre = {"mistral": "llama-bpe", "qwen2": "qwen2", "gpt2": "gpt-2"}[family]
        assert field(reader, "tokenizer.ggml.pre") == pre == report["tokenizer"]["pre"]
        assert field(reader, "tokenizer.ggml.merges") == merges
        assert report["tokenizer"]["merges"] == len(merges)
    assert field(reader, "tokenizer.ggml.bos_token_id") == hf_tok.bos_token_id
    assert field(reader, "tokenizer.ggml.eos_token_id") == hf_tok.eos_token_id
    plain = hf_tok("x y", add_special_tokens=False)["input_ids"]
    full = hf_tok("x y")["input_ids"]
    assert field(reader, "tokenizer.ggml.add_bos_token") == (full[:1] == [hf_tok.bos_token_id] != plain[:1])
    assert field(reader, "tokenizer.ggml.add_eos_token") is False
    if hf_tok.pad_token_id is not None:
        assert field(reader, "tokenizer.ggml.padding_token_id") == hf_tok.pad_token_id
    if family == "llama":
        assert field(reader, "tokenizer.ggml.unknown_token_id") == hf_tok.unk_token_id
        assert field(reader, "tokenizer.chat_template") == hf_tok.chat_template == CHAT_TEMPLATE
    else:
        assert "tokenizer.chat_template" not in reader.fields


def llama_cpp_or_skip():
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        reason = (f"llama-cpp-python is not importable ({e}); installer/bootstrap.sh builds it "
                  "unless TESSERA_SKIP_LLAMA_CPP=1 (about 7 minutes on 2 cores), or: "
                  "~/.cache/tessera/venv/bin/pip install llama-cpp-python==0.3.36")
        print(reason)
        pytest.skip(reason)
    return llama_cpp


def load_llama(llama_cpp, path):
    """A llama.cpp context over `path`: keys and values cached in float32 (llama.cpp's default is
    f16), so that f32 compares f32; and without llama.cpp's extra CPU buffer types (weight
    repacking, AMX), whose Q8_0 kernels stop with a general protection fault in libggml-cpu on
    this machine's CPU for every Q8_0 file, gguf-py's own included. The plain CPU path computes
    the same model."""
    low = llama_cpp.llama_cpp
    default_params = low.llama_model_default_params

    def plain_cpu():
        params = default_params()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = plain_cpu
    try:
        return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=256, n_threads=2,
                               n_batch=64, verbose=False, seed=0, type_k=0, type_v=0)
    finally:
        low.llama_model_default_params = default_params


@pytest.mark.parametrize("gguf_type", ["f32", "q8_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_logits_equal_transformers(family, gguf_type, exported):
    llama_cpp = llama_cpp_or_skip()
    folder = exported[family]["dir"]
    path, _ = exported[family][gguf_type]
    hf_tok = AutoTokenizer.from_pretrained(folder)
    ids = hf_tok(PROMPT)["input_ids"]
    with torch.no_grad():
        ref = hf_model(folder)(torch.tensor([ids])).logits[0].numpy()
    llm = load_llama(llama_cpp, path)
    # llama.cpp's tokenizer, from the GGUF metadata alone, gives transformers' ids.
    assert llm.tokenize(PROMPT.encode(), add_bos=True, special=False) == ids
    llm.reset()
    llm.eval(ids)
    ours = np.asarray(llm.scores[: len(ids)], dtype=np.float32)[:, : ref.shape[1]]
    diff = float(np.abs(ours - ref).max())
    scale = float(np.abs(ref).max())
    bound = LOGITS_REL_BOUND.get((gguf_type, family), LOGITS_REL_BOUND[gguf_type])
    same_argmax = float((ours.argmax(-1) == ref.argmax(-1)).mean())
    print(f"{family} {gguf_type}: llama.cpp vs transformers max |logits diff| {diff:.3e}, "
          f"max |logits| {scale:.2f}, ratio {diff / scale:.2e} (bound {bound}), "
          f"same argmax at {same_argmax:.0%} of {len(ids)} positions")
    assert diff <= bound * scale
    assert same_argmax >= (1.0 if gguf_type == "f32" else 0.8)


# ---- refusals ---------------------------------------------------------------------------------

def leftovers(folder):
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_refuses_what_gguf_cannot_express(exported, tmp_path):
    bert = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2)).save_pretrained(bert)
    (bert / "tokenizer.json").write_text((exported["gpt2"]["dir"] / "tokenizer.json").read_text())
    proc = cli("export", "--model", bert, "--out", tmp_path / "b.gguf", "--format", "gguf", expect=2)
    assert "bert" in proc.stderr and "GGUF" in proc.stderr

    # A pre-tokenizer llama.cpp has no name for (ByteLevel that prepends a space).
    odd = tmp_path / "odd"
    src = exported["gpt2"]["dir"]
    odd.mkdir()
    for f in src.iterdir():
        (odd / f.name).write_bytes(f.read_bytes())
    doc = json.loads((odd / "tokenizer.json").read_text())
    doc["pre_tokenizer"]["add_prefix_space"] = True
    (odd / "tokenizer.json").write_text(json.dumps(doc))
    proc = cli("export", "--model", odd, "--out", tmp_path / "o.gguf", "--format", "gguf", expect=2)
    assert "tokenizer.json" in proc.stderr and "pre_tokenizer" in proc.stderr
    assert "hint:" in proc.stderr

    (odd / "tokenizer.json").unlink()
    proc = cli("export", "--model", odd, "--out", tmp_path / "o.gguf", "--format", "gguf", expect=2)
    assert "tokenizer.json" in proc.stderr and "missing" in proc.stderr
    assert not (tmp_path / "o.gguf").exists() and not (tmp_path / "b.gguf").exists()
    assert leftovers(tmp_path) == []


def test_existing_file_needs_force(exported, tmp_path):
    src = exported["gpt2"]["dir"]
    out = tmp_path / "m.gguf"
    out.write_bytes(b"not a gguf")
    proc = cli("export", "--model", src, "--out", out, "--format", "gguf", expect=2)
    assert "exists" in proc.stderr and "--force" in proc.stderr
    assert out.read_bytes() == b"not a gguf"
    cli("export", "--model", src, "--out", out, "--format", "gguf", "--gguf-type", "q8_0", "--force")
    assert field(gguf.GGUFReader(out), "general.file_type") == FILE_TYPE_CODE["q8_0"]
    proc = cli("export", "--model", src, "--out", tmp_path, "--format", "gguf", expect=2)
    assert "folder" in proc.stderr
    proc = cli("export", "--model", src, "--out", tmp_path / "x", "--gguf-type", "q8_0", expect=2)
    assert "--format gguf" in proc.stderr
    proc = cli("export", "--model", src, "--out", tmp_path / "y.gguf", "--format", "gguf",
               "--gguf-type", "q4_0", expect=2)
    assert "q8_0" in proc.stderr
    assert leftovers(tmp_path) == []
