"""Tokenizer throughput, ours ÷ HuggingFace `tokenizers`, measured side by side in one run.

Generates >= 10 MB of deterministic mixed text (prose, code, CJK, emoji, accents,
whitespace), trains a GPT-2-style byte-level BPE and a BERT-style WordPiece on part of it,
then encodes every line in ONE thread with both libraries (best of REPEATS passes each),
checks that the total token counts agree and prints tokens/s and the ratio."""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one thread
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "parity"))
import tokenizer_corpus  # noqa: E402

TOOL = pathlib.Path(os.environ["TESSERA_TOOLS_DIR"]) / "tessera-tok-tool"
TARGET_BYTES = int(os.environ.get("TESSERA_BENCH_BYTES", 10 * 1024 * 1024))
REPEATS = int(os.environ.get("TESSERA_BENCH_REPEATS", "2"))


def make_text():
    samples, size, seed = [], 0, 0
    while size < TARGET_BYTES:
        for s in tokenizer_corpus.corpus(5000, seed=1000 + seed):
            samples.append(s)
            size += len(s.encode()) + 1
        seed += 1
    return "\n".join(samples)


def gpt2_style(train):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train, trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def wordpiece_style(train):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(train, trainers.WordPieceTrainer(
        vocab_size=8000, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    return tok


def bench_hf(tok, lines):
    best, tokens = float("inf"), 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        encodings = tok.encode_batch(lines, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        tokens = sum(len(e.ids) for e in encodings)
    return tokens, best


def bench_ours(path, text_file):
    out = subprocess.run([str(TOOL), "bench", str(path), str(text_file), str(REPEATS)],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    return r["tokens"], r["seconds"]


def main():
    text = make_text()
    lines = text.split("\n")
    train = lines[: len(lines) // 10]
    print(f"text: {len(text.encode()) / 1e6:.1f} MB, {len(lines)} lines; one thread; "
          f"best of {REPEATS} passes")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        text_file = tmp / "text.txt"
        text_file.write_text(text, encoding="utf-8")
        for name, build in (("gpt2 byte-level BPE", gpt2_style), ("bert WordPiece", wordpiece_style)):
            tok = build(train)
            path = tmp / f"{name.split()[0]}.json"
            tok.save(str(path))
            hf_tokens, hf_s = bench_hf(tok, lines)
            our_tokens, our_s = bench_ours(path, text_file)
            hf_rate, our_rate = hf_tokens / hf_s, our_tokens / our_s
            same = hf_tokens == our_tokens
            ok = ok and same
            print(f"{name:22s} tokens hf={hf_tokens} ours={our_tokens} ({'match' if same else 'MISMATCH'})"
                  f" | hf {hf_rate / 1e6:.2f} M tok/s, ours {our_rate / 1e6:.2f} M tok/s"
                  f" | ours/hf = {our_rate / hf_rate:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
