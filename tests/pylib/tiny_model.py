"""The tiny random Llama the fault and parity tests train: a byte-level BPE tokenizer fitted on
short arithmetic sentences and a LlamaForCausalLM with random weights from transformers, saved
together in one folder, plus those sentences as a JSONL text dataset."""
import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tiny_tokenizer import byte_level_bpe

SENTENCES = [f"{a} and {b} make {a + b}" for a in range(20) for b in range(20)]


def make_tiny_llama(folder, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=2, seed=0):
    """Writes the tokenizer and the model to `folder`; returns the tokenizer."""
    fast = byte_level_bpe(SENTENCES, 300)
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=intermediate,
                                 num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                 bos_token_id=0, eos_token_id=1, pad_token_id=2)).save_pretrained(folder)
    return fast


def write_text_dataset(path, lines=SENTENCES):
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
