"""gemini against single on a model that fits: step time, and what streaming the optimizer state
through the disk costs.

GPT-2 small (124M parameters, random init, dropout 0), batch 4 x seq 128, fp32, AdamW, clip 1.0,
the same token batches, at 1 and 2 intra-op threads; three sides of tessera-train-probe, each in
its own process, one at a time:

  single       the `single` plugin (everything in RAM)
  gemini-host  `gemini`, parameters in chunks, optimizer state on the host (offload_optim_frac 0)
  gemini-disk  `gemini` with all of the optimizer state on disk (offload_optim_frac 1), in a
               folder of the benchmark's temporary directory

It prints the median step time of the measured steps (the gaps between per-step `metric`
events), gemini ÷ single, the bytes the disk tier moved per step (from its `memory` events), and
for gemini-disk: step time ÷ max(single's step time, bytes moved ÷ the disk bandwidth measured in
this run). Every side's losses are single's exactly. The goals (issues 9 and 25): gemini-host ÷ single ≤ 1.05; the disk ratio ≤ 1.25 means
the I/O is hidden (the update of the chunks on disk runs behind the next forward, which can hide
up to the forward's time of it). It only prints; it fails only when a side crashes or the sides' losses differ.

Environment: TESSERA_TOOLS_DIR (where tessera-train-probe is), BENCH_GEMINI_STEPS (measured steps,
default 4), BENCH_GEMINI_WARMUP (default 1), BENCH_GEMINI_THREADS (default "1,2").
"""

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import BATCH, LR, MAX_GRAD_NORM, MODELS, SEQ, ours_step_seconds, run_child  # noqa: E402


def disk_bandwidth(folder, size=512 << 20):
    """Sequential write and read of a file as large as the optimizer state moved, the way the disk
    tier moves its chunks (engine/memory/disk_store.cpp): O_DIRECT with page-aligned 64 MiB
    buffers where the filesystem allows it, no fsync (the tier's files are scratch). Without
    O_DIRECT: buffered, fsync after writing and the file's page cache dropped before reading."""
    import mmap

    path = os.path.join(folder, "bandwidth.bin")
    block = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs
    block.write(os.urandom(1 << 20) * 64)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
        direct = True
    except OSError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        direct = False
    t0 = time.perf_counter()
    for _ in range(size // len(block)):
        os.write(fd, block)
    if not direct:
        os.fsync(fd)
    write = size / (time.perf_counter() - t0)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    if not direct:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    while os.readv(fd, [block]) > 0:
        pass
    read = size / (time.perf_counter() - t0)
    os.close(fd)
    os.remove(path)
    return write, read


def disk_traffic_per_step(events):
    """Bytes read and written per step, from the disk tier's `memory` events: the one before the
    first step and the last one (the trainer waits for the last step's update before it), over
    every step. The events between them come while an update runs behind the next forward, so
    one of them is no baseline."""
    disk = [e for e in events if e.get("type") == "memory" and e.get("tier") == "disk"]
    if len(disk) < 2:
        return 0.0, 0.0
    first, last = disk[0]["traffic"], disk[-1]["traffic"]
    steps = len(disk) - 1
    return ((last["read_bytes"] - first["read_bytes"]) / steps,
            (last["written_bytes"] - first["written_bytes"]) / steps)


def main():
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        raise SystemExit("FAIL: TESSERA_TOOLS_DIR is not set (the build's tests/ folder)")
    probe = os.path.join(tools, "tessera-train-probe")
    measured = int(os.environ.get("BENCH_GEMINI_STEPS", "4"))
    warmup = int(os.environ.get("BENCH_GEMINI_WARMUP", "1"))
    thread_counts = [int(t) for t in os.environ.get("BENCH_GEMINI_THREADS", "1,2").split(",")]
    steps = warmup + measured
    with tempfile.TemporaryDirectory(prefix="tessera-bench-gemini-", dir=os.environ.get("TMPDIR")) as tmp:
        torch.manual_seed(0)
        config = GPT2Config(**MODELS["gpt2-small"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            architectures=["GPT2LMHeadModel"])
        model = GPT2LMHeadModel(config)
        params = sum(p.numel() for p in model.parameters())
        model_dir = os.path.join(tmp, "model")
        model.save_pretrained(model_dir, safe_serialization=True)
        del model
        ids = torch.randint(0, config.vocab_size, (steps, BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        batches = os.path.join(tmp, "batches.safetensors")
        save_file({"input_ids": ids}, batches)
        offload = os.path.join(tmp, "offload")
        os.makedirs(offload)
        write_bps, read_bps = disk_bandwidth(offload)
        print(f"bench_gemini: gpt2-small ({params / 1e6:.1f}M parameters), batch {BATCH} x seq {SEQ}, fp32, "
              f"{warmup} warm-up + {measured} measured steps; disk at {offload}: write {write_bps / 1e6:.0f} MB/s, "
              f"read {read_bps / 1e6:.0f} MB/s (measured now)")
        sides = {
            "single": ["--plugin", "single"],
            "gemini-host": ["--plugin", "gemini", "--strategy-options", json.dumps({"offload_optim_frac": 0.0})],
            "gemini-disk": ["--plugin", "gemini", "--strategy-options",
                            json.dumps({"offload_optim_frac": 1.0, "offload_dir": offload})],
        }
        failures = []
        for threads in thread_counts:
            results = {}
            for side, extra in sides.items():
                report = os.path.join(tmp, f"{side}-{threads}.json")
                events = os.path.join(tmp, f"{side}-{threads}.events.jsonl")
                argv = [probe, "--model", model_dir, "--batches", batches, "--steps", str(steps), "--lr", str(LR),
                        "--schedule", "constant", "--max-grad-norm", str(MAX_GRAD_NORM), "--threads", str(threads),
                        "--report", report, "--events", events, *extra]
                rss, _ = run_child(argv, threads, f"{side} ({threads} threads)")
                with open(report) as f:
                    losses = json.load(f)["losses"]
                step_s = statistics.median(ours_step_seconds(events)[warmup:])
                with open(events) as f:
                    read, written = disk_traffic_per_step([json.loads(line) for line in f])
                results[side] = dict(step_s=step_s, rss=rss, losses=losses, read=read, written=written,
                                     moved=read + written)
            print(f"\n[{threads} thread{'s' if threads > 1 else ''}]  load average {os.getloadavg()[0]:.2f} on "
                  f"{os.cpu_count()} CPUs")
            print(f"  {'side':12s} {'s/step':>7s} {'÷single':>8s} {'peak RSS':>9s} {'RSS ÷single':>11s} "
                  f"{'disk MB/step':>12s}")
            base = results["single"]
            for side, r in results.items():
                print(f"  {side:12s} {r['step_s']:7.3f} {r['step_s'] / base['step_s']:8.3f} "
                      f"{r['rss'] / 2**20:7.0f}MB {r['rss'] / base['rss']:11.3f} {r['moved'] / 1e6:12.1f}")
                if r["losses"] != base["losses"]:
                    failures.append(f"{side} ({threads} threads): losses {r['losses']} differ from single's "
                                    f"{base['losses']}")
            disk = results["gemini-disk"]
            read_s = disk["read"] / read_bps
            write_s = disk["written"] / write_bps
            bound = max(base["step_s"], read_s + write_s)
            print(f"  gemini-disk: {disk['read'] / 1e6:.0f} MB read + {disk['written'] / 1e6:.0f} MB written per "
                  f"step = {read_s + write_s:.3f} s at the measured bandwidth; step ÷ max(single, I/O) = "
                  f"{disk['step_s'] / bound:.3f} (gradient writes overlap backward; the update runs behind "
                  "the next forward)")
        if failures:
            raise SystemExit("FAIL:\n  " + "\n  ".join(failures))
        print("\nbench_gemini: done (figures only; goals: gemini-host ÷ single <= 1.05, "
              "gemini-disk ÷ max(single, I/O) <= 1.25)")


if __name__ == "__main__":
    main()
