"""engine/data against Python oracles.

- Parquet rows (several row groups, nested list<struct> messages, nulls) against pyarrow.
- CSV/TSV written by Python's csv module (quotes, commas, line breaks) against csv.DictReader.
- Chat examples against transformers' apply_chat_template(tokenize=True,
  return_assistant_tokens_mask=True) on a template whose {% generation %} block covers what
  our prefix rendering learns (the reply and its end marker): same ids, same loss mask.
- The shuffle against an independent Python implementation of the documented algorithm
  (mt19937_64 + Fisher-Yates with rejection sampling), so the order is reproducible anywhere.
"""
import csv
import json
import os
import pathlib
import subprocess

import pytest

TOOL = pathlib.Path(os.environ.get("TESSERA_TOOLS_DIR", "")) / "tessera-data-tool"


def run_tool(*args):
    out = subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return lines[0], lines[1:]


@pytest.fixture(scope="module", autouse=True)
def tool_exists():
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build the tessera-data-tool target")


def test_parquet_rows_match_pyarrow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 23
    table = pa.table({
        "text": [f"row {i} é 你好" if i % 5 else None for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "score": [i / 4 for i in range(n)],
        "flag": [i % 2 == 0 for i in range(n)],
        "messages": [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
                     for i in range(n)],
    })
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=5)  # 5 row groups, the last one short
    assert pq.ParquetFile(path).num_row_groups == 5
    header, rows = run_tool("rows", path)
    if header.get("file_type") != "parquet":
        pytest.fail(f"unexpected header {header}")
    assert header["columns"] == table.column_names
    assert header["num_rows"] == n
    assert rows == table.to_pylist()


def test_csv_and_tsv_match_python_csv(tmp_path):
    records = [
        {"text": "plain", "label": "1"},
        {"text": "with, comma", "label": "0"},
        {"text": 'with "quotes" inside', "label": "1"},
        {"text": "two\nlines", "label": "0"},
        {"text": "crlf\r\ninside", "label": "1"},
        {"text": "tab\there", "label": "0"},
        {"text": "", "label": "1"},
        {"text": "ünïcödé ✓", "label": "0"},
    ]
    for name, dialect in (("d.csv", "excel"), ("d.tsv", "excel-tab")):
        path = tmp_path / name
        with open(path, "w", newline="", encoding="utf-8-sig") as f:  # BOM + CRLF line ends
            writer = csv.DictWriter(f, fieldnames=["text", "label"], dialect=dialect)
            writer.writeheader()
            writer.writerows(records)
        with open(path, newline="", encoding="utf-8-sig") as f:
            expected = list(csv.DictReader(f, dialect=dialect))
        header, rows = run_tool("rows", path)
        assert header["columns"] == ["text", "label"]
        # Line ends inside quoted values are read as "\n" (CRLF normalized), like text mode.
        expected = [{k: v.replace("\r\n", "\n") for k, v in r.items()} for r in expected]
        # An empty single value on its own would be a blank line; this row has two fields.
        assert rows == expected, name


CHATML_WITH_GENERATION = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there, how are you?"},
     {"role": "assistant", "content": "Fine, thanks! And you?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name two colours."},
     {"role": "assistant", "content": "Red and blue."},
     {"role": "user", "content": "Two more, in French: é?"},
     {"role": "assistant", "content": "Vert et jaune — voilà."}],
    [{"role": "user", "content": "Multi\nline\n\nquestion with  spaces"},
     {"role": "assistant", "content": "  leading spaces and\ttabs\n"},
     {"role": "user", "content": "ok"}],
]


def make_tokenizer_folder(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [m["content"] for conv in CONVERSATIONS for m in conv] * 20
    corpus += ["the quick brown fox jumps over the lazy dog"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_WITH_GENERATION
    fast.save_pretrained(path)
    return fast


def test_chat_ids_and_assistant_mask_match_transformers(tmp_path):
    fast = make_tokenizer_folder(tmp_path / "model")
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS), encoding="utf-8")
    header, examples = run_tool("tokenize", data, tmp_path / "model", "--max-length", "0")
    assert header["format"] == "chat (messages='messages')"
    assert len(examples) == len(CONVERSATIONS)
    for conv, ex in zip(CONVERSATIONS, examples):
        ref = fast.apply_chat_template(conv, tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
        assert ex["input_ids"] == list(ref["input_ids"])
        ours = [int(label != -100) for label in ex["labels"]]
        assert ours == list(ref["assistant_masks"])
        assert sum(ours) > 0
        # Learned positions carry their own token ids.
        assert all(l == i for l, i in zip(ex["labels"], ex["input_ids"]) if l != -100)


def test_instruction_rows_use_the_chat_template(tmp_path):
    fast = make_tokenizer_folder(tmp_path / "model")
    data = tmp_path / "inst.jsonl"
    rows = [{"instruction": "Name two colours.", "input": "Be brief", "output": "Red and blue."},
            {"instruction": "Hello there, how are you?", "output": "Fine, thanks!"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    header, examples = run_tool("tokenize", data, tmp_path / "model")
    assert header["format"].startswith("instruction (")
    for row, ex in zip(rows, examples):
        user = row["instruction"] + ("\n\n" + row["input"] if row.get("input") else "")
        conv = [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        ref = fast.apply_chat_template(conv, tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
        assert ex["input_ids"] == list(ref["input_ids"])
        assert [int(l != -100) for l in ex["labels"]] == list(ref["assistant_masks"])


class MT19937_64:
    """The 64-bit Mersenne Twister as std::mt19937_64 specifies it."""

    def __init__(self, seed):
        self.mt = [seed & (2**64 - 1)]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & (2**64 - 1))
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for k in range(312):
                y = (self.mt[k] & 0xFFFFFFFF80000000) | (self.mt[(k + 1) % 312] & 0x7FFFFFFF)
                self.mt[k] = self.mt[(k + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & (2**64 - 1)


def reference_shuffle(n, seed):
    rng = MT19937_64(seed)
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = 2**64 - (2**64 % bound)
        while True:
            r = rng()
            if r < limit:
                break
        j = r % bound
        order[i], order[j] = order[j], order[i]
    return order


@pytest.mark.parametrize("n,seed", [(10, 42), (1000, 0), (777, 2**64 - 1), (3, 12345)])
def test_shuffle_matches_documented_algorithm(n, seed):
    out = subprocess.run([str(TOOL), "shuffle", str(n), str(seed)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == reference_shuffle(n, seed)


def test_bad_rows_are_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "x"\n{"text": "\xff"}\n{"text": "fine"}\n')
    out = subprocess.run([str(TOOL), "rows", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert f"{path}:2" in out.stderr and "invalid JSON" in out.stderr
    header, rows = run_tool("rows", path, "--skip-bad-rows")
    assert header["skipped"] == 2
    assert rows == [{"text": "ok"}, {"text": "fine"}]
