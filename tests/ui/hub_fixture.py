"""The local Hub (tests/pylib/hub_server.py) for the studio's tests, as a child process.

Serves, made here with transformers (random weights):
  org/tiny-llama      a llama the engine trains (safetensors in shards, BPE tokenizer)
  org/llama-gated     the same files, gated: 401 without a token, 403 with one not granted
  org/t5-small-ish    a config with model_type t5 (not supported)
  org/pickle-only     pytorch_model.bin only (refused before any download)
and datasets:
  data/alpaca-mini    configs declared by its card: "instruct" (default; train in two JSONL files,
                      50 rows, and a validation file, 10 rows) and "chat" (one JSONL file of
                      messages, train only); the viewer serves both
  data/parquet-only   one Parquet file, train split by its name (36 rows)
  data/gated-set      a gated dataset (401 without a token)
Prints one JSON line {"endpoint": ...} when ready, then reads commands from stdin, one JSON
object a line, and answers each with one JSON line:
  {"faults": {...}}   replaces the server's faults (see hub_server.py; lists for "status")
  {"grant": TOKEN}    gives TOKEN access to the gated repository
  {"requests": TEXT}  answers {"count": n, "ranged": m}: requests whose path holds TEXT, and of
                      those, how many carried a Range header
  {"viewer": BOOL}    the dataset viewer's /first-rows on or off (501)
  {"rows": [REPO, PATH]}  answers {"rows": [{column: value}, ...]}: the rows of a dataset file,
                      as the server's viewer reads them
  {"searches": PATH}  answers {"filters": [[tag, ...], ...]}: the filter= tags of each search
                      request to PATH ("/api/models" or "/api/datasets"), oldest first
  {"add_bnb": true}   adds org/tiny-llama-bnb-4bit: org/tiny-llama quantized by bitsandbytes
                      (NF4, double-quantized absmax) and saved by transformers
Exits when stdin closes.
"""
import io
import json
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo, read_rows  # noqa: E402


def make_llama_files(d: Path):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(vocab={"<unk>": 0, "a": 1, "b": 2}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="b").save_pretrained(d)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(d, max_shard_size="300KB")
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    files["README.md"] = (b"---\nlicense: apache-2.0\ntags: [text-generation]\n---\n# a test model\n\n"
                          b"A **tiny** Llama for the studio's tests: see [the license](LICENSE) and "
                          b"[the Hub](https://huggingface.co/docs).\n\n"
                          b"| layers | hidden |\n|---|---|\n| 2 | 64 |\n")
    return files


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def make_bnb_files(source: Path, d: Path):
    """The tiny llama as the Hub's `-bnb-4bit` repositories ship one: quantized to NF4 with
    double-quantized absmax by bitsandbytes and saved by transformers (config.json then has its
    quantization_config)."""
    import torch
    from transformers import AutoTokenizer, BitsAndBytesConfig, LlamaForCausalLM

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    model = LlamaForCausalLM.from_pretrained(source, quantization_config=quantization, device_map="cpu",
                                             dtype=torch.float32)
    model.save_pretrained(d)
    AutoTokenizer.from_pretrained(source).save_pretrained(d)
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def make_datasets():
    """The dataset repositories (see the module's docstring), as Repo objects."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def instruct(i):
        return {"instruction": f"Count to {i}.", "output": " ".join(f"word{k}" for k in range(i % 7 + 1))}

    card = (b"---\nlicense: mit\nconfigs:\n"
            b"- config_name: instruct\n  default: true\n  data_files:\n"
            b"  - split: train\n    path: instruct/train-*.jsonl\n"
            b"  - split: validation\n    path: instruct/valid.jsonl\n"
            b"- config_name: chat\n  data_files: chat/*.jsonl\n---\n"
            b"# Alpaca mini\n\nInstructions and **answers** for the studio's tests.\n")
    chat = [{"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": str(i)}]}
            for i in range(12)]
    alpaca = Repo("data/alpaca-mini", {
        "README.md": card,
        "instruct/train-00000.jsonl": jsonl(instruct(i) for i in range(30)),
        "instruct/train-00001.jsonl": jsonl(instruct(i) for i in range(30, 50)),
        "instruct/valid.jsonl": jsonl(instruct(i) for i in range(100, 110)),
        "chat/conversations.jsonl": jsonl(chat),
    }, repo_type="dataset", license="mit", downloads=700, likes=5,
        tags=["task_categories:text-generation", "format:json", "size_categories:n<1K"],
        viewer_splits={("instruct", "train"): ["instruct/train-00000.jsonl", "instruct/train-00001.jsonl"],
                       ("instruct", "validation"): ["instruct/valid.jsonl"],
                       ("chat", "train"): ["chat/conversations.jsonl"]})
    table = pa.table({"text": [f"document number {i} " + "lorem " * (i % 5) for i in range(36)],
                      "source": [f"s{i % 3}" for i in range(36)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    parquet = Repo("data/parquet-only", {"data/train-00000-of-00001.parquet": buffer.getvalue()},
                   repo_type="dataset", license="apache-2.0", downloads=300,
                   tags=["format:parquet", "size_categories:n<1K"])
    gated = Repo("data/gated-set", {"train.jsonl": jsonl(instruct(i) for i in range(5))},
                 repo_type="dataset", gated=True, license="other", downloads=20)
    return [alpaca, parquet, gated]


def main():
    work = Path(sys.argv[1])
    llama = make_llama_files(work / "llama-src")
    t5 = {"config.json": json.dumps({"model_type": "t5", "d_model": 64}).encode(),
          "model.safetensors": llama["model-00001-of-00003.safetensors"]
          if "model-00001-of-00003.safetensors" in llama else b"x"}
    with HubServer(page_size=2) as server:
        server.add(Repo("org/tiny-llama", llama, downloads=1500, likes=9, tags=["text-generation", "transformers"]))
        server.add(Repo("org/llama-gated", llama, gated=True, downloads=900, license="llama3"))
        server.add(Repo("org/t5-small-ish", t5, downloads=40, license="mit"))
        server.add(Repo("org/pickle-only", {"config.json": b'{"model_type": "llama"}',
                                            "pytorch_model.bin": b"\x80" * 1000}, downloads=30))
        for dataset in make_datasets():
            server.add(dataset)
        print(json.dumps({"endpoint": server.endpoint}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            out = {"ok": True}
            if "faults" in cmd:
                server.faults = cmd["faults"]
            if "grant" in cmd:
                server.tokens.add(cmd["grant"])
            if "requests" in cmd:
                hits = [r for r in server.requests(contains=cmd["requests"])]
                out = {"count": len(hits), "ranged": sum(1 for r in hits if "Range" in r[3])}
            if "viewer" in cmd:
                server.viewer = bool(cmd["viewer"])
            if "rows" in cmd:
                repo_id, file = cmd["rows"]
                repo = server.repos[("dataset", repo_id)]
                out = {"rows": read_rows(file, repo.file_bytes(file))}
            if "add_bnb" in cmd:  # built on request: bitsandbytes takes seconds to import
                files = make_bnb_files(work / "llama-src", work / "llama-bnb")
                server.add(Repo("org/tiny-llama-bnb-4bit", files, downloads=20,
                                tags=["text-generation", "4-bit", "bitsandbytes"]))
            if "searches" in cmd:
                searches = [urllib.parse.urlsplit(r[2]) for r in server.requests(server="hub")]
                out = {"filters": [urllib.parse.parse_qs(u.query).get("filter", []) for u in searches
                                   if u.path == cmd["searches"]]}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
