"""Hub downloads: our client against huggingface_hub, and what a resume re-sends (issue 10).

A local server that speaks the Hub's HTTP API (tests/pylib/hub_server.py: the API host redirects
LFS files to a second "CDN" host, as the Hub does) serves a 1 GiB repository: four 256 MiB
safetensors shards (random bytes), their index and a config. Both clients fetch it from the same
server into an empty cache on the same disk, one after the other, twice in alternation:
`tessera-cli hub download` and `huggingface_hub.snapshot_download` (8 files at once in both; the
same files). Throughput is the repository's bytes ÷ wall time of the whole command.

Resume: the server cuts the connection after half of one shard; the client retries with Range.
The server counts the body bytes it wrote for that shard over all requests; what it sent beyond
the shard's size was sent twice. Goal: re-sent ≤ 1% of what the client had received before the
cut. A second case stops the client with SIGINT half-way (Ctrl-C) and runs it again: the same
count across the two processes (bytes in the socket buffers when it stopped are lost, so this
one is reported, not held to the goal).

It prints figures and ratios and fails only when a download fails or a file differs.
Environment: TESSERA_CLI (tessera-cli), BENCH_HUB_MIB (repository size, default 1024).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from hub_server import HubServer, Repo, client_env  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_adam import cpu_description  # noqa: E402

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))
SHARDS = 4
REPO = "bench/big"


def cpu_model_and_flags():
    model, flags = cpu_description()
    return model, " ".join(flags) or "none of note"


def make_files(total_mib):
    shard = total_mib * (1 << 20) // SHARDS
    files = {}
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    for name in names:
        files[name] = os.urandom(shard)
    index = '{"metadata": {"total_size": %d}, "weight_map": {%s}}' % (
        shard * SHARDS, ", ".join(f'"w{i}": "{n}"' for i, n in enumerate(names)))
    files["model.safetensors.index.json"] = index.encode()
    files["config.json"] = b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'
    return files, names


def env_for(hub, cache):
    return client_env(hub, cache, HF_HUB_DISABLE_PROGRESS_BARS=1)


def ours(hub, cache):
    return [CLI, "hub", "download", REPO], env_for(hub, cache)


def peer(hub, cache):
    code = (f"from huggingface_hub import snapshot_download\n"
            f"print(snapshot_download({REPO!r}, max_workers=8))\n")
    return [sys.executable, "-c", code], env_for(hub, cache)


def timed(command_env):
    command, env = command_env
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(command[:3])} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return seconds


def check_snapshot(cache, files):
    snapshots = list((cache / ("models--" + REPO.replace("/", "--")) / "snapshots").iterdir())
    if len(snapshots) != 1:
        raise SystemExit(f"FAIL: {len(snapshots)} snapshots in {cache}")
    for name, data in files.items():
        got = (snapshots[0] / name).read_bytes()
        if got != data:
            raise SystemExit(f"FAIL: {name} in {snapshots[0]} differs from the served file")


def main():
    total_mib = int(os.environ.get("BENCH_HUB_MIB", "1024"))
    files, shards = make_files(total_mib)
    size = sum(len(d) for d in files.values())
    print(f"bench_hub: {size / (1 << 20):.0f} MiB repository ({SHARDS} LFS shards via a second host), "
          "local server on loopback; CPU: %s (%s), %d CPUs" % (*map(str, cpu_model_and_flags()), os.cpu_count()))
    with tempfile.TemporaryDirectory(prefix="tessera-bench-hub-", dir=os.environ.get("TMPDIR")) as tmp, \
            HubServer() as hub:
        tmp = Path(tmp)
        hub.add(Repo(REPO, files))
        print(f"\n  {'round':5s} {'tessera s':>10s} {'MB/s':>7s} {'huggingface_hub s':>18s} {'MB/s':>7s} "
              f"{'ours ÷ peer (throughput)':>25s}")
        for round_ in (1, 2):
            times = {}
            for side, command in (("ours", ours), ("peer", peer)):
                cache = tmp / f"{side}-{round_}" / "hub"
                cache.mkdir(parents=True)
                times[side] = timed(command(hub, cache))
                check_snapshot(cache, files)
                subprocess.run(["rm", "-rf", str(cache.parent)], check=True)
            print(f"  {round_:5d} {times['ours']:10.2f} {size / times['ours'] / 1e6:7.0f} {times['peer']:18.2f} "
                  f"{size / times['peer'] / 1e6:7.0f} {times['peer'] / times['ours']:25.2f}")

        # Resume after a cut connection, inside one download.
        shard = shards[0]
        half = len(files[shard]) // 2
        hub.body_bytes_sent.clear()
        hub.faults = {"cut_after": {shard: [half, 1]}}
        cache = tmp / "cut" / "hub"
        cache.mkdir(parents=True)
        timed(ours(hub, cache))
        check_snapshot(cache, files)
        resent = hub.body_bytes_sent[shard] - len(files[shard])
        print(f"\n  resume after a cut at {half / (1 << 20):.0f} MiB of {shard}: the server sent "
              f"{hub.body_bytes_sent[shard] / (1 << 20):.2f} MiB for it; re-sent {resent} bytes = "
              f"{100.0 * resent / half:.4f}% of what had been received (goal <= 1%)")

        # Ctrl-C half-way, then a second process.
        hub.faults = {"slow_bytes_per_s": 64 << 20}
        hub.body_bytes_sent.clear()
        cache = tmp / "sigint" / "hub"
        cache.mkdir(parents=True)
        command, env = ours(hub, cache)
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while hub.body_bytes_sent.get(shard, 0) < half and time.time() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        child.wait(timeout=60)
        before = hub.body_bytes_sent.get(shard, 0)
        partial = sum(p.stat().st_size for p in cache.rglob("*.incomplete"))
        hub.faults = {}
        timed(ours(hub, cache))
        check_snapshot(cache, files)
        total_sent = sum(hub.body_bytes_sent.get(n, 0) for n in shards)
        shards_size = sum(len(files[n]) for n in shards)
        print(f"  Ctrl-C after {before / (1 << 20):.0f} MiB of {shard} (exit {child.returncode}), "
              f".incomplete files held {partial / (1 << 20):.1f} MiB; the second run completed: all shards "
              f"re-sent {total_sent - shards_size} bytes = {100.0 * (total_sent - shards_size) / max(partial, 1):.3f}% "
              f"of what the first had kept")
    print("\nbench_hub: done (figures only; goals: ours ÷ huggingface_hub >= 1.0, resume re-sends <= 1%)")


if __name__ == "__main__":
    main()
