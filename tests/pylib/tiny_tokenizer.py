"""Tokenizers for the generated test models, trained on a test's own corpus and returned as
transformers fast tokenizers (save_pretrained them):

  byte_level_bpe     GPT-2 style byte-level BPE with <s> (0), </s> (1) and <pad> (2); with
                     `split_pattern` it splits as Llama 3 / Qwen2 do (a Split regex, then
                     ByteLevel without its own regex), optionally after a normalizer (Qwen2: NFC)
  sentencepiece_bpe  Llama 2 / Mistral style BPE with byte fallback: <unk> (0), <s> (1), </s> (2),
                     the 256 <0xXX> byte tokens (3…258), "▁" for spaces, BOS added by the
                     post-processor
"""
import json

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from transformers import PreTrainedTokenizerFast


def byte_level_bpe(corpus, vocab_size, split_pattern=None, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    if split_pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def sentencepiece_bpe(corpus, vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=100,
        show_progress=False))
    # Byte tokens right after the specials (where Llama 2 has them); trained tokens keep their order.
    data = json.loads(tok.to_str())
    trained = [t for t, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])]
    order = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    order += [t for t in trained if t not in order]
    data["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    for added in data["added_tokens"]:
        added["id"] = data["model"]["vocab"][added["content"]]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
