"""The engine on a CUDA GPU against transformers, torch and peft on the same GPU (issue 25).

Run by tests/gpu/run.sh on a lent GPU machine (TESSERA_CLI and TESSERA_TOOLS_DIR point at its
Qt-free build); not part of CTest, since CI's machines have no GPU. The models, batches and
reference loops are the CPU parity suites' own (tests/parity), here on `cuda`:

- logits, hidden states and loss of every family (padded right, and unpadded so that causal
  stacks attend without a mask tensor), fp32 and bf16 (tessera-model-probe --device cuda);
- greedy generation token for token, and eval's loss equal to the CPU's (tessera-cli --device cuda);
- DPO (full, and LoRA with its reference the base with adapters off) equal to the same run on the
  CPU, whose TRL parity parity_preference holds;
- 20 full fine-tuning steps equal transformers + torch.optim.AdamW on the GPU, LoRA equal peft,
  bf16 close to fp32, activation checkpointing and resume exact with dropout drawing from the
  GPU's generator (tessera-train-probe with single on cuda);
- QLoRA's tiles dequantized by the CUDA kernel to the CPU's bits (tessera-model-probe
  --dequantize); QLoRA (nf4 double-quantized, fp4, int8; single, and gemini's device tier) equal to the same
  run on the CPU, and a QLoRA job's merged export equal to the CPU job's;
- the other strategies on cuda: equal to single where they run; where a strategy still refuses
  CUDA with "not supported yet", the test is an expected failure that says so;
- strategies of two ranks (hybrid's tensor, sequence and pipeline parallelism with and without
  LoRA, ddp, zero 2, sharded gemini's device tier) through `tessera-cli launch --nproc 2`, both
  ranks on the one GPU (TESSERA_TESTS_SHARE_GPU: NCCL refuses two ranks on one GPU, so their
  collectives go through host memory over Gloo), equal to the same jobs on the CPU.

fp32 on both sides without TF32 (LibTorch's and torch's default for matmuls); each bound is the
CPU suite's unless a comment says why the GPU needs another. Every comparison prints its figure.

TESSERA_GPU_CHECK_DEVICE=cpu runs the same suite on the CPU: a check of the suite itself before a
session spends GPU time on it (tests/gpu/check_build.sh's build, or the normal build's tools).
"""
import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "parity"))
sys.path.insert(0, str(HERE.parent / "pylib"))
sys.path.insert(0, str(HERE))

import test_generate_parity as gen  # noqa: E402
import test_model_parity as mp  # noqa: E402
import test_train_parity as tp  # noqa: E402
from test_generate_parity import models_root  # noqa: E402,F401  (fixture)
from test_model_parity import saved_models  # noqa: E402,F401  (fixture)
from test_train_parity import batches, llama_dir  # noqa: E402,F401  (fixtures)
from train_probe import save_pair_batch  # noqa: E402

DEVICE = os.environ.get("TESSERA_GPU_CHECK_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="no CUDA device here")

CUDA = {"device": DEVICE}
# Training on a GPU is not bit-deterministic (atomic adds in the embedding's and index ops'
# backward), and 20 steps at lr 1e-2 amplify last-bit differences: 1e-3 relative instead of the
# CPU's 1e-4 (the printed figure says how close it was).
TRAIN_REL = 1e-3


@pytest.fixture(autouse=True)
def no_tf32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def where(name):
    """The device name the CLI reports for DEVICE."""
    return "cuda:0" if name == "cuda" else name


@pytest.mark.skipif(DEVICE != "cuda", reason="a GPU to see")
def test_the_cli_sees_the_gpu():
    version = json.loads(gen.cli("version", "--json").stdout)
    # The CUDA module (engine/cuda/runtime.h) loads by itself where a driver is.
    assert version["cuda_module_loaded"], version["cuda_module"]
    assert version["gpu_count"] >= 1 and version["cuda"], version
    profile = json.loads(gen.cli("profile", "--json", "--no-disk").stdout)
    name = torch.cuda.get_device_properties(0).name
    total = torch.cuda.get_device_properties(0).total_memory
    assert profile["gpus"], profile
    gpu = profile["gpus"][0]
    print(f"profile: {gpu} (torch: {name}, {total} bytes)")
    assert gpu["name"] in name or name in gpu["name"]
    assert abs(gpu["memory"] - total) <= 0.02 * total
    free, _ = torch.cuda.mem_get_info(0)
    assert abs(gpu["memory_free"] - free) <= 0.05 * total
    # The profile's measured rates against the same measurements made here by torch.
    rates = gpu["rates"]
    assert rates and rates["measured"], gpu
    theirs = torch_rates(rates["copy_bytes"], rates["gemm_size"])
    for key, value in theirs.items():
        ratio = rates[key] / value
        print(f"profile {key}: {rates[key]:.4g} vs torch {value:.4g} (ratio {ratio:.3f})")
        assert 0.7 <= ratio <= 1.3, key


def torch_rates(copy_bytes, n):
    """What runner/gpu_rates.cpp measures, measured by torch with CUDA events (medians of 5)."""
    def median_seconds(work):
        work()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return sorted(times)[2]

    host = torch.full((copy_bytes,), 7, dtype=torch.uint8).pin_memory()
    dev = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    out = {"host_to_device_bytes_per_s": copy_bytes / median_seconds(lambda: dev.copy_(host, non_blocking=True)),
           "device_to_host_bytes_per_s": copy_bytes / median_seconds(lambda: host.copy_(dev, non_blocking=True))}
    for key, dtype in (("fp32_flops", torch.float32), ("bf16_flops", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        out[key] = 2 * n**3 / median_seconds(lambda: a @ b)
    return out


def probe_on(model_dir, tmp, ids, mask, labels, dtype):
    """tessera-model-probe on DEVICE (the CPU parity suite's run_probe)."""
    return mp.run_probe(model_dir, tmp, ids, mask, labels, dtype, device=DEVICE)


def reference_on_device(case, model_dir, ids, mask, labels, dtype):
    model = type(mp.CASES[case]()).from_pretrained(model_dir, dtype=dtype).to(DEVICE).eval()
    with torch.no_grad():
        out = model(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE),
                    labels=labels.to(DEVICE), output_hidden_states=True)
    return out.logits.float().cpu(), out.hidden_states[-1].float().cpu(), out.loss.float().item()


@pytest.mark.parametrize("padding_side", ["right", "none"])
@pytest.mark.parametrize("case", list(mp.CASES))
def test_fp32_logits_on_the_gpu(case, padding_side, saved_models, tmp_path):  # noqa: F811
    classification = case.startswith("bert")
    ids, mask, labels = mp.make_batch(padding_side, 7, classification)
    logits, hidden, loss = reference_on_device(case, saved_models[case], ids, mask, labels,
                                             torch.float32)
    ours = probe_on(saved_models[case], tmp_path, ids, mask, labels, "float32")
    pick = (lambda t: t) if classification else (lambda t: mp.valid_positions(t, mask))
    logits_diff = (pick(ours["logits"]) - pick(logits)).abs().max().item()
    hidden_diff = (mp.valid_positions(ours["hidden_states"], mask)
                   - mp.valid_positions(hidden, mask)).abs().max().item()
    loss_diff = abs(ours["loss"].item() - loss)
    print(f"{case}/{padding_side} {DEVICE} fp32: logits {logits_diff:.2e} hidden {hidden_diff:.2e} "
          f"loss {loss_diff:.2e}")
    assert logits_diff <= mp.FP32_ATOL and hidden_diff <= mp.FP32_ATOL
    assert loss_diff <= mp.FP32_ATOL


@pytest.mark.parametrize("case", list(mp.CASES))
def test_bf16_logits_on_the_gpu(case, saved_models, tmp_path):  # noqa: F811
    classification = case.startswith("bert")
    ids, mask, labels = mp.make_batch("right", 11, classification)
    logits, _, loss = reference_on_device(case, saved_models[case], ids, mask, labels,
                                        torch.bfloat16)
    ours = probe_on(saved_models[case], tmp_path, ids, mask, labels, "bfloat16")
    pick = (lambda t: t) if classification else (lambda t: mp.valid_positions(t, mask))
    diff = (pick(ours["logits"]) - pick(logits)).abs()
    print(f"{case} {DEVICE} bf16: max {diff.max().item():.4f} mean {diff.mean().item():.5f} "
          f"loss {abs(ours['loss'].item() - loss):.5f}")
    assert diff.max().item() <= mp.BF16_LOGITS_ATOL
    assert diff.mean().item() <= mp.BF16_LOGITS_MEAN_ATOL
    assert abs(ours["loss"].item() - loss) <= mp.BF16_LOSS_ATOL


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_greedy_generation_on_the_gpu(family, models_root):  # noqa: F811
    folder = models_root[family]
    tok = gen.PreTrainedTokenizerFast.from_pretrained(folder)
    model = gen.load_hf(folder).to(DEVICE)
    for prompt in gen.PROMPTS:
        ours = json.loads(gen.cli("generate", "--model", folder, "--prompt", prompt, "--greedy",
                                  "--device", DEVICE, "--max-new-tokens", gen.NEW_TOKENS,
                                  "--json").stdout)
        assert ours["device"] == where(DEVICE)
        ids = tok(prompt, return_tensors="pt").input_ids.to(DEVICE)
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=gen.NEW_TOKENS)
        expected = ref[0, ids.shape[1]:].tolist()
        print(f"{family} {prompt!r} {DEVICE}: {len(expected)} tokens, "
              f"{sum(a == b for a, b in zip(ours['generated_ids'], expected))} equal")
        assert ours["generated_ids"] == expected, f"{family} {prompt!r}"


def test_eval_on_the_gpu_equals_the_cpu(models_root, tmp_path):  # noqa: F811
    data, _ = gen.write_eval_data(tmp_path)
    runs = {}
    for device in ("cpu", DEVICE):
        runs[device] = json.loads(gen.cli("eval", "--model", models_root["llama"], "--data", data,
                                          "--max-length", 128, "--device", device,
                                          "--json").stdout)
    rel = abs(runs[DEVICE]["mean_loss"] - runs["cpu"]["mean_loss"]) / runs["cpu"]["mean_loss"]
    print(f"eval: cpu {runs['cpu']['mean_loss']:.8f} {DEVICE} {runs[DEVICE]['mean_loss']:.8f} "
          f"rel {rel:.2e}")
    assert runs[DEVICE]["device"] == where(DEVICE)
    assert runs[DEVICE]["predicted_tokens"] == runs["cpu"]["predicted_tokens"]
    assert rel <= 1e-5


def on_device(batch_fixture):
    path, ids, mask, labels = batch_fixture
    return path, ids.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)


def max_rel(ours, theirs):
    return max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))


def test_full_finetune_on_the_gpu_matches_transformers(llama_dir, batches, tmp_path):  # noqa: F811
    steps, lr = 20, 1e-2
    report = tp.run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", "--lr", lr,
                          "--schedule", "cosine", "--warmup", 3, "--weight-decay", 0.01,
                          "--max-grad-norm", 1.0, "--strategy-options", json.dumps(CUDA))
    model = tp.LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).to(DEVICE)
    losses, norms, _ = tp.reference_losses(model, list(model.parameters()), on_device(batches),
                                           steps, lr, "cosine", 3, 0.01, 1.0)
    print(f"full fine-tune {DEVICE}: losses rel {max_rel(report['losses'], losses):.2e}, "
          f"grad norms rel {max_rel(report['grad_norms'], norms):.2e}")
    assert losses[-1] < losses[0] * 0.9
    tp.assert_close(report["losses"], losses, "cuda loss", rel=TRAIN_REL)
    tp.assert_close(report["grad_norms"], norms, "cuda grad_norm", rel=10 * TRAIN_REL)


def test_lora_on_the_gpu_matches_peft(llama_dir, batches, tmp_path):  # noqa: F811
    from peft import LoraConfig

    steps, lr = 20, 2e-2
    torch.manual_seed(5)
    base = tp.LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    peft_model, init_file = tp.peft_start(
        base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                         task_type="CAUSAL_LM"), tmp_path / "init")
    report = tp.run_probe(llama_dir, batches[0], steps, tmp_path / "r.json", "--method", "lora",
                          "--lora-rank", 4, "--lora-alpha", 8, "--lora-init", init_file, "--lr", lr,
                          "--schedule", "linear", "--warmup", 2, "--max-grad-norm", 1.0,
                          "--strategy-options", json.dumps(CUDA))
    peft_model = peft_model.to(DEVICE)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    losses, _, _ = tp.reference_losses(peft_model, trainable, on_device(batches), steps, lr,
                                       "linear", 2, 0.0, 1.0)
    print(f"LoRA {DEVICE}: losses rel {max_rel(report['losses'], losses):.2e}")
    tp.assert_close(report["losses"], losses, "cuda LoRA loss", rel=TRAIN_REL)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_dpo_on_the_gpu_equals_the_cpu(method, llama_dir, tmp_path):  # noqa: F811
    """Preference tuning (issue 27) on cuda: DPO's frozen reference (a copy for full fine-tuning,
    the base with the adapters off for LoRA) and its figures per step equal the same run on the
    CPU, whose TRL parity is parity_preference's (TRL is not on the GPU machine)."""
    from peft import LoraConfig

    g = torch.Generator().manual_seed(11)

    def tokens(n):
        return torch.randint(3, tp.VOCAB, (n,), generator=g).tolist()

    chosen, rejected = [], []
    for i in range(8):
        prompt, good, bad = tokens(4 + i % 3), tokens(3 + i % 2), tokens(5 - i % 2)
        chosen.append((prompt + good, [-100] * len(prompt) + good))
        rejected.append((prompt + bad, [-100] * len(prompt) + bad))
    batch = save_pair_batch(tmp_path, chosen, rejected, pad_id=0)
    flags = ["--lr", 1e-2, "--schedule", "linear", "--max-grad-norm", 1.0, "--preference", "dpo",
             "--beta", 0.2]
    if method == "lora":
        torch.manual_seed(5)
        base = tp.LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
        _, init_file = tp.peft_start(
            base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                             task_type="CAUSAL_LM"), tmp_path / "init")
        flags += ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8, "--lora-init", init_file]
    steps = 6
    cpu = tp.run_probe(llama_dir, batch, steps, tmp_path / "cpu.json", *flags, "--strategy-options",
                       json.dumps({"device": "cpu"}))
    ours = tp.run_probe(llama_dir, batch, steps, tmp_path / "gpu.json", *flags, "--strategy-options",
                        json.dumps(CUDA))
    print(f"DPO {method} {DEVICE} vs cpu: losses rel {max_rel(ours['losses'], cpu['losses']):.2e}")
    tp.assert_close(ours["losses"], cpu["losses"], f"{DEVICE} DPO loss", rel=TRAIN_REL)
    for key in ("reward_chosen", "reward_rejected", "reward_margin", "log_prob_chosen"):
        got, want = [m[key] for m in ours["preference"]], [m[key] for m in cpu["preference"]]
        assert all(abs(a - b) <= TRAIN_REL * abs(b) + 1e-6 for a, b in zip(got, want)), (key, got, want)
    assert abs(cpu["preference"][-1]["reward_margin"]) > 1e-3  # the run moved


def test_bf16_finetune_on_the_gpu_follows_fp32(llama_dir, batches, tmp_path):  # noqa: F811
    common = ["--lr", 1e-2, "--schedule", "cosine", "--warmup", 3, "--strategy-options",
              json.dumps(CUDA)]
    fp32 = tp.run_probe(llama_dir, batches[0], 20, tmp_path / "fp32.json", *common)
    bf16 = tp.run_probe(llama_dir, batches[0], 20, tmp_path / "bf16.json", *common,
                        "--precision", "bf16")
    rel = max_rel(bf16["losses"], fp32["losses"])
    print(f"bf16 vs fp32 {DEVICE}: losses rel {rel:.3f}; last {bf16['losses'][-1]:.4f} "
          f"vs {fp32['losses'][-1]:.4f}")
    assert bf16["losses"][-1] < bf16["losses"][0] * 0.9
    assert rel <= 0.05  # what bf16 costs on this model on the CPU too (test_train_parity)


@pytest.mark.skipif(DEVICE != "cuda", reason="fp16 with loss scaling needs CUDA")
@pytest.mark.parametrize("plugin,options", [
    ("single", {}), ("ddp", {}), ("zero", {"stage": 2}),
    ("zero", {"stage": 2, "offload_optimizer": True}),
    # the device tier with half the optimizer updated by the CPU Adam, which writes the new
    # values in fp16 (bf16's bits there once: the loss went astray from the first step)
    ("gemini", {"host_param_frac": 0.5, "host_optim_frac": 0.5, "chunk_size": "160KiB"}),
])
def test_fp16_with_the_loss_scaler_follows_fp32(plugin, options, llama_dir, batches, tmp_path):  # noqa: F811
    """fp16 compute with float32 masters and the dynamic loss scaler (an overflowing step is
    skipped and the scale halved, as torch's GradScaler): it trains, ending near fp32's loss."""
    common = ["--lr", 1e-2, "--schedule", "cosine", "--warmup", 3]
    fp32 = tp.run_probe(llama_dir, batches[0], 20, tmp_path / "fp32.json", *common,
                        "--strategy-options", json.dumps(CUDA))
    fp16 = tp.run_probe(llama_dir, batches[0], 20, tmp_path / "fp16.json", *common, "--plugin",
                        plugin, "--precision", "fp16", "--strategy-options",
                        json.dumps({**options, **CUDA}))
    print(f"fp16 {plugin} vs fp32 single: last {fp16['losses'][-1]:.4f} vs {fp32['losses'][-1]:.4f}")
    assert fp16["losses"][-1] < fp16["losses"][0] * 0.9
    assert abs(fp16["losses"][-1] - fp32["losses"][-1]) <= 0.1 * fp32["losses"][-1]


def test_recomputation_and_resume_replay_the_gpu_generator(llama_dir, batches, tmp_path):  # noqa: F811
    """LoRA dropout draws its masks from the GPU's generator: activation checkpointing must
    replay them in the recomputation, and a resume must restore the stream the run had."""
    common = ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8, "--lora-dropout", 0.1,
              "--lr", 2e-2, "--seed", 3, "--strategy-options", json.dumps(CUDA)]
    plain = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "plain.json", *common)
    recomputed = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "ckpt.json", *common,
                              "--activation-checkpointing")
    print(f"recomputed vs plain {DEVICE}: rel {max_rel(recomputed['losses'], plain['losses']):.2e}")
    tp.assert_close(recomputed["losses"], plain["losses"], "recomputed cuda loss", rel=1e-5)
    run = tmp_path / "run"
    first = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "a.json", *common, "--out-dir",
                         run, "--save-every", 5, "--stop-after", 5)
    second = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "b.json", *common, "--out-dir",
                          run, "--resume", run)
    resumed = first["losses"] + second["losses"]
    print(f"resumed vs plain {DEVICE}: rel {max_rel(resumed, plain['losses']):.2e}")
    rng = load_file(str(run / "checkpoint-5" / "rng_state.safetensors"))
    assert ("torch_cuda" in rng) == (DEVICE == "cuda")
    tp.assert_close(resumed, plain["losses"], "resumed cuda loss", rel=1e-5)


@pytest.mark.parametrize("plugin,options", [
    ("gemini", {}),
    ("gemini", {"offload_optim_frac": 1.0}),
    # the device tier: half the parameters streamed from host memory, the optimizer split between
    # the GPU (torch's fused AdamW), host memory and disk (the CPU Adam)
    ("gemini", {"host_param_frac": 0.5, "host_optim_frac": 0.4, "offload_optim_frac": 0.3,
                "chunk_size": "160KiB", "device_budget": "64MiB"}),
    # parameter chunks in all three tiers: on the GPU, in host memory and on disk (read into
    # host memory, copied up, copied back and written when changed)
    ("gemini", {"offload_param_frac": 0.35, "host_param_frac": 0.35, "host_optim_frac": 0.5,
                "offload_optim_frac": 0.25, "chunk_size": "160KiB", "device_budget": "64MiB"}),
    # auto placement: every parameter chunk homed in host memory, as many kept on the GPU as the
    # budget leaves beside the first step's measured peak (which holds cuBLAS's workspace, 32 MiB
    # on Hopper: the budget leaves room beside it, and the test checks that shards moved)
    ("gemini", {"placement": "auto", "device_budget": "128MiB", "chunk_size": "160KiB"}),
    ("ddp", {}),
    ("zero", {"stage": 1}),
    ("zero", {"stage": 2}),
    # ZeRO-Offload: the shard's masters and moments in host memory, updated by the CPU Adam, the
    # gradients copied down from the gradient shares (stage 2) or the buckets (stage 1)
    ("zero", {"stage": 2, "offload_optimizer": True}),
    ("zero", {"stage": 1, "offload_optimizer": True}),
])
def test_strategy_on_the_gpu_equals_single(plugin, options, llama_dir, batches, tmp_path):  # noqa: F811
    common = ["--lr", 1e-2, "--schedule", "cosine", "--warmup", 3]
    single = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "single.json", *common,
                          "--strategy-options", json.dumps(CUDA))
    events = tmp_path / "events.jsonl"
    cmd = [str(tp.probe_path()), "--model", str(llama_dir), "--batches", str(batches[0]),
           "--steps", "10", "--report", str(tmp_path / "r.json"), "--events", str(events),
           *map(str, common), "--plugin", plugin, "--strategy-options",
           json.dumps({**options, **CUDA})]
    env = None
    if DEVICE == "cpu" and "device_budget" in options:
        # On the CPU the device tier runs on the tests' simulated device (engine/train/device_tier.h).
        cmd[-1] = json.dumps({**options, "device": "simulated"})
        env = dict(os.environ, TESSERA_SIMULATED_DEVICE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode == 2 and "not supported yet" in done.stderr:
        pytest.xfail(f"{plugin} {options} on {DEVICE}: {done.stderr.strip().splitlines()[0]}")
    assert done.returncode == 0, done.stderr
    ours = json.loads((tmp_path / "r.json").read_text())
    print(f"{plugin} {options} {DEVICE} vs single: rel {max_rel(ours['losses'], single['losses']):.2e}")
    tp.assert_close(ours["losses"], single["losses"], f"{plugin} cuda loss", rel=TRAIN_REL)
    if options.get("placement") == "auto":
        logs = [json.loads(line).get("message", "") for line in events.read_text().splitlines()]
        moved = next(m for m in logs if m.startswith("gemini placement auto: "))
        print(moved)
        assert int(moved.split()[3]) >= 1, moved  # "gemini placement auto: N of M ..."


@pytest.mark.parametrize("options", [
    # shards in host memory: copied up for each gather, gradient shards copied down
    {"chunk_size": "160KiB", "host_param_frac": 1.0, "host_optim_frac": 1.0},
    # shards of half the optimizer state and half the parameters on disk: read, copied up and
    # gathered on the GPU
    {"chunk_size": "160KiB", "host_param_frac": 0.5, "host_optim_frac": 0.5,
     "offload_optim_frac": 0.5, "offload_param_frac": 0.5},
    # everything on the GPU: the shards are the chunks, the device Adam updates them there
    {"chunk_size": "160KiB"},
    # the hybrid Adam: optimizer shards on the GPU, in host memory and on disk; half the
    # parameter shards in host memory
    {"chunk_size": "160KiB", "host_param_frac": 0.5, "host_optim_frac": 0.4, "offload_optim_frac": 0.3},
])
def test_gemini_device_tier_on_the_gpu_moves_what_its_placement_says(options, llama_dir, batches, tmp_path):  # noqa: F811
    """gemini's device tier on a GPU (one process: a group of one, whose collectives copy): a shard
    in host memory is copied up for each gather, its gradient chunk filled on the GPU and copied
    down for the CPU Adam; a shard on the GPU is the chunk itself, updated there by torch's fused
    AdamW. The losses of single on the GPU; what crossed between the tiers and the moments on the
    device as the placement says. On the CPU, the simulated device."""
    common = ["--lr", 1e-2, "--schedule", "cosine", "--warmup", 3]
    single = tp.run_probe(llama_dir, batches[0], 10, tmp_path / "single.json", *common,
                          "--strategy-options", json.dumps(CUDA))
    device = {"device": "cuda", "device_budget": "64MiB"} if DEVICE == "cuda" else \
        {"device": "simulated", "device_budget": "64MiB"}
    events = tmp_path / "events.jsonl"
    cmd = [str(tp.probe_path()), "--model", str(llama_dir), "--batches", str(batches[0]),
           "--steps", "10", "--report", str(tmp_path / "r.json"), "--events", str(events),
           *map(str, common), "--plugin", "gemini", "--strategy-options", json.dumps({**options, **device})]
    env = dict(os.environ, TESSERA_SIMULATED_DEVICE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    ours = json.loads((tmp_path / "r.json").read_text())
    print(f"gemini device tier {options} {DEVICE} vs single: rel {max_rel(ours['losses'], single['losses']):.2e}")
    tp.assert_close(ours["losses"], single["losses"], "gemini device tier loss", rel=TRAIN_REL)
    memory = [json.loads(line) for line in events.read_text().splitlines()]
    tier = [e for e in memory if e["type"] == "memory" and e.get("tier") == "device"]
    assert tier and tier[-1]["device"] == where(DEVICE if DEVICE == "cuda" else "simulated"), tier[-1:]
    moments = max(e["by_category"]["optimizer"] for e in tier)
    if options.get("host_optim_frac", 0) + options.get("offload_optim_frac", 0) >= 1.0:
        # every update on the host (the CPU Adam's, in host memory or on disk)
        assert tier[-1]["traffic"]["to_host_bytes"] > 0 and moments == 0
    elif "host_param_frac" not in options:  # everything on the device: nothing moves
        assert tier[-1]["traffic"]["to_host_bytes"] == tier[-1]["traffic"]["to_device_bytes"] == 0
        assert moments > 0
    else:
        assert tier[-1]["traffic"]["to_host_bytes"] > 0 and moments > 0


BUSY_COMMON = ["--lr", 1e-3, "--schedule", "cosine", "--warmup", 2]


@pytest.fixture(scope="module")
def busy_gpu_job(tmp_path_factory):
    """A llama whose fp32 kernels keep the GPU busy long after the host queued them (hidden 1024,
    6 layers, 8 × 1024 tokens a step), its batches, and 6 steps of single on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("busy")
    torch.manual_seed(0)
    vocab = 4096
    config = LlamaConfig(vocab_size=vocab, hidden_size=1024, intermediate_size=4096, num_hidden_layers=6,
                         num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder / "model", safe_serialization=True)
    batch_file, *_ = tp.counting_batches(folder, 6, 8, 1024, vocab)
    single = tp.run_probe(folder / "model", batch_file, 6, folder / "single.json", *BUSY_COMMON,
                          "--strategy-options", json.dumps(CUDA))
    return folder / "model", batch_file, single


@pytest.mark.skipif(DEVICE != "cuda", reason="a GPU whose kernels run behind the host")
@pytest.mark.xdist_group("busy_gpu")  # one worker builds busy_gpu_job (run.sh: --dist loadgroup)
@pytest.mark.parametrize("options", [
    # every parameter chunk streamed up from host memory, the update on the GPU (its shard staged
    # up for it)
    {"host_param_frac": 1.0},
    # ... and every update on the host, the gradients copied down
    {"host_param_frac": 1.0, "host_optim_frac": 1.0},
])
def test_gemini_streaming_on_a_busy_gpu_equals_single(options, busy_gpu_job, tmp_path):
    """The device tier streaming every parameter chunk from host memory on a GPU that runs behind
    the host: a released chunk's block goes to the next chunk while kernels that read it may still
    be queued. Each block comes from the pool of the stream that writes it first
    (train::FirstWriter), so the losses are single's. Before, the copy stream could overwrite a
    block those kernels still read; the CPU suite's simulated device, whose compute never lags,
    refuses such a copy (test_train simulated_device_tier_budgets_copies_and_orders)."""
    model_dir, batch_file, single = busy_gpu_job
    streamed = {"device": "cuda", "device_budget": "4GiB", "chunk_size": "64MiB", **options}
    ours = tp.run_probe(model_dir, batch_file, 6, tmp_path / "gemini.json", *BUSY_COMMON, "--plugin", "gemini",
                        "--strategy-options", json.dumps(streamed))
    print(f"gemini streaming {options} on a busy GPU vs single: rel {max_rel(ours['losses'], single['losses']):.2e}")
    tp.assert_close(ours["losses"], single["losses"], "gemini streaming on a busy GPU", rel=TRAIN_REL)


@pytest.mark.skipif(DEVICE != "cuda", reason="LibTorch's CUDA sync debug mode")
@pytest.mark.parametrize("plugin,options", [
    ("single", {}),
    # shards in host memory, copied up for each gather; the CPU Adam behind the next forward
    ("gemini", {"chunk_size": "160KiB", "host_param_frac": 1.0, "host_optim_frac": 1.0}),
])
def test_host_waits_for_the_gpu_are_counted_per_step(plugin, options, llama_dir, batches, tmp_path):  # noqa: F811
    """How often a step makes the host wait for the GPU: with TESSERA_CUDA_SYNC_DEBUG=warn
    LibTorch warns at each such wait (an .item(), a blocking copy, a stream or device
    synchronize), so a 6-step run's warnings less a 3-step run's, over 3, are the waits per step.
    Each step reads its loss at least (the figure says what else waits: what the MFU goal wants
    gone); a mode that warned of nothing would fail here."""
    def waits(steps):
        cmd = [str(tp.probe_path()), "--model", str(llama_dir), "--batches", str(batches[0]),
               "--steps", str(steps), "--report", str(tmp_path / f"r{steps}.json"), "--plugin", plugin,
               "--strategy-options", json.dumps({**options, **CUDA})]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, TESSERA_CUDA_SYNC_DEBUG="warn"))
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr.count("called a synchronizing CUDA operation")
    few, more = waits(3), waits(6)
    per_step = (more - few) / 3
    print(f"cuda {plugin}: {per_step:.1f} host waits for the GPU per step ({few} warnings in 3 steps, "
          f"{more} in 6)")
    assert per_step >= 1, (few, more)


@pytest.mark.skipif(DEVICE != "cuda", reason="the device tier of a GPU")
def test_memory_events_report_the_gpu(llama_dir, batches, tmp_path):  # noqa: F811
    """The memory events' device tier comes from the CUDA allocator: the weights are the model's
    float32 parameters (counted here by transformers), the state fits in what is used, used in
    what is reserved, and a host event with the process's resident set follows it."""
    events = tmp_path / "events.jsonl"
    tp.run_probe(llama_dir, batches[0], 4, tmp_path / "r.json", "--events", events,
                 "--strategy-options", json.dumps(CUDA))
    memory = [json.loads(line) for line in events.read_text().splitlines()]
    memory = [e for e in memory if e["type"] == "memory"]
    device = [e for e in memory if e["tier"] == "device"]
    assert device, memory
    params = sum(p.numel() for p in tp.LlamaForCausalLM.from_pretrained(llama_dir).parameters())
    for e in device:
        c = e["by_category"]
        print(f"device memory: used {e['used']} reserved {e['reserved']} peak {e['peak']} "
              f"total {e['total']} free {e['free']}; {c}")
        assert e["device"] == "cuda:0"
        assert c["weights"] == 4 * params
        assert c["weights"] + c["gradients"] + c["optimizer"] <= e["used"] <= e["reserved"]
        assert e["used"] <= e["peak"] and e["free"] < e["total"]
        assert abs(e["total"] - torch.cuda.get_device_properties(0).total_memory) <= 1 << 20
    after = memory[memory.index(device[-1]) + 1]
    assert after["tier"] == "host" and after["device"] == "cpu" and after["used"] > 0


@pytest.mark.skipif(DEVICE != "cuda", reason="the device tier of a GPU")
def test_zero_offload_reports_its_optimizer_in_host_memory(llama_dir, batches, tmp_path):  # noqa: F811
    """ZeRO-Offload on the GPU: the float32 masters, the gradients copied down for the CPU Adam
    and the AdamW moments of the (one rank's, so whole) shard are in the host tier of the memory
    events, the device tier holding the model's weights and no optimizer state. (Its losses
    against single: test_strategy_on_the_gpu_equals_single.)"""
    events = tmp_path / "events.jsonl"
    tp.run_probe(llama_dir, batches[0], 4, tmp_path / "r.json", "--events", events, "--plugin",
                 "zero", "--strategy-options",
                 json.dumps({"stage": 2, "offload_optimizer": True, **CUDA}))
    memory = [json.loads(line) for line in events.read_text().splitlines()]
    memory = [e for e in memory if e["type"] == "memory"]
    params = sum(p.numel() for p in tp.LlamaForCausalLM.from_pretrained(llama_dir).parameters())
    device = [e for e in memory if e["tier"] == "device"]
    assert device, memory
    last = device[-1]
    host = memory[memory.index(last) + 1]
    print(f"zero offload: device {last['by_category']}, host {host['by_category']}")
    assert host["tier"] == "host" and host["device"] == "cpu"
    assert host["by_category"]["optimizer"] == 8 * params
    assert host["by_category"]["weights"] == 4 * params  # the float32 masters
    assert host["by_category"]["gradients"] == 4 * params  # copied down through the tier
    assert last["by_category"]["optimizer"] == 0
    assert last["by_category"]["weights"] == 4 * params  # the fp32 compute weights


@pytest.mark.skipif(DEVICE != "cuda", reason="device auto on a machine with a GPU")
@pytest.mark.parametrize("plugin", ["ddp", "zero", "gemini"])
def test_device_auto_trains_on_the_gpu(plugin, llama_dir, batches, tmp_path):  # noqa: F811
    """`device: auto` is the GPU for ddp and zero (a GPU for the one rank) and gemini (its device
    tier, one process): the memory events' device tier is the GPU's."""
    events = tmp_path / "events.jsonl"
    tp.run_probe(llama_dir, batches[0], 3, tmp_path / "r.json", "--events", events, "--plugin",
                 plugin, "--strategy-options", json.dumps({"device": "auto"}))
    memory = [json.loads(line) for line in events.read_text().splitlines()]
    device = [e for e in memory if e["type"] == "memory" and e["tier"] == "device"]
    assert device and device[-1]["device"] == "cuda:0", memory[-3:]


def test_trace_summary_counts_the_device_time_by_category():
    """bench_gpu.py's breakdown of a step: device kernels by category, copies, the busy time as
    the union of overlapping streams, the window; a CPU trace counts only outermost operators."""
    import trace_summary

    def op(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    device = trace_summary.summarize({"traceEvents": [
        op("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 0, 10),
        op("kernel", "vectorized_elementwise_kernel<mul>", 5, 10, tid=2),  # another stream
        op("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 20, 5),
        op("kernel", "pytorch_flash::flash_fwd_kernel", 30, 10),
        op("cpu_op", "aten::mm", 0, 100),  # not counted beside device events
    ]}, steps=2)
    assert device["source"].startswith("device")
    assert device["ms_per_step"] == pytest.approx(
        {"gemm": 5e-3, "elementwise": 5e-3, "copies and casts": 2.5e-3, "attention": 5e-3})
    assert device["busy_ms_per_step"] == pytest.approx(15e-3)  # (0–15, 20–25, 30–40) / 2
    assert device["window_ms_per_step"] == pytest.approx(20e-3)
    assert device["busy_fraction"] == pytest.approx(0.75)
    cpu = trace_summary.summarize([
        op("cpu_op", "aten::linear", 0, 10),
        op("cpu_op", "aten::addmm", 1, 8),  # inside aten::linear
        op("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 12, 4),
        op("cpu_op", "aten::addmm", 2, 3, tid=7),  # another thread's outermost
    ], steps=1)
    assert cpu["source"] == "cpu operators"
    assert cpu["ms_per_step"] == pytest.approx({"gemm": 13e-3, "elementwise": 4e-3})
    assert [row["name"] for row in cpu["top"]] == [
        "aten::linear", "autograd::engine::evaluate_function: MulBackward0", "aten::addmm"]


def test_the_report_names_the_frames_of_a_crash(tmp_path):
    """A program of ours that dies of a fault writes its stack (core/fatal_signals.h); run.sh's
    report finds it in the logs, even inside pytest's assertion text, and names our frames with
    addr2line: PROGRAM(+0xOFFSET) is an offset into that binary, here the one of `main`."""
    import shutil

    cli = os.environ.get("TESSERA_CLI")
    if not (cli and shutil.which("nm") and shutil.which("addr2line")):
        pytest.skip("needs TESSERA_CLI and binutils (nm, addr2line)")
    symbols = subprocess.run(["nm", "-C", cli], capture_output=True, text=True).stdout.splitlines()
    main = next(int(line.split()[0], 16) for line in symbols if line.endswith(" T main"))
    (tmp_path / "pytest-serial.log").write_text(
        "E   AssertionError: dataset x.jsonl: 10 rows\n"
        "E   \n"
        "E   tessera-cli: fatal signal SIGSEGV (invalid memory access); stack, innermost first:\n"
        f"E   {cli}(+0x{main + 4:x})[0x55aa00001000]\n"
        "E   /lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85)[0x7f0000002000]\n"
        "E   tessera-cli: this is a bug in Tessera; please report it\n")
    report = subprocess.run([sys.executable, str(HERE / "report.py"), str(tmp_path)],
                            capture_output=True, text=True, check=True).stdout
    assert "## Crashes (fatal signals)" in report, report
    assert "tessera-cli: SIGSEGV (in pytest-serial.log)" in report, report
    assert f"- `{Path(cli).name}` main" in report, report
    assert "- `libc.so.6` __libc_start_main+0x85" in report, report


@pytest.mark.skipif(DEVICE == "cuda", reason="run.sh runs the benchmark itself on the GPU")
def test_the_benchmark_times_and_profiles_both_sides(tmp_path):
    """bench_gpu.py --smoke (the CPU, a tiny llama) before a GPU session runs it: both sides timed
    and profiled after the timed steps, their losses close, QLoRA timed against LoRA, and the
    report shows the breakdown."""
    out = tmp_path / "logs"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(HERE / "bench_gpu.py"), "--smoke", "--layers", "2", "--steps", "8",
         "--profiled", "2", "--json", str(out / "bench.json"), "--traces", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    bench = json.loads((out / "bench.json").read_text())
    print(done.stdout)
    assert bench["loss_max_rel"] < 1e-2  # bf16 on both sides, the same batches and optimizer
    # The plan of the same job, set against the run (on a GPU: the device tier's peak against
    # the CUDA allocator's).
    plan = bench["plan"]
    assert plan["tier"] == "host" and plan["settings"]["micro_batch"] == 2
    assert plan["step_ratio"] > 0 and plan["peak_ratio"] > 0
    # QLoRA against LoRA on the same base: both timed.
    assert bench["qlora_step_ratio"] > 0, bench.get("qlora_error")
    import trace_summary

    for side in ("ours", "trainer"):
        summary = bench["profile"][side]
        assert summary["steps"] == 2 and summary["source"] == "cpu operators"
        assert summary["ms_per_step"]["gemm"] > 0 and summary["ms_per_step"]["attention"] > 0
        # The trace holds the 2 profiled steps, not the run's 10: each forward of the 2-layer
        # llama makes 15 linear calls (7 per layer and the head), on both sides.
        with gzip.open(out / f"trace-{side}.json.gz") as f:
            every = trace_summary.summarize(json.load(f), 2, top=100000)
        calls = {row["name"]: row["calls_per_step"] for row in every["top"]}
        print(f"profile {side}: aten::linear {calls.get('aten::linear')} calls per step")
        assert calls.get("aten::linear") == 15, calls
    report = subprocess.run([sys.executable, str(HERE / "report.py"), str(out)],
                            capture_output=True, text=True, check=True).stdout
    assert "Where a step goes (2 profiled steps" in report and "| gemm |" in report, report
    assert "the plan of the same job" in report, report
    assert "QLoRA (nf4, double-quantized)" in report, report


# gemini's device tier with the parameter and optimizer shards half in host memory (on the
# suite's CPU leg, gemini on the CPU).
GEMINI_HYBRID = ({"device": "cuda", "host_param_frac": 0.5, "host_optim_frac": 0.5}
                 if DEVICE == "cuda" else {"device": "cpu"})


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "fp4", "fp4-dq", "int8"])
@pytest.mark.parametrize("shape", [(50, 192), (20, 100)])
def test_quantized_tiles_dequantize_on_the_gpu_to_the_cpus_bits(fmt, shape, tmp_path):
    """QLoRA's base on cuda: each tile dequantized by the CUDA module's kernel (one pass from the
    packed codes), into a new tensor or a reused buffer, has the same bits as the CPU's loops and
    as the torch-ops path, in float32, bf16 and fp16: whole weights, rows from inside, bands of
    columns (192 columns: 3 blocks a row), and a short last block (20 x 100 = 31 blocks and 16
    values). On the suite's CPU leg the `device` path is the CPU's loops."""
    torch.manual_seed(3)
    weight = torch.randn(*shape) * 0.05
    weight[1, :5] = 0.0  # a block with zeros, and one larger value
    weight[2, 7] = 1.5
    from safetensors.torch import save_file

    save_file({"weight": weight.contiguous()}, str(tmp_path / "weight.safetensors"))
    args = [str(mp.probe_path()), "--dequantize", fmt.removesuffix("-dq"), "--device", DEVICE,
            "--input", str(tmp_path / "weight.safetensors"), "--output", str(tmp_path / "out.safetensors")]
    if fmt.endswith("-dq"):
        args.append("--double-quant")
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    cases = sorted({name.rsplit(".", 1)[0] for name in out})
    assert len(cases) >= 6, cases  # whole and rows, in three dtypes (bands where 192 columns)
    for case in cases:
        cpu = out[f"{case}.cpu"]
        for path in ("device", "device_into", "ops"):
            assert torch.equal(out[f"{case}.{path}"], cpu), (case, path)
    whole = out["whole.float32.cpu"]
    assert whole.shape == weight.shape
    rel = ((whole - weight).abs().max() / weight.abs().max()).item()
    print(f"{fmt} {shape}: {len(cases)} blocks equal on {DEVICE}; quantization error {rel:.3f} of the largest value")
    assert rel < (0.02 if fmt == "int8" else 0.2)  # the codes hold the weight, not zeros


@pytest.mark.parametrize("fmt,plugin", [("nf4-dq", "single"), ("fp4", "single"), ("int8", "single"),
                                        ("nf4-dq", "gemini")])
def test_qlora_on_the_gpu_equals_the_cpu(fmt, plugin, llama_dir, batches, tmp_path):  # noqa: F811
    """QLoRA on cuda: the quantized base moves to the GPU with the model (single) or with the
    chunks (gemini's device tier, its shards half in host memory), and each tile is dequantized
    there by the CUDA kernel, to the same bits as the CPU's loops (the test above). 10
    steps equal the same run under single on the CPU, whose parity with bitsandbytes + peft is
    parity_qlora's (bitsandbytes is not on the GPU machine)."""
    from peft import LoraConfig

    torch.manual_seed(5)
    base = tp.LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    _, init_file = tp.peft_start(
        base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                         task_type="CAUSAL_LM"), tmp_path / "init")
    flags = ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8, "--lora-init", init_file,
             "--quantize", fmt.removesuffix("-dq"), "--lr", 1e-2, "--schedule", "linear",
             "--max-grad-norm", 1.0]
    if fmt.endswith("-dq"):
        flags.append("--double-quant")
    steps = 10
    cpu = tp.run_probe(llama_dir, batches[0], steps, tmp_path / "cpu.json", *flags,
                       "--strategy-options", json.dumps({"device": "cpu"}))
    ours = tp.run_probe(llama_dir, batches[0], steps, tmp_path / "gpu.json", *flags, "--plugin",
                        plugin, "--strategy-options",
                        json.dumps(GEMINI_HYBRID if plugin == "gemini" else CUDA))
    print(f"QLoRA {fmt} {plugin} {DEVICE} vs single on the cpu: losses rel "
          f"{max_rel(ours['losses'], cpu['losses']):.2e}")
    tp.assert_close(ours["losses"], cpu["losses"], f"{DEVICE} QLoRA {fmt} {plugin} loss", rel=TRAIN_REL)
    assert cpu["losses"][-1] < cpu["losses"][0]  # the adapters learned


def test_qlora_job_on_the_gpu_exports_what_the_cpu_job_does(tmp_path):
    """A QLoRA job through tessera-cli on cuda: the base quantized and held in the GPU's tier
    of the memory events, and its merged export (dequantized on the GPU, merged on the host) computes what the
    same job's export on the CPU computes."""
    from tiny_model import make_tiny_llama, write_text_dataset

    model_dir = tmp_path / "model"
    make_tiny_llama(model_dir, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
    write_text_dataset(tmp_path / "text.jsonl")
    exported = {}
    for device in dict.fromkeys([DEVICE, "cpu"]):
        out, events = tmp_path / f"run-{device}", tmp_path / f"events-{device}.jsonl"
        gen.cli("finetune", "--model", model_dir, "--data", tmp_path / "text.jsonl", "--format",
                "text", "--method", "lora", "--quantize", "nf4", "--lora-rank", "4", "--steps", "6",
                "--batch-size", "4", "--max-length", "32", "--lr", "1e-2", "--strategy", "single",
                "--strategy-options", json.dumps({"device": device}), "--out", out, "--events",
                events)
        records = [json.loads(line) for line in events.read_text().splitlines()]
        logs = [r.get("message", "") for r in records if r["type"] == "log"]
        quantized = [m for m in logs if "quantized 14 linear weights to nf4 (40.5 KiB)" in m]
        assert quantized, logs
        # The tier the model computes in holds the quantized base among its weights.
        tier = "device" if device == "cuda" else "host"
        memory = [r for r in records if r["type"] == "memory" and r["tier"] == tier]
        assert memory and memory[-1]["device"] == where(device), records[-3:]
        assert memory[-1]["by_category"]["weights"] >= 40.5 * 1024, memory[-1]
        exported[device] = tp.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        ours = exported[DEVICE].eval()(input_ids=ids).logits
        cpu = exported["cpu"].eval()(input_ids=ids).logits
    rel = ((ours - cpu).abs().max() / cpu.abs().max()).item()
    print(f"QLoRA job {DEVICE} vs cpu: merged export logits rel {rel:.2e}")
    assert rel <= TRAIN_REL


@pytest.mark.skipif(DEVICE != "cuda", reason="device auto on a machine with a GPU")
@pytest.mark.parametrize("plugin", ["single", "gemini"])
def test_qlora_with_device_auto_trains_on_the_gpu(plugin, llama_dir, batches, tmp_path):  # noqa: F811
    """`device: auto` trains QLoRA on the GPU under single and gemini (its device tier, one
    process): the memory events' device tier is the GPU's and holds the quantized base."""
    events = tmp_path / "events.jsonl"
    tp.run_probe(llama_dir, batches[0], 2, tmp_path / "r.json", "--method", "lora", "--quantize",
                 "nf4", "--events", events, "--plugin", plugin, "--strategy-options",
                 json.dumps({"device": "auto"}))
    memory = [json.loads(line) for line in events.read_text().splitlines()]
    device = [e for e in memory if e["type"] == "memory" and e["tier"] == "device"]
    assert device and device[-1]["device"] == "cuda:0", memory[-3:]
    # The base's codes (half a byte a weight) and absmax are among the GPU's weights.
    params = sum(p.numel() for p in tp.LlamaForCausalLM.from_pretrained(llama_dir).parameters())
    assert device[-1]["by_category"]["weights"] > 0, device[-1]
    print(f"QLoRA {plugin} device auto: device weights {device[-1]['by_category']['weights']} "
          f"bytes for {params} parameters")


@pytest.fixture(scope="module")
def ranks_job_dir(tmp_path_factory):
    """A llama whose sizes split over 2 ranks (heads, kv heads, MLP width, vocabulary) and 2
    pipeline stages (2 layers), with its tokenizer, and instruction data."""
    from tiny_model import SENTENCES
    from tiny_tokenizer import byte_level_bpe

    d = tmp_path_factory.mktemp("ranks")
    fast = byte_level_bpe(SENTENCES, 300)
    torch.manual_seed(0)
    tp.LlamaForCausalLM(tp.LlamaConfig(
        vocab_size=(len(fast) + 7) // 8 * 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0,
        eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)).save_pretrained(d / "llama")
    fast.save_pretrained(d / "llama")
    with open(d / "data.jsonl", "w") as f:
        for a in range(8):
            for b in range(8):
                f.write(json.dumps({"instruction": f"What is {a} plus {b}?", "output": str(a + b)}) + "\n")
    return d


def launch_two_ranks(d, name, plugin, options, method, accumulation, device, precision="fp32", steps=6):
    """`tessera-cli launch --nproc 2` of a job on `device`; on a GPU the two ranks share it
    (TESSERA_TESTS_SHARE_GPU: NCCL refuses two ranks on one GPU, so their collectives go through
    host memory over Gloo). Returns the run's events."""
    out = d / "runs" / name
    lora = {"type": "lora", "rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "o_proj", "down_proj"]}
    spec = {"version": 1, "model": {"path": str(d / "llama")}, "dataset": {"train": str(d / "data.jsonl")},
            "method": lora if method == "lora" else {"type": "full"},
            "precision": precision,
            "training": {"steps": steps, "batch_size": 2, "gradient_accumulation": accumulation,
                         "learning_rate": 2e-3, "warmup_steps": 2, "max_grad_norm": 1.0, "seed": 5},
            "strategy": {"name": plugin, "options": {**options, "device": device}},
            "output": {"dir": str(out)}}
    path = d / f"{name}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, TESSERA_DIST_TIMEOUT_S="60", OMP_NUM_THREADS="2")
    if device == "cuda":
        env["TESSERA_TESTS_SHARE_GPU"] = "1"
    if device == "simulated":
        env["TESSERA_SIMULATED_DEVICE"] = "1"
    done = subprocess.run([str(gen.tool("cli")), "launch", "--nproc", "2", str(path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def exported_difference(ours, theirs, file):
    """The largest difference between two runs' exported tensors, relative to each tensor's
    largest value (at least 1)."""
    a, b = load_file(str(ours / file)), load_file(str(theirs / file))
    assert sorted(a) == sorted(b), file
    return max(float((a[k].float() - b[k].float()).abs().max()) / max(1.0, float(b[k].float().abs().max()))
               for k in a)


@pytest.mark.parametrize("plugin,options,method,accumulation", [
    # tensor parallelism: every layer split over the 2 ranks (all-reduces in forward and backward)
    ("hybrid", {"tp_size": 2}, "full", 1),
    # sequence parallelism: all-gathers and reduce-scatters of the positions
    ("hybrid", {"tp_size": 2, "sequence_parallel": True}, "full", 1),
    ("hybrid", {"tp_size": 2}, "lora", 1),
    # pipeline stages: 1F1B over 2 micro-batches, activations and gradients sent between them
    ("hybrid", {"tp_size": 1, "pp_size": 2}, "full", 2),
    ("hybrid", {"tp_size": 1, "pp_size": 2}, "lora", 2),
    ("ddp", {}, "full", 1),
    ("zero", {"stage": 2}, "full", 1),
    # gemini sharded over 2 ranks with its device tier: half the shards in host memory
    ("gemini", {"chunk_size": "160KiB", "host_param_frac": 0.5, "host_optim_frac": 0.5}, "full", 1),
])
def test_two_ranks_on_the_gpu_equal_the_cpu(plugin, options, method, accumulation, ranks_job_dir):
    """Strategies of several ranks on CUDA — hybrid's tensor, sequence and pipeline parallelism,
    ddp, zero, sharded gemini — with their two ranks on the one GPU this machine has: the same
    job's losses on the CPU, and the GPU in the memory events. (NCCL between two GPUs needs a
    machine with two; here the collectives' CUDA tensors go through host memory.)"""
    name = f"{plugin}-{'-'.join(f'{k}{v}' for k, v in options.items())}-{method}"
    # The CPU has no device tier to place shards between: its reference keeps them in RAM, and
    # the suite's CPU leg runs gemini's device tier on the tests' simulated device.
    reference = {k: v for k, v in options.items() if not k.startswith("host_")}
    device = DEVICE
    if DEVICE == "cpu" and reference != options:
        device, options = "simulated", {**options, "device_budget": "64MiB"}
    ours = launch_two_ranks(ranks_job_dir, name + f"-{device}", plugin, options, method, accumulation, device)
    cpu = launch_two_ranks(ranks_job_dir, name + "-cpu-ref", plugin, reference, method, accumulation, "cpu")
    mine, theirs = [e["loss"] for e in ours if e["type"] == "metric" and "loss" in e], \
        [e["loss"] for e in cpu if e["type"] == "metric" and "loss" in e]
    assert len(mine) == len(theirs) == 6, (mine, theirs)
    # The export, gathered from both ranks (hybrid: from host memory), and LoRA's adapter.
    runs = ranks_job_dir / "runs"
    files = ["model/model.safetensors"] + (["adapter/adapter_model.safetensors"] if method == "lora" else [])
    exported = max(exported_difference(runs / f"{name}-{device}", runs / f"{name}-cpu-ref", f) for f in files)
    print(f"{name} 2 ranks {device} vs cpu: losses rel {max_rel(mine, theirs):.2e}, export {exported:.2e}")
    tp.assert_close(mine, theirs, f"{name} 2 ranks {device} loss", rel=TRAIN_REL)
    assert exported <= TRAIN_REL
    tier = [e for e in ours if e["type"] == "memory" and e["tier"] == "device"]
    if device == "cpu":
        assert not tier
    else:
        assert tier and tier[-1]["device"] == where(device), [e for e in ours if e["type"] == "memory"][-2:]
        assert len(tier[-1].get("ranks", [])) == 2, tier[-1]
    if device == "cuda":
        logs = [e.get("message", "") for e in ours if e["type"] == "log"]
        assert any("the ranks share GPUs" in m for m in logs), logs


@pytest.mark.skipif(DEVICE != "cuda", reason="fp16 with loss scaling needs CUDA")
@pytest.mark.parametrize("options,accumulation", [({"tp_size": 2}, 1), ({"tp_size": 1, "pp_size": 2}, 2)])
def test_two_ranks_of_hybrid_in_fp16_follow_fp32(options, accumulation, ranks_job_dir):
    """fp16 under hybrid: a step whose gradients overflow on one rank only (the head's, on the
    last pipeline stage; one tensor rank's block) is skipped by every rank, each halving its loss
    scale with the others (the skip decides by the global norm), so the run trains as fp32 does."""
    name = "hybrid-" + "-".join(f"{k}{v}" for k, v in options.items())
    runs = {precision: launch_two_ranks(ranks_job_dir, f"{name}-{precision}", "hybrid", options, "full",
                                        accumulation, DEVICE, precision=precision, steps=16)
            for precision in ("fp32", "fp16")}
    losses = {p: [e["loss"] for e in events if e["type"] == "metric" and "loss" in e] for p, events in runs.items()}
    print(f"{name} fp16 vs fp32 on {DEVICE}: last {losses['fp16'][-1]:.4f} vs {losses['fp32'][-1]:.4f}")
    assert all(math.isfinite(x) for x in losses["fp16"]), losses["fp16"]
    assert losses["fp16"][-1] < losses["fp16"][0]
    assert abs(losses["fp16"][-1] - losses["fp32"][-1]) <= 0.1 * losses["fp32"][-1]
