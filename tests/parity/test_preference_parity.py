"""Preference tuning against TRL (issue 27): per-step loss, rewards, margins, reward accuracy and
log-probabilities of our trainer equal TRL's on the same model, token ids and hyperparameters,
within 1e-5 relative in fp32 — full fine-tuning and LoRA.

- DPO (sigmoid, label smoothing 0) and IPO: TRL's DPOTrainer, trained by its own loop. With
  label smoothing, DPOTrainer 1.x has no conservative sigmoid; ours is checked against the
  formula on TRL's log-probabilities (test_label_smoothing_is_the_conservative_dpo_loss).
- SimPO: TRL's CPOTrainer with loss_type "simpo"; ORPO: TRL's ORPOTrainer; KTO: TRL's
  KTOTrainer (unpaired examples, its KL estimate from the mismatched rows TRL builds).

Each TRL trainer tokenizes the text pairs itself; its tokenized dataset, collated as its collator
does (prompt + completion, chosen rows first, right padding, the prompt out of the loss), is
what tessera-train-probe trains on, so both sides see the same ids. One batch holds every pair,
so the order a sampler draws them in does not matter.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from tiny_model import make_tiny_llama  # noqa: E402
from train_probe import run_probe, save_pair_batch as save_batch  # noqa: E402

trl = pytest.importorskip("trl")

REL_TOL = 1e-5
STEPS = 6
PAIRS = [
    ("2 and 3 make", " 5", " 7"),
    ("4 and 4 make", " 8", " 9"),
    ("10 and 1 make", " 11", " 3"),
    ("6 and 7 make", " 13", " 12"),
]
METRICS = {  # TRL's log name -> the probe report's
    "rewards/chosen": "reward_chosen",
    "rewards/rejected": "reward_rejected",
    "rewards/margins": "reward_margin",
    "rewards/accuracies": "reward_accuracy",
    "logps/chosen": "log_prob_chosen",
    "logps/rejected": "log_prob_rejected",
}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    make_tiny_llama(folder, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2)
    return folder


def text_pairs():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])


def prompt_completion_rows(dataset):
    """DPOTrainer's tokenized columns as (ids, labels) rows: the prompt out of the loss."""
    def row(prompt, completion):
        return prompt + completion, [-100] * len(prompt) + completion

    chosen = [row(e["prompt_ids"], e["chosen_ids"]) for e in dataset]
    rejected = [row(e["prompt_ids"], e["rejected_ids"]) for e in dataset]
    return chosen, rejected


class History:
    """A TrainerCallback that keeps the logged training steps."""

    def __init__(self):
        from transformers import TrainerCallback

        steps = self.steps = []

        class Keep(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    steps.append(dict(logs))

        self.callback = Keep()


def trl_args(config_class, folder, lr, **extra):
    return config_class(output_dir=str(folder), max_steps=STEPS, per_device_train_batch_size=len(PAIRS),
                        learning_rate=lr, lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0,
                        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                        dataloader_drop_last=False, remove_unused_columns=False,
                        # TRL's own defaults are bf16 autocast and activation checkpointing: fp32 here
                        bf16=False, gradient_checkpointing=False, **extra)


def assert_close(ours, theirs, what, floors=None):
    assert len(ours) == len(theirs) == STEPS, f"{what}: {len(ours)} vs {len(theirs)} steps"
    for step, (a, b) in enumerate(zip(ours, theirs)):
        floor = 1e-7 if floors is None else floors[step]
        assert abs(a - b) <= REL_TOL * abs(b) + floor, f"{what}: step {step + 1}: ours {a!r} vs TRL {b!r}"


def compare(report, history, beta, kto=False):
    assert_close(report["losses"], [h["loss"] for h in history], "loss")
    # KTO is unpaired: no reward accuracy; its KL estimate instead.
    metrics = {k: v for k, v in METRICS.items() if not (kto and k == "rewards/accuracies")}
    if kto:
        metrics["kl"] = "kl"
    # A reward is β times a float32 log-probability sum, or a difference of two (TRL's values are
    # float32): near zero its last bits are those sums', two ulps of |log p| (2^-22 relative) at
    # least — a GEMM summing in another order (AMX, AVX-512, AVX2) moves them that much.
    reward_floors = [1e-7 + beta * 2**-22 * max(abs(h["logps/chosen"]), abs(h["logps/rejected"]))
                     for h in history]
    for theirs, ours in metrics.items():
        floors = reward_floors if theirs.startswith("rewards/") else None
        assert_close([m[ours] for m in report["preference"]], [h[theirs] for h in history], theirs, floors)
    # The run moved: a test of six identical steps would prove little.
    assert abs(report["losses"][-1] - report["losses"][0]) > 1000 * REL_TOL * abs(report["losses"][0])


def lora_start(llama_dir, folder, b_std=0.0):
    """peft's LoRA model, saved for the probe's --lora-init. lora_B starts at zero as peft starts
    it (the policy is then the reference, the base with adapters off, as TRL takes it), or drawn
    with `b_std` so that the policy starts away from the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and b_std > 0:
                p.normal_(0.0, b_std)
    model.save_pretrained(folder)
    return model, ["--method", "lora", "--lora-rank", 4, "--lora-alpha", 8, "--lora-targets", "q_proj,v_proj",
                   "--lora-init", Path(folder) / "adapter_model.safetensors"]


def start(llama_dir, tmp_path, method):
    """Both sides' start for `method` (full or LoRA): the tokenizer, the learning rate, TRL's model
    and the probe's method flags."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    if method == "full":
        return tokenizer, 5e-3, AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32), []
    return tokenizer, 2e-2, *lora_start(llama_dir, tmp_path / "init")


def train_both(llama_dir, tmp_path, trainer, history, save, lr, *flags):
    """TRL's `trainer` trained by its own loop, then the probe on the same token ids (`save` writes
    the trainer's tokenized dataset as the probe's batch) with the same schedule and `flags`;
    returns the probe's report and TRL's logged steps."""
    batch = save(trainer.train_dataset)
    trainer.train()
    report = run_probe(llama_dir, batch, STEPS, tmp_path / "r.json", "--lr", lr, "--schedule", "linear",
                       "--max-grad-norm", 1.0, *flags)
    return report, history.steps


def pairs_saver(tmp_path, rows_of, tokenizer):
    """A `save` for train_both: the dataset's (chosen, rejected) rows by `rows_of`, as one batch."""
    return lambda dataset: save_batch(tmp_path, *rows_of(dataset), tokenizer.pad_token_id)


def dpo_run(llama_dir, tmp_path, loss_type, method):
    from trl import DPOConfig, DPOTrainer

    tokenizer, lr, model, probe_method = start(llama_dir, tmp_path, method)
    history = History()
    trainer = DPOTrainer(model=model, args=trl_args(DPOConfig, tmp_path / "trl", lr, beta=0.2, loss_type=[loss_type]),
                         train_dataset=text_pairs(), processing_class=tokenizer, callbacks=[history.callback])
    return train_both(llama_dir, tmp_path, trainer, history, pairs_saver(tmp_path, prompt_completion_rows, tokenizer),
                      lr, "--preference", "dpo" if loss_type == "sigmoid" else loss_type, "--beta", 0.2,
                      *probe_method)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_match_trl_dpo_trainer(llama_dir, tmp_path, loss_type, method):
    report, history = dpo_run(llama_dir, tmp_path, loss_type, method)
    compare(report, history, beta=0.2)
    # From the reference at the start, the policy moves away from it: rewards are not zero.
    assert report["preference"][0]["reward_margin"] == 0.0
    assert abs(report["preference"][-1]["reward_margin"]) > 1e-3


def test_label_smoothing_is_the_conservative_dpo_loss(llama_dir, tmp_path):
    """cDPO: −(1−ε)·logσ(βΔ) − ε·logσ(−βΔ), Δ from the policy's and the reference's log-probs
    (the base with adapters off), computed here with peft from a LoRA start away from the base."""
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model, probe_method = lora_start(llama_dir, tmp_path / "init", b_std=0.3)
    trainer = DPOTrainer(model=model, args=trl_args(DPOConfig, tmp_path / "trl", 1e-2),
                         train_dataset=text_pairs(), processing_class=tokenizer)
    chosen, rejected = prompt_completion_rows(trainer.train_dataset)
    batch = save_batch(tmp_path, chosen, rejected, tokenizer.pad_token_id)
    eps, beta = 0.1, 1.0
    # A single step from the start: every pair's log-ratios are those of the starting adapter.
    report = run_probe(llama_dir, batch, 1, tmp_path / "r.json", "--preference", "dpo", "--beta", beta,
                       "--label-smoothing", eps, *probe_method)
    plain = run_probe(llama_dir, batch, 1, tmp_path / "p.json", "--preference", "dpo", "--beta", beta,
                      *probe_method)
    with torch.no_grad():
        rows = chosen + rejected
        length = max(len(i) for i, _ in rows)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (length - len(i)) for i, _ in rows])
        mask = torch.tensor([[1] * len(i) + [0] * (length - len(i)) for i, _ in rows])
        labels = torch.tensor([lab + [-100] * (length - len(lab)) for _, lab in rows])
        logits = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            ref_logits = model(input_ids=ids, attention_mask=mask).logits

        def logps(lg):
            target = labels[:, 1:]
            keep = target != -100
            lp = torch.log_softmax(lg[:, :-1].float(), -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            return (lp * keep).sum(1)

        ratio = logps(logits) - logps(ref_logits)
        n = len(PAIRS)
        z = beta * (ratio[:n] - ratio[n:])
        smoothed = (-(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)).mean()
        sigmoid = (-torch.nn.functional.logsigmoid(z)).mean()
    assert report["losses"][0] == pytest.approx(smoothed.item(), rel=REL_TOL)
    assert plain["losses"][0] == pytest.approx(sigmoid.item(), rel=REL_TOL)
    assert abs(smoothed.item() - sigmoid.item()) > 100 * REL_TOL * sigmoid.item()


def paired_rows(dataset):
    """CPOTrainer / ORPOTrainer's tokenized columns (their own labels: the prompt is -100)."""
    chosen = [(e["chosen_input_ids"], e["chosen_labels"]) for e in dataset]
    rejected = [(e["rejected_input_ids"], e["rejected_labels"]) for e in dataset]
    return chosen, rejected


def reference_free_run(llama_dir, tmp_path, which, method):
    tokenizer, lr, model, probe_method = start(llama_dir, tmp_path, method)
    history = History()
    if which == "simpo":
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        args = trl_args(CPOConfig, tmp_path / "trl", lr, beta=2.0, loss_type="simpo", simpo_gamma=0.6,
                        cpo_alpha=0.5)
        trainer = CPOTrainer(model=model, args=args, train_dataset=text_pairs(), processing_class=tokenizer,
                             callbacks=[history.callback])
        flags = ["--preference", "simpo", "--beta", 2.0, "--simpo-gamma", 0.6, "--sft-weight", 0.5]
    else:
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        args = trl_args(ORPOConfig, tmp_path / "trl", lr, beta=0.3)
        trainer = ORPOTrainer(model=model, args=args, train_dataset=text_pairs(), processing_class=tokenizer,
                              callbacks=[history.callback])
        flags = ["--preference", "orpo", "--beta", 0.3]
    return train_both(llama_dir, tmp_path, trainer, history, pairs_saver(tmp_path, paired_rows, tokenizer), lr,
                      *flags, *probe_method)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("which", ["simpo", "orpo"])
def test_simpo_and_orpo_match_trl_cpo_and_orpo_trainers(llama_dir, tmp_path, which, method):
    report, history = reference_free_run(llama_dir, tmp_path, which, method)
    compare(report, history, beta=2.0 if which == "simpo" else 0.3)


DATA_TOOL = Path(os.environ.get("TESSERA_TOOLS_DIR", "")) / "tessera-data-tool"


def our_pairs(data_file, model_dir, max_length=None, fmt="preference"):
    args = [str(DATA_TOOL), "tokenize", str(data_file), str(model_dir), "--format", fmt]
    if max_length:
        args += ["--max-length", str(max_length)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return lines[0], lines[1:]


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize("implicit", [False, True], ids=["prompt", "implicit-prompt"])
@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_pairs_tokenize_as_trl_dpo_trainer_does(llama_dir, tmp_path, chat, implicit):
    """Our preference format (text pairs with the EOS appended, or chat messages rendered with the
    template) gives the ids and the loss mask TRL's DPOTrainer gives: prompt + completion per row,
    the completion where the prompt's tokens and prompt + completion's part. Without a prompt
    column (`implicit`, HH-RLHF's layout) the prompt is the common start of chosen and rejected as
    TRL's extract_prompt takes it: by code point (a non-ASCII pair), a space before the parting
    kept with the completions, one completion the start of the other."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    folder = tmp_path / "model"
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    if chat:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    rows = []
    more = [("7 and 8 make", "15 (a sum)", "78"), ("1 and 1 make ", "2", " 11 or so"), ("ça fait", " é", " è"),
            ("3 plus 4 is", " 7", " 7 or 8")]
    for p, c, r in PAIRS + more:
        if chat:
            user = [{"role": "user", "content": p}]
            chosen, rejected = [{"role": "assistant", "content": c}], [{"role": "assistant", "content": r}]
            rows.append({"chosen": user + chosen, "rejected": user + rejected} if implicit
                        else {"prompt": user, "chosen": chosen, "rejected": rejected})
        else:
            rows.append({"chosen": p + c, "rejected": p + r} if implicit else {"prompt": p, "chosen": c, "rejected": r})
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    header, ours = our_pairs(data, folder)
    assert header["format"].startswith("preference")
    trainer = DPOTrainer(model=model, args=trl_args(DPOConfig, tmp_path / "trl", 1e-3),
                         train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    chosen, rejected = prompt_completion_rows(trainer.train_dataset)
    assert len(ours) == len(chosen) == len(rows)
    for i, example in enumerate(ours):
        assert (example["input_ids"], example["labels"]) == tuple(map(list, chosen[i])), f"row {i + 1} chosen"
        assert (example["rejected_input_ids"], example["rejected_labels"]) == tuple(map(list, rejected[i])), \
            f"row {i + 1} rejected"
    # A prompt longer than max_length leaves no completion: a row error naming the line.
    out = subprocess.run([str(DATA_TOOL), "tokenize", str(data), str(folder), "--format", "preference",
                          "--max-length", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "pairs.jsonl:1:" in out.stderr and "max_length" in out.stderr, out.stderr


KTO_ROWS = [
    ("2 and 3 make", " 5", True),
    ("4 and 4 make", " 9", False),
    ("10 and 1 make", " 11", True),
    ("6 and 7 make", " 12", False),
    ("3 and 3 make", " 6", True),
    ("5 and 9 make", " 13", False),
]


def kto_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": p, "completion": c, "label": y} for p, c, y in KTO_ROWS])


def save_kto_batch(folder, dataset, pad_id):
    """KTOTrainer's tokenized examples as one probe batch: the examples' rows, then each prompt with
    its KL completion (TRL rotated them within the batch), and which examples are desirable."""
    rows = [(e["prompt_ids"] + e["completion_ids"], [-100] * len(e["prompt_ids"]) + e["completion_ids"])
            for e in dataset]
    mismatched = [(e["prompt_ids"] + e["KL_completion_ids"],
                   [-100] * len(e["prompt_ids"]) + e["KL_completion_ids"]) for e in dataset]
    path = save_batch(folder, rows, mismatched, pad_id)
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    tensors["desirable"] = torch.tensor([[int(bool(e["label"])) for e in dataset]], dtype=torch.int64)
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("method", ["full", "lora"])
def test_kto_matches_trl_kto_trainer(llama_dir, tmp_path, method):
    from trl import KTOConfig, KTOTrainer

    tokenizer, lr, model, probe_method = start(llama_dir, tmp_path, method)
    history = History()
    args = trl_args(KTOConfig, tmp_path / "trl", lr, beta=0.3, desirable_weight=1.0, undesirable_weight=1.5)
    args.per_device_train_batch_size = len(KTO_ROWS)
    trainer = KTOTrainer(model=model, args=args, train_dataset=kto_dataset(), processing_class=tokenizer,
                         callbacks=[history.callback])
    report, steps = train_both(llama_dir, tmp_path, trainer, history,
                               lambda dataset: save_kto_batch(tmp_path, dataset, tokenizer.pad_token_id), lr,
                               "--preference", "kto", "--beta", 0.3, "--desirable-weight", 1.0,
                               "--undesirable-weight", 1.5, *probe_method)
    compare(report, steps, beta=0.3, kto=True)
    assert all(step["desirable"] == 3 and step["undesirable"] == 3 for step in report["preference"])


def test_unpaired_rows_tokenize_as_trl_kto_trainer_does(llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    rows = [{"prompt": p, "completion": c, "label": y} for p, c, y in KTO_ROWS]
    data = tmp_path / "unpaired.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    header, ours = our_pairs(data, llama_dir, fmt="unpaired")
    assert header["format"].startswith("unpaired")
    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    args = trl_args(KTOConfig, tmp_path / "trl", 1e-3)
    args.per_device_train_batch_size = len(KTO_ROWS)
    trainer = KTOTrainer(model=model, args=args, train_dataset=kto_dataset(), processing_class=tokenizer)
    for i, (example, theirs) in enumerate(zip(ours, trainer.train_dataset)):
        assert example["input_ids"] == theirs["prompt_ids"] + theirs["completion_ids"], f"row {i + 1}"
        assert example["prompt_length"] == len(theirs["prompt_ids"]), f"row {i + 1}"
        assert example["desirable"] == theirs["label"], f"row {i + 1}"
