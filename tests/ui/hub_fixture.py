"""The local Hub (tests/pylib/hub_server.py) for the studio's tests, as a child process.

Serves, made here with transformers (random weights):
  org/tiny-llama      a llama the engine trains (safetensors in shards, BPE tokenizer)
  org/llama-gated     the same files, gated: 401 without a token, 403 with one not granted
  org/t5-small-ish    a config with model_type t5 (not supported)
  org/pickle-only     pytorch_model.bin only (refused before any download)
Prints one JSON line {"endpoint": ...} when ready, then reads commands from stdin, one JSON
object a line, and answers each with one JSON line:
  {"faults": {...}}   replaces the server's faults (see hub_server.py; lists for "status")
  {"grant": TOKEN}    gives TOKEN access to the gated repository
  {"requests": TEXT}  answers {"count": n, "ranged": m}: requests whose path holds TEXT, and of
                      those, how many carried a Range header
  {"searches": PATH}  answers {"filters": [[tag, ...], ...]}: the filter= tags of each search
                      request to PATH ("/api/models" or "/api/datasets"), oldest first
Exits when stdin closes.
"""
import json
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo  # noqa: E402


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
            if "searches" in cmd:
                searches = [urllib.parse.urlsplit(r[2]) for r in server.requests(server="hub")]
                out = {"filters": [urllib.parse.parse_qs(u.query).get("filter", []) for u in searches
                                   if u.path == cmd["searches"]]}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
