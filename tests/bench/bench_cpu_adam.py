"""CPU AdamW step throughput: our fused kernel against DeepSpeed and torch, and a memory bound.

One fp32 parameter with an fp32 gradient, AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01), at 1M / 16M / 64M / 256M parameters and 1 and 2 threads:

  ours       tessera-cpu-adam-tool bench (engine/optim/cpu_adam.h, the widest ISA level here),
             fp32, and with the bf16 compute copy written in the same pass (ours+bf16)
  ds         DeepSpeed's DeepSpeedCPUAdam (adamw_mode=True); its op is JIT-built with ninja on
             first use (minutes). Skipped, saying why, when deepspeed cannot be imported or built
  fused      torch.optim.AdamW(fused=True)
  foreach    torch.optim.AdamW(foreach=True)
  bound      memory bound from a STREAM-style triad measured by the tool in the same process at
             the same thread count, in the step's own access pattern: p, m, v += s*g in place
             over four arrays >= 4x the L3 (16 bytes read, 12 written per element); its bytes/s
             / 28 bytes per parameter (p, g, m, v read; p, m, v written), or / 30 with a bf16
             copy. (The classic a = b + s*c undercounts here: its written array is read first by
             the hardware, and two read streams reach less bandwidth than the step's four.)

Each side runs in its own child process, one at a time (256M parameters are 4 GiB of p, g, m,
v). Rate = parameters / the median wall time of the timed steps after warm-up steps.
It only prints; it fails only when a side crashes (DeepSpeed being unavailable is not a crash).

Environment: TESSERA_TOOLS_DIR (where tessera-cpu-adam-tool is), BENCH_CPU_ADAM_SIZES
(parameters, comma-separated, default 1M,16M,64M,256M; K/M suffixes allowed),
BENCH_CPU_ADAM_THREADS (default 1,2), BENCH_CPU_ADAM_STEPS (timed steps; default: about 2 s
of steps per side, 5 to 200), BENCH_CPU_ADAM_WARMUP (default 3), BENCH_CPU_ADAM_SIDES (default
ours,ds,fused,foreach).
"""

import json
import os
import statistics
import subprocess
import sys
import time

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
DEFAULT_SIZES = "1M,16M,64M,256M"
ASSUMED_BYTES_PER_S = 10e9  # only to choose how many steps make about 2 s


def parse_size(text):
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def cpu_description():
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16") if f in flags]
    return model, have


def child_torch(mode, size, threads, steps, warmup):
    """`--child fused|foreach|ds SIZE THREADS STEPS WARMUP`: prints {"median_s": ...}."""
    import torch

    torch.set_num_threads(threads)
    param = torch.nn.Parameter(torch.rand(size) - 0.5)
    param.grad = (torch.rand(size) - 0.25) * 1e-3
    if mode == "ds":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam([param], lr=LR, betas=BETAS, eps=EPS,
                                   weight_decay=WEIGHT_DECAY, adamw_mode=True)
        except Exception as e:  # noqa: BLE001 - any failure means "DeepSpeed unavailable"
            print(json.dumps({"unavailable": f"{type(e).__name__}: {e}"}))
            return
    else:
        opt = torch.optim.AdamW([param], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                **({"fused": True} if mode == "fused" else {"foreach": True}))
    secs = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            secs.append(dt)
    if not torch.isfinite(param).all():
        raise SystemExit(f"{mode}: non-finite parameters after {warmup + steps} steps")
    print(json.dumps({"median_s": statistics.median(secs), "min_s": min(secs)}))


def run_child(argv, threads, label):
    """Runs one side and returns its last stdout line parsed as JSON. Exits on a crash."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if "ds" in argv:
        # DeepSpeed lives outside the venv (installer/bootstrap.sh): on the path for this side only.
        site = os.environ.get("TESSERA_BENCH_SITE",
                              os.path.join(os.environ.get("TESSERA_HOME", os.path.expanduser("~/.cache/tessera")),
                                           "bench-site"))
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("DS_ACCELERATOR", "cpu")
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout + proc.stderr)
        raise SystemExit(f"FAIL: {label} exited with {proc.returncode}: {' '.join(argv)}")
    out = proc.stdout.strip()
    # The tool prints one JSON document; the Python children print one line last.
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return json.loads(out.splitlines()[-1])


def main():
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        raise SystemExit("FAIL: TESSERA_TOOLS_DIR is not set (the build's tests/ folder)")
    tool = os.path.join(tools, "tessera-cpu-adam-tool")
    if not os.access(tool, os.X_OK):
        raise SystemExit(f"FAIL: {tool} is missing; build it first")
    sizes = [parse_size(s) for s in os.environ.get("BENCH_CPU_ADAM_SIZES", DEFAULT_SIZES)
             .split(",")]
    thread_counts = [int(t) for t in os.environ.get("BENCH_CPU_ADAM_THREADS", "1,2").split(",")]
    fixed_steps = os.environ.get("BENCH_CPU_ADAM_STEPS")
    warmup = int(os.environ.get("BENCH_CPU_ADAM_WARMUP", "3"))
    sides = os.environ.get("BENCH_CPU_ADAM_SIDES", "ours,ds,fused,foreach").split(",")

    import torch

    isa = run_child([tool, "isa"], 1, "ours (isa)")
    model, flags = cpu_description()
    print(f"bench_cpu_adam: {model}; flags {' '.join(flags) or '(none of avx2/avx512)'}; "
          f"{os.cpu_count()} CPUs; torch {torch.__version__} "
          f"(capability {torch.backends.cpu.get_cpu_capability()}); ours at ISA {isa['detected']}")
    print(f"  AdamW lr {LR} betas {BETAS} eps {EPS} weight decay {WEIGHT_DECAY}, one fp32 param "
          f"+ fp32 grad; median of timed steps after {warmup} warm-up; G params/s")

    ds_note = None
    rows = []
    for threads in thread_counts:
        for size in sizes:
            steps = int(fixed_steps) if fixed_steps else max(
                5, min(200, round(2.0 * ASSUMED_BYTES_PER_S / (28 * size))))
            r = {"size": size, "threads": threads, "steps": steps}
            if "ours" in sides:
                rep = run_child([tool, "bench", "--size", str(size), "--threads", str(threads),
                                 "--steps", str(steps), "--warmup", str(warmup)], threads,
                                f"ours ({size}, {threads} threads)")
                r["ours"] = rep["fp32"]["params_per_s"]
                r["ours_bf16"] = rep["bf16_copy"]["params_per_s"]
                r["bound"] = rep["bound_params_per_s"]["fp32"]
                r["bound_bf16"] = rep["bound_params_per_s"]["bf16_copy"]
                r["triad_gbs"] = rep["triad"]["bytes_per_s"] / 1e9
                r["l3_bytes"] = rep["triad"]["l3_bytes"]
            for side in ("ds", "fused", "foreach"):
                if side not in sides or (side == "ds" and ds_note):
                    continue
                rep = run_child([sys.executable, os.path.abspath(__file__), "--child", side,
                                 str(size), str(threads), str(steps), str(warmup)], threads,
                                f"{side} ({size}, {threads} threads)")
                if "unavailable" in rep:
                    ds_note = rep["unavailable"]
                    print(f"  note: DeepSpeed is unavailable, continuing without it: {ds_note}")
                    continue
                r[side] = size / rep["median_s"]
            rows.append(r)
            print_row(r, header=len(rows) == 1)
            sys.stdout.flush()

    print("\n  ratios (ours fp32 ÷ peer):")
    print(f"  {'params':>6s} {'thr':>3s} {'÷ds':>7s} {'÷fused':>7s} {'÷foreach':>8s} "
          f"{'÷bound':>7s} {'bf16÷bound':>10s}")
    for r in rows:
        def ratio(peer, mine="ours"):
            return f"{r[mine] / r[peer]:.3f}" if mine in r and r.get(peer) else "-"

        print(f"  {label_size(r['size']):>6s} {r['threads']:>3d} {ratio('ds'):>7s} "
              f"{ratio('fused'):>7s} {ratio('foreach'):>8s} {ratio('bound'):>7s} "
              f"{ratio('bound_bf16', 'ours_bf16'):>10s}")
    for r in rows:
        peers = [r[p] for p in ("ds", "fused", "foreach") if r.get(p)]
        if "bound" in r and peers and r["bound"] < max(peers):
            if r.get("l3_bytes") and 16 * r["size"] <= 2 * r["l3_bytes"]:
                print(f"  note: at {label_size(r['size'])} the step's {16 * r['size'] >> 20} MiB "
                      f"of p, g, m, v fit the {r['l3_bytes'] >> 20} MiB L3: the steps run from "
                      "cache, so the DRAM bound does not apply there")
                continue
            print(f"  note: at {label_size(r['size'])} x {r['threads']} threads the measured "
                  f"bound ({r['bound'] / 1e9:.3f} G/s) is below the best peer "
                  f"({max(peers) / 1e9:.3f} G/s): the bound is a measurement error there "
                  "(noise or a disturbed run), not a result")
    if ds_note:
        print(f"  DeepSpeed was not measured: {ds_note}")
    print(f"\nbench_cpu_adam: done (figures only; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs)")


def label_size(n):
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else str(n)


def print_row(r, header):
    cols = ("ours", "ours_bf16", "ds", "fused", "foreach", "bound", "bound_bf16")
    names = ("ours", "ours+bf16", "ds", "fused", "foreach", "bound", "bound16")
    if header:
        print(f"\n  {'params':>6s} {'thr':>3s} {'steps':>5s} "
              + " ".join(f"{n:>9s}" for n in names) + f" {'triad GB/s':>10s}")
    vals = " ".join(f"{r[c] / 1e9:9.3f}" if r.get(c) else f"{'-':>9s}" for c in cols)
    triad = f"{r['triad_gbs']:10.2f}" if "triad_gbs" in r else f"{'-':>10s}"
    print(f"  {label_size(r['size']):>6s} {r['threads']:>3d} {r['steps']:>5d} {vals} {triad}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, mode, n, t, s, w = sys.argv
        child_torch(mode, int(n), int(t), int(s), int(w))
    else:
        main()
