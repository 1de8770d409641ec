"""QLoRA's memory and speed (issue 27): a generated ~1B llama (TinyLlama-1.1B's shape, random
weights saved in bf16 as the Hub ships them), LoRA rank 16 on q/k/v/o, batch 2 × 128 tokens,
AdamW with a constant learning rate:

  ours LoRA      tessera-train-probe --precision bf16 --method lora (the dense base in bf16)
  ours QLoRA     the same with --quantize nf4 --double-quant (the base's linear weights in NF4,
                 their absmax double-quantized: QLoRA as its paper trains)
  peft + bnb     transformers with a BitsAndBytesConfig (nf4 with double quantization, compute
                 dtype bf16) and peft's LoRA on it, the same batches and optimizer

Each side runs in its own child process; its peak RSS is ru_maxrss (os.wait4), its step time
the median of the measured steps (ours: the gaps between consecutive step `metric` events).
Printed: ours QLoRA ÷ ours LoRA peak (goal ≤ 0.40), ours QLoRA ÷ peft + bnb peak (goal ≤ 1.0),
and peft + bnb's step time ÷ ours (goal ≥ 1.0: ours at least as fast), with the first step's
losses of both QLoRA sides (same weights and batch: they must agree, bf16's 1e-2 relative).

It only prints; it fails when a side crashes, a loss is not finite or the QLoRA sides' first
losses disagree. Environment: TESSERA_TOOLS_DIR (tessera-train-probe's folder), BENCH_QLORA_LAYERS
(default 22, TinyLlama's; fewer for a quick look), BENCH_QLORA_STEPS (measured, default 3),
BENCH_QLORA_THREADS (default: every CPU), BENCH_QLORA_CHECKPOINTING=1 (all three sides with
activation checkpointing, as QLoRA's paper and the peers' defaults train: the activations, which
every side holds alike, no longer dominate the peaks).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BATCH, SEQ, RANK, LR = 2, 128, 16, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def config_for(layers):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                       num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                       max_position_embeddings=2048, tie_word_embeddings=False)


def peft_child(model_dir, batches_path, steps, report_path, threads, checkpointing):
    """peft's LoRA on transformers' bitsandbytes NF4 base, as `bench_qlora.py --peft-child`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    ids = load_file(batches_path)["input_ids"].to(torch.int64)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    base = LlamaForCausalLM.from_pretrained(model_dir, quantization_config=bnb, device_map="cpu",
                                            dtype=torch.bfloat16)
    if checkpointing:
        # The frozen embedding's output must carry a gradient for the recomputed layers' inputs.
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        base.enable_input_require_grads()
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0,
                                            target_modules=TARGETS, task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    losses, seconds = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        x = ids[step % ids.shape[0]]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    with open(report_path, "w") as f:
        json.dump({"losses": losses, "step_seconds": seconds}, f)


def make_inputs(folder, layers, steps):
    """The model (bf16 safetensors) and the batches, as `bench_qlora.py --make-inputs`: in a
    child of its own, so that the benchmark's process stays small (a child's peak RSS starts
    from its parent's at fork)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(config_for(layers)).to(torch.bfloat16)
    model.save_pretrained(os.path.join(folder, "model"), safe_serialization=True)
    ids = torch.randint(0, 32000, (steps, BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids}, os.path.join(folder, "batches.safetensors"))
    with open(os.path.join(folder, "parameters.json"), "w") as f:
        json.dump(sum(p.numel() for p in model.parameters()), f)


def run_child(argv, threads, label):
    """Runs one side; returns its peak RSS in bytes. Raises on a crash."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.stdout.write(out.decode(errors="replace"))
        raise SystemExit(f"FAIL: {label} exited with {status}: {' '.join(argv)}")
    return usage.ru_maxrss * 1024


def ours_step_seconds(events_path):
    times = [json.loads(line)["t"] for line in open(events_path)
             if '"metric"' in line and "tokens_per_s" in line]
    return [float("nan")] + [b - a for a, b in zip(times, times[1:])]


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = line.split()
            return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
                            if f in flags)
    return "unknown"


def main():
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        raise SystemExit("FAIL: TESSERA_TOOLS_DIR is not set (the build's tests/ folder)")
    probe = os.path.join(tools, "tessera-train-probe")
    layers = int(os.environ.get("BENCH_QLORA_LAYERS", "22"))
    measured = int(os.environ.get("BENCH_QLORA_STEPS", "3"))
    threads = int(os.environ.get("BENCH_QLORA_THREADS", str(os.cpu_count())))
    checkpointing = os.environ.get("BENCH_QLORA_CHECKPOINTING", "0") == "1"
    steps = 1 + measured

    with tempfile.TemporaryDirectory(prefix="tessera-bench-qlora-") as tmp:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--make-inputs", tmp,
                        str(layers), str(steps)], check=True)
        params = json.load(open(os.path.join(tmp, "parameters.json")))
        model_dir = os.path.join(tmp, "model")
        batches = os.path.join(tmp, "batches.safetensors")
        print(f"bench_qlora: llama of {params / 1e9:.2f}B parameters ({layers} layers, bf16 "
              f"checkpoint), LoRA rank {RANK} on {','.join(TARGETS)}, batch {BATCH} x {SEQ}, "
              f"1 warm-up + {measured} measured steps, {threads} threads, activation checkpointing "
              f"{'on' if checkpointing else 'off'}; CPU flags: {cpu_flags()}")

        common = [probe, "--model", model_dir, "--batches", batches, "--steps", str(steps),
                  "--precision", "bf16", "--method", "lora", "--lora-rank", str(RANK),
                  "--lora-alpha", str(2 * RANK), "--lora-targets", ",".join(TARGETS), "--lr",
                  str(LR), "--schedule", "constant", "--threads", str(threads)]
        if checkpointing:
            common.append("--activation-checkpointing")
        results = {}
        for side, extra in (("ours LoRA", []), ("ours QLoRA", ["--quantize", "nf4", "--double-quant"])):
            report = os.path.join(tmp, f"{len(results)}.json")
            events = os.path.join(tmp, f"{len(results)}.jsonl")
            rss = run_child(common + extra + ["--report", report, "--events", events], threads, side)
            losses = json.load(open(report))["losses"]
            results[side] = dict(rss=rss, losses=losses,
                                 step=statistics.median(ours_step_seconds(events)[1:]))
        report = os.path.join(tmp, "peft.json")
        rss = run_child([sys.executable, os.path.abspath(__file__), "--peft-child", model_dir,
                         batches, str(steps), report, str(threads), str(int(checkpointing))],
                        threads, "peft + bnb")
        rep = json.load(open(report))
        results["peft + bnb"] = dict(rss=rss, losses=rep["losses"],
                                     step=statistics.median(rep["step_seconds"][1:]))

        print(f"  {'side':11s} {'peak RSS':>10s} {'s/step':>8s}  losses")
        for side, r in results.items():
            print(f"  {side:11s} {r['rss'] / 2**30:8.2f} GiB {r['step']:8.2f}  "
                  f"{', '.join(f'{x:.4f}' for x in r['losses'])}")
        ours, lora, peft = results["ours QLoRA"], results["ours LoRA"], results["peft + bnb"]
        print(f"  ours QLoRA / ours LoRA (bf16) peak: {ours['rss'] / lora['rss']:.2f} (goal <= 0.40)")
        print(f"  ours QLoRA / peft + bnb peak:       {ours['rss'] / peft['rss']:.2f} (goal <= 1.0)")
        print(f"  peft + bnb / ours QLoRA step time:  {peft['step'] / ours['step']:.2f} (goal >= 1.0)")
        failures = [f"{side}: non-finite loss" for side, r in results.items()
                    if not all(x == x and abs(x) != float("inf") for x in r["losses"])]
        first, theirs = ours["losses"][0], peft["losses"][0]
        if abs(first - theirs) > 1e-2 * abs(theirs):
            failures.append(f"first QLoRA loss: ours {first} vs peft + bnb {theirs}")
        if failures:
            raise SystemExit("FAIL: " + "; ".join(failures))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peft-child":
        peft_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                   sys.argv[7] == "1")
    elif len(sys.argv) > 1 and sys.argv[1] == "--make-inputs":
        make_inputs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
