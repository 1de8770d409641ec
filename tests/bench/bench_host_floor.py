"""The host floor of gemini's disk tier (issue 25): with every parameter, gradient and optimizer
state on disk, what the process holds resident is bounded by the runtime, the chunks in flight
and the activations, not by the model. A generated llama is fine-tuned in full by
`tessera-cli run` (plan, load, steps, checkpoint, the streamed export, all of it) with
`host_budget` set and the offload fractions 1, inside a memory cgroup of that budget (page cache
included) where the machine allows one.

Default model: the issue's, a 297M-parameter llama (hidden 1024, 18 layers, intermediate 2816,
vocabulary 32000, untied, fp32), batch 1 x 128, 3 steps, budget 1.5 GiB: its training state is
4.4 GiB, 3x the budget. BENCH_FLOOR_MODEL=large: a 1.3B llama in bf16 (hidden 2048, 24 layers,
intermediate 5632, vocabulary 32000), 2 steps, budget BENCH_FLOOR_BUDGET (default 1.75GiB):
state ~20 GiB, about 11x; it needs ~55 GiB of free disk (the model, the state, the checkpoint and
the export) and several minutes.

It prints the training state on disk (the disk tier's own figure, checked against the files'
sizes by the parity tests), state / budget, the measured peak RSS (wait4) and the cgroup's peak
and OOM kills, the plan's host estimate and plan / measured, and the step time. It fails when the
plan refuses the budget, the run fails or is OOM-killed, the peak RSS exceeds the budget, or a
loss is not finite; otherwise it only prints.

Environment: TESSERA_CLI, BENCH_FLOOR_MODEL (default|large), BENCH_FLOOR_BUDGET (e.g. 1.5GiB),
BENCH_FLOOR_CHECKPOINTING (default 1: activation checkpointing on; without it the default model
peaks lower than 1.5 GiB too, but the plan's estimate, 1.35 GiB, is at the edge of what the budget
leaves after its 10% headroom and the plan refuses it, naming checkpointing), BENCH_FLOOR_DIR (where the model, run
and offload folder go; default a temporary folder under /tmp).
"""

import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from memory_cgroup import CgroupUnavailable, MemoryCgroup  # noqa: E402
from tiny_tokenizer import byte_level_bpe  # noqa: E402

GIB = 1 << 30
CLI = os.environ.get("TESSERA_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build/app/cli/tessera-cli"))

MODELS = {
    "default": dict(hidden_size=1024, num_hidden_layers=18, intermediate_size=2816, num_attention_heads=16,
                    precision="fp32", steps=3, budget="1.5GiB"),
    "large": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5632, num_attention_heads=16,
                  precision="bf16", steps=2, budget="1.75GiB"),
}


def parse_gib(text):
    text = text.strip().lower()
    assert text.endswith("gib"), "BENCH_FLOOR_BUDGET is written like 1.5GiB"
    return int(float(text[:-3]) * GIB)


def cli(*args, check=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=3600)
    if check and r.returncode != 0:
        raise SystemExit(f"FAIL: tessera-cli {' '.join(map(str, args[:2]))}: {r.stdout}{r.stderr}")
    return r


def generate(folder, shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(600)]
    lines = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(64)]
    model_dir = os.path.join(folder, "model")
    byte_level_bpe(lines, 1000).save_pretrained(model_dir)
    dtype = torch.bfloat16 if shape["precision"] == "bf16" else torch.float32
    config = LlamaConfig(vocab_size=32000, hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"],
                         num_hidden_layers=shape["num_hidden_layers"],
                         num_attention_heads=shape["num_attention_heads"], max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir, safe_serialization=True)
    del model
    data = os.path.join(folder, "text.jsonl")
    with open(data, "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line}) + "\n")
    return model_dir, data, parameters


def generate_in_a_child(folder, which):
    """The model is made by a child process: a parent holding it would fork the CLI with its
    pages mapped, and wait4's peak RSS (kept across exec) would be the parent's."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--generate", folder, which],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: generating the model: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    which = os.environ.get("BENCH_FLOOR_MODEL", "default")
    shape = MODELS[which]
    budget_text = os.environ.get("BENCH_FLOOR_BUDGET", shape["budget"])
    budget = parse_gib(budget_text)
    checkpointing = os.environ.get("BENCH_FLOOR_CHECKPOINTING", "1") == "1"
    root = os.environ.get("BENCH_FLOOR_DIR") or tempfile.mkdtemp(prefix="tessera-bench-floor-")
    os.makedirs(root, exist_ok=True)
    try:
        t0 = time.perf_counter()
        model_dir, data, parameters = generate_in_a_child(root, which)
        print(f"bench_host_floor: llama {parameters / 1e6:.0f}M parameters ({shape['num_hidden_layers']} layers, "
              f"hidden {shape['hidden_size']}, vocabulary 32000, untied), {shape['precision']}, batch 1 x 128, "
              f"{shape['steps']} steps; generated in {time.perf_counter() - t0:.0f} s")
        spec = json.loads(cli("finetune", "--model", model_dir, "--data", data, "--format", "text",
                              "--max-length", 128, "--batch-size", 1, "--steps", shape["steps"],
                              "--precision", shape["precision"], "--out", os.path.join(root, "run"),
                              "--print-job").stdout)
        spec["strategy"] = {"name": "gemini", "options": {
            "offload_optim_frac": 1.0, "offload_param_frac": 1.0, "host_budget": budget_text,
            "offload_dir": os.path.join(root, "offload")}}
        spec.setdefault("training", {})["activation_checkpointing"] = checkpointing
        job = os.path.join(root, "job.json")
        with open(job, "w") as f:
            json.dump(spec, f)
        plan = json.loads(cli("plan", job, "--json", check=False).stdout or "{}")
        host = next((t for t in plan.get("memory", []) if t["tier"] == "host"), None)
        if host is None:
            raise SystemExit(f"FAIL: no plan: {plan}")

        events = os.path.join(root, "events.jsonl")
        argv = [CLI, "run", job, "--events", events]
        group = None
        try:
            group = MemoryCgroup(f"tessera-bench-floor-{os.getpid()}", budget)
            argv = ["sh", "-c", f'echo $$ > "{group.path}/cgroup.procs" && exec "$0" "$@"', *argv]
        except CgroupUnavailable as e:
            print(f"  no memory cgroup ({e}): peak RSS only")
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        peak_rss = usage.ru_maxrss * 1024
        group_peak = group.peak_bytes() if group else None
        kills = group.oom_kills() if group else 0
        if group:
            group.remove()
        if code != 0 or kills:
            sys.stdout.write(out.decode(errors="replace")[-4000:])
            raise SystemExit(f"FAIL: the run exited with {code} ({kills} OOM kills in the cgroup)")

        evs = [json.loads(line) for line in open(events)]
        disk = max((e["used"] for e in evs if e["type"] == "memory" and e.get("tier") == "disk"), default=0)
        losses = [e["loss"] for e in evs if e["type"] == "metric" and "loss" in e]
        steps = [e["t"] for e in evs if e["type"] == "metric" and "tokens_per_s" in e]
        step_s = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else float("nan")
        flags = sorted({f for f in open("/proc/cpuinfo").read().split() if f in
                        ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")})
        print(f"  machine: {os.cpu_count()} CPUs, flags {' '.join(flags)}; activation checkpointing "
              f"{'on' if checkpointing else 'off'}")
        print(f"  training state on disk  {disk / GIB:6.2f} GiB   (the disk tier's own figure)")
        print(f"  host_budget             {budget / GIB:6.2f} GiB   state / budget {disk / budget:.1f}x")
        print(f"  peak RSS (wait4)        {peak_rss / GIB:6.2f} GiB   peak / budget {peak_rss / budget:.2f}")
        if group_peak is not None:
            print(f"  cgroup peak             {group_peak / GIB:6.2f} GiB   (page cache included), {kills} OOM kills")
        print(f"  plan's host estimate    {host['peak'] / GIB:6.2f} GiB   plan / measured {host['peak'] / peak_rss:.2f}")
        print(f"  run {wall:.0f} s in all; {step_s:.1f} s per step after the first; losses "
              + " ".join(f"{v:.4f}" for v in losses))
        if peak_rss > budget:
            raise SystemExit("FAIL: the peak RSS is above the budget")
        if not losses or not all(math.isfinite(v) for v in losses):
            raise SystemExit(f"FAIL: losses {losses}")
        print("bench_host_floor: done (figures only)")
    finally:
        if not os.environ.get("BENCH_FLOOR_DIR"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--generate":
        print(json.dumps(generate(sys.argv[2], MODELS[sys.argv[3]])))
    else:
        main()
