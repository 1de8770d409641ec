"""`tessera-cli inspect` and `tokenize` report what transformers sees in a model folder, and
fail with exit code 2 and a message naming the file on bad input (never a signal)."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CLI = os.environ.get("TESSERA_CLI", str(Path(__file__).resolve().parents[2] / "build/app/cli/tessera-cli"))

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def run(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    corpus = ["hello world", "fine-tune the model", "the quick brown fox"] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(d)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config)
    model.save_pretrained(d, max_shard_size="20KB")  # several shards + index
    return d


def test_inspect_matches_transformers(llama_dir):
    r = run("inspect", llama_dir, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    model = LlamaForCausalLM.from_pretrained(llama_dir)
    tok = AutoTokenizer.from_pretrained(llama_dir)
    assert info["model_type"] == "llama"
    assert info["parameters"] == model.num_parameters()
    assert info["tokenizer"]["vocab_size"] == len(tok)
    assert info["chat_template"] == "chatml"
    assert info["num_key_value_heads"] == 2
    assert len(info["files"]) > 1, "the model was saved in several shards"
    assert sum(f["tensors"] for f in info["files"]) == len(model.state_dict())
    assert info["special_tokens"]["eos"] == "<|im_end|>"
    human = run("inspect", llama_dir)
    assert human.returncode == 0 and "chatml" in human.stdout and "llama" in human.stdout


def test_tokenize_json_matches_transformers(llama_dir, tmp_path):
    texts = ["hello world", "the  quick\tbrown fox\n", "<|im_start|>user hi<|im_end|>"]
    tok = AutoTokenizer.from_pretrained(llama_dir)
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(texts) + "\n")
    r = run("tokenize", "--model", llama_dir, "--json", "--file", f)
    assert r.returncode == 0, r.stderr
    ours = [json.loads(line) for line in r.stdout.splitlines()]
    # --file gives one array per line of the file (lines without their newline).
    assert ours == [tok(t.rstrip("\n"))["input_ids"] for t in "\n".join(texts).split("\n")]


def test_bad_inputs_exit_2_with_the_file_named(llama_dir, tmp_path):
    # A truncated shard.
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in llama_dir.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    r = run("inspect", broken)
    assert r.returncode == 2
    assert shard.name in r.stderr

    # A pickle checkpoint is refused, not unpickled.
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((llama_dir / "config.json").read_text())
    torch.save({"w": torch.zeros(2)}, pickled / "pytorch_model.bin")
    r = run("inspect", pickled)
    assert r.returncode == 2
    assert "pytorch_model.bin" in r.stderr and "pickle" in r.stderr.lower()

    # An unsupported architecture names what is supported.
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "vocab_size": 10}))
    r = run("inspect", t5)
    assert r.returncode == 2 and "t5" in r.stderr and "llama" in r.stderr

    # Usage errors.
    assert run("inspect").returncode == 2
    assert run("inspect", llama_dir, "--bogus").returncode == 2
    assert run("tokenize", "--model", tmp_path / "absent", "x").returncode == 2
    assert run("no-such-command").returncode == 2
