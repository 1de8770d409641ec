"""Writes the fuzzers' seed corpora (tests/fuzz/corpus/<target>/) from the shapes the tests use:
the job spec of docs/job-spec.md, the tiny configs and tokenizers of the unit tests and
tests/pylib, the parity suite's chat templates, small datasets of each type. Run with the venv's
python (safetensors, pyarrow, tokenizers, transformers) when a parser learns a new shape:
  ~/.cache/tessera/venv/bin/python tests/fuzz/make_seeds.py
"""
import importlib.util
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors.numpy import save

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS / "pylib"))
CORPUS = HERE / "corpus"


def put(target, name, content):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    data = content if isinstance(content, bytes) else content.encode()
    (folder / name).write_bytes(data)


def compact(doc):
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def safetensors_seeds():
    put("fuzz_safetensors_header", "f32_i64_meta", save(
        {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([1, 2], dtype=np.int64)},
        metadata={"format": "pt"}))
    put("fuzz_safetensors_header", "f16_bool_u8", save(
        {"h": np.ones((2, 2), dtype=np.float16), "m": np.array([True, False]),
         "b": np.zeros((0, 4), dtype=np.uint8)}))
    # bf16 by hand (numpy has no bfloat16), and the empty header.
    header = compact({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    put("fuzz_safetensors_header", "bf16", struct.pack("<Q", len(header)) + header + b"\x80\x3f\x00\x40")
    put("fuzz_safetensors_header", "empty", struct.pack("<Q", 2) + b"{}")
    index = {"metadata": {"total_size": 24},
             "weight_map": {"w": "model-00001-of-00002.safetensors", "ids": "model-00002-of-00002.safetensors"}}
    put("fuzz_safetensors_index", "two_shards", json.dumps(index, indent=2))
    put("fuzz_safetensors_index", "one_shard", compact({"weight_map": {"w": "model.safetensors"}}))


def config_seeds():
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100,
             "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
             "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
             "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": [2, 3]}
    put("fuzz_config", "llama", json.dumps(llama, indent=2))
    llama3 = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                  head_dim=16, mlp_bias=False, attention_bias=True)
    put("fuzz_config", "llama3", compact(llama3))
    put("fuzz_config", "qwen2", compact(dict(llama, model_type="qwen2", sliding_window=64,
                                             use_sliding_window=False)))
    put("fuzz_config", "mistral", compact(dict(llama, model_type="mistral", sliding_window=None)))
    put("fuzz_config", "gpt2", compact({"model_type": "gpt2", "vocab_size": 50, "n_embd": 32,
                                        "n_layer": 3, "n_head": 4, "n_positions": 64,
                                        "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}))
    put("fuzz_config", "bert", compact({"model_type": "bert", "vocab_size": 30, "hidden_size": 32,
                                        "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "intermediate_size": 64, "max_position_embeddings": 64,
                                        "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                                        "hidden_act": "gelu", "id2label": {"0": "neg", "1": "pos"}}))


def job_seeds():
    base = {"version": 1, "model": {"path": "models/tiny-llama"},
            "dataset": {"train": ["data/train.jsonl"], "format": "instruction", "validation_split": 0.05},
            "method": {"type": "lora", "rank": 8, "alpha": 16},
            "training": {"steps": 200, "batch_size": 8, "learning_rate": 2e-4, "schedule": "cosine"},
            "output": {"dir": "runs/first"}}
    put("fuzz_job_spec", "docs_example", json.dumps(base, indent=2))
    full = dict(base, name="full", precision="bf16",
                model={"hub_id": "org/model", "revision": "main"},
                dataset={"hub_id": "org/data", "revision": "v1", "config": "en", "train": ["data/train-*.parquet"],
                         "columns": {"text": "body"}, "max_length": 64, "packing": False, "skip_bad_rows": True},
                method={"type": "full"},
                training={"epochs": 1.5, "gradient_accumulation": 2, "weight_decay": 0.01, "warmup_steps": 3,
                          "eval_every": 5, "save_every": 5, "keep_last": 1, "activation_checkpointing": True},
                strategy={"name": "gemini", "options": {"offload_optim_frac": 1.0}},
                nodes={"ranks_per_node": [{"name": "local", "nproc": 1}, {"name": "box2", "nproc": 2}],
                       "master_addr": "192.168.1.20", "master_port": 29500})
    put("fuzz_job_spec", "full", compact(full))
    put("fuzz_job_spec", "syntax_error", "{\n  \"version\": 1,\n  \"model\": {,\n}\n")


def event_seeds():
    lines = [{"v": 1, "type": "log", "t": 1.5, "level": "info", "message": "loading"},
             {"v": 1, "type": "progress", "t": 2.0, "phase": "steps", "done": 1, "total": 10, "eta_seconds": 3.5},
             {"v": 1, "type": "metric", "t": 2.1, "step": 1, "loss": 2.5, "lr": 2e-5},
             {"v": 1, "type": "error", "t": 3.0, "code": "invalid_input", "message": "bad", "hint": "fix"}]
    text = "".join(compact(line) + "\n" for line in lines)
    put("fuzz_events", "complete", text)
    put("fuzz_events", "torn", text + '{"v":1,"type":"met')
    put("fuzz_events", "empty", "")
    # What launch reads after a failure: the ranks' errors, one naming the rank at fault.
    ranked_errors = [{"v": 1, "type": "error", "t": 5.0, "rank": 1, "code": "peer_lost",
                      "message": "rank 1 on box2 (192.168.1.21) stopped answering", "hint": "x"},
                     {"v": 1, "type": "error", "t": 5.1, "rank": 0, "code": "internal",
                      "message": "collective timed out"}]
    put("fuzz_events", "rank_errors", "".join(compact(line) + "\n" for line in ranked_errors))
    # The studio's reader: the first byte picks the pieces the stream arrives in.
    ranked = [{"v": 1, "type": "metric", "t": 4.0, "step": 2, "loss": 2.4, "tokens_per_s": 900.0,
               "ranks": [{"rank": 0, "loss": 2.3, "tokens_per_s": 450.0},
                         {"rank": 1, "loss": 2.5, "tokens_per_s": 450.0}]},
              {"v": 1, "type": "memory", "t": 4.1, "tier": "host", "used": 1 << 30,
               "by_category": {"weights": 1 << 20, "optimizer": 2 << 20},
               "ranks": [{"rank": 0, "host": "a", "used": 1 << 29, "by_category": {"weights": 1 << 19}}]},
              {"v": 1, "type": "checkpoint", "t": 5.0, "step": 2, "path": "/runs/x/checkpoint-2"},
              {"v": 1, "type": "done", "t": 6.0, "status": "completed", "steps": 2, "total_steps": 2}]
    studio = text + "".join(compact(line) + "\r\n" for line in ranked) + "not json\n" + '{"v":1,"ty'
    put("fuzz_studio_events", "stream", b"\x07" + studio.encode())
    put("fuzz_studio_events", "one_byte_pieces", b"\x00" + text.encode())


def dataset_seeds():
    rows = [{"instruction": "Add 2 and 3.", "input": "", "output": "5"},
            {"instruction": "Say hi", "input": "in French", "output": "Salut \u00e9\u4e2d"}]
    chats = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}]}]
    put("fuzz_dataset_jsonl", "instruction", "".join(compact(r) + "\n" for r in rows))
    put("fuzz_dataset_jsonl", "chat_crlf", "".join(compact(r) + "\r\n" for r in chats))
    put("fuzz_dataset_jsonl", "text_bad_line", '{"text": "one"}\n\n{"text": 2, "label": [1]}\n{"text": \n')
    put("fuzz_dataset_json", "list", json.dumps(rows, indent=1))
    put("fuzz_dataset_json", "data_field", compact({"version": 2, "data": chats}))
    put("fuzz_dataset_json", "classification", compact([{"text": "good", "label": 1}, {"text": "bad", "label": 0}]))
    put("fuzz_dataset_csv", "quoted", 'text,label\n"a, quoted ""word""",pos\nplain,neg\n"multi\nline",pos\n')
    put("fuzz_dataset_csv", "instruction_tabs", "instruction\tinput\toutput\nAdd\t\t5\nSay\tx\ty\n")
    put("fuzz_dataset_csv", "bom_crlf", "\ufefftext\r\nhello\r\n\r\nworld\r\n")
    for name, table in {
        "instruction": pa.table({k: [r[k] for r in rows] for k in rows[0]}),
        "chat": pa.Table.from_pylist(chats),
        "typed": pa.table({"text": ["a", None, "c"], "label": pa.array([1, 0, None], pa.int64()),
                           "score": [0.5, 1.5, float("nan")]}),
    }.items():
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=2)
        put("fuzz_dataset_parquet", name, sink.getvalue().to_pybytes())


def tokenizer_seeds():
    import tiny_tokenizer
    bpe = {"version": "1.0", "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": False,
                     "byte_fallback": False,
                     "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "bc": 5, "abc": 6},
                     "merges": ["a b", "ab c", "b c"]}}
    put("fuzz_tokenizer", "tiny_bpe", compact(bpe))
    wordpiece = {
        "added_tokens": [{"id": i, "content": t, "special": True, "normalized": False}
                         for i, t in enumerate(["[UNK]", "[CLS]", "[SEP]"])],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                           "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
                                              "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 10,
                  "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "un": 3, "##aff": 4, "##able": 5,
                            "hello": 6, "!": 7, "cafe": 8, "\u4e2d": 9}}}
    put("fuzz_tokenizer", "tiny_wordpiece", compact(wordpiece))
    corpus = ["hello world, the quick brown fox", "caf\u00e9 \u4e2d\u6587 123 tokens!"] * 4
    llama3_split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    for name, tok in (("byte_level", tiny_tokenizer.byte_level_bpe(corpus, 270)),
                      ("byte_level_split", tiny_tokenizer.byte_level_bpe(corpus, 270, split_pattern=llama3_split)),
                      ("sentencepiece", tiny_tokenizer.sentencepiece_bpe(corpus, 280))):
        put("fuzz_tokenizer", name, tok.backend_tokenizer.to_str())


def chat_seeds():
    spec = importlib.util.spec_from_file_location("parity_chat", TESTS / "parity" / "test_chat_template.py")
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    for name, (template, tokens) in parity.TEMPLATES.items():
        put("fuzz_chat_template", name, template)
        put("fuzz_tokenizer_config", name, json.dumps(dict(tokens, chat_template=template,
                                                           add_bos_token=True, model_max_length=2048,
                                                           tokenizer_class="PreTrainedTokenizerFast")))
    for name, template in parity.EXTRA_TEMPLATES.items():
        put("fuzz_chat_template", "extra_" + name, template)
    put("fuzz_tokenizer_config", "added_token_dicts", compact(
        {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>",
         "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"},
                           {"name": "tool_use", "template": "{{ tools }}"}]}))


def hub_seeds():
    sha = "0123456789abcdef0123456789abcdef01234567"
    lfs = {"oid": "a" * 64, "size": 1024, "pointerSize": 134}
    model = {"id": "org/model", "sha": sha, "private": False, "gated": False, "downloads": 12,
             "likes": 3, "pipeline_tag": "text-generation", "library_name": "transformers",
             "cardData": {"license": "mit"}, "tags": ["license:mit", "llama"],
             "siblings": [{"rfilename": "config.json", "size": 600, "blobId": "b" * 40},
                          {"rfilename": "model.safetensors", "size": 1024, "blobId": "c" * 40, "lfs": lfs},
                          {"rfilename": "tokenizer.json"}, {"rfilename": "pytorch_model.bin"}]}
    put("fuzz_hub_responses", "model_info", json.dumps(model))
    dataset = {"id": "org/data", "sha": sha, "gated": "auto", "downloads": 1,
               "siblings": [{"rfilename": f} for f in (
                   "README.md", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
                   "data/validation.jsonl", "en/test.csv", "fr/train/0000.parquet", "partial-train/0000.parquet")]}
    put("fuzz_hub_responses", "dataset_info", json.dumps(dataset))
    put("fuzz_hub_responses", "first_rows", json.dumps({
        "features": [{"feature_idx": 0, "name": "text", "type": {"dtype": "string", "_type": "Value"}},
                     {"feature_idx": 1, "name": "label", "type": {"dtype": "int64", "_type": "Value"}}],
        "rows": [{"row_idx": i, "row": {"text": f"row {i}", "label": i % 2}, "truncated_cells": []}
                 for i in range(8)]}))
    put("fuzz_hub_responses", "jsonl_rows", "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(8)))
    put("fuzz_hub_responses", "search", json.dumps([
        {"id": "org/a", "downloads": 5, "likes": 1, "private": False, "tags": ["text-generation"],
         "pipeline_tag": "text-generation", "lastModified": "2024-01-01T00:00:00.000Z"},
        {"id": "org/b", "downloads": 2**40, "likes": 0, "gated": "manual"}]))
    put("fuzz_hub_responses", "card", """---
license: mit
configs:
- config_name: default
  default: true
  data_files:
  - split: train
    path: "data/train-*"
  - split: validation
    path: data/validation.jsonl
- config_name: en
  data_dir: en
  data_files: "*.csv"
- config_name: fr
  data_files: [fr/**/*.parquet, "fr/extra.json"]
---
# A dataset
""")


def agent_seeds():
    def frame(message):
        data = message if isinstance(message, bytes) else compact(message).encode()
        return b"\x00" + struct.pack(">I", len(data)) + data

    def signed(body, **fields):
        envelope = dict({"type": "request", "client_id": "fuzz-client", "nonce": "0123456789abcdef01",
                         "timestamp": 0, "body": compact(body)}, **fields)
        return b"\x01" + compact(envelope).encode()

    put("fuzz_agent_requests", "pair_start", frame(
        {"type": "pair_start", "client_id": "0123456789abcdef" * 2, "client_name": "laptop",
         "client_public_key": "ab" * 32}))
    put("fuzz_agent_requests", "unsigned_request", frame(
        {"type": "request", "client_id": "fuzz-client", "nonce": "n" * 16, "timestamp": 1700000000,
         "body": "{}", "hmac": "00" * 32}))
    put("fuzz_agent_requests", "unknown_type", frame({"type": "hello"}))
    put("fuzz_agent_requests", "huge_length", b"\x00\xff\xff\xff\xff{}")
    put("fuzz_agent_requests", "ping", signed({"what": "ping"}))
    put("fuzz_agent_requests", "link_test", signed({"what": "link_test", "bytes": 1024}, nonce="1123456789abcdef01"))
    put("fuzz_agent_requests", "stale", signed({"what": "ping"}, timestamp=-3600))
    put("fuzz_agent_requests", "check", signed(
        {"what": "check", "requirements": {"ranks": 1, "memory_bytes": 1024},
         "job": {"model": {"path": "m"}, "dataset": {"train": ["d.jsonl"]}}}, nonce="3123456789abcdef01"))
    put("fuzz_agent_requests", "spawn", signed(
        {"what": "spawn", "job": {"version": 1, "model": {"path": "m"}, "dataset": {"train": ["d.jsonl"]},
                                  "output": {"dir": "o"}}, "ranks": [0]}, nonce="2123456789abcdef01"))


if __name__ == "__main__":
    safetensors_seeds()
    config_seeds()
    job_seeds()
    event_seeds()
    dataset_seeds()
    tokenizer_seeds()
    chat_seeds()
    hub_seeds()
    agent_seeds()
    for folder in sorted(CORPUS.iterdir()):
        files = list(folder.iterdir())
        print(f"{folder.name}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")
