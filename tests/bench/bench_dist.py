"""Data parallelism on this machine: tokens/s from 1 to 2 processes for each strategy, and the
bytes communicated per step against the strategy's theoretical volume (issue 12).

A generated llama (about 5M parameters, random init), packed text blocks of SEQ tokens, batch
BATCH per micro-batch, fp32, AdamW, clipping 1.0; every side trains on 2 x BATCH sequences per
step, one side at a time:

  single            tessera-cli run, 1 process, gradient_accumulation 2 (at 1 and 2 threads)
  ddp               tessera-cli launch --nproc 2, 1 thread per rank
  zero1, zero2      the same with strategy zero, stage 1 / 2
  zero2-offload     zero stage 2 with offload_optimizer (on the CPU: the state stays where it is)
  gemini            gemini sharded over the ranks (ZeRO-3: parameters, gradients and optimizer
                    state in chunks of which each rank keeps 1/N, gathered whole while in use)

and the peers, the same model from transformers in PyTorch (Gloo on loopback, 1 thread per rank):
torch-single (1 process, accumulation 2, 1 and 2 threads), torch-ddp (DistributedDataParallel),
torch-zero1 (ZeroRedundancyOptimizer around DistributedDataParallel). Stage 2 has no peer here
(PyTorch's FSDP does not shard gradients alone on the CPU; DeepSpeed is not installed).

Printed per side: tokens/s (median step of the measured ones: ours from the metric events'
job throughput, the peers' from their own step timings), ÷ single at the same total threads
(scaling from 1 to 2 processes), ours ÷ peer; and for our distributed sides the bytes per step:

  ring      the metric events' traffic ring_bytes (engine/dist counters; broadcasts, once at the
            first steps, aside) ÷ the theoretical volume (docs/events.md): ddp 2(N-1)/N·4P,
            zero1 3(N-1)/N·4P, zero2 2(N-1)/N·4P with one micro-batch per rank, gemini
            3(N-1)/N·4P (ZeRO-3: two all-gathers of the parameters and a reduce-scatter; below 1
            where chunks stay gathered from forward to backward). Goal <= 1.1.
  gloo      what rank 1 wrote to its sockets per step, measured from /proc/<pid>/io (wchar,
            sampled every 5 ms and read at the metric events' times; rank 1 writes no event
            stream) ÷ the ring volume of the same step. Gloo's reduce_scatter all-reduces the
            whole input, so zero2's is above 1 there for a reason outside our code.

It only prints; it fails when a side crashes or our sides' losses differ from single's by more
than 1e-4 relative. Environment: BENCH_DIST_STEPS (measured steps, default 6), BENCH_DIST_WARMUP
(default 2), BENCH_DIST_LAYERS (default 4).
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "pylib"))

CLI = os.environ.get("TESSERA_CLI") or str(
    Path(os.environ.get("TESSERA_TOOLS_DIR", HERE.parents[1] / "build" / "tests")).parent / "app" / "cli" / "tessera-cli")
SEQ, BATCH, LR = 128, 4, 1e-4
WARMUP = int(os.environ.get("BENCH_DIST_WARMUP", "2"))
STEPS = int(os.environ.get("BENCH_DIST_STEPS", "6"))
LAYERS = int(os.environ.get("BENCH_DIST_LAYERS", "4"))
CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=1,
              pad_token_id=2)
STRATEGIES = [("ddp", "ddp", {}), ("zero1", "zero", {"stage": 1}), ("zero2", "zero", {"stage": 2}),
              ("zero2-offload", "zero", {"stage": 2, "offload_optimizer": True}), ("gemini", "gemini", {})]


def cpu_description():
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    have = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16") if f in flags]
    return model, have


def announce(name):
    """The benchmarks' first line: tessera-cli present (else FAIL), the CPU, its SIMD flags, the
    CPU count, torch's version and the platform."""
    if not Path(CLI).exists():
        raise SystemExit(f"FAIL: {CLI} is missing: build tessera-cli, or set TESSERA_CLI")
    cpu, flags = cpu_description()
    import torch

    print(f"{name}: {cpu}; flags {' '.join(flags) or '(none of avx2/avx512)'}; {os.cpu_count()} CPUs; "
          f"torch {torch.__version__}; {platform.platform()}")


def make_model(folder):
    """The model, its tokenizer and the packed text, once."""
    import random

    import torch
    from tiny_tokenizer import byte_level_bpe
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]
    lines = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(600)]
    fast = byte_level_bpe(lines, CONFIG["vocab_size"])
    config = dict(CONFIG, vocab_size=len(fast), num_hidden_layers=LAYERS)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.save_pretrained(folder / "model")
    fast.save_pretrained(folder / "model")
    with open(folder / "text.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line}) + "\n")
    return sum(p.numel() for p in model.parameters())


def spec_of(folder, name, strategy, options, accumulation, steps):
    """The benchmarks' job: the model and packed text of make_model, `steps` steps of
    `accumulation` micro-batches of BATCH × SEQ, fp32, constant LR, clipping 1.0, on the CPU."""
    return {
        "version": 1,
        "model": {"path": str(folder / "model")},
        "dataset": {"train": str(folder / "text.jsonl"), "format": "text", "max_length": SEQ, "packing": True},
        "training": {"steps": steps, "batch_size": BATCH, "gradient_accumulation": accumulation,
                     "learning_rate": LR, "schedule": "constant", "max_grad_norm": 1.0, "seed": 5},
        "strategy": {"name": strategy, "options": {"device": "cpu", **options}},
        "output": {"dir": str(folder / name)},
    }


def job(folder, name, strategy, options, accumulation):
    spec = spec_of(folder, name, strategy, options, accumulation, WARMUP + STEPS)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def wchar(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rank_pid(parent, rank):
    """The pid of the child of `parent` started with RANK=rank, or None while there is none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if ppid != parent:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, StopIteration, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def run_ours(folder, name, strategy, options, nproc, threads):
    """One of our sides; returns the metric events and rank 1's (time, wchar) samples."""
    accumulation = 2 if nproc == 1 else 1
    spec = job(folder, name, strategy, options, accumulation)
    events = folder / f"{name}.events.jsonl"
    argv = [CLI, "run", spec] if nproc == 1 else [CLI, "launch", "--nproc", "2", spec]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TESSERA_DIST_TIMEOUT_S="120")
    proc = subprocess.Popen([*map(str, argv), "--events", str(events)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []

    def sample():
        pid = None
        while proc.poll() is None:
            pid = pid or rank_pid(proc.pid, 1)
            if pid is not None:
                value = wchar(pid)
                if value is not None:
                    samples.append((time.time(), value))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    if nproc > 1:
        sampler.start()
    _, err = proc.communicate()
    if nproc > 1:
        sampler.join()
    if proc.returncode != 0:
        sys.stdout.write(err[-4000:])
        raise SystemExit(f"FAIL: {name} exited with {proc.returncode}")
    metrics = [json.loads(line) for line in events.read_text().splitlines()]
    metrics = [e for e in metrics if e.get("type") == "metric" and "loss" in e]
    return metrics, samples


def wchar_at(samples, t):
    """rank 1's wchar at wall time t: the last sample at or before it."""
    before = [value for when, value in samples if when <= t]
    return before[-1] if before else None


def peer_child(model_dir, mode, rank, world, port, threads, report):
    """`bench_dist.py --peer MODE RANK WORLD PORT THREADS REPORT`: the PyTorch side."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    vocab = model.config.vocab_size
    accumulation = 2 if world == 1 else 1
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    if mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(rank)
    seconds = []
    for _ in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        for _ in range(accumulation):
            ids = torch.randint(3, vocab, (BATCH, SEQ), generator=generator)
            (model(input_ids=ids, labels=ids).loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.barrier()  # the step ends when the slowest rank's does, as ours is counted
        seconds.append(time.perf_counter() - t0)
    if rank == 0:
        Path(report).write_text(json.dumps({"step_seconds": seconds}))
    if world > 1:
        dist.destroy_process_group()


def spawn_peers(script, argv_of_rank, world, threads, what):
    """The PyTorch side of a benchmark: `python SCRIPT --peer *argv_of_rank(rank, port)` for each of
    `world` ranks (a free loopback port for their rendezvous), `threads` threads each; fails naming
    `what` and the rank when one exits with an error."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    procs = [subprocess.Popen([sys.executable, str(script), "--peer", *map(str, argv_of_rank(rank, port))],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    for rank, proc in enumerate(procs):
        _, err = proc.communicate()
        if proc.returncode != 0:
            sys.stdout.write(err[-4000:])
            raise SystemExit(f"FAIL: peer {what} rank {rank} exited with {proc.returncode}")


def run_cli_job(folder, name, spec, nproc, threads):
    """Ours: `spec` written to FOLDER/NAME.json and run (`tessera-cli run`, or `launch --nproc`),
    `threads` threads per process; returns its events."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps(spec))
    argv = [CLI, "run", path] if nproc == 1 else [CLI, "launch", "--nproc", str(nproc), path]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TESSERA_DIST_TIMEOUT_S="120")
    r = subprocess.run([*map(str, argv)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stderr[-4000:])
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    return [json.loads(line) for line in (Path(spec["output"]["dir"]) / "events.jsonl").read_text().splitlines()]


def run_peer(folder, mode, world, threads):
    report = folder / f"peer-{mode}-{world}-{threads}.json"
    spawn_peers(__file__, lambda rank, port: [folder / "model", mode, rank, world, port, threads, report],
                world, threads, mode)
    seconds = json.loads(report.read_text())["step_seconds"][WARMUP:]
    return 2 * BATCH * SEQ / statistics.median(seconds)


def main():
    if not Path(CLI).exists():
        raise SystemExit(f"FAIL: {CLI} is missing: build tessera-cli, or set TESSERA_CLI")
    cpu, flags = cpu_description()
    cores = os.cpu_count()
    import torch

    print(f"bench_dist: {cpu}; flags {' '.join(flags) or '(none of avx2/avx512)'}; {cores} CPUs; "
          f"torch {torch.__version__}; {platform.platform()}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-dist-") as tmp:
        folder = Path(tmp)
        parameters = make_model(folder)
        gradient_bytes = 4 * parameters
        print(f"  llama {parameters / 1e6:.2f}M parameters ({LAYERS} layers), {2 * BATCH} x {SEQ} tokens per "
              f"step (2 micro-batches of {BATCH}), fp32, {WARMUP} warm-up + {STEPS} measured steps; "
              f"load average {os.getloadavg()[0]:.2f}")
        ours, peers = {}, {}
        for threads in (1, 2):
            metrics, _ = run_ours(folder, f"single-{threads}t", "single", {}, 1, threads)
            ours[f"single@{threads}"] = metrics
            peers[f"single@{threads}"] = run_peer(folder, "single", 1, threads)
        for label, strategy, options in STRATEGIES:
            ours[label] = run_ours(folder, label, strategy, options, 2, 1)
        peers["ddp"] = run_peer(folder, "ddp", 2, 1)
        peers["zero1"] = run_peer(folder, "zero1", 2, 1)

        def tokens_per_s(metrics):
            return statistics.median(m["tokens_per_s"] for m in metrics[WARMUP:])

        reference = ours["single@1"]
        single_tps = {t: tokens_per_s(ours[f"single@{t}"]) for t in (1, 2)}
        print(f"\n  {'side':15s} {'procs':>5s} {'tokens/s':>9s} {'÷single@1':>9s} {'÷single@2':>9s} "
              f"{'peer tok/s':>10s} {'ours÷peer':>9s} {'ring÷theory':>11s} {'gloo÷ring':>9s}")
        for threads in (1, 2):
            tps, peer = single_tps[threads], peers[f"single@{threads}"]
            print(f"  {'single@' + str(threads) + 't':15s} {1:5d} {tps:9.0f} {tps / single_tps[1]:9.3f} "
                  f"{tps / single_tps[2]:9.3f} {peer:10.0f} {tps / peer:9.3f} {'-':>11s} {'-':>9s}")
        for label, strategy, options in STRATEGIES:
            metrics, samples = ours[label]
            tps = tokens_per_s(metrics)
            worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(metrics, reference))
            if worst > 1e-4:
                failures.append(f"{label}: losses differ from single's by {worst:.2e} relative")
            ring = 0.5  # (N-1)/N at N = 2
            # zero stage 1 all-reduces and all-gathers; gemini (ZeRO-3) gathers the parameters for
            # forward and again for backward and reduce-scatters the gradients: 3 volumes each.
            theory = (3 if options.get("stage") == 1 or strategy == "gemini" else 2) * ring * gradient_bytes
            measured = metrics[WARMUP:]
            ring_bytes = [m["traffic"]["ring_bytes"] - m["traffic"]["broadcast"]["ring_bytes"] for m in measured]
            ring_ratio = statistics.mean(ring_bytes) / theory
            gloo_ratio = float("nan")
            start, end = wchar_at(samples, metrics[WARMUP - 1]["t"]), wchar_at(samples, metrics[-1]["t"])
            if start is not None and end is not None:
                gloo_ratio = (end - start) / sum(m["traffic"]["ring_bytes"] for m in measured)
            peer = peers.get(label)
            print(f"  {label:15s} {2:5d} {tps:9.0f} {tps / single_tps[1]:9.3f} {tps / single_tps[2]:9.3f} "
                  f"{peer if peer else float('nan'):10.0f} {tps / peer if peer else float('nan'):9.3f} "
                  f"{ring_ratio:11.4f} {gloo_ratio:9.3f}")
            traffic = measured[-1]["traffic"]
            kinds = ", ".join(f"{k} {traffic[k]['calls']}x {traffic[k]['bytes'] / 1e6:.2f} MB"
                              for k in ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
                              if traffic[k]["calls"])
            print(f"  {'':15s} per step: {kinds}; 4P = {gradient_bytes / 1e6:.2f} MB; losses vs single "
                  f"{worst:.1e}")
            if ring_ratio > 1.1:
                print(f"  {'':15s} NOTE: ring bytes ÷ theoretical {ring_ratio:.3f} is above the 1.1 goal")
    print("\n  ÷single@1: throughput over one process at 1 thread (the same cores per process); ÷single@2: "
          "over one process using both cores. peers: PyTorch (transformers model) with Gloo; zero2 and "
          "gemini have none.")
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"bench_dist: done (figures only; goal: ring bytes ÷ theoretical <= 1.1){' with failures' if failures else ''}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        model_dir, mode, rank, world, port, threads, report = sys.argv[2:9]
        peer_child(model_dir, mode, int(rank), int(world), int(port), int(threads), report)
    else:
        sys.exit(main())
