"""The training engine (`cru_harness.training`) against plain PyTorch steps written out here: the same update
from k accumulated micro-batches as from one batch, for a whole run (`train_model`) and for the in-place engine
CRU's routers, LUNAR and the testbed train with."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

import cru_harness.baselines as B
from cru_harness.baselines.data import ForgetRetainDataset
from cru_harness.testbed.models import build_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer
from cru_harness.training import Engine, default_counts, train_model

from test_baselines_training import FORGET, RETAIN, REFUSALS


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in FORGET + RETAIN] + REFUSALS
    return train_tokenizer(texts * 3, vocab_size=320)


def plain_nll(model, batch):
    """Token-mean NLL of the answer tokens, written out: logits at t predict label t+1, -100 ignored."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    return F.cross_entropy(logits.transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100)


def max_gap(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_a_run_of_ga_is_plain_adamw_steps_on_whole_batches(tokenizer):
    """GA, effective batch 4 over micro-batches of 1 (4 accumulated, answers of different lengths), 2 steps: the
    same weights as AdamW (decay on matrices only), clipping at 1, stepping -NLL of all 4 rows at once."""
    model = build_tiny_model("llama", tokenizer, seed=0, n_layers=2, hidden_size=32)
    reference = copy.deepcopy(model)
    config = B.get_method("ga").Config(learning_rate=1e-2, num_epochs=2, warmup_epochs=0.0, effective_batch_size=4,
                                       micro_batch_size=1, weight_decay=0.1, lr_scheduler="constant")
    dataset = ForgetRetainDataset(tokenizer, FORGET, [], seed=0)
    result = train_model(model, B.get_method("ga")(config), dataset, seed=0, progress=False)
    assert result.optimizer_steps == 2 and result.gradient_accumulation_steps == 4

    whole = dataset.collate([dataset[i] for i in range(len(dataset))])["forget"]
    reference.train()
    params = [p for p in reference.parameters()]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=1e-2)
    losses = []
    for _ in range(2):   # every step sees all 4 forget rows: the order within a step only reorders a sum
        loss = -plain_nll(reference, whole)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert [h["loss"] for h in result.history] == pytest.approx(losses, rel=1e-5)
    moved = max_gap(reference, build_tiny_model("llama", tokenizer, seed=0, n_layers=2, hidden_size=32))
    assert moved > 1e-3 and max_gap(result.model, reference) < 1e-5   # float sums in another order


def test_the_in_place_engine_accumulates_token_normalised_sub_batches_exactly(tokenizer):
    """`Engine` without an accelerator (CRU's routers, LUNAR, the testbed): two micro-batches whose losses divide
    by the group's answer tokens (`counts`) step as one batch's token mean, with SGD at lr 1 (the update is the
    gradient itself), and it logs the summed loss and the lr before the step."""
    model = build_tiny_model("llama", tokenizer, seed=1, n_layers=1, hidden_size=16)
    reference = copy.deepcopy(model)
    dataset = ForgetRetainDataset(tokenizer, FORGET, [], seed=0)
    micro = [dataset.collate([dataset[0]]), dataset.collate([dataset[1], dataset[2]])]
    assert default_counts(micro[0]["forget"])["tokens"] != default_counts(micro[1]["forget"])["tokens"]

    def loss_fn(batch):
        inputs = batch["forget"]
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1]
        summed = F.cross_entropy(logits.float().transpose(1, 2), inputs["labels"][:, 1:], ignore_index=-100,
                                 reduction="sum")
        loss = summed / inputs["group_tokens"]
        return loss, {"loss": float(loss.detach())}

    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=1.0),
                    counts=lambda key, inputs: default_counts(inputs))
    logs = engine.step(micro, loss_fn)

    whole = dataset.collate([dataset[i] for i in range(3)])["forget"]
    loss = plain_nll(reference, whole)
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= p.grad
    assert logs["loss"] == pytest.approx(loss.item(), rel=1e-6) and logs["lr"] == 1.0
    assert max_gap(model, reference) < 1e-6
    assert all(p.grad is None for p in model.parameters())   # zeroed after the step


def test_an_epoch_schedule_steps_at_end_epoch_only():
    """LUNAR's decay: `scheduler_interval="epoch"` leaves the lr alone between steps and decays it at
    `end_epoch()`; the lr logged is the one the step used."""
    linear = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.5)
    engine = Engine(linear, optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.1),
                    scheduler_interval="epoch")
    x = torch.ones(4, 3)

    def loss_fn(batch):
        loss = linear(batch).pow(2).mean()
        return loss, {"loss": float(loss.detach())}

    lrs = [engine.step([x], loss_fn)["lr"] for _ in range(2)]
    engine.end_epoch()
    lrs.append(engine.step([x], loss_fn)["lr"])
    assert lrs == pytest.approx([0.5, 0.5, 0.05])
    with pytest.raises(ValueError, match="step or epoch"):
        Engine(linear, optimizer, scheduler_interval="batch")


def test_a_run_resumed_from_its_checkpoint_ends_with_the_uninterrupted_weights(tokenizer, tmp_path):
    """NPO, 6 steps over 2 epochs, saved every 2 steps and killed in step 5: resumed from step 4 (the stream
    replayed up to it, the optimizer, schedule and generators loaded), it ends bit for bit where the run that was
    never interrupted does, with the same logs."""
    config = B.get_method("npo").Config(learning_rate=1e-2, num_epochs=3, warmup_epochs=0.5, effective_batch_size=2,
                                        micro_batch_size=1, lr_scheduler="linear")

    def run(method, checkpoint_dir=None):
        model = build_tiny_model("llama", tokenizer, seed=0, n_layers=2, hidden_size=32)
        ref = copy.deepcopy(model).eval().requires_grad_(False)
        dataset = ForgetRetainDataset(tokenizer, FORGET, RETAIN, seed=0)
        return train_model(model, method, dataset, ref_model=ref, seed=0, progress=False,
                           checkpoint_dir=checkpoint_dir, checkpoint_every=2)

    whole = run(B.get_method("npo")(config))

    class Killed(type(B.get_method("npo")(config))):
        calls = 0

        def compute_loss(self, model, batch, ref_model=None):
            Killed.calls += 1
            if Killed.calls == 9:   # the first micro-batch of step 5
                raise KeyboardInterrupt
            return super().compute_loss(model, batch, ref_model)

    with pytest.raises(KeyboardInterrupt):
        run(Killed(config), tmp_path / "state")
    assert json.loads((tmp_path / "state" / "engine_state.json").read_text())["optimizer_steps"] == 4
    resumed = run(B.get_method("npo")(config), tmp_path / "state")
    assert resumed.optimizer_steps == whole.optimizer_steps == 6
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert all(torch.equal(p, q) for p, q in zip(resumed.model.parameters(), whole.model.parameters()))
