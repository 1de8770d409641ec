"""engine/parallel's tensor-parallel layers across real local processes (tessera-tp-tool, one
process per rank, torchrun's variables set by hand, Gloo on loopback): a small language model's
vocabulary-parallel embedding, column-parallel gate/up and row-parallel down projections (with
biases), vocabulary-parallel head and cross-entropy (with ignored targets), computed over 2 and 4
ranks and over the tensor groups of a 2 × 2 (data × tensor) mesh, give the loss, the logits and
every weight's gradient block of the same model computed whole (fp32, 1e-5); a split that does
not divide is refused naming the tensor and the sizes. Then real checkpoints made by transformers
(llama, qwen2, mistral, gpt2 with its dropout) split by their family's tensor-parallel plan (parallel/split_model.h)
against the whole model: loss, logits and every gradient block."""
import os
import socket
import subprocess
from pathlib import Path

import pytest


def tool() -> Path:
    tools = os.environ.get("TESSERA_TOOLS_DIR")
    if not tools:
        pytest.skip("TESSERA_TOOLS_DIR is not set (run through ctest)")
    return Path(tools) / "tessera-tp-tool"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_layers_equal_the_whole_model(world):
    for rank, (code, out, err) in enumerate(run_ranks(world, "layers")):
        assert code == 0, f"rank {rank}: exit {code}\n{out}\n{err}"
        assert out.strip() == f"ok rank {rank} of {world}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny random models made by transformers: llama (untied head), qwen2 (q/k/v biases, tied
    head) and mistral (a sliding window), 4 attention heads over 2 kv heads, and gpt2 (dropout
    0.1); vocabulary 64."""
    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)
    root = tmp_path_factory.mktemp("tp-models")
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    makers = {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=False)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**sizes, tie_word_embeddings=True)),
        "mistral": lambda: MistralForCausalLM(MistralConfig(**sizes, sliding_window=6)),
        # Its default dropout (0.1 on embeddings, attention probabilities and residuals), the
        # fused c_attn split by heads in each of q, k and v, Conv1D weights, a tied head.
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                   n_positions=64)),
    }
    for family, make in makers.items():
        torch.manual_seed(0)
        make().save_pretrained(root / family)
    return root


def run_ranks(world, *args):
    port = free_port()
    base = {k: v for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    ranks = []
    for rank in range(world):
        env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
               "TESSERA_DIST_TIMEOUT_S": "30", "OMP_NUM_THREADS": "1"}
        ranks.append(subprocess.Popen([str(tool()), *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return [(p.wait(timeout=120), *p.communicate()) for p in ranks]


@pytest.mark.parametrize("family,world", [("llama", 2), ("qwen2", 2), ("mistral", 2), ("gpt2", 2), ("llama", 4)])
def test_a_model_split_by_its_family_plan_equals_the_whole_model(models, family, world):
    """parallel/split_model.h on real checkpoints: loss, logits and every gradient block equal the
    whole model's at tp 2 (with 4 ranks: the two tensor groups of a 2 × 2 mesh, and tp 4 over the
    world, where each of the 2 kv heads is held by 2 ranks)."""
    for rank, (code, out, err) in enumerate(run_ranks(world, "model", models / family)):
        assert code == 0, f"rank {rank}: exit {code}\n{out}\n{err}"
        assert out.strip() == f"ok rank {rank} of {world}"
