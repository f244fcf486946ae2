"""Plain, deterministic causal-LM fine-tuning for the tiny testbed models (AdamW, CPU-friendly).

QA pairs are formatted with the protocol's plain template, `Question: {q}\nAnswer: {a}` followed by EOS, so
the answer starts after one space: exactly the continuation the TOFU tasks score (` {a}`).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from cru_harness.data.corpora import format_qa, format_qa_prompt  # noqa: F401  (re-exported: the plain template)
from cru_harness.devices import input_device
from cru_harness.training.engine import Engine

ANSWER_MARKER = "\nAnswer:"  # where the answer starts in format_qa's text (answer_only_loss)
IGNORE_INDEX = -100


@dataclass
class FinetuneStats:
    """What happened during fine-tuning (kept in a checkpoint's recipe for reports)."""
    epochs: int
    steps: int
    seconds: float
    epoch_losses: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        return self.epoch_losses[-1] if self.epoch_losses else math.nan


def encode_rows(tokenizer, texts: Sequence[str], max_length: int,
            answer_only_loss: bool) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per text, EOS appended; labels mask the prompt when `answer_only_loss`."""
    encoded = []
    for text in texts:
        enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=answer_only_loss,
                        truncation=True, max_length=max_length - 1)
        ids = list(enc["input_ids"]) + [tokenizer.eos_token_id]
        labels = list(ids)
        if answer_only_loss:
            marker = text.rfind(ANSWER_MARKER)
            if marker < 0:
                raise ValueError(f"answer_only_loss needs texts containing {ANSWER_MARKER!r}; got {text[:80]!r}")
            answer_start = marker + len(ANSWER_MARKER)
            for i, (start, _end) in enumerate(enc["offset_mapping"]):
                if start < answer_start:
                    labels[i] = IGNORE_INDEX
        encoded.append((ids, labels))
    return encoded


def collate(batch, pad_id: int):
    """(input_ids, attention_mask, labels) of `encode_rows` rows, right-padded to the longest."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        labels[row, :len(labs)] = torch.tensor(labs)  # padding stays IGNORE_INDEX: never in the loss
        attention[row, :len(ids)] = 1
    return input_ids, attention, labels


def finetune_causal_lm(model, tokenizer, texts: Sequence[str], *, epochs: int = 20, lr: float = 3e-3,
                       batch_size: int = 16, max_length: int = 128, seed: int = 0, answer_only_loss: bool = False,
                       weight_decay: float = 0.0, warmup_fraction: float = 0.05,
                       progress: bool = True) -> FinetuneStats:
    """Fine-tune `model` in place on `texts` (each gets EOS appended) with AdamW and a linear-decay schedule.

    Padding is masked out of the loss; with `answer_only_loss` only tokens after `\\nAnswer:` are learned
    (TOFU fine-tunes on answers). Deterministic on CPU for a given seed: shuffling uses its own RNG and the
    torch seed is set before training.
    """
    if not texts:
        raise ValueError("finetune_causal_lm got no texts")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer needs both a pad and an EOS token")
    torch.manual_seed(seed)
    shuffler = random.Random(seed)
    data = encode_rows(tokenizer, texts, max_length, answer_only_loss)
    steps_per_epoch = math.ceil(len(data) / batch_size)
    total_steps = epochs * steps_per_epoch
    warmup = max(1, int(warmup_fraction * total_steps))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # Linear warm-up then linear decay to 0: memorisation converges reliably without tuning a tail.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (total_steps - step) / max(1, total_steps - warmup))))

    # The training engine in place (the model where it is, in this process), clipped at 1 as before.
    engine = Engine(model, optimizer, schedule, max_grad_norm=1.0)

    model.train()
    device = input_device(model)  # batches are built on the CPU and sent where the model is
    stats = FinetuneStats(epochs=epochs, steps=0, seconds=0.0)
    started = time.perf_counter()
    bar = tqdm(total=total_steps, desc="fine-tune", disable=not progress, leave=False)

    def loss_fn(batch):
        input_ids, attention, labels = batch
        loss = model(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                     labels=labels.to(device)).loss
        return loss, {"loss": loss.item()}

    try:
        for _epoch in range(epochs):
            order = list(range(len(data)))
            shuffler.shuffle(order)
            losses = []
            for first in range(0, len(order), batch_size):
                batch = collate([data[i] for i in order[first:first + batch_size]], tokenizer.pad_token_id)
                loss = engine.step([batch], loss_fn)["loss"]
                losses.append(loss)
                stats.steps += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
            stats.epoch_losses.append(sum(losses) / len(losses))
    finally:
        bar.close()
        model.eval()
    stats.seconds = time.perf_counter() - started
    return stats


@torch.no_grad()
def greedy_answers(model, tokenizer, questions: Sequence[str], *, max_new_tokens: int = 40,
                   batch_size: int = 32) -> list[str]:
    """Greedy completions of `Question: {q}\\nAnswer:` (left-padded batches), stripped of the leading space."""
    answers: list[str] = []
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # generation continues from the last position of every row
    try:
        for first in range(0, len(questions), batch_size):
            prompts = [format_qa_prompt(q) for q in questions[first:first + batch_size]]
            enc = tokenizer(prompts, return_tensors="pt", padding=True).to(input_device(model))
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            new = out[:, enc["input_ids"].shape[1]:]
            answers.extend(t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
    return answers
