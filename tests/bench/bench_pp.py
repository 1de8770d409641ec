"""Pipeline parallelism on this machine (issue 26): strategy `hybrid` at pp 2 against PyTorch's own
pipeline parallelism (torch.distributed.pipelining, Schedule1F1B) on the same transformers model,
and each stage's measured bubble against the 1F1B theory.

bench_dist.py's generated llama (about 5M parameters, random init; BENCH_PP_LAYERS layers), packed
text blocks of SEQ tokens, BENCH_PP_MICRO micro-batches of BATCH per step (gradient accumulation),
fp32, AdamW, clipping 1.0:

  single@2t   tessera-cli run, 1 process, 2 threads, the same micro-batches accumulated; peer: the
              transformers model in PyTorch with the same accumulation
  pp2         tessera-cli launch --nproc 2, strategy hybrid tp_size 1 pp_size 2, 1 thread per rank
              (Gloo on loopback); peer: the model cut at the same layer as ours (the split our
              planner's cost balance chose, read from our run's log) into two PipelineStage
              modules, Schedule1F1B over the same number of micro-batches, Gloo, 1 thread per rank
  pp2x2chunk  the same with pp_chunks 2 (interleaved 1F1B, one layer per virtual stage; needs the
              default 4 layers); peer: ScheduleInterleaved1F1B over the same 4 virtual stages

Printed per side: tokens/s (the median measured step: ours from the metric events' job
throughput, the peer's from its own step timings, each step ending at a barrier), ours ÷ peer,
pp2 ÷ single@2t, and for ours each stage's idle share of the step (the metric events'
ranks[].pipeline_idle_s ÷ step_s) ÷ the 1F1B bubble (p − 1) / (m + p − 1). The theory assumes
equal stages; layers come whole, so stages differ, and a faster stage also waits for the slower
one. The pipeline's bubble is therefore the idle share of the stage that computes longest (the
critical path; goal <= 1.15 × theory), and the others' extra wait is the stages' imbalance,
printed beside. It fails when a side
crashes or ours at pp 2 differs from ours in one process by more than 1e-4 relative in any loss.
Environment: BENCH_PP_STEPS (measured steps, default 6), BENCH_PP_WARMUP (default 2),
BENCH_PP_LAYERS (default 4), BENCH_PP_MICRO (default 4).
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
os.environ.setdefault("BENCH_DIST_LAYERS", os.environ.get("BENCH_PP_LAYERS", "4"))
import bench_dist  # noqa: E402  (the model, the text and the CPU description)

CLI = bench_dist.CLI
SEQ, BATCH, LR = bench_dist.SEQ, bench_dist.BATCH, bench_dist.LR
WARMUP = int(os.environ.get("BENCH_PP_WARMUP", "2"))
STEPS = int(os.environ.get("BENCH_PP_STEPS", "6"))
MICRO = int(os.environ.get("BENCH_PP_MICRO", "4"))


def run_ours(folder, name, strategy, options, nproc, threads):
    spec = bench_dist.spec_of(folder, name, strategy, options, MICRO, WARMUP + STEPS)
    return bench_dist.run_cli_job(folder, name, spec, nproc, threads)


def peer_child(model_dir, rank, world, port, threads, cut, report):
    """`bench_pp.py --peer MODEL RANK WORLD PORT THREADS CUT REPORT`: the PyTorch side; CUT is the
    first layer of stage 1."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    vocab = model.config.vocab_size

    def loss_of(logits, labels):
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1)) / MICRO

    class Stage(torch.nn.Module):
        """Layers [first, end) of the model, with the embedding before layer 0 and the norm and
        head after the last; rotary tables made from the positions, causal attention."""

        def __init__(self, first, end):
            super().__init__()
            count = len(model.model.layers)
            self.embed = model.model.embed_tokens if first == 0 else None
            self.layers = torch.nn.ModuleList(model.model.layers[first:end])
            self.rotary = model.model.rotary_emb
            self.norm = model.model.norm if end == count else None
            self.head = model.lm_head if end == count else None

        def forward(self, x):
            h = self.embed(x) if self.embed is not None else x
            positions = torch.arange(h.shape[1]).unsqueeze(0)
            cos_sin = self.rotary(h, positions)
            for layer in self.layers:
                h = layer(h, position_ids=positions, position_embeddings=cos_sin)
                h = h[0] if isinstance(h, tuple) else h
            return self.head(self.norm(h)) if self.head is not None else h

    generator = torch.Generator().manual_seed(0)
    seconds = []
    if world == 1:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        for _ in range(WARMUP + STEPS):
            t0 = time.perf_counter()
            for _ in range(MICRO):
                ids = torch.randint(3, vocab, (BATCH, SEQ), generator=generator)
                loss_of(model(input_ids=ids).logits, ids).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds.append(time.perf_counter() - t0)
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        count = len(model.model.layers)
        if cut > 0:
            module = Stage(0, cut) if rank == 0 else Stage(cut, count)
            stage = PipelineStage(module, rank, world, torch.device("cpu"))
            schedule = Schedule1F1B(stage, MICRO, loss_fn=loss_of)
        else:  # interleaved: one layer per virtual stage, rank r holding virtual stages r, r + world, …
            chunks = count // world
            modules = [Stage(g, g + 1) for g in range(rank, count, world)]
            module = torch.nn.ModuleList(modules)
            stages = [PipelineStage(m, g, count, torch.device("cpu")) for m, g in zip(modules, range(rank, count, world))]
            schedule = ScheduleInterleaved1F1B(stages, MICRO, loss_fn=loss_of)
            assert chunks == 2
        optimizer = torch.optim.AdamW(module.parameters(), lr=LR)
        for _ in range(WARMUP + STEPS):
            t0 = time.perf_counter()
            ids = torch.randint(3, vocab, (MICRO * BATCH, SEQ), generator=generator)  # same on both stages
            if rank == 0:
                schedule.step(ids)
            else:
                schedule.step(target=ids)  # the last (virtual) stage is this rank's
            # The global norm over both stages' parameters, as ours clips.
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            squares = sum((g.norm() ** 2 for g in grads), torch.zeros(()))
            dist.all_reduce(squares)
            coefficient = torch.clamp(1.0 / (squares.sqrt() + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coefficient)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dist.barrier()
            seconds.append(time.perf_counter() - t0)
    if rank == 0:
        Path(report).write_text(json.dumps({"step_seconds": seconds}))
    if world > 1:
        dist.destroy_process_group()


def run_peer(folder, world, threads, cut):
    report = folder / f"peer-pp-{world}-{cut}.json"
    bench_dist.spawn_peers(__file__, lambda rank, port: [folder / "model", rank, world, port, threads, cut, report],
                           world, threads, f"pp {world}")
    return MICRO * BATCH * SEQ / statistics.median(json.loads(report.read_text())["step_seconds"][WARMUP:])


def main():
    bench_dist.announce("bench_pp")
    with tempfile.TemporaryDirectory(prefix="tessera-bench-pp-") as tmp:
        folder = Path(tmp)
        parameters = bench_dist.make_model(folder)
        config = json.loads((folder / "model" / "config.json").read_text())
        print(f"  llama {parameters / 1e6:.2f}M parameters ({config['num_hidden_layers']} layers), {MICRO} "
              f"micro-batches of {BATCH} x {SEQ} tokens per step, fp32, {WARMUP} warm-up + {STEPS} measured "
              f"steps; load average {os.getloadavg()[0]:.2f}")
        single = run_ours(folder, "single", "single", {}, 1, 2)
        pp2 = run_ours(folder, "pp2", "hybrid", {"tp_size": 1, "pp_size": 2}, 2, 1)
        stages = [e["message"] for e in pp2 if e.get("type") == "log" and "pipeline stages hold" in e.get("message", "")]
        if not stages:
            raise SystemExit("FAIL: the pp 2 run did not log its stages")
        # "... hold layers 0-2 | layers 3": stage 1 starts after the first range.
        first_range = stages[0].split("hold ", 1)[1].split(" | ")[0].removeprefix("layers ")
        cut = int(first_range.split("-")[-1]) + 1
        peer_single = run_peer(folder, 1, 2, cut)
        peer_pp2 = run_peer(folder, 2, 1, cut)
        # Interleaved: 2 chunks of one layer per stage (needs the default 4 layers).
        interleaved = run_ours(folder, "pp2x2", "hybrid", {"tp_size": 1, "pp_size": 2, "pp_chunks": 2}, 2, 1)
        peer_interleaved = run_peer(folder, 2, 1, 0)

    def metrics(events):
        return [e for e in events if e.get("type") == "metric" and "loss" in e]

    def tokens_per_s(events):
        return statistics.median(m["tokens_per_s"] for m in metrics(events)[WARMUP:])

    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                for run in (pp2, interleaved) for a, b in zip(metrics(run), metrics(single)))
    theory = (2 - 1) / (MICRO + 2 - 1)

    def idle_shares(run):
        idle = {}
        for m in metrics(run)[WARMUP:]:
            for rank in m["ranks"]:
                idle.setdefault(rank["rank"], []).append(rank["pipeline_idle_s"] / rank["step_s"])
        return {rank: statistics.median(s) for rank, s in idle.items()}
    idle = idle_shares(pp2)
    ours_single, ours_pp2 = tokens_per_s(single), tokens_per_s(pp2)
    ours_interleaved = tokens_per_s(interleaved)
    print(f"  stages: {stages[0].split('hold ', 1)[1]} (peer cut at layer {cut})")
    print(f"\n  {'side':10s} {'procs':>5s} {'tokens/s':>9s} {'peer tok/s':>10s} {'ours÷peer':>9s} {'÷single@2t':>10s}")
    print(f"  {'single@2t':10s} {1:5d} {ours_single:9.0f} {peer_single:10.0f} {ours_single / peer_single:9.3f} "
          f"{1.0:10.3f}")
    print(f"  {'pp2':10s} {2:5d} {ours_pp2:9.0f} {peer_pp2:10.0f} {ours_pp2 / peer_pp2:9.3f} "
          f"{ours_pp2 / ours_single:10.3f}")
    print(f"  {'pp2x2chunk':10s} {2:5d} {ours_interleaved:9.0f} {peer_interleaved:10.0f} "
          f"{ours_interleaved / peer_interleaved:9.3f} {ours_interleaved / ours_single:10.3f}")
    for rank, share in sorted(idle.items()):
        print(f"  pp2 stage {rank}: idle {share:.3f} of the step; 1F1B theory {theory:.3f}; "
              f"measured ÷ theory {share / theory:.3f}")
    interleaved_theory = (2 - 1) / (2 * MICRO + 2 - 1)
    for rank, share in sorted(idle_shares(interleaved).items()):
        print(f"  pp2x2chunk stage {rank}: idle {share:.3f} of the step; interleaved theory "
              f"{interleaved_theory:.3f}; measured ÷ theory {share / interleaved_theory:.3f}")
    print(f"  pp2's and pp2x2chunk's losses against one process: {worst:.2e} relative (bound 1e-4)")
    shares = idle
    critical = min(shares, key=shares.get)  # the stage that waits least computes longest
    imbalance = max(shares.values()) - shares[critical]
    print(f"  critical path: stage {critical}; the other stages wait up to {imbalance:.3f} of the step more "
          f"(their layers cost less: layers come whole)")
    interleaved_shares = idle_shares(interleaved)
    interleaved_critical = min(interleaved_shares.values()) / interleaved_theory
    print(f"bench_pp: ours ÷ PyTorch pipelining at pp 2 {ours_pp2 / peer_pp2:.3f}, interleaved "
          f"{ours_interleaved / peer_interleaved:.3f} (goal >= 1.0); bubble (critical-path stage) "
          f"÷ theory {shares[critical] / theory:.3f}, interleaved {interleaved_critical:.3f} (goal <= 1.15)")
    if worst > 1e-4:
        raise SystemExit(f"FAIL: pp 2's losses differ from one process's by {worst:.2e} relative")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        peer_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                   int(sys.argv[7]), sys.argv[8])
    else:
        main()
