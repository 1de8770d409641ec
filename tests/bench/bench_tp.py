"""Tensor parallelism on this machine (issue 26): strategy `hybrid` at tp 2 against PyTorch's own
tensor parallelism (torch.distributed.tensor.parallel) on the same transformers model, and the
bytes its tensor group communicates per step against Megatron's volume.

bench_dist.py's generated llama (about 5M parameters, random init; BENCH_TP_LAYERS layers), packed
text blocks of SEQ tokens, one micro-batch of BATCH per step, fp32, AdamW, clipping 1.0:

  single@2t   tessera-cli run, 1 process, 2 threads; peer: the transformers model in PyTorch
  tp2         tessera-cli launch --nproc 2, strategy hybrid tp_size 2, 1 thread per rank (Gloo
              on loopback); peer: the same model with q/k/v and gate/up ColwiseParallel and o and
              down RowwiseParallel (parallelize_module over a 2-rank CPU device mesh, Gloo), the
              embedding and the head whole on both ranks (ours splits those by vocabulary too)
  tp2sp       the same with sequence parallelism: ours sequence_parallel true; peer: PyTorch's
              SequenceParallel on the layer norms (input, post-attention, final), the attention's
              and the MLP's input gathered over the sequence (PrepareModuleInput Shard(1) →
              Replicate), o and down RowwiseParallel to Shard(1) (a reduce-scatter), the residual
              stream between them each rank's sequence block, the embedding's output split and
              the head's input gathered (both whole, as at tp2)

Printed per side: tokens/s (the median measured step: ours from the metric events' job
throughput, the peer's from its own step timings, each step ending at a barrier), ours ÷ peer,
tp2 ÷ single@2t (what splitting the layers over 2 one-thread processes costs or saves here), and
for ours at tp 2 the metric events' tensor_traffic ring bytes ÷ Megatron's volume
(docs/events.md; goal <= 1.1). It fails when a side crashes or ours at tp 2 differs from ours in
one process by more than 1e-4 relative in any loss. Environment: BENCH_TP_STEPS (measured steps,
default 6), BENCH_TP_WARMUP (default 2), BENCH_TP_LAYERS (default 4).
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("BENCH_DIST_LAYERS", os.environ.get("BENCH_TP_LAYERS", "4"))
import bench_dist  # noqa: E402  (the model, the text and the CPU description)

CLI = bench_dist.CLI
SEQ, BATCH, LR = bench_dist.SEQ, bench_dist.BATCH, bench_dist.LR
WARMUP = int(os.environ.get("BENCH_TP_WARMUP", "2"))
STEPS = int(os.environ.get("BENCH_TP_STEPS", "6"))


def run_ours(folder, name, strategy, options, nproc, threads):
    spec = bench_dist.spec_of(folder, name, strategy, options, 1, WARMUP + STEPS)
    events = bench_dist.run_cli_job(folder, name, spec, nproc, threads)
    return [e for e in events if e.get("type") == "metric" and "loss" in e]


def clip(model, max_norm, world):
    """clip_grad_norm_ over a model whose parameters are part DTensors (clip_grad_norm_ itself
    refuses the mix): the squared norms of the sharded gradients' local blocks summed over the
    ranks, the replicated ones counted once, as ours computes it."""
    import torch
    import torch.distributed as dist

    sharded, replicated, grads = torch.zeros(()), torch.zeros(()), []
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad
        if world > 1 and hasattr(g, "placements"):
            local = g.to_local()
            if any(placement.is_shard() for placement in g.placements):
                sharded += local.norm() ** 2
            else:
                replicated += local.norm() ** 2
            grads.append(local)
        else:
            replicated += g.norm() ** 2
            grads.append(g)
    if world > 1:
        dist.all_reduce(sharded)
    coefficient = torch.clamp(max_norm / ((sharded + replicated).sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient)


def peer_child(model_dir, rank, world, port, threads, report, sequence_parallel=False):
    """`bench_tp.py --peer MODEL RANK WORLD PORT THREADS REPORT [sp]`: the PyTorch side."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel()}
        if sequence_parallel:
            from torch.distributed.tensor import Replicate, Shard
            from torch.distributed.tensor.parallel import (PrepareModuleInput, PrepareModuleOutput,
                                                           SequenceParallel)
            plan.update({
                "input_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
                "post_attention_layernorm": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
            })
            parallelize_module(model, mesh, {
                "model.embed_tokens": PrepareModuleOutput(output_layouts=Replicate(),
                                                          desired_output_layouts=Shard(1)),
                "model.norm": SequenceParallel(),
                "lm_head": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                              use_local_output=True),
            })
        for layer in model.model.layers:
            parallelize_module(layer, mesh, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(0)  # the same batch on both ranks of the tensor group
    vocab = model.config.vocab_size
    seconds, losses = [], []
    for _ in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        ids = torch.randint(3, vocab, (BATCH, SEQ), generator=generator)
        if sequence_parallel:
            # The embedding's output is each rank's block of positions: transformers would take
            # the positions (rotary, causal mask) from its length, so they are given whole.
            positions = torch.arange(SEQ)
            loss = model(input_ids=ids, labels=ids, position_ids=positions.unsqueeze(0),
                         cache_position=positions).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        clip(model, 1.0, world)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.barrier()
        seconds.append(time.perf_counter() - t0)
    if rank == 0:
        Path(report).write_text(json.dumps({"step_seconds": seconds, "losses": losses}))
    if world > 1:
        dist.destroy_process_group()


def run_peer(folder, world, threads, sequence_parallel=False):
    report = folder / f"peer-tp-{world}{'-sp' if sequence_parallel else ''}.json"
    bench_dist.spawn_peers(__file__, lambda rank, port: [folder / "model", rank, world, port, threads, report,
                                                        *(["sp"] if sequence_parallel else [])],
                           world, threads, f"tp {world}{' sp' if sequence_parallel else ''}")
    measured = json.loads(report.read_text())
    return BATCH * SEQ / statistics.median(measured["step_seconds"][WARMUP:]), measured["losses"]


def main():
    bench_dist.announce("bench_tp")
    with tempfile.TemporaryDirectory(prefix="tessera-bench-tp-") as tmp:
        folder = Path(tmp)
        parameters = bench_dist.make_model(folder)
        config = json.loads((folder / "model" / "config.json").read_text())
        print(f"  llama {parameters / 1e6:.2f}M parameters ({config['num_hidden_layers']} layers), {BATCH} x {SEQ} "
              f"tokens per step, fp32, {WARMUP} warm-up + {STEPS} measured steps; load average "
              f"{os.getloadavg()[0]:.2f}")
        single = run_ours(folder, "single", "single", {}, 1, 2)
        tp2 = run_ours(folder, "tp2", "hybrid", {"tp_size": 2}, 2, 1)
        tp2sp = run_ours(folder, "tp2sp", "hybrid", {"tp_size": 2, "sequence_parallel": True}, 2, 1)
        peer_single, _ = run_peer(folder, 1, 2)
        peer_tp2, peer_tp2_losses = run_peer(folder, 2, 1)
        peer_tp2sp, peer_tp2sp_losses = run_peer(folder, 2, 1, sequence_parallel=True)
    # The peer's sequence-parallel plan computes what its tensor-parallel one does (else the
    # comparison would time something else).
    peer_worst = max(abs(a - b) / abs(b) for a, b in zip(peer_tp2sp_losses, peer_tp2_losses))

    def tokens_per_s(metrics):
        return statistics.median(m["tokens_per_s"] for m in metrics[WARMUP:])

    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                for side in (tp2, tp2sp) for a, b in zip(side, single))
    hidden, layers, tp, tokens = config["hidden_size"], config["num_hidden_layers"], 2, BATCH * SEQ
    theory = 2 * (tp - 1) / tp * ((4 * layers + 2) * tokens * hidden * 4 + 8 * tokens) + (tp - 1) * 4 * tokens
    ring = statistics.mean(m["tensor_traffic"]["ring_bytes"] for m in tp2[WARMUP:]) / theory
    # Sequence parallelism moves the all-reduces' bytes as all-gather + reduce-scatter pairs, and
    # Megatron-LM gathers each column-parallel input again in backward for its weight gradient
    # (q/k/v, gate/up): 2 more gathers of b·s·h per layer.
    theory_sp = theory + 2 * layers * (tp - 1) / tp * tokens * hidden * 4
    ring_sp = statistics.mean(m["tensor_traffic"]["ring_bytes"] for m in tp2sp[WARMUP:]) / theory_sp
    ours_single, ours_tp2, ours_tp2sp = tokens_per_s(single), tokens_per_s(tp2), tokens_per_s(tp2sp)
    print(f"\n  {'side':10s} {'procs':>5s} {'tokens/s':>9s} {'peer tok/s':>10s} {'ours÷peer':>9s} "
          f"{'÷single@2t':>10s} {'ring÷Megatron':>13s}")
    print(f"  {'single@2t':10s} {1:5d} {ours_single:9.0f} {peer_single:10.0f} {ours_single / peer_single:9.3f} "
          f"{1.0:10.3f} {'-':>13s}")
    print(f"  {'tp2':10s} {2:5d} {ours_tp2:9.0f} {peer_tp2:10.0f} {ours_tp2 / peer_tp2:9.3f} "
          f"{ours_tp2 / ours_single:10.3f} {ring:13.3f}")
    print(f"  {'tp2sp':10s} {2:5d} {ours_tp2sp:9.0f} {peer_tp2sp:10.0f} {ours_tp2sp / peer_tp2sp:9.3f} "
          f"{ours_tp2sp / ours_single:10.3f} {ring_sp:13.3f}")
    print(f"  tp2's and tp2sp's losses against one process: {worst:.2e} relative (bound 1e-4)")
    print(f"bench_tp: ours ÷ PyTorch tensor parallelism at tp 2 {ours_tp2 / peer_tp2:.3f}, with sequence "
          f"parallelism {ours_tp2sp / peer_tp2sp:.3f} (goal >= 1.0); tensor-group ring bytes ÷ Megatron's "
          f"volume {ring:.3f}, with sequence parallelism {ring_sp:.3f} (goal <= 1.1)")
    print(f"  the peer's tp2sp losses against its tp2: {peer_worst:.2e} relative (bound 1e-4)")
    if worst > 1e-4:
        raise SystemExit(f"FAIL: tp 2's losses differ from one process's by {worst:.2e} relative")
    if peer_worst > 1e-4:
        raise SystemExit(f"FAIL: the peer's sequence-parallel losses differ from its tp 2's by {peer_worst:.2e}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        peer_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7],
                   sequence_parallel=len(sys.argv) > 8 and sys.argv[8] == "sp")
    else:
        main()
