"""The GPU benchmark of issue 25, run by tests/gpu/run.sh on a lent GPU (one run, one process at
a time on the GPU; prints ours ÷ peer ratios and writes them as JSON).

- The machine's ceilings, measured here: bf16 and fp32 (no TF32) GEMM rate (8192³ products,
  CUDA events, median of 10 after warm-up), pinned host→device and device→host bandwidth.
- bf16 fine-tuning step of a generated ~1.1B llama (TinyLlama's shape, random weights, batch 8 ×
  1024 tokens, every token real): ours (tessera-train-probe, `single` on cuda, precision bf16:
  float32 master weights, bf16 compute, AdamW) ÷ the HF Trainer's step as the Trainer runs it
  with bf16=True and optim adamw_torch_fused (float32 weights under torch.autocast(bfloat16),
  SDPA attention, clip_grad_norm_ 1.0, fused AdamW), written out as its loop so that each step
  is timed alone. Median of the steps after the first three. MFU = model FLOPs per step
  (6·N·tokens + 12·layers·hidden·T·tokens, PaLM's count) ÷ step time ÷ the bf16 GEMM rate.
- gemini with the optimizer state in host memory (`host_optim_frac` 1: the parameters on the GPU,
  the CPU Adam updating float32 masters and moments from gradients copied down as they arrive)
  ÷ ours on `single` (everything on the GPU), the same model and batches (goal <= 1.10).
- QLoRA: LoRA (rank 16, every linear of the blocks) on the base quantized to NF4 with
  double-quantized absmax, ÷ LoRA on the bf16 base: what dequantizing each tile (our CUDA kernel,
  forward and backward) costs a step, and the GPU memory it saves.
- ZeRO-Offload (zero stage 2 with offload_optimizer) on the one GPU ÷ ours on single, and the
  plan's step of it (the CPU Adam and the copies added) ÷ what it measured.
- Not measured: the largest model gemini trains on one GPU with host RAM and disk (0.8 × (GPU +
  RAM + disk) ÷ 16 bytes is ~16B parameters on an H200 machine: its checkpoint and optimizer
  state alone exceed the 64 GiB disk and the device time of a session).

- The planner against the run: `tessera-cli plan` of the same job (single on the GPU, bf16, the
  same batch), before any run of it is calibrated, ÷ what ours measured: the step time, and the
  device tier's peak against the CUDA allocator's peak (the memory events' `peak`).
- Where each step's time goes: after the timed steps, ours and the Trainer's loop each run
  PROFILED more steps under LibTorch's profiler (Kineto), and tests/gpu/trace_summary.py sets
  their kernel time per category side by side (GEMM, attention, optimizer, norms and loss,
  elementwise, copies), with the time the GPU was busy and the window of the steps: what to
  change first when ours is slower than it should be. The profiled steps are not timed.

    python tests/gpu/bench_gpu.py [--json OUT.json] [--steps N] [--layers N] [--profiled N]
                                  [--smoke]

--smoke runs every part on the CPU with a tiny llama (the GPU's rates and gemini left out): a
check of the benchmark itself where there is no GPU (tests/gpu/test_gpu.py runs it in CI).
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_summary import read_summary, table  # noqa: E402

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 2048, 5632, 32, 4, 32000
BATCH, SEQ = 8, 1024
DEVICE = "cuda"
TIMED_FROM = 3  # the steps before it warm the allocator and the kernels' choices


def use_smoke_shapes():
    global HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB, BATCH, SEQ, DEVICE
    HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 64, 128, 4, 2, 256
    BATCH, SEQ, DEVICE = 2, 32, "cpu"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gemm_rate(dtype, n=8192, reps=10):
    a = torch.randn(n, n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, n, device=DEVICE, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        if DEVICE != "cuda":
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times)


def copy_bandwidth(size=1 << 30, reps=5):
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(7)  # touched, quickly
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    rates = {}
    for name, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        rates[name] = size / statistics.median(times)
    return rates


def make_model(folder, layers):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=layers, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return params


def model_flops_per_step(params, layers):
    tokens = BATCH * SEQ
    return 6 * params * tokens + 12 * layers * HIDDEN * SEQ * tokens


def batches_file(path, count):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (count, BATCH, SEQ), generator=g)
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()},
              str(path))
    return ids


def ours_step_seconds(model_dir, batches, steps, work, plugin="single", options=None, profiled=0,
                      extra=(), name=None):
    """Ours on `plugin`: {step_s: the median of steps TIMED_FROM..steps-1, losses: the first
    `steps`, wall_s: the run with loading, peak_bytes: the CUDA allocator's peak (the memory
    events' device tier; on the CPU the process's peak RSS), profile: with `profiled`, the summary
    of that many more steps under the profiler}. `extra`: more flags (the method); `name`: the
    run's files' name (the plugin's by default)."""
    probe = Path(os.environ["TESSERA_TOOLS_DIR"]) / "tessera-train-probe"
    events = work / f"events-{name or plugin}.jsonl"
    trace = work / f"trace-{plugin}.json"
    cmd = [str(probe), "--model", str(model_dir), "--batches", str(batches),
           "--steps", str(steps + profiled),
           "--report", str(work / "report.json"), "--precision", "bf16", "--lr", "1e-5",
           # the peer's loop: a constant rate and torch's AdamW default weight decay
           "--schedule", "constant", "--weight-decay", "0.01", "--max-grad-norm", "1.0",
           "--events", str(events), "--plugin", plugin, "--strategy-options",
           json.dumps({"device": DEVICE, **(options or {})}), *extra]
    if profiled:
        cmd += ["--profile", str(trace), "--profile-from", str(steps)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"tessera-train-probe exit {done.returncode}: {done.stderr[-2000:]}")
    stream = [json.loads(line) for line in events.read_text().splitlines()]
    metrics = [m for m in stream if m.get("type") == "metric" and "tokens_per_s" in m]
    seconds = [BATCH * SEQ / m["tokens_per_s"] for m in metrics if m["tokens_per_s"] > 0]
    report = json.loads((work / "report.json").read_text())
    device_peaks = [m.get("peak", 0) for m in stream
                    if m.get("type") == "memory" and m.get("tier") == "device"]
    return {"step_s": statistics.median(seconds[TIMED_FROM:steps]),
            "losses": report["losses"][:steps], "wall_s": wall,
            "peak_bytes": max(device_peaks) if DEVICE == "cuda" and device_peaks
            else report.get("peak_rss_bytes", 0),
            "profile": summary_or_none(trace, profiled)}


def summary_or_none(trace, steps):
    """The profile's summary, or None (said) when there is none: a profiler that failed costs
    the breakdown only, never the timed figures."""
    if not steps:
        return None
    try:
        return read_summary(trace, steps)
    except (OSError, ValueError, KeyError) as e:
        print(f"profile {trace.name}: none ({e})", flush=True)
        return None


def plan_of(work, model_dir, steps, strategy="single", options=None):
    """tessera-cli plan of the job ours runs (`strategy` on DEVICE, bf16, batch BATCH × SEQ
    tokens): its step time, the CPU Adam's share of it, and the peak of the tier it computes on
    (device on a GPU, else host)."""
    text = work / "text.jsonl"
    words = " ".join(f"w{i}" for i in range(64))
    text.write_text("".join(json.dumps({"text": words * 40}) + "\n" for _ in range(64)))
    spec = {"version": 1, "model": {"path": str(model_dir)},
            "dataset": {"train": str(text), "format": "text", "max_length": SEQ, "packing": True},
            "training": {"steps": steps, "batch_size": BATCH, "learning_rate": 1e-5,
                         "schedule": "constant", "weight_decay": 0.01, "max_grad_norm": 1.0,
                         "save_every": 0},
            "precision": "bf16",
            "strategy": {"name": strategy, "options": {"device": DEVICE, **(options or {})}},
            "output": {"dir": str(work / "planned")}}
    path = work / f"job-{strategy}.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run([os.environ["TESSERA_CLI"], "plan", str(path), "--json"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"tessera-cli plan exit {done.returncode}: {done.stderr[-2000:]}")
    plan = json.loads(done.stdout)
    tier = "device" if DEVICE == "cuda" else "host"
    memory = next(m for m in plan["memory"] if m["tier"] == tier)
    return {"tier": tier, "step_s": plan["time"]["seconds_per_step"], "peak_bytes": memory["peak"],
            "host_update_s": plan["time"].get("host_update_seconds_per_step", 0.0),
            "copy_s": plan["time"].get("copy_seconds_per_step", 0.0),
            "exposed_copy_s": plan["time"].get("exposed_copy_seconds_per_step", 0.0),
            "settings": plan["settings"], "time_source": plan["time"]["source"]}


def plan_against(out, key, work, steps, strategy, options, measured_s):
    """The plan of the job ours ran on `strategy` (plan_of) ÷ what it measured, as out[key +
    "_plan"] (its step, the CPU Adam's and the copies' part of it), or out[key + "_plan_error"]."""
    try:
        planned = plan_of(work, work / "model", steps, strategy, options)
        out[f"{key}_plan"] = dict(planned, step_ratio=planned["step_s"] / measured_s)
        print(f"{key} plan ÷ measured: step {planned['step_s'] / measured_s:.2f} "
              f"({planned['step_s'] * 1e3:.1f} ms planned, of which the CPU Adam "
              f"{planned['host_update_s'] * 1e3:.1f} ms and the copies' unhidden part "
              f"{planned['exposed_copy_s'] * 1e3:.1f} ms)", flush=True)
    except Exception as e:  # noqa: BLE001 - reported beside the rest
        out[f"{key}_plan_error"] = str(e)
        print(f"{key} plan: failed: {e}", flush=True)


def trainer_step_seconds(model_dir, ids, steps, work, profiled=0):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa").to(DEVICE).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    seconds, losses = [], []
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def one_step(step):
        batch = ids[step % ids.shape[0]].to(DEVICE)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the Trainer logs the loss: one sync per step, as ours
        sync()
        seconds.append(time.perf_counter() - t0)

    for step in range(steps):
        one_step(step)
    peak = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0
    summary = None
    if profiled:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if DEVICE == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for step in range(steps, steps + profiled):
                one_step(step)
        trace = work / "trace-trainer.json"
        prof.export_chrome_trace(str(trace))
        summary = summary_or_none(trace, profiled)
    del model, opt
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(seconds[TIMED_FROM:steps]), losses[:steps], peak, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--profiled", type=int, default=3,
                        help="steps profiled after the timed ones, each side (0: none)")
    parser.add_argument("--traces", type=Path, help="keep the profiles' traces here (gzipped)")
    parser.add_argument("--smoke", action="store_true", help="the CPU and a tiny llama")
    args = parser.parse_args()
    if args.smoke:
        use_smoke_shapes()
    elif not torch.cuda.is_available():
        print("bench_gpu: no CUDA device")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "none (--smoke, CPU)",
           "torch": torch.__version__, "batch": BATCH, "seq": SEQ, "layers": args.layers}
    if DEVICE == "cuda":
        out["gemm_bf16_flops"] = gemm_rate(torch.bfloat16)
        out["gemm_fp32_flops"] = gemm_rate(torch.float32, n=4096)
        out["copy"] = copy_bandwidth()
    else:
        out["gemm_bf16_flops"] = gemm_rate(torch.bfloat16, n=512, reps=3)

    def save():  # after each part, so a run stopped at its limit still reports what it measured
        if args.json:
            tmp = args.json.with_suffix(".tmp")
            tmp.write_text(json.dumps(out, indent=1) + "\n")
            tmp.replace(args.json)

    save()
    if DEVICE == "cuda":
        print(f"GEMM bf16 {out['gemm_bf16_flops'] / 1e12:.0f} TFLOP/s, fp32 "
              f"{out['gemm_fp32_flops'] / 1e12:.1f} TFLOP/s; pinned h2d "
              f"{out['copy']['h2d'] / 1e9:.1f} GB/s, d2h {out['copy']['d2h'] / 1e9:.1f} GB/s",
              flush=True)
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-gpu-") as tmp:
        work = Path(tmp)
        params = make_model(work / "model", args.layers)
        ids = batches_file(work / "batches.safetensors", 4)
        out["params"] = params
        flops = model_flops_per_step(params, args.layers)
        print(f"model: {params / 1e9:.2f}B parameters, {flops / 1e12:.1f} TFLOP per step", flush=True)
        profiles = {}
        try:
            run = ours_step_seconds(work / "model", work / "batches.safetensors", args.steps,
                                    work, profiled=args.profiled)
            ours, our_losses, wall, profiles["ours"] = (run["step_s"], run["losses"],
                                                        run["wall_s"], run["profile"])
            out.update(ours_step_s=ours, ours_losses=our_losses, ours_wall_s=wall,
                       ours_peak_bytes=run["peak_bytes"],
                       ours_mfu=flops / ours / out["gemm_bf16_flops"])
            print(f"ours: {ours * 1e3:.1f} ms/step, MFU {out['ours_mfu']:.3f} "
                  f"(run {wall:.0f} s with loading)", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, then the peer is still measured
            out["ours_error"] = str(e)
            print(f"ours: failed: {e}", flush=True)
        save()
        if "ours_step_s" in out:
            # The planner's figures for the same job against what this run measured (the plan
            # of a job, as `tessera-cli plan` shows it before a run: no calibration from one).
            try:
                planned = plan_of(work, work / "model", args.steps)
                planned["step_ratio"] = planned["step_s"] / out["ours_step_s"]
                planned["peak_ratio"] = planned["peak_bytes"] / out["ours_peak_bytes"]
                out["plan"] = planned
                print(f"plan ÷ measured: step {planned['step_ratio']:.2f} "
                      f"({planned['step_s'] * 1e3:.1f} ms planned), {planned['tier']} peak "
                      f"{planned['peak_ratio']:.2f} ({planned['peak_bytes'] / 2**30:.2f} GiB planned, "
                      f"{out['ours_peak_bytes'] / 2**30:.2f} measured)", flush=True)
            except Exception as e:  # noqa: BLE001 - reported beside the rest
                out["plan_error"] = str(e)
                print(f"plan: failed: {e}", flush=True)
            save()
        try:  # the peer failing (its profiler, an out-of-memory) leaves our other parts to run
            theirs, their_losses, peak, profiles["trainer"] = trainer_step_seconds(
                work / "model", ids, args.steps, work, profiled=args.profiled)
            out.update(trainer_step_s=theirs, trainer_losses=their_losses, trainer_peak_bytes=peak,
                       trainer_mfu=flops / theirs / out["gemm_bf16_flops"])
            print(f"HF Trainer loop: {theirs * 1e3:.1f} ms/step, MFU {out['trainer_mfu']:.3f}, "
                  f"peak {peak / 2**30:.1f} GiB", flush=True)
        except Exception as e:  # noqa: BLE001 - reported beside the rest
            out["trainer_error"] = str(e)
            print(f"HF Trainer loop: failed: {e}", flush=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        save()
        if "ours_step_s" in out and "trainer_step_s" in out:
            # The headline first and saved, so a gemini run stopped at the limit cannot lose it.
            out["speedup_vs_trainer"] = theirs / ours
            # The same batches, rate and optimizer: the losses follow each other (bf16 autocast
            # and our bf16 compute round differently).
            out["loss_max_rel"] = max(abs(a - b) / abs(b) for a, b in zip(our_losses, their_losses))
            print(f"losses: ours vs Trainer at most {out['loss_max_rel']:.2e} relative apart")
            print(f"ours ÷ Trainer step time: {ours / theirs:.3f} "
                  f"(speed-up {theirs / ours:.3f}x; goal >= 1.1x, MFU goal >= 0.55)", flush=True)
            save()
        profiles = {side: p for side, p in profiles.items() if p}
        if profiles:
            out["profile"] = profiles
            save()
            print(f"where a step goes ({args.profiled} profiled steps each, "
                  f"{next(iter(profiles.values()))['source']}):")
            print("\n".join(table(profiles)), flush=True)
            if args.traces:
                args.traces.mkdir(parents=True, exist_ok=True)
                for side in profiles:
                    name = "single" if side == "ours" else side
                    with open(work / f"trace-{name}.json", "rb") as src, \
                            gzip.open(args.traces / f"trace-{side}.json.gz", "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if "ours_step_s" in out and DEVICE == "cuda":
            try:
                run = ours_step_seconds(work / "model", work / "batches.safetensors", args.steps,
                                        work, "gemini", {"host_optim_frac": 1.0})
                gemini, gemini_losses = run["step_s"], run["losses"]
                out.update(gemini_host_optim_step_s=gemini, gemini_host_optim_ratio=gemini / ours,
                           gemini_losses=gemini_losses)
                print(f"gemini, optimizer in host memory: {gemini * 1e3:.1f} ms/step, "
                      f"÷ ours on single {gemini / ours:.3f} (goal <= 1.10)", flush=True)
                # The plan's step of it: single's compute plus the CPU Adam of every element at
                # the profile's rate, which bounds the step from below (it runs after the backward).
                plan_against(out, "gemini", work, args.steps, "gemini", {"host_optim_frac": 1.0}, gemini)
            except Exception as e:  # noqa: BLE001 - reported beside the rest
                out["gemini_error"] = str(e)
                print(f"gemini, optimizer in host memory: failed: {e}", flush=True)

        save()
        if "ours_step_s" in out:
            # QLoRA's cost (on the GPU; --smoke: on the CPU): the same LoRA (rank 16 on every
            # linear of the blocks) on the base quantized to NF4 with double-quantized absmax,
            # each tile dequantized by our kernel in forward and again in backward, ÷ LoRA on the
            # bf16 base.
            try:
                lora = ["--method", "lora", "--lora-rank", "16", "--lora-alpha", "32",
                        "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]
                steps = {}
                for name, flags in (("lora", lora), ("qlora", lora + ["--quantize", "nf4", "--double-quant"])):
                    run = ours_step_seconds(work / "model", work / "batches.safetensors", args.steps,
                                            work, extra=flags, name=name)
                    steps[name] = run["step_s"]
                    out.update({f"{name}_step_s": run["step_s"], f"{name}_peak_bytes": run["peak_bytes"]})
                out["qlora_step_ratio"] = steps["qlora"] / steps["lora"]
                print(f"LoRA {steps['lora'] * 1e3:.1f} ms/step, QLoRA (nf4, double-quantized) "
                      f"{steps['qlora'] * 1e3:.1f} ms/step: QLoRA ÷ LoRA {out['qlora_step_ratio']:.3f}; "
                      f"{'GPU' if DEVICE == 'cuda' else 'RSS'} peak {out['lora_peak_bytes'] / 2**30:.2f} → {out['qlora_peak_bytes'] / 2**30:.2f} GiB",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - reported beside the rest
                out["qlora_error"] = str(e)
                print(f"QLoRA: failed: {e}", flush=True)
        save()
        if "ours_step_s" in out and DEVICE == "cuda":
            # ZeRO-Offload on the one GPU (stage 2): the CPU Adam over every element and the
            # copies down and up each step, ÷ ours on single; and the plan's step of it (compute,
            # the CPU Adam at the profile's rate, the copies at the GPU's) ÷ what it measured.
            try:
                options = {"stage": 2, "offload_optimizer": True}
                run = ours_step_seconds(work / "model", work / "batches.safetensors", args.steps,
                                        work, "zero", options)
                offload = run["step_s"]
                out.update(zero_offload_step_s=offload, zero_offload_ratio=offload / out["ours_step_s"],
                           zero_offload_losses=run["losses"])
                print(f"ZeRO-Offload: {offload * 1e3:.1f} ms/step, ÷ ours on single "
                      f"{offload / out['ours_step_s']:.3f}", flush=True)
                plan_against(out, "zero_offload", work, args.steps, "zero", options, offload)
            except Exception as e:  # noqa: BLE001 - reported beside the rest
                out["zero_offload_error"] = str(e)
                print(f"ZeRO-Offload: failed: {e}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
