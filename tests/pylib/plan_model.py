"""The planner tests' model (tests/parity/test_plan_estimate.py, tests/integration/
test_plan_ranks.py, tests/bench/bench_plan.py): a llama of ~21M parameters (hidden 512, 4 layers,
vocabulary 8000) with random weights, sized so that weights, optimizer state and activations are
each a visible share of a run's peak above the runtime, its byte-level tokenizer fitted on random
words, and those words' lines as a JSONL text dataset."""
import json
import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tiny_tokenizer import byte_level_bpe


def make_plan_model(folder, lines=300):
    """Writes folder/model (tokenizer and weights, seed 0) and folder/text.jsonl (`lines` lines of
    60 random words); returns the model's parameter count."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(600)]
    text = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(lines)]
    fast = byte_level_bpe(text, 1000)
    fast.save_pretrained(folder / "model")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376,
                                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                                         max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
                                         pad_token_id=2))
    model.save_pretrained(folder / "model")
    with open(folder / "text.jsonl", "w") as f:
        for line in text:
            f.write(json.dumps({"text": line}) + "\n")
    return sum(p.numel() for p in model.parameters())
