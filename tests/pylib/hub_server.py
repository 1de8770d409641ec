"""A local server that speaks the HuggingFace Hub's HTTP API for the endpoints Tessera's client and
huggingface_hub's downloads use, serving repositories made at test time, with fault injection.

Two servers run on loopback: the Hub (API + /resolve) and a "CDN" that the Hub redirects LFS
files to with an absolute URL (a second host, as the real Hub sends large files to a CDN).

Endpoints (models; datasets under /api/datasets and /datasets/...):
  GET  /api/models?search=&sort=&direction=&limit=&filter=&cursor=   (paged: Link rel="next")
  GET  /api/models/{repo}[/revision/{rev}]                           (siblings with sizes, blobs)
  GET  /api/models/{repo}/tree/{rev}?recursive=                      (huggingface_hub's listing)
  HEAD/GET /{repo}/resolve/{rev}/{path}   X-Repo-Commit, ETag (git blob id) or, for LFS files,
           302 to the CDN with X-Linked-Etag (sha256) and X-Linked-Size
  HEAD/GET CDN /blob/{sha256}             Range supported unless told to ignore it
  GET  /first-rows?dataset=&config=&split=   the dataset viewer (served at the Hub's root, as
           mirrors do): {"features": [{"name"}], "rows": [{"row_idx", "row"}]}, the first 100 rows
           read from the split's files; HubServer.viewer = False answers 501 (no viewer)
A revision is "main", the repository's commit, or a branch given to Repo(branches=...) such as
"refs/convert/parquet" (sent URL-encoded, refs%2Fconvert%2Fparquet, as huggingface_hub sends it).

Faults (HubServer.faults, changed by tests between runs):
  cut_after   {path: (n_bytes, times)}  send the headers of the whole body, close after n bytes
  ignore_range  True                    answer every Range request with 200 and the whole file
  flip_byte   {path}                    one byte of the body flipped (the advertised sha256 kept)
  status      {key: [code, times, headers]}  key "api", "resolve:{path}", "cdn:{path}" or "search"
  slow_bytes_per_s  N                   throttle bodies (to overlap two downloads, or to cancel)
  stall_after {path: (n_bytes, seconds, times)}  send n bytes, then nothing for `seconds`, then
                                        the rest (a stalled connection)
Auth: a repository made with gated=True answers 401 without a token and 403 (X-Error-Code:
GatedRepo) to a token not in `tokens`.
"""

import csv
import hashlib
import io
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, repo_id, files, repo_type="model", gated=False, lfs_suffixes=(".safetensors", ".parquet", ".bin"),
                 extra_listing=(), license="apache-2.0", downloads=0, likes=0, tags=(), branches=None,
                 viewer_splits=None):
        self.id = repo_id
        self.type = repo_type
        self.files = dict(files)  # path -> bytes
        self.gated = gated
        self.sha = "%040x" % random.getrandbits(160)
        self.lfs = {p for p in self.files if p.endswith(tuple(lfs_suffixes))}
        self.extra_listing = list(extra_listing)  # names listed but not served (e.g. "../../x")
        self.license = license
        self.downloads = downloads
        self.likes = likes
        self.tags = list(tags)
        self._sha256 = {}
        # Other revisions ({"refs/convert/parquet": {path: bytes}}), each a repository of its own
        # commit; the main branch is this one.
        self.branches = {name: Repo(repo_id, branch_files, repo_type, gated, lfs_suffixes, license=license)
                         for name, branch_files in (branches or {}).items()}
        # What the dataset viewer serves: {(config, split): [paths at main or a branch]}; None:
        # the conversion branch's {config}/{split}/ folders when there is one, else config
        # "default" with splits by file name (test code, simpler than the Hub's rules).
        self.viewer_splits = viewer_splits

    def at(self, rev):
        """The repository at revision `rev` (a branch, or a commit), or None."""
        if rev in ("main", self.sha):
            return self
        for name, branch in self.branches.items():
            if rev in (name, branch.sha):
                return branch
        return None

    def all_revisions(self):
        return [self] + list(self.branches.values())

    def viewer_layout(self):
        if self.viewer_splits is not None:
            return {k: list(v) for k, v in self.viewer_splits.items()}
        layout = {}
        parquet = self.branches.get("refs/convert/parquet")
        if parquet is not None:
            for p in sorted(parquet.files):
                parts = p.split("/")
                if len(parts) == 3 and p.endswith(".parquet"):
                    layout.setdefault((parts[0], parts[1].removeprefix("partial-")), []).append(p)
            return layout
        for p in sorted(self.files):
            if not p.endswith((".jsonl", ".json", ".csv", ".tsv", ".parquet")):
                continue
            words = p.replace("/", "-").replace("_", "-").replace(".", "-").split("-")
            split = next((w for w in ("train", "validation", "test") if w in words), "train")
            layout.setdefault(("default", split), []).append(p)
        return layout

    def file_bytes(self, path):
        for rev in self.all_revisions():
            if path in rev.files:
                return rev.files[path]
        raise KeyError(path)

    def sha256(self, path):
        # Memoized: the CDN looks blobs up by hash on every request (a benchmark serves 1 GiB).
        if path not in self._sha256:
            self._sha256[path] = hashlib.sha256(self.files[path]).hexdigest()
        return self._sha256[path]

    def sibling(self, path):
        data = self.files.get(path, b"x")
        entry = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
        if path in self.lfs:
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def info(self):
        siblings = [self.sibling(p) for p in sorted(self.files)] + [self.sibling(p) for p in self.extra_listing]
        return {
            "_id": self.sha[:24], "id": self.id, "modelId": self.id, "sha": self.sha, "private": False,
            "gated": "manual" if self.gated else False, "downloads": self.downloads, "likes": self.likes,
            "tags": self.tags + [f"license:{self.license}"], "pipeline_tag": "text-generation",
            "library_name": "transformers", "cardData": {"license": self.license},
            "lastModified": "2025-01-01T00:00:00.000Z", "siblings": siblings,
        }

    def tree(self):
        out = []
        for p in sorted(self.files) + self.extra_listing:
            s = self.sibling(p)
            entry = {"type": "file", "path": p, "size": s["size"], "oid": s["blobId"]}
            if "lfs" in s:
                entry["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}
            out.append(entry)
        return out


def client_env(hub, cache, **extra):
    """The environment of a Hub client (ours or huggingface_hub) pointed at `hub` with the cache
    folder `cache`: the caller's HF_* / HUGGINGFACE_* settings and TRANSFORMERS_OFFLINE dropped
    (CTest runs the suites offline, and both clients read that too), telemetry and Xet off,
    then `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "TRANSFORMERS_OFFLINE"}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache), "HF_HOME": str(Path(cache).parent / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


class HubServer:
    """Start with `with HubServer() as hub:`; hub.endpoint is HF_ENDPOINT."""

    def __init__(self, page_size=2):
        self.repos = {}  # (type, id) -> Repo
        self.renamed = {}  # old id -> new id (relative redirects)
        self.tokens = set()  # tokens granted access to gated repositories
        self.faults = {}
        self.page_size = page_size
        self.viewer = True  # False: /first-rows answers 501, as for a dataset the viewer cannot show
        self.log = []  # (server, method, path, headers dict)
        self.body_bytes_sent = {}  # file path -> body bytes written to sockets (all requests)
        self.lock = threading.Lock()
        self.hub = _Server(self, "hub")
        self.cdn = _Server(self, "cdn")

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.hub.port}"

    @property
    def cdn_origin(self):
        return f"http://localhost:{self.cdn.port}"  # another host name than the endpoint's

    def add(self, repo):
        self.repos[(repo.type, repo.id)] = repo
        return repo

    def requests(self, server=None, method=None, contains=None):
        with self.lock:
            return [r for r in self.log if (server is None or r[0] == server) and (method is None or r[1] == method)
                    and (contains is None or contains in r[2])]

    def take_fault(self, key):
        """Consumes one use of a status fault; returns (code, headers) or None."""
        with self.lock:
            fault = self.faults.get("status", {}).get(key)
            if not fault or fault[1] == 0:
                return None
            fault[1] -= 1
            return fault[0], dict(fault[2] if len(fault) > 2 else {})

    def __enter__(self):
        self.hub.start()
        self.cdn.start()
        return self

    def __exit__(self, *exc):
        self.hub.stop()
        self.cdn.stop()


class _Server:
    def __init__(self, owner, name):
        self.owner, self.name = owner, name
        handler = type(f"Handler_{name}", (_Handler,), {"owner": owner, "server_name": name})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: HubServer
    server_name: str

    def log_message(self, *args):
        pass

    # -- helpers -----------------------------------------------------------------------------
    def send(self, code, body=b"", headers=None, head=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def error(self, code, error_code=None, message="", head=False, headers=None):
        h = dict(headers or {})
        if error_code:
            h["X-Error-Code"] = error_code
        if message:
            h["X-Error-Message"] = message
        self.send(code, {"error": message or error_code or str(code)}, h, head=head)

    def token(self):
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    def check_access(self, repo, head=False):
        if not repo.gated:
            return True
        tok = self.token()
        if tok is None:
            self.error(401, "GatedRepo", "Access to this repository requires a token", head=head)
            return False
        if tok not in self.owner.tokens:
            self.error(403, "GatedRepo", "Access to this gated repository is restricted", head=head)
            return False
        return True

    def status_fault(self, key, head=False):
        fault = self.owner.take_fault(key)
        if fault is None:
            return False
        code, headers = fault
        self.error(code, message=f"injected {code}", head=head, headers=headers)
        return True

    def do_HEAD(self):
        self.route(head=True)

    def do_GET(self):
        self.route(head=False)

    def route(self, head):
        url = urllib.parse.urlsplit(self.path)
        with self.owner.lock:
            self.owner.log.append((self.server_name, self.command, self.path, dict(self.headers.items())))
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            if self.server_name == "cdn":
                return self.cdn_blob(path, head)
            if path == "/first-rows":
                return self.first_rows(query)
            if path in ("/api/models", "/api/datasets"):
                return self.search("dataset" if path == "/api/datasets" else "model", query, url)
            if path.startswith("/api/models/") or path.startswith("/api/datasets/"):
                return self.api_repo(path, head)
            # Segments unquoted one by one: a revision may carry an encoded '/'.
            return self.resolve([urllib.parse.unquote(p) for p in url.path.strip("/").split("/")], head)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- API ---------------------------------------------------------------------------------
    def search(self, repo_type, query, url):
        if self.status_fault("search"):
            return
        text = query.get("search", [""])[0].lower()
        filters = query.get("filter", [])
        hits = [r for (t, _), r in self.owner.repos.items()
                if t == repo_type and text in r.id.lower() and all(f in r.tags or f == f"license:{r.license}" for f in filters)]
        sort = query.get("sort", ["downloads"])[0]
        key = {"downloads": lambda r: r.downloads, "likes": lambda r: r.likes}.get(sort, lambda r: r.id)
        hits.sort(key=key, reverse=True)
        limit = int(query.get("limit", ["1000"])[0])
        cursor = int(query.get("cursor", ["0"])[0])
        page = min(limit, self.owner.page_size)
        chosen = hits[cursor:cursor + page]
        headers = {}
        if cursor + page < len(hits):
            q = urllib.parse.parse_qs(url.query)
            q["cursor"] = [str(cursor + page)]
            nxt = f"{self.owner.endpoint}{url.path}?{urllib.parse.urlencode(q, doseq=True)}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        out = [{k: v for k, v in r.info().items() if k != "siblings"} for r in chosen]
        self.send(200, out, headers)

    def find_repo(self, repo_type, parts):
        """Longest match of 'org/name' or 'name' among the first parts; returns (repo, rest)."""
        for n in (2, 1):
            rid = "/".join(parts[:n])
            rid = self.owner.renamed.get(rid, rid)
            repo = self.owner.repos.get((repo_type, rid))
            if repo is not None:
                return repo, parts[n:]
        return None, parts

    def api_repo(self, path, head):
        if self.status_fault("api", head):
            return
        repo_type = "dataset" if path.startswith("/api/datasets/") else "model"
        parts = path.split("/")[3:]
        repo, rest = self.find_repo(repo_type, parts)
        if repo is None:
            return self.error(401 if self.token() is None else 404, "RepoNotFound", "Repository not found", head=head)
        if not self.check_access(repo, head):
            return
        if rest and rest[0] in ("revision", "tree"):
            rev = "/".join(rest[1:]) if rest[0] == "revision" else rest[1] if len(rest) > 1 else "main"
            if rest[0] == "tree":
                rev = next((b for b in repo.branches if "/".join(rest[1:]).startswith(b + "/")
                            or "/".join(rest[1:]) == b), rev)
            target = repo.at(rev)
            if target is None:
                return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            if rest[0] == "tree":
                return self.send(200, target.tree(), head=head)
            return self.send(200, target.info(), head=head)
        self.send(200, repo.info(), head=head)

    # -- dataset viewer ------------------------------------------------------------------------
    def first_rows(self, query):
        if not self.owner.viewer:
            return self.error(501, message="The dataset viewer is not available for this dataset.")
        rid = query.get("dataset", [""])[0]
        repo = self.owner.repos.get(("dataset", rid))
        if repo is None:
            return self.error(404, "DatasetNotFoundError", "The dataset does not exist.")
        if not self.check_access(repo):
            return
        files = repo.viewer_layout().get((query.get("config", [""])[0], query.get("split", [""])[0]))
        if files is None:
            return self.error(404, "SplitNotFoundError", "The config or the split does not exist.")
        columns, rows = [], []
        try:
            for path in files:
                for row in read_rows(path, repo.file_bytes(path)):
                    if len(rows) == 100:
                        break
                    columns += [c for c in row if c not in columns]
                    rows.append(row)
        except Exception as e:  # the viewer's answer to a file it cannot read
            return self.error(500, "RowsPostProcessingError", f"{type(e).__name__}: {e}")
        self.send(200, {"dataset": rid, "config": query["config"][0], "split": query["split"][0],
                        "features": [{"feature_idx": i, "name": c, "type": {"_type": "Value"}}
                                     for i, c in enumerate(columns)],
                        "rows": [{"row_idx": i, "row": r, "truncated_cells": []} for i, r in enumerate(rows)],
                        "truncated": False})

    # -- files -------------------------------------------------------------------------------
    def resolve(self, parts, head):
        repo_type = "model"
        if parts and parts[0] == "datasets":
            repo_type, parts = "dataset", parts[1:]
        if "resolve" not in parts:
            return self.error(404, message="not found")
        i = parts.index("resolve")
        rid = "/".join(parts[:i])
        if rid in self.owner.renamed:  # a renamed repository: relative redirect
            new = "/" + self.owner.renamed[rid] + "/" + "/".join(parts[i:])
            if repo_type == "dataset":
                new = "/datasets" + new
            return self.send(307, b"", {"Location": new}, head=head)
        repo = self.owner.repos.get((repo_type, rid))
        if repo is None:
            return self.error(401 if self.token() is None else 404, "RepoNotFound", "Repository not found", head=head)
        if not self.check_access(repo, head):
            return
        rev, file = parts[i + 1], "/".join(parts[i + 2:])
        for branch in repo.branches:  # a branch name sent with its '/' unencoded
            if "/".join(parts[i + 1:]).startswith(branch + "/"):
                rev, file = branch, "/".join(parts[i + 1:])[len(branch) + 1:]
        repo = repo.at(rev)
        if repo is None:
            return self.error(404, "RevisionNotFound", "Invalid rev id", head=head)
        if file not in repo.files:
            return self.error(404, "EntryNotFound", f"{file} does not exist", head=head,
                              headers={"X-Repo-Commit": repo.sha})
        if self.status_fault(f"resolve:{file}", head):
            return
        data = repo.files[file]
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes"}
        if file in repo.lfs:
            sha = hashlib.sha256(data).hexdigest()
            headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                            "Location": f"{self.owner.cdn_origin}/blob/{sha}?file={urllib.parse.quote(file)}"})
            return self.send(302, b"", headers, head=head)
        self.body(data, file, headers, head)

    def cdn_blob(self, path, head):
        sha = path.rsplit("/", 1)[-1]
        for repo in (rev for r in self.owner.repos.values() for rev in r.all_revisions()):
            for file in repo.lfs:
                if repo.sha256(file) == sha:
                    if self.status_fault(f"cdn:{file}", head):
                        return
                    return self.body(repo.files[file], file, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, head)
        self.error(404, message="no such blob", head=head)

    def body(self, data, file, headers, head):
        faults = self.owner.faults
        if file in faults.get("flip_byte", ()):
            data = bytearray(data)
            data[len(data) // 2] ^= 0x01
            data = bytes(data)
        start = 0
        code = 200
        rng = self.headers.get("Range")
        if rng and not faults.get("ignore_range") and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
            if start >= len(data):
                return self.send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head=head)
            code = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        chunk = data[start:]
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if head:
            return
        cut = None
        stall = None  # (after n bytes, seconds)
        with self.owner.lock:
            rule = faults.get("cut_after", {}).get(file)
            if rule and rule[1] > 0:
                rule[1] -= 1
                cut = rule[0]
            rule = faults.get("stall_after", {}).get(file)
            if rule and rule[2] > 0:
                rule[2] -= 1
                stall = (rule[0], rule[1])
        rate = faults.get("slow_bytes_per_s")
        # Small writes where a fault needs the granularity, large ones otherwise (throughput).
        sent, step = 0, (16384 if rate or cut is not None or stall else 1 << 20)
        view = memoryview(chunk)
        while sent < len(chunk):
            n = step if cut is None else min(step, cut - sent)
            if stall and sent < stall[0]:
                n = min(n, stall[0] - sent)
            if n <= 0:
                break
            if stall and sent == stall[0]:
                self.wfile.flush()
                time.sleep(stall[1])
                stall = None
            self.wfile.write(view[sent:sent + n])
            with self.owner.lock:
                self.owner.body_bytes_sent[file] = self.owner.body_bytes_sent.get(file, 0) + n
            sent += n
            if rate:
                self.wfile.flush()
                time.sleep(n / rate)
        if cut is not None and sent < len(chunk):
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def read_rows(path, data):
    """The rows of a data file as dicts (JSON lines, CSV, TSV or Parquet), in file order."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_table(io.BytesIO(data)).to_pylist()
    text = data.decode("utf-8")
    if path.endswith((".csv", ".tsv")):
        return list(csv.DictReader(io.StringIO(text), delimiter="\t" if path.endswith(".tsv") else ","))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def walk_cache(cache_dir):
    """Checks that a Hub cache is consistent and returns {repo folder: {commit: {path: bytes}}}:
    every snapshot entry is a relative symlink to an existing blob, LFS-named blobs hash to their
    name, refs name existing snapshots, and no temporary file is left."""
    out = {}
    cache = Path(cache_dir)
    if not cache.exists():
        return out
    for repo_dir in cache.iterdir():
        if repo_dir.name.startswith("."):
            continue
        blobs = repo_dir / "blobs"
        for blob in (blobs.iterdir() if blobs.exists() else []):
            assert not blob.name.endswith(".incomplete"), f"left over: {blob}"
            assert ".tmp" not in blob.name, f"left over: {blob}"
            if len(blob.name) == 64:
                assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, f"corrupt blob {blob}"
        snapshots = {}
        for snap in (repo_dir / "snapshots").iterdir() if (repo_dir / "snapshots").exists() else []:
            files = {}
            for p in sorted(snap.rglob("*")):
                if p.is_dir() and not p.is_symlink():
                    continue
                assert p.is_symlink(), f"{p} is not a symlink"
                target = os.readlink(p)
                assert not os.path.isabs(target), f"{p} -> {target} is absolute"
                resolved = (p.parent / target).resolve()
                assert resolved.parent == blobs.resolve(), f"{p} -> {target} is not in blobs/"
                assert resolved.exists(), f"{p} -> {target} is dangling"
                files[p.relative_to(snap).as_posix()] = resolved.read_bytes()
            snapshots[snap.name] = files
        refs = repo_dir / "refs"
        for ref in (refs.rglob("*") if refs.exists() else []):
            if ref.is_file():
                assert ".tmp" not in ref.name, f"left over: {ref}"
                assert len(ref.read_text()) == 40, f"ref {ref} is not a commit hash"
        out[repo_dir.name] = snapshots
    return out
