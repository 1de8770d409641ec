"""Generated text decoded as transformers decodes it, for a byte-level BPE tokenizer (Llama 3
style) and a byte-fallback one (Llama 2 style), both built here (tests/parity/test_tokenizer.py).

A model can be made to generate any chain of tokens: with every attention and MLP output
projection zero, the residual stream at a position is the current token's embedding, so greedy
decoding follows a table "token a → token b" written into embed_tokens (a basis vector per
token of the chain) and lm_head (the next token's row points at the current one's vector).
The chains spell multi-byte characters one byte token at a time.

Run: cd build && TESSERA_CLI=$PWD/app/cli/tessera-cli ~/.cache/tessera/venv/bin/python -m pytest
     -q ../tests/parity/test_generate_decode.py

Checked, against transformers' generate(do_sample=False) and tokenizer.decode(ids,
skip_special_tokens=True):
  - `generate --json`: generated ids equal, text equal, stop_reason eos (the chain ends in EOS)
    or max_new_tokens (cut inside a character: U+FFFD, counted in replacement_chars);
  - plain `generate` prints that text and a newline; `--json-lines` prints pieces that join to
    it, none of them part of a character (a partial one would show as U+FFFD);
  - `generate --stop TEXT` ends where generate(stop_strings=…) ends (ASCII chains);
  - `tokenize --decode --json` on random id sequences (byte tokens, specials, words): the
    pieces `generate` would stream join to tokenizer.decode of the ids.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
import test_tokenizer  # noqa: E402
from random_weights import randomize  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

PROMPT = "Hello world"
REPLACEMENT = "\ufffd"


def cli(*args, expect=0):
    path = os.environ.get("TESSERA_CLI")
    if not path:
        pytest.skip("TESSERA_CLI is not set")
    proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == expect, proc.stderr
    return proc


def byte_level_ids(tok, text):
    """The byte-level alphabet's single-byte tokens spelling `text`'s UTF-8 bytes (GPT-2's
    bytes_to_unicode)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in mapping):
        mapping[b] = chr(256 + n)
    return [tok.convert_tokens_to_ids(mapping[b]) for b in text.encode()]


def byte_fallback_ids(tok, text):
    return [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in text.encode()]


STYLES = {
    "llama3": (test_tokenizer.build_llama3, byte_level_ids, "<|end_of_text|>"),
    "llama2": (test_tokenizer.build_llama2, byte_fallback_ids, "</s>"),
}


def chain_model(folder, tok, chain):
    """A random-weight Llama that, greedy, answers the prompt's last token with `chain`."""
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = randomize(LlamaForCausalLM(config), 5)
    hidden = config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        assert len(chain) <= hidden and len(set(chain)) == len(chain), chain
        for i, (current, following) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[current] = torch.nn.functional.one_hot(
                torch.tensor(i), hidden).float()
            model.lm_head.weight[following, i] = 10.0
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode")
    made = {}
    for style, (build, _, eos) in STYLES.items():
        folder, _ = build(root)
        tok = PreTrainedTokenizerFast.from_pretrained(folder)
        if tok.eos_token is None:
            tok.eos_token = eos
        made[style] = (root, folder, tok)
    return made


# A chain of characters whose bytes are spelt one token each, then EOS: CJK (3 bytes), an emoji
# (4 bytes), an accented letter (2 bytes). Its characters share no byte, so every token of the
# chain is a different one (the table maps a token to one successor).
CHARACTERS = "中😀é"


@pytest.mark.parametrize("style", list(STYLES))
def test_generated_multibyte_text_equals_decode(style, tokenizers):
    root, _, tok = tokenizers[style]
    spell = STYLES[style][1]
    prompt_ids = tok(PROMPT).input_ids
    reply = spell(tok, CHARACTERS) + [tok.eos_token_id]
    assert tok.unk_token_id not in reply and None not in reply
    folder = chain_model(root / f"{style}-chain", tok, [prompt_ids[-1]] + reply)

    ours = json.loads(cli("generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                          "--max-new-tokens", 20, "--json").stdout)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=20)[0, ids.shape[1]:].tolist()
    assert ref == reply, "the chain model does not generate its chain"
    assert ours["prompt_ids"] == prompt_ids
    assert ours["generated_ids"] == ref
    expected = tok.decode(ref, skip_special_tokens=True)
    assert expected == CHARACTERS
    assert ours["text"] == expected
    assert ours["stop_reason"] == "eos" and ours["replacement_chars"] == 0
    assert ours["tokens"][-1] == tok.eos_token

    plain = cli("generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                "--max-new-tokens", 20).stdout
    assert plain == expected + "\n"
    lines = [json.loads(line) for line in
             cli("generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                 "--max-new-tokens", 20, "--json-lines").stdout.splitlines()]
    pieces = [line["text"] for line in lines[:-1]]
    assert lines[-1]["generated_ids"] == ref
    assert "".join(pieces) == expected
    assert all(REPLACEMENT not in p for p in pieces), pieces
    # Byte-level: each character once its last byte arrived. Byte fallback decodes a run of
    # byte tokens as a whole (one U+FFFD per byte when the run is not valid UTF-8), so the run
    # is printed when it ends.
    assert pieces == (list(CHARACTERS) if style == "llama3" else [CHARACTERS]), pieces

    # Cut inside the emoji: the bytes so far are not a character, shown as U+FFFD as
    # transformers shows them (byte fallback: the whole run, "中" too, one U+FFFD a byte).
    cut = json.loads(cli("generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                         "--max-new-tokens", 5, "--json").stdout)
    assert cut["generated_ids"] == ref[:5]
    assert cut["text"] == tok.decode(ref[:5], skip_special_tokens=True)
    assert cut["text"] == ("中" + REPLACEMENT if style == "llama3" else REPLACEMENT * 5)
    assert cut["stop_reason"] == "max_new_tokens"
    assert cut["replacement_chars"] == cut["text"].count(REPLACEMENT) > 0
    plain = cli("generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                "--max-new-tokens", 5).stdout
    assert plain == cut["text"] + "\n"


@pytest.mark.parametrize("style", list(STYLES))
def test_streamed_pieces_join_to_decode(style, tokenizers, tmp_path):
    _, folder, tok = tokenizers[style]
    spell = STYLES[style][1]
    rng = random.Random(17)
    specials = [tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens]
    words = tok(" the quick brown fox, café 中文 東京 👍🏽", add_special_tokens=False).input_ids
    bytes_ = spell(tok, "中😀éß€") + spell(tok, "\u00e9")[:1]  # and a lone lead byte
    invalid = spell(tok, "€")[1:] + spell(tok, "😀")[:2]  # continuation bytes first, a cut lead
    pool = words + bytes_ + invalid + specials
    sequences = [spell(tok, "中"), spell(tok, "😀")[:3], invalid, words + invalid + words,
                 spell(tok, "a") + spell(tok, "中")[:1]]
    # One CLI process per sequence (about a second each): 25 random ones per style.
    sequences += [[rng.choice(pool) for _ in range(rng.randint(1, 24))] for _ in range(17)]
    sequences += [[rng.randrange(len(tok)) for _ in range(rng.randint(1, 24))] for _ in range(8)]
    for ids in sequences:
        out = json.loads(cli("tokenize", "--model", folder, "--decode", "--json",
                             ",".join(map(str, ids))).stdout)
        expected = tok.decode(ids, skip_special_tokens=True)
        assert out["text"] == expected, ids
        assert "".join(out["pieces"]) == expected, (ids, out["pieces"])


# ASCII with no repeated character (each token of a chain has one successor). transformers'
# StopStringCriteria matches stop strings against the tokens' strings, so only stop strings made
# of whole characters per token compare: ASCII bytes are.
ASCII_REPLY = "Yes. No!"


@pytest.mark.parametrize("style", list(STYLES))
def test_stop_strings_end_the_reply_as_transformers(style, tokenizers):
    root, _, tok = tokenizers[style]
    spell = STYLES[style][1]
    prompt_ids = tok(PROMPT).input_ids
    reply = spell(tok, ASCII_REPLY) + [tok.eos_token_id]
    folder = chain_model(root / f"{style}-ascii", tok, [prompt_ids[-1]] + reply)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])

    def reference(stops):
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=20, stop_strings=stops,
                                  tokenizer=tok)[0, ids.shape[1]:].tolist()

    # One token ("."), one across two tokens (". "), the first of two to appear, and one the
    # reply never contains (the reply runs to its EOS).
    for stops in ([". "], ["."], ["s. N"], ["!", "Ye"], ["maybe"]):
        args = ["generate", "--model", folder, "--prompt", PROMPT, "--greedy",
                "--max-new-tokens", 20, "--json"]
        for stop in stops:
            args += ["--stop", stop]
        ours = json.loads(cli(*args).stdout)
        ref = reference(stops)
        assert ours["generated_ids"] == ref, stops
        assert ours["text"] == tok.decode(ref, skip_special_tokens=True)
        if stops == ["maybe"]:
            assert ours["stop_reason"] == "eos" and "stop_string" not in ours
        else:
            assert ours["stop_reason"] == "stop_string"
            assert any(ours["text"].endswith(s) for s in stops), ours["text"]
            assert ours["stop_string"] in stops and ours["text"].endswith(ours["stop_string"])
    assert reference(["."]) == spell(tok, "Yes."), "the stop string did not stop transformers"

    cli("generate", "--model", folder, "--prompt", PROMPT, "--stop", "", expect=2)
