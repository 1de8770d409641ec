"""Training-step benchmark: our trainer against transformers and against a plain LibTorch loop.

Same model (GPT-2 small, random init, dropout 0), same token batches, same batch size, fp32,
AdamW (lr 1e-4, no weight decay), gradient clipping at 1.0, at 1 and 2 intra-op threads:

  ours      tessera-train-probe (engine/train Trainer, `single` plugin, our AdamW)
  hf        Python transformers GPT2LMHeadModel + torch.optim.AdamW, plain loop
  libtorch  tessera-libtorch-train-loop: our model code (model::load_pretrained) trained by
            torch::optim::AdamW in a plain C++ loop, so ours/libtorch isolates the trainer

Each side runs in its own child process; peak RSS is that child's ru_maxrss (os.wait4).
Throughput = tokens per step / the median wall time of the measured steps (the first steps are
warm-up).
For ours the step time is the gap between consecutive per-step `metric` events, so it includes
all the trainer's per-step work (events, memory report). MFU = 6 * parameters * tokens/s over
the FLOP/s of a 2048x2048 fp32 torch.mm at the same thread count, measured in this run.

It only prints. It fails only when a side crashes, a loss is not finite, a run diverges
(last loss above 1.5x the first), or the sides disagree on the first step's loss (same weights,
same batch) by more than 1e-3 relative.

Environment: TESSERA_TOOLS_DIR (where the two executables are), BENCH_TRAIN_MODEL
(gpt2-small | gpt2-tiny), BENCH_TRAIN_STEPS (measured steps, default 3), BENCH_TRAIN_WARMUP
(default 1), BENCH_TRAIN_THREADS (default "1,2").
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

BATCH, SEQ = 4, 128
LR, MAX_GRAD_NORM = 1e-4, 1.0

MODELS = {
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-tiny": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=512,
                      bos_token_id=0, eos_token_id=0),
}


def hf_child(model_dir, batches_path, steps, report_path, threads):
    """The transformers side, run as `bench_train.py --hf-child ...` in its own process."""
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(threads)
    ids = load_file(batches_path)["input_ids"].to(torch.int64)
    model = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    losses, seconds = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        x = ids[step % ids.shape[0]]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    with open(report_path, "w") as f:
        json.dump({"losses": losses, "step_seconds": seconds}, f)


def run_child(argv, threads, label, extra_env=None):
    """Runs one side; returns (peak RSS bytes, wall seconds). Raises on a crash."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **(extra_env or {}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stdout.write(out.decode(errors="replace"))
        raise SystemExit(f"FAIL: {label} exited with {proc.returncode}: {' '.join(argv)}")
    return usage.ru_maxrss * 1024, wall


def ours_step_seconds(events_path):
    """Per-step wall time from the gaps between consecutive `metric` events of training steps."""
    times = []
    with open(events_path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("type") == "metric" and "tokens_per_s" in e:
                times.append(e["t"])
    # The first step has no predecessor event; its in-step time is not needed (it is warm-up).
    return [float("nan")] + [b - a for a, b in zip(times, times[1:])]


def matmul_flops(threads):
    import torch

    torch.set_num_threads(threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        torch.mm(a, b)
    reps, t0 = 0, time.perf_counter()
    while reps < 5 or time.perf_counter() - t0 < 2.0:
        torch.mm(a, b)
        reps += 1
    return 2.0 * n**3 * reps / (time.perf_counter() - t0)


def main():
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        raise SystemExit("FAIL: TESSERA_TOOLS_DIR is not set (the build's tests/ folder)")
    probe = os.path.join(tools, "tessera-train-probe")
    loop = os.path.join(tools, "tessera-libtorch-train-loop")
    for exe in (probe, loop):
        if not os.access(exe, os.X_OK):
            raise SystemExit(f"FAIL: {exe} is missing; build it first")
    model_name = os.environ.get("BENCH_TRAIN_MODEL", "gpt2-small")
    measured = int(os.environ.get("BENCH_TRAIN_STEPS", "3"))
    warmup = int(os.environ.get("BENCH_TRAIN_WARMUP", "1"))
    thread_counts = [int(t) for t in os.environ.get("BENCH_TRAIN_THREADS", "1,2").split(",")]
    steps = warmup + measured

    with tempfile.TemporaryDirectory(prefix="tessera-bench-train-") as tmp:
        torch.manual_seed(0)
        config = GPT2Config(**MODELS[model_name], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            architectures=["GPT2LMHeadModel"])
        model = GPT2LMHeadModel(config)
        params = sum(p.numel() for p in model.parameters())  # tied wte/lm_head counted once
        model_dir = os.path.join(tmp, "model")
        model.save_pretrained(model_dir, safe_serialization=True)
        del model
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, config.vocab_size, (steps, BATCH, SEQ), generator=gen)
        batches = os.path.join(tmp, "batches.safetensors")
        save_file({"input_ids": ids}, batches)
        tokens_per_step = BATCH * SEQ

        print(f"bench_train: {model_name} ({params / 1e6:.1f}M parameters), batch {BATCH} x seq "
              f"{SEQ} = {tokens_per_step} tokens/step, fp32, AdamW lr {LR}, clip {MAX_GRAD_NORM}, "
              f"{warmup} warm-up + {measured} measured steps, torch {torch.__version__}")
        print("  ours = tessera-train-probe; hf = transformers + torch.optim.AdamW; libtorch = "
              "our model code + torch::optim::AdamW plain loop (isolates the trainer)")

        failures = []
        mm_by_threads = {}
        for threads in thread_counts:
            results = {}
            sides = {
                "ours": [probe, "--model", model_dir, "--batches", batches, "--steps", str(steps),
                         "--lr", str(LR), "--schedule", "constant", "--max-grad-norm",
                         str(MAX_GRAD_NORM), "--threads", str(threads)],
                "hf": [sys.executable, os.path.abspath(__file__), "--hf-child", model_dir, batches,
                       str(steps)],
                "libtorch": [loop, "--model", model_dir, "--batches", batches, "--steps",
                             str(steps), "--lr", str(LR), "--max-grad-norm", str(MAX_GRAD_NORM),
                             "--threads", str(threads)],
            }
            for side, argv in sides.items():
                report = os.path.join(tmp, f"{side}-{threads}.json")
                if side == "ours":
                    events = os.path.join(tmp, f"events-{threads}.jsonl")
                    argv = argv + ["--report", report, "--events", events]
                elif side == "hf":
                    argv = argv + [report, str(threads)]
                else:
                    argv = argv + ["--report", report]
                rss, wall = run_child(argv, threads, f"{side} ({threads} threads)")
                with open(report) as f:
                    rep = json.load(f)
                losses = rep["losses"]
                secs = ours_step_seconds(events) if side == "ours" else rep["step_seconds"]
                timed = secs[warmup:]
                # Median step: robust to a step slowed by other processes on this shared machine.
                tps = tokens_per_step / statistics.median(timed)
                results[side] = dict(rss=rss, tps=tps, losses=losses, wall=wall, step_s=timed)
                if not all(math.isfinite(x) for x in losses):
                    failures.append(f"{side} ({threads} threads): non-finite loss {losses}")
                elif losses[-1] > 1.5 * losses[0]:
                    failures.append(f"{side} ({threads} threads): diverged {losses}")
            flops = matmul_flops(threads)
            mm_by_threads[threads] = flops
            # Other processes on this machine skew the figures (most at 2 threads on 2 cores):
            # the load average says how busy it was.
            print(f"\n[{threads} thread{'s' if threads > 1 else ''}]  fp32 mm 2048x2048: "
                  f"{flops / 1e9:.1f} GFLOP/s; load average {os.getloadavg()[0]:.2f} "
                  f"on {os.cpu_count()} CPUs")
            print(f"  {'side':9s} {'tokens/s':>9s} {'s/step':>7s} {'peak RSS':>10s} {'MFU':>6s}"
                  f"  {'process wall':>12s}  losses")
            for side, r in results.items():
                mfu = 6.0 * params * r["tps"] / flops
                print(f"  {side:9s} {r['tps']:9.1f} {tokens_per_step / r['tps']:7.2f} "
                      f"{r['rss'] / 2**20:8.0f}MB {mfu:6.3f}  {r['wall']:11.1f}s  "
                      + " ".join(f"{x:.4f}" for x in r["losses"]))
            ours = results["ours"]
            for peer in ("hf", "libtorch"):
                p = results[peer]
                print(f"  ours/{peer:8s} throughput {ours['tps'] / p['tps']:.3f}   "
                      f"peak RSS {ours['rss'] / p['rss']:.3f}")
            if 1 in mm_by_threads and threads > 1 and flops < 1.3 * mm_by_threads[1]:
                print(f"  note: the matmul is only {flops / mm_by_threads[1]:.2f}x faster than on 1 "
                      "thread: other processes hold the cores, so these figures are "
                      "contention-bound and noisy")
            first = ours["losses"][0]
            for peer in ("hf", "libtorch"):
                other = results[peer]["losses"][0]
                if abs(first - other) > 1e-3 * abs(other):
                    failures.append(f"first-step loss ours {first} vs {peer} {other} "
                                    f"({threads} threads)")
        if failures:
            raise SystemExit("FAIL:\n  " + "\n  ".join(failures))
        print("\nbench_train: done (figures only; aim: throughput >= 1.0 and peak RSS <= 1.0 "
              "against both peers, MFU >= 0.6)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-child":
        _, _, m, b, n, r, t = sys.argv
        hf_child(m, b, int(n), r, int(t))
    else:
        main()
