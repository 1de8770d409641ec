"""`tessera-cli hub` against a local server that speaks the Hub's HTTP API (tests/pylib/hub_server.py):
search, info, downloads into the cache huggingface_hub uses, with injected faults. After every case
the cache is walked: snapshot entries are relative symlinks into blobs, LFS blobs hash to their
names, nothing temporary is left."""
import hashlib
import json
import os
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


def test_search_pages_sorts_and_filters(hub, tmp_path):
    r = cli(hub, tmp_path / "c", "search", "llama", "--json", "--limit", "5")
    assert r.returncode == 0, r.stderr
    ids = [h["id"] for h in json.loads(r.stdout)]
    assert ids == ["org/llama", "org/llama-gated"]  # by downloads; the server's pages hold 2
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
    hub.faults["status"] = {"api": [500, 100, {"Retry-After": "0"}]}
    r = cli(hub, tmp_path / "cache2", "info", "org/llama")
    assert r.returncode == 1 and "HTTP 500" in r.stderr, r.stderr


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
    assert proc.returncode == 1 and "cancelled" in err, err
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
