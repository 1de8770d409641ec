"""`tessera-cli hub` against a local server that speaks the Hub's HTTP API (tests/pylib/hub_server.py):
search, info, downloads into the cache huggingface_hub uses, with injected faults. After every case
the cache is walked: snapshot entries are relative symlinks into blobs, LFS blobs hash to their
names, nothing temporary is left."""
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo, client_env, walk_cache  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
PYTHON = sys.executable
TOKEN = "hf_tessera_test_secret_token_0123456789"


def make_llama_files(tmp_path, hidden=64, vocab=1000):
    """A random-weight Llama saved by transformers: config, safetensors, tokenizer files."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path / "llama-src"
    d.mkdir()
    tok = Tokenizer(models.BPE(vocab={"<unk>": 0, "a": 1, "b": 2}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="b").save_pretrained(d)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(d, max_shard_size="300KB")
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    files["README.md"] = b"---\nlicense: apache-2.0\n---\n# a test model\n"
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    return files


@pytest.fixture(scope="module")
def llama_files(tmp_path_factory):
    return make_llama_files(tmp_path_factory.mktemp("llama"))


@pytest.fixture
def hub(llama_files):
    with HubServer() as server:
        server.add(Repo("org/llama", llama_files, downloads=50, likes=3, tags=["text-generation", "transformers"]))
        server.add(Repo("org/llama-gated", llama_files, gated=True, downloads=40))
        server.add(Repo("org/pickle-only", {"config.json": b"{}", "pytorch_model.bin": b"\x80" * 1000}, downloads=30))
        server.add(Repo("org/evil", {"config.json": b"{}", "model.safetensors": llama_files["model.safetensors"]
                                     if "model.safetensors" in llama_files else b"x"}, extra_listing=["../../x"]))
        server.add(Repo("org/chat-data", {"data/train.jsonl": b'{"text": "hi"}\n' * 50, "README.md": b"# data\n",
                                          "data/test.parquet": b"PAR1" + b"\0" * 300 + b"PAR1"},
                        repo_type="dataset", downloads=7))
        server.tokens.add(TOKEN)
        yield server


def cli(hub, cache, *args, timeout=120, **extra):
    return subprocess.run([CLI, "hub", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=client_env(hub, cache, **extra))


def expected_model_files(files):
    keep = [p for p in files if "/" not in p and (p.endswith((".safetensors", ".safetensors.index.json")) or p in (
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"))]
    return {p: files[p] for p in keep}


def snapshot_of(cache, repo="models--org--llama"):
    snaps = walk_cache(cache)[repo]
    assert len(snaps) == 1
    return next(iter(snaps.items()))


def human(size):
    """Bytes as the CLI writes them (core::human_bytes)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    value, unit = float(size), 0
    while value >= 1024 and unit < 4:
        value, unit = value / 1024, unit + 1
    return f"{value:.0f} {units[unit]}" if unit == 0 else f"{value:.1f} {units[unit]}"


def test_search_pages_sorts_and_filters(hub, tmp_path):
    r = cli(hub, tmp_path / "c", "search", "llama", "--json", "--limit", "5")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)
    assert [h["id"] for h in hits] == ["org/llama", "org/llama-gated"]  # by downloads; the server's pages hold 2
    # As the Hub writes it: false when open, else how access is granted.
    assert [h["gated"] for h in hits] == [False, "manual"]
    r = cli(hub, tmp_path / "c", "search", "", "--json", "--limit", "3")
    assert [h["id"] for h in json.loads(r.stdout)] == ["org/llama", "org/llama-gated", "org/pickle-only"]
    assert any("cursor=2" in req[2] for req in hub.requests("hub", "GET", "/api/models")), "the next page was followed"
    r = cli(hub, tmp_path / "c", "search", "", "--json", "--filter", "text-generation")
    assert [h["id"] for h in json.loads(r.stdout)] == ["org/llama"]
    r = cli(hub, tmp_path / "c", "search", "", "--json", "--task", "text-generation", "--library", "transformers",
            "--license", "apache-2.0")
    assert [h["id"] for h in json.loads(r.stdout)] == ["org/llama"]
    assert any("filter=license%3Aapache-2.0" in req[2] or "filter=license:apache-2.0" in req[2]
               for req in hub.requests("hub", "GET", "/api/models")), "the license went as a tag filter"
    r = cli(hub, tmp_path / "c", "search", "", "--json", "--license", "mit")
    assert json.loads(r.stdout) == []
    r = cli(hub, tmp_path / "c", "search", "chat", "--dataset")
    assert r.returncode == 0 and "org/chat-data" in r.stdout
    r = cli(hub, tmp_path / "c", "search", "x", "--sort", "stars")
    assert r.returncode == 2 and "--sort" in r.stderr


def test_info_lists_files_and_what_is_fetched(hub, tmp_path, llama_files):
    r = cli(hub, tmp_path / "c", "info", "org/llama", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["sha"] == hub.repos[("model", "org/llama")].sha and info["license"] == "apache-2.0"
    sizes = {f["path"]: f["size"] for f in info["files"]}
    assert sizes == {p: len(b) for p, b in llama_files.items()}
    fetched = {f["path"] for f in info["files"] if f["fetched"]}
    assert fetched == set(expected_model_files(llama_files))
    r = cli(hub, tmp_path / "c", "info", "org/pickle-only")
    assert r.returncode == 0 and "only pickle weights" in r.stdout


def test_info_shows_the_model_card(hub, tmp_path, llama_files):
    r = cli(hub, tmp_path / "c", "info", "org/llama", "--card")
    assert r.returncode == 0, r.stderr
    assert llama_files["README.md"].decode() in r.stdout
    r = cli(hub, tmp_path / "c", "info", "org/llama", "--card", "--json")
    assert json.loads(r.stdout)["card"] == llama_files["README.md"].decode()
    # The card is read at the commit the revision resolved to, not at a moving branch.
    sha = hub.repos[("model", "org/llama")].sha
    assert hub.requests("hub", "GET", f"/org/llama/resolve/{sha}/README.md")
    r = cli(hub, tmp_path / "c", "info", "org/pickle-only", "--card", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["card"] is None
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("README.md")), "cards are not cached"


def test_download_fills_the_cache_as_huggingface_hub_does(hub, tmp_path, llama_files):
    cache = tmp_path / "cache"
    events = tmp_path / "events.jsonl"
    r = cli(hub, cache, "download", "org/llama", "--events", events)
    assert r.returncode == 0, r.stderr
    repo = hub.repos[("model", "org/llama")]
    commit, files = snapshot_of(cache)
    assert commit == repo.sha and r.stdout.strip() == str(cache / "models--org--llama" / "snapshots" / commit)
    assert files == expected_model_files(llama_files)
    assert (cache / "models--org--llama" / "refs" / "main").read_text() == commit
    assert "download:" in r.stderr
    progress = [json.loads(line) for line in events.read_text().splitlines()]
    progress = [e for e in progress if e["type"] == "progress"]
    assert progress and all(e["phase"] == "download" for e in progress)
    assert progress[-1]["done"] == progress[-1]["total"] == sum(map(len, files.values()))
    # LFS files came from the second host, through the absolute redirect.
    assert hub.requests("cdn", "GET"), "LFS bodies are served by the CDN"
    # A second run finds everything in the cache and fetches no body.
    before = len(hub.requests(method="GET", contains="/resolve/")) + len(hub.requests("cdn", "GET"))
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    assert len(hub.requests(method="GET", contains="/resolve/")) + len(hub.requests("cdn", "GET")) == before
    total = sum(map(len, files.values()))
    assert f"received 0 B, {human(total)} already in the cache" in r.stderr, r.stderr
    # Blobs that another revision's snapshot holds are linked, not fetched, and the summary counts
    # them as already there (it said "received 0 B, 0 B already in the cache").
    shutil.rmtree(cache / "models--org--llama" / "snapshots")
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    assert len(hub.requests(method="GET", contains="/resolve/")) + len(hub.requests("cdn", "GET")) == before
    assert f"received 0 B, {human(total)} already in the cache" in r.stderr, r.stderr
    assert snapshot_of(cache)[1] == files
    # Offline: the snapshot from the cache alone.
    r = cli(hub, cache, "download", "org/llama", HF_HUB_OFFLINE=1)
    assert r.returncode == 0 and r.stdout.strip().endswith(commit), r.stderr


def test_include_and_datasets(hub, tmp_path):
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama", "--include", "*.json")
    assert r.returncode == 0, r.stderr
    _, files = snapshot_of(cache)
    assert files and all(p.endswith(".json") for p in files)
    r = cli(hub, cache, "download", "org/chat-data", "--dataset")
    assert r.returncode == 0, r.stderr
    snaps = walk_cache(cache)["datasets--org--chat-data"]
    assert set(next(iter(snaps.values()))) == {"README.md", "data/train.jsonl", "data/test.parquet"}


def largest_lfs(files):
    return max((p for p in files if p.endswith(".safetensors")), key=lambda p: len(files[p]))


def test_dropped_connection_resumes_with_range(hub, tmp_path, llama_files):
    big = largest_lfs(llama_files)
    cut = 70000
    hub.faults["cut_after"] = {big: [cut, 2]}
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    _, files = snapshot_of(cache)
    assert files[big] == llama_files[big]
    ranges = [req[3].get("Range") for req in hub.requests("cdn", "GET")
              if req[2].startswith(f"/blob/{hashlib.sha256(llama_files[big]).hexdigest()}")]
    assert ranges[:3] == [None, f"bytes={cut}-", f"bytes={2 * cut}-"], ranges


def test_server_that_ignores_range_restarts_from_zero(hub, tmp_path, llama_files):
    big = largest_lfs(llama_files)
    hub.faults.update(cut_after={big: [50000, 1]}, ignore_range=True)
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    assert snapshot_of(cache)[1][big] == llama_files[big]


def test_flipped_byte_is_refused_and_nothing_is_kept(hub, tmp_path, llama_files):
    big = largest_lfs(llama_files)
    hub.faults["flip_byte"] = {big}
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode != 0
    assert "SHA-256" in r.stderr and big in r.stderr, r.stderr
    sha = hashlib.sha256(llama_files[big]).hexdigest()
    blobs = cache / "models--org--llama" / "blobs"
    assert not (blobs / sha).exists() and not (blobs / (sha + ".incomplete")).exists()
    for snap in walk_cache(cache)["models--org--llama"].values():
        assert big not in snap


def test_refused_repositories_download_nothing(hub, tmp_path):
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/pickle-only")
    assert r.returncode == 2 and "pickle" in r.stderr and "safetensors" in r.stderr, r.stderr
    r = cli(hub, cache, "download", "org/evil")
    assert r.returncode == 2 and "../../x" in r.stderr and "refused" in r.stderr, r.stderr
    assert not hub.requests(contains="/resolve/"), "nothing was fetched"
    assert not any(p.is_file() and not p.name.endswith(".lock") for p in cache.rglob("*") if "blobs" in p.parts
                   or "snapshots" in p.parts)
    assert not (tmp_path / "x").exists() and not (cache.parent / "x").exists()
    walk_cache(cache)
    r = cli(hub, cache, "download", "../../x")
    assert r.returncode == 2 and "repository id" in r.stderr


def test_gated_and_missing_repositories_explain_what_to_do(hub, tmp_path):
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama-gated")
    assert r.returncode == 2 and "hub login" in r.stderr and "401" in r.stderr, r.stderr
    r = cli(hub, cache, "download", "org/llama-gated", HF_TOKEN="hf_not_granted")
    assert r.returncode == 2 and "gated" in r.stderr and "accept its license" in r.stderr, r.stderr
    assert f"{hub.endpoint}/org/llama-gated" in r.stderr
    r = cli(hub, cache, "info", "org/nope", HF_TOKEN="hf_not_granted")
    assert r.returncode == 2 and "not found" in r.stderr, r.stderr
    r = cli(hub, cache, "info", "org/llama", "--revision", "v9")
    assert r.returncode == 2 and 'revision "v9" not found' in r.stderr, r.stderr
    walk_cache(cache)


def test_retries_honour_retry_after_and_5xx(hub, tmp_path, llama_files):
    cache = tmp_path / "cache"
    hub.faults["status"] = {"api": [429, 1, {"Retry-After": "1"}], "resolve:config.json": [500, 2, {}],
                            f"cdn:{largest_lfs(llama_files)}": [503, 1, {"Retry-After": "0"}]}
    start = time.monotonic()
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start >= 1.0, "Retry-After: 1 was honoured"
    assert snapshot_of(cache)[1] == expected_model_files(llama_files)
    # Each wait is said as it starts (a Retry-After may hold a request for minutes): the reason,
    # the wait and the attempt to come.
    assert re.search(r"hub: \S+/api/models/org/llama\S*: HTTP 429 \(rate limited\); trying again in 1 s "
                     r"\(attempt 2 of 4\)", r.stderr), r.stderr
    assert re.search(r"hub: \S+/config\.json: HTTP 500; trying again in \d+ s \(attempt 3 of 8\)", r.stderr), r.stderr
    assert re.search(r"HTTP 503; trying again in 0 s \(attempt 2 of 8\)", r.stderr), r.stderr
    hub.faults["status"] = {"api": [500, 100, {"Retry-After": "0"}]}
    r = cli(hub, tmp_path / "cache2", "info", "org/llama")
    assert r.returncode == 1 and "HTTP 500" in r.stderr, r.stderr
    assert r.stderr.count("HTTP 500; trying again in 0 s") == 3, r.stderr  # info tries 4 times


def test_token_is_sent_to_the_hub_only_and_never_shown(hub, tmp_path, llama_files):
    cache = tmp_path / "cache"
    home = cache.parent / "hf-home"
    r = subprocess.run([CLI, "hub", "login"], input=TOKEN + "\n", capture_output=True, text=True,
                       env=client_env(hub, cache), timeout=60)
    assert r.returncode == 0, r.stderr
    token_file = home / "token"
    assert token_file.read_text() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    events = tmp_path / "events.jsonl"
    outputs = []
    r = cli(hub, cache, "download", "org/llama-gated", "--events", events)
    outputs += [r.stdout, r.stderr, events.read_text()]
    assert r.returncode == 0, r.stderr
    hub.faults["flip_byte"] = {largest_lfs(llama_files)}
    r = cli(hub, tmp_path / "cache2", "download", "org/llama-gated", "--events", events)
    outputs += [r.stdout, r.stderr, events.read_text()]
    assert r.returncode != 0
    r = cli(hub, cache, "download", "org/llama-gated", HF_TOKEN="hf_wrong_token_abcdef")
    outputs += [r.stdout, r.stderr]
    assert "hf_wrong_token_abcdef" not in r.stdout + r.stderr
    for text in outputs:
        assert TOKEN not in text
    assert all(req[3].get("Authorization") is None for req in hub.requests("cdn")), "no token to the CDN"
    assert any(req[3].get("Authorization") == f"Bearer {TOKEN}" for req in hub.requests("hub"))
    r = cli(hub, cache, "logout")
    assert r.returncode == 0 and not token_file.exists()


def test_cancel_keeps_the_partial_file_and_the_next_run_resumes(hub, tmp_path, llama_files):
    big = largest_lfs(llama_files)
    hub.faults["slow_bytes_per_s"] = 100_000
    cache = tmp_path / "cache"
    proc = subprocess.Popen([CLI, "hub", "download", "org/llama"], env=client_env(hub, cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sha = hashlib.sha256(llama_files[big]).hexdigest()
    partial = cache / "models--org--llama" / "blobs" / (sha + ".incomplete")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size > 20000):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "cancelled" in err, err  # 128 + SIGINT
    kept = partial.stat().st_size
    assert 0 < kept < len(llama_files[big])
    hub.faults.clear()
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    assert snapshot_of(cache)[1][big] == llama_files[big]
    last = [req for req in hub.requests("cdn", "GET") if sha in req[2]][-1]
    assert last[3].get("Range") == f"bytes={kept}-"


def test_two_processes_end_with_one_copy(hub, tmp_path, llama_files):
    hub.faults["slow_bytes_per_s"] = 2_000_000
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([CLI, "hub", "download", "org/llama"], env=client_env(hub, cache),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    for out, err, code in results:
        assert code == 0, err
    _, files = snapshot_of(cache)
    assert files == expected_model_files(llama_files)
    blobs = sorted(p.name for p in (cache / "models--org--llama" / "blobs").iterdir())
    assert len(blobs) == len(files)
    lfs_gets = [req for req in hub.requests("cdn", "GET")]
    assert len(lfs_gets) == sum(p.endswith(".safetensors") for p in files), "each blob was fetched once"


def test_offline_names_what_is_missing(hub, tmp_path):
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/llama", HF_HUB_OFFLINE=1)
    assert r.returncode == 2 and "not in the cache" in r.stderr, r.stderr
    r = cli(hub, cache, "download", "org/llama", "--include", "config.json")
    assert r.returncode == 0, r.stderr
    r = cli(hub, cache, "download", "org/llama", HF_HUB_OFFLINE=1)
    assert r.returncode == 2 and "missing" in r.stderr and ".safetensors" in r.stderr, r.stderr


def run_python(hub, cache, code, **extra):
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                       env=client_env(hub, cache, **extra))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_huggingface_hub_cache_is_ours_and_ours_is_its(hub, tmp_path, llama_files):
    wanted = expected_model_files(llama_files)
    # huggingface_hub downloads, we read offline.
    cache = tmp_path / "py-cache"
    path = run_python(hub, cache, "from huggingface_hub import snapshot_download as s;"
                      "print(s('org/llama', allow_patterns=['*.json', '*.safetensors']))").strip()
    r = cli(hub, cache, "download", "org/llama", HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == path
    assert {p: (Path(path) / p).read_bytes() for p in wanted} == wanted
    walk_cache(cache)
    # We download, huggingface_hub reads offline (and transformers loads the snapshot).
    cache = tmp_path / "our-cache"
    r = cli(hub, cache, "download", "org/llama")
    assert r.returncode == 0, r.stderr
    ours = r.stdout.strip()
    code = ("import json; from huggingface_hub import hf_hub_download as d, snapshot_download as s;"
            f"files={sorted(wanted)!r};"
            "paths={f: d('org/llama', f) for f in files};"
            "snap=s('org/llama', allow_patterns=files);"
            "print(json.dumps({'snap': snap, 'paths': paths}))")
    out = json.loads(run_python(hub, cache, code, HF_HUB_OFFLINE=1))
    assert out["snap"] == ours
    for f, p in out["paths"].items():
        assert Path(p).read_bytes() == wanted[f]
    run_python(hub, cache, f"from transformers import AutoModelForCausalLM as M; M.from_pretrained({ours!r})",
               HF_HUB_OFFLINE=1)


def test_renamed_repository_follows_the_relative_redirect(hub, tmp_path, llama_files):
    hub.renamed["org/old-llama"] = "org/llama"
    cache = tmp_path / "cache"
    r = cli(hub, cache, "download", "org/old-llama", "--events", "-")
    assert r.returncode == 0, r.stderr
    assert hub.requests("hub", "HEAD", "/org/old-llama/resolve/"), "asked under the old name"
    snaps = walk_cache(cache)["models--org--old-llama"]
    assert next(iter(snaps.values())) == expected_model_files(llama_files)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[-1]["type"] == "log" and "models--org--old-llama" in lines[-1]["message"]


# -- Datasets: configs and splits, row previews, the Parquet conversion branch ------------------

def jsonl(rows):
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def parquet(rows):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def csv_text(header, rows):
    return ("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n").encode()


def cells(rows, columns):
    """Rows as the client shows them: strings as they are, other values as compact JSON."""
    return [[r[c] if isinstance(r[c], str) else json.dumps(r[c], separators=(",", ":")) for c in columns]
            for r in rows]


CHAT = [{"prompt": f"question {i}", "answer": f"answer {i}", "turn": i, "tags": ["x", i]} for i in range(40)]
# Over 1 MiB, so that a preview without the viewer reads only a part of it.
BIG = [{"text": f"row {i} " + "lorem ipsum " * 30, "id": i} for i in range(3500)]
TABLE = [{"question": f"q{i}", "label": str(i % 3)} for i in range(30)]
CONVERTED = [{"text": f"converted {i}", "n": i} for i in range(25)]

CARD = """---
license: mit
configs:
- config_name: chat
  default: true
  data_files:
  - split: train
    path: chat/train-*.jsonl
  - split: validation
    path: [chat/dev.jsonl]
- config_name: plain
  data_files: plain/*.csv
- config_name: listed
  data_files:
  - plain/a.csv
  - chat/dev.jsonl
---
# Three configs: split dicts, one glob, a list of globs
"""


@pytest.fixture
def datasets(hub):
    hub.add(Repo("org/cards", {"README.md": CARD.encode(), "chat/train-1.jsonl": jsonl(CHAT[:20]),
                               "chat/train-2.jsonl": jsonl(CHAT[20:]), "chat/dev.jsonl": jsonl(CHAT[:5]),
                               "plain/a.csv": csv_text(["question", "label"], [r.values() for r in TABLE]),
                               "plain/b.csv": csv_text(["question", "label"], [("z", "1")])},
                 repo_type="dataset",
                 viewer_splits={("chat", "train"): ["chat/train-1.jsonl", "chat/train-2.jsonl"],
                                ("chat", "validation"): ["chat/dev.jsonl"], ("plain", "train"): ["plain/a.csv", "plain/b.csv"]}))
    hub.add(Repo("org/big", {"data/train.jsonl": jsonl(BIG), "README.md": b"# no header\n",
                             "data/validation.csv": csv_text(["question", "label"], [r.values() for r in TABLE]),
                             "data/test.parquet": parquet(CONVERTED)}, repo_type="dataset"))
    hub.add(Repo("org/scripted", {"README.md": b"---\nlicense: mit\n---\n# a loading script\n", "scripted.py": b"pass\n"},
                 repo_type="dataset",
                 branches={"refs/convert/parquet": {"default/train/0000.parquet": parquet(CONVERTED[:10]),
                                                    "default/train/0001.parquet": parquet(CONVERTED[10:]),
                                                    "default/test/0000.parquet": parquet(CONVERTED[:3]),
                                                    "extra/train/0000.parquet": parquet(CONVERTED[:1])}}))
    hub.add(Repo("org/bad-card", {"README.md": b"---\nlicense: mit\nconfigs:\n- config_name: a\n  data_files:\n"
                                                b"  - split: train\n    path: [x.csv\n---\n", "x.csv": b"a\n1\n"},
                 repo_type="dataset"))
    return hub


def layout_of(out):
    """(config, default, revision, [(split, [(path, size)])]) of `hub info --dataset --json`."""
    return [(c["name"], c["default"], c["revision"], [(s["name"], [(f["path"], f["size"]) for f in s["files"]])
                                                      for s in c["splits"]]) for c in out["dataset"]["configs"]]


def sized(repo, *paths):
    return [(p, len(repo.file_bytes(p))) for p in paths]


def test_dataset_configs_from_the_card_the_file_names_and_the_conversion_branch(datasets, tmp_path):
    hub, cache = datasets, tmp_path / "cache"
    cards = hub.repos[("dataset", "org/cards")]
    r = cli(hub, cache, "info", "org/cards", "--dataset", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["dataset"]["source"] == "card" and out["dataset"]["commit"] == cards.sha
    assert layout_of(out) == [
        ("chat", True, "main", [("train", sized(cards, "chat/train-1.jsonl", "chat/train-2.jsonl")),
                                ("validation", sized(cards, "chat/dev.jsonl"))]),
        ("plain", False, "main", [("train", sized(cards, "plain/a.csv", "plain/b.csv"))]),
        ("listed", False, "main", [("train", sized(cards, "plain/a.csv", "chat/dev.jsonl"))])]
    r = cli(hub, cache, "info", "org/cards", "--dataset")
    assert "configs (from its card):" in r.stdout and "chat (default), at main" in r.stdout
    assert "validation: 1 file" in r.stdout and "chat/dev.jsonl" in r.stdout
    # The card went through the cache, so the layout is the same offline.
    served = len(hub.log)
    r = cli(hub, cache, "info", "org/cards", "--dataset", "--json", HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr
    assert layout_of(json.loads(r.stdout)) == layout_of(out) and len(hub.log) == served
    walk_cache(cache)

    big = hub.repos[("dataset", "org/big")]
    out = json.loads(cli(hub, cache, "info", "org/big", "--dataset", "--json").stdout)
    assert out["dataset"]["source"] == "file names"
    assert layout_of(out) == [("default", True, "main", [("train", sized(big, "data/train.jsonl")),
                                                         ("validation", sized(big, "data/validation.csv")),
                                                         ("test", sized(big, "data/test.parquet"))])]

    # Only a loading script at main: the Hub's Parquet conversion, its folders the configs.
    conv = hub.repos[("dataset", "org/scripted")].branches["refs/convert/parquet"]
    out = json.loads(cli(hub, cache, "info", "org/scripted", "--dataset", "--json").stdout)
    assert out["dataset"]["source"] == "parquet conversion"
    assert layout_of(out) == [
        ("default", True, "refs/convert/parquet", [
            ("train", sized(conv, "default/train/0000.parquet", "default/train/0001.parquet")),
            ("test", sized(conv, "default/test/0000.parquet"))]),
        ("extra", False, "refs/convert/parquet", [("train", sized(conv, "extra/train/0000.parquet"))])]
    assert hub.requests("hub", "GET", "/api/datasets/org/scripted/revision/refs%2Fconvert%2Fparquet")


def test_a_malformed_card_names_the_repository_and_the_line(datasets, tmp_path):
    r = cli(datasets, tmp_path / "cache", "preview", "org/bad-card")
    assert r.returncode == 2, r.stderr
    assert "org/bad-card" in r.stderr and "README.md line 8" in r.stderr and "malformed" in r.stderr, r.stderr
    # hub info still shows the repository, with the card's fault in place of its configs.
    r = cli(datasets, tmp_path / "cache", "info", "org/bad-card", "--dataset", "--json")
    assert r.returncode == 0, r.stderr
    assert "README.md line 8" in json.loads(r.stdout)["dataset_error"]["message"]


def preview(hub, cache, repo, *args, **env):
    r = cli(hub, cache, "preview", repo, "--json", *args, **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_preview_through_the_viewer_and_without_it(datasets, tmp_path):
    hub, cache = datasets, tmp_path / "cache"
    # The viewer: the default config's train split, then a named config, and Parquet.
    p = preview(hub, cache, "org/cards", "--rows", "5")
    assert p == {"columns": ["prompt", "answer", "turn", "tags"], "rows": cells(CHAT[:5], ["prompt", "answer", "turn", "tags"]),
                 "source": "dataset viewer", "partial": True}
    assert hub.requests("hub", "GET", "/first-rows?dataset=org/cards&config=chat&split=train")
    p = preview(hub, cache, "org/cards", "--config", "plain", "--rows", "100")
    assert p["rows"] == cells(TABLE, ["question", "label"]) + [["z", "1"]] and p["partial"] is False
    p = preview(hub, cache, "org/big", "--split", "test", "--rows", "4")
    assert p["source"] == "dataset viewer" and p["rows"] == cells(CONVERTED[:4], ["text", "n"])
    r = cli(hub, cache, "preview", "org/big", "--rows", "3")
    assert r.returncode == 0 and r.stdout.splitlines()[0].split() == ["text", "|", "id"], r.stdout
    assert "3 rows from dataset viewer; the split has more" in r.stdout

    # No viewer: the complete lines of the first 1 MiB (a Range request), equal to the file's rows.
    hub.viewer = False
    p = preview(hub, cache, "org/big", "--rows", "5")
    assert p == {"columns": ["text", "id"], "rows": cells(BIG[:5], ["text", "id"]),
                 "source": "data/train.jsonl, first 1 MiB", "partial": True}
    gets = hub.requests("hub", "GET", "/datasets/org/big/resolve/")
    assert gets[-1][3].get("Range") == "bytes=0-1048575"
    p = preview(hub, cache, "org/cards", "--rows", "100")  # a split of two files: more rows
    assert p["rows"] == cells(CHAT[:20], ["prompt", "answer", "turn", "tags"]) and p["partial"] is True
    assert p["source"] == "chat/train-1.jsonl"
    p = preview(hub, cache, "org/big", "--split", "validation", "--rows", "100")
    assert p["rows"] == cells(TABLE, ["question", "label"]) and p["partial"] is False
    # A server that ignores the Range: the client stops reading after 1 MiB.
    hub.faults["ignore_range"] = True
    assert preview(hub, cache, "org/big", "--rows", "5")["rows"] == cells(BIG[:5], ["text", "id"])
    hub.faults.clear()
    # An unreachable viewer is the same as none.
    hub.viewer = True
    p = preview(hub, cache, "org/big", "--rows", "2", TESSERA_HUB_VIEWER_ENDPOINT="http://127.0.0.1:9")
    assert p["source"] == "data/train.jsonl, first 1 MiB" and p["rows"] == cells(BIG[:2], ["text", "id"])
    hub.viewer = False
    # Parquet has no preview without the viewer.
    r = cli(hub, cache, "preview", "org/big", "--split", "test")
    assert r.returncode == 2 and "preview needs the Hub's dataset viewer for Parquet files" in r.stderr, r.stderr
    r = cli(hub, cache, "preview", "org/big", "--split", "nope")
    assert r.returncode == 2 and 'no split "nope"' in r.stderr and "train, validation, test" in r.stderr

    # Offline: from the cache, once the file is there; no request at all.
    r = cli(hub, cache, "preview", "org/big", HF_HUB_OFFLINE=1)
    assert r.returncode == 2 and "data/train.jsonl" in r.stderr and "not in the cache" in r.stderr, r.stderr
    assert cli(hub, cache, "download", "org/big", "--dataset", "--include", "data/train.jsonl").returncode == 0
    served = len(hub.log)
    p = preview(hub, cache, "org/big", "--rows", "3", HF_HUB_OFFLINE=1)
    assert p["rows"] == cells(BIG[:3], ["text", "id"]) and p["source"] == "data/train.jsonl, first 1 MiB"
    assert len(hub.log) == served
    walk_cache(cache)


def test_parquet_conversion_branch_is_shared_with_huggingface_hub(datasets, tmp_path):
    hub = datasets
    conv = hub.repos[("dataset", "org/scripted")].branches["refs/convert/parquet"]
    files = sorted(conv.files)
    fetch = ("import json, sys; from huggingface_hub import hf_hub_download as d;"
             f"print(json.dumps({{f: d('org/scripted', f, repo_type='dataset', revision='refs/convert/parquet')"
             f" for f in {files!r}}}))")
    # huggingface_hub downloads the branch; we read its cache offline.
    cache = tmp_path / "py-cache"
    paths = json.loads(run_python(hub, cache, fetch))
    assert hub.requests("hub", "HEAD", "/datasets/org/scripted/resolve/refs%2Fconvert%2Fparquet/")
    ref = cache / "datasets--org--scripted" / "refs" / "refs" / "convert" / "parquet"
    assert ref.read_text() == conv.sha
    served = len(hub.log)
    r = cli(hub, cache, "download", "org/scripted", "--dataset", "--revision", "refs/convert/parquet", HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(Path(paths[files[0]]).parents[2])
    r = cli(hub, cache, "info", "org/scripted", "--dataset", "--revision", "refs/convert/parquet", "--json",
            HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr
    assert [(c[0], [s[0] for s in c[3]]) for c in layout_of(json.loads(r.stdout))] == [
        ("default", ["train", "test"]), ("extra", ["train"])]
    assert len(hub.log) == served, "offline asked the server nothing"
    walk_cache(cache)

    # We download the branch; huggingface_hub reads ours offline, file for file.
    cache = tmp_path / "our-cache"
    r = cli(hub, cache, "download", "org/scripted", "--dataset", "--revision", "refs/convert/parquet")
    assert r.returncode == 0, r.stderr
    ours = r.stdout.strip()
    assert (cache / "datasets--org--scripted" / "refs" / "refs" / "convert" / "parquet").read_text() == conv.sha
    snap = ("from huggingface_hub import snapshot_download as s;"
            "print(s('org/scripted', repo_type='dataset', revision='refs/convert/parquet'))")
    assert run_python(hub, cache, snap, HF_HUB_OFFLINE=1).strip() == ours
    for f, p in json.loads(run_python(hub, cache, fetch, HF_HUB_OFFLINE=1)).items():
        assert Path(p).read_bytes() == conv.files[f] and p.startswith(ours)
    assert next(iter(walk_cache(cache)["datasets--org--scripted"].values())) == conv.files


def test_a_stalled_transfer_resumes_and_a_slow_one_is_not_cut(hub, tmp_path, llama_files):
    big = largest_lfs(llama_files)
    sha = hashlib.sha256(llama_files[big]).hexdigest()
    # Nothing for 4 s after 50 000 bytes, with a 1 s limit: cut, then resumed with a Range.
    hub.faults["stall_after"] = {big: [50000, 4, 1]}
    cache = tmp_path / "stalled"
    r = cli(hub, cache, "download", "org/llama", HF_HUB_DOWNLOAD_TIMEOUT=1)
    assert r.returncode == 0, r.stderr
    assert snapshot_of(cache)[1][big] == llama_files[big]
    ranges = [req[3].get("Range") for req in hub.requests("cdn", "GET") if sha in req[2]]
    assert ranges[0] is None and ranges[1] is not None and int(ranges[1][6:-1]) >= 50000, ranges
    # Slow but moving (about 3 s per file with the same 1 s limit): one request per file.
    hub.faults.clear()
    hub.faults["slow_bytes_per_s"] = 100_000
    hub.log.clear()
    cache = tmp_path / "slow"
    r = cli(hub, cache, "download", "org/llama", HF_HUB_DOWNLOAD_TIMEOUT=1)
    assert r.returncode == 0, r.stderr
    assert snapshot_of(cache)[1] == expected_model_files(llama_files)
    assert [req[3].get("Range") for req in hub.requests("cdn", "GET") if sha in req[2]] == [None]
    assert len(llama_files[big]) > 100_000 * 2, "the transfer outlasts the limit"
