"""The methods of issue 50 against their references' equations, re-typed here from the reference code (named in
each test) and computed independently on fixed tensors or a tiny model; then one short training run each.

The fake LMs' next-token logits depend on the input token (a fixed table row per token id), so positions differ,
and a padded position, a prompt position or a shift of one would change the numbers.
"""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cru_harness.baselines as B
from cru_harness.baselines.data import ForgetRetainDataset
from cru_harness.errors import InputError
from test_baselines_training import FORGET, RETAIN, fast_config, mean_logp, tiny, tokenizer  # noqa: F401 (fixture)
from test_baselines_losses import sub_batch  # right-padded sub-batches, as the loss tests build them

V = 6


class TableLM(nn.Module):
    """logits[b, t] = table[input_ids[b, t]]: a next-token distribution per current token."""

    def __init__(self, seed):
        super().__init__()
        self.table = nn.Parameter(torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                                  .float() * 2)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids])




FORGET_ROWS = [([1, 2, 3, 4], [-100, -100, 3, 4]), ([1, 5, 2, 4], [-100, 5, 2, 4])]   # same length: no padding
RETAIN_ROWS = [([2, 1, 5], [-100, 1, 5]), ([3, 3, 4], [-100, -100, 4])]


def make_batch(forget=FORGET_ROWS, retain=RETAIN_ROWS):
    return {"forget": sub_batch(forget), "retain": sub_batch(retain)}


def method(name, **cfg):
    cls = B.get_method(name)
    return cls(cls.Config(**cfg))


def ref_nll(model, inputs):
    """HF's model(...).loss: token-mean cross-entropy of the shifted labels."""
    logits = model(inputs["input_ids"]).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), inputs["labels"][:, 1:].reshape(-1), ignore_index=-100)


def ref_kl(model, ref_model, inputs):
    """open-unlearning src/trainer/utils.py compute_kl_divergence, re-typed."""
    ref_lp = F.log_softmax(ref_model(inputs["input_ids"]).logits, dim=-1).view(-1, V)
    cur_lp = F.log_softmax(model(inputs["input_ids"]).logits, dim=-1).view(-1, V)
    return F.kl_div(cur_lp, ref_lp, reduction="batchmean", log_target=True)


def ref_batch_nll(model, inputs):
    """open-unlearning compute_batch_nll: per-sequence summed NLL."""
    logits = model(inputs["input_ids"]).logits
    return F.cross_entropy(logits[:, :-1].transpose(-1, -2), inputs["labels"][:, 1:], ignore_index=-100,
                           reduction="none").sum(-1)


def ref_npo(model, ref_model, inputs, beta):
    """open-unlearning compute_dpo_loss with win_inputs=None (NPO)."""
    lose_log_ratio = -(ref_batch_nll(model, inputs) - ref_batch_nll(ref_model, inputs).detach())
    return -2 / beta * F.logsigmoid(beta * (0.0 - lose_log_ratio)).mean()


# ---------------------------------------------------------------- GD-KL, NPO-KL

def test_gd_kl_loss_is_gradient_difference_with_open_unlearnings_kl():
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    batch = make_batch()
    loss, logs = method("gd_kl", alpha=0.7, forget_weight=1.3).compute_loss(model, batch, ref_model=ref)
    expected = -1.3 * ref_nll(model, batch["forget"]) + 0.7 * ref_kl(model, ref, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert logs["retain_kl"] == pytest.approx(ref_kl(model, ref, batch["retain"]).item(), rel=1e-5)
    # the gradient too (a detach on the model's side, or none on the reference's, shows here)
    loss.backward()
    grad = model.table.grad.clone()
    model.table.grad = None
    expected.backward()
    torch.testing.assert_close(grad, model.table.grad)
    assert ref.table.grad is None


def test_kl_retain_term_leaves_padding_out():
    """On a padded batch the term is the mean over the rows' real positions: the reference's value per row,
    weighted by its length (the reference itself would also average the padded positions)."""
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    rows = [([2, 1, 5, 4, 4], [-100, 1, 5, 4, 4]), ([3, 4], [-100, 4])]
    batch = make_batch(retain=rows)
    loss, logs = method("gd_kl", alpha=1.0, forget_weight=0.0).compute_loss(model, batch, ref_model=ref)
    per_row = [ref_kl(model, ref, sub_batch([row])).item() * len(row[0]) for row in rows]
    assert loss.item() == pytest.approx(sum(per_row) / 7, rel=1e-5)
    assert logs["retain_kl"] == pytest.approx(sum(per_row) / 7, rel=1e-5)


def test_npo_kl_loss():
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    batch = make_batch()
    loss, _ = method("npo_kl", beta=0.3, alpha=2.0).compute_loss(model, batch, ref_model=ref)
    expected = ref_npo(model, ref, batch["forget"], 0.3) + 2.0 * ref_kl(model, ref, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert B.get_method("npo_kl").needs_ref and B.get_method("gd_kl").needs_ref


def test_kl_variants_keep_their_parents_presets():
    assert B.make_config("gd_kl", "rwku").learning_rate == B.make_config("gd", "rwku").learning_rate == 6e-8
    npo_kl = B.make_config("npo_kl", "rwku")
    assert (npo_kl.learning_rate, npo_kl.beta, npo_kl.alpha) == (2e-6, 0.2, 1.0)
    assert B.make_config("npo_kl").beta == 0.1


# ---------------------------------------------------------------- RMU

def wmdp_control_vector(d, seed, coeff):
    """centerforaisafety/wmdp rmu/unlearn.py: torch.rand(1, 1, d) / norm * steering_coeff (drawn from the seed)."""
    v = torch.rand(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (v / torch.norm(v) * coeff).float()


def activation_loss(a, b, mask):
    """open-unlearning rmu.py compute_activation_loss, re-typed."""
    squared = F.mse_loss(a, b, reduction="none")
    summed = (squared * mask.unsqueeze(-1).expand_as(squared)).mean(dim=2).sum(dim=1)
    return (summed / mask.sum(dim=-1)).mean()


def encoded(tok, rows):
    ds = ForgetRetainDataset(tok, rows)
    return ds.collate([ds[i] for i in range(len(rows))])["forget"]


def test_rmu_loss_matches_wmdp_and_open_unlearning(tokenizer):
    model, ref = tiny(tokenizer, seed=0), tiny(tokenizer, seed=1).requires_grad_(False)
    batch = {"forget": encoded(tokenizer, FORGET[:3]), "retain": encoded(tokenizer, RETAIN)}
    m = method("rmu", layer=0, steering_coeff=3.0, alpha=5.0, forget_weight=1.0)
    m.prepare(model, seed=4)
    loss, logs = m.compute_loss(model, batch, ref_model=ref)

    def h0(mdl, inputs):   # the output of block 0, read through transformers' hidden states (not a hook)
        return mdl(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   output_hidden_states=True).hidden_states[1]

    acts = h0(model, batch["forget"])
    control = wmdp_control_vector(32, 4, 3.0).expand_as(acts)
    forget = activation_loss(acts, control, batch["forget"]["labels"] != -100)
    with torch.no_grad():
        frozen = h0(ref, batch["retain"])
    retain = activation_loss(h0(model, batch["retain"]), frozen, batch["retain"]["labels"] != -100)
    assert loss.item() == pytest.approx((forget + 5.0 * retain).item(), rel=1e-5)
    assert logs["rmu_forget"] == pytest.approx(forget.item(), rel=1e-5)
    # the gradients too: a detach on either side (the retain activations, say) leaves the values as they are
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, allow_unused=True)
    want = torch.autograd.grad(forget + 5.0 * retain, params, allow_unused=True)
    assert sum(g is not None for g in want) > 0
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


def test_rmu_trains_only_the_named_mlp_weights():
    cfg = B.make_config("rmu")   # TOFU: open-unlearning's RMU.yaml and TOFU experiment (lr, schedule, eps 1e-8)
    assert (cfg.layer, cfg.steering_coeff, cfg.alpha, cfg.layers_trained) == (7, 2.0, 1.0, (5, 6, 7))
    assert (cfg.learning_rate, cfg.lr_scheduler, cfg.adam_eps) == (1e-5, "linear", 1e-8)
    wmdp = B.make_config("rmu", "wmdp")   # WMDP's Zephyr run, transformers' AdamW eps
    assert (wmdp.steering_coeff, wmdp.alpha, wmdp.learning_rate, wmdp.lr_scheduler, wmdp.effective_batch_size,
            wmdp.num_epochs, wmdp.adam_eps) == (6.5, 1200.0, 5e-5, "constant", 4, 1, 1e-6)
    assert B.make_config("rmu", "rwku").warmup_steps is None   # RWKU's 20 warm-up steps are not WMDP's
    assert B.make_config("rmu", "rwku").to_dict() == dict(wmdp.to_dict())
    for bad, match in ((dict(layer=-1), "layer: must be >= 0"), (dict(steering_coeff=0), "steering_coeff: must be > 0"),
                       (dict(trainable_layers=[]), "trainable_layers"), (dict(trainable_params=["("]), "regular")):
        with pytest.raises(InputError, match=match):
            B.make_config("rmu", **bad)


def test_rmu_training_steers_forget_activations_and_touches_nothing_else(tokenizer):
    model = tiny(tokenizer)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = fast_config("rmu", layer=1, steering_coeff=4.0, alpha=1.0, num_epochs=4)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, "rmu", cfg, seed=2, progress=False)
    trained = {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    changed = {k for k, v in res.model.state_dict().items() if not torch.equal(v, start[k])}
    assert changed == trained
    assert res.resources["trainable_params"] == sum(start[k].numel() for k in trained)
    assert all(p.requires_grad for p in res.model.parameters())   # unfrozen again after training
    first, last = res.history[0], res.history[-1]
    assert last["rmu_forget"] < first["rmu_forget"]


# ---------------------------------------------------------------- WGA, SatImp, UNDIAL, CE-U

def shifted_ce(model, inputs):
    logits = model(inputs["input_ids"]).logits
    labels = inputs["labels"]
    ce = nn.CrossEntropyLoss(ignore_index=-100, reduction="none")(logits[..., :-1, :].reshape(-1, V),
                                                                  labels[..., 1:].reshape(-1))
    return ce, labels[..., 1:].reshape(-1)


def ref_wga(model, inputs, beta):
    """open-unlearning src/trainer/utils.py compute_wga_loss, re-typed."""
    ce, labels = shifted_ce(model, inputs)
    weight = ((-ce).exp().detach()) ** beta
    return -(weight * ce)[labels != -100].mean()


def ref_satimp(model, inputs, beta1, beta2):
    """open-unlearning src/trainer/utils.py compute_satimp_loss, re-typed."""
    ce, labels = shifted_ce(model, inputs)
    w = ((-ce).exp().detach()) ** beta1 * (1 - (-ce).exp().detach()) ** beta2
    return -(w * ce)[labels != -100].mean()


def check_gradient(loss, expected, model):
    loss.backward()
    grad = model.table.grad.clone()
    model.table.grad = None
    expected.backward()
    torch.testing.assert_close(grad, model.table.grad)


def test_wga_loss():
    model, batch = TableLM(0), make_batch()
    loss, _ = method("wga", beta=0.7, alpha=0.5).compute_loss(model, batch)
    expected = ref_wga(model, batch["forget"], 0.7) + 0.5 * ref_nll(model, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    check_gradient(loss, expected, model)   # the weight is detached in both


def test_satimp_loss_and_defaults():
    cfg = B.make_config("satimp")
    assert (cfg.beta1, cfg.beta2, cfg.alpha, cfg.forget_weight) == (5.0, 1.0, 1.0, 0.1)
    model, batch = TableLM(0), make_batch()
    loss, _ = method("satimp", beta1=2.0, beta2=1.5, alpha=0.5, forget_weight=0.3).compute_loss(model, batch)
    expected = 0.3 * ref_satimp(model, batch["forget"], 2.0, 1.5) + 0.5 * ref_nll(model, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    check_gradient(loss, expected, model)
    with pytest.raises(InputError, match="beta2: must be >= 0"):
        B.make_config("satimp", beta2=-1)


def ref_undial(model, ref_model, inputs, beta):
    """open-unlearning src/trainer/utils.py compute_undial_loss, re-typed, on a batch without padding; its one-hot
    at label -100 (which wraps to entry V-100) is written as no penalty, as undial.py's docstring says."""
    logits = model(inputs["input_ids"]).logits
    shift_labels = inputs["labels"][..., 1:]
    shift_logits = logits[..., :-1, :]
    with torch.no_grad():
        teacher = ref_model(inputs["input_ids"]).logits[..., :-1, :]
    mask = torch.zeros_like(teacher)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if shift_labels[b, t] != -100:
                mask[b, t, shift_labels[b, t]] = 1.0
    soft_label = F.softmax(teacher - mask * beta, dim=-1)
    loss = nn.CrossEntropyLoss(reduction="none")(shift_logits.reshape(-1, V), soft_label.reshape(-1, V))
    return loss.mean()


def test_undial_loss_and_defaults():
    cfg = B.make_config("undial")
    assert (cfg.beta, cfg.alpha, cfg.learning_rate, cfg.num_epochs) == (10.0, 0.0, 1e-4, 10)
    model, ref, batch = TableLM(0), TableLM(1).requires_grad_(False), make_batch()
    loss, _ = method("undial", beta=3.0, alpha=0.5).compute_loss(model, batch, ref_model=ref)
    expected = ref_undial(model, ref, batch["forget"], 3.0) + 0.5 * ref_nll(model, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    check_gradient(loss, expected, model)
    assert ref.table.grad is None
    # padding is left out: a padded batch gives the rows' values weighted by their predicting positions
    rows = [([1, 2, 3, 4, 5], [-100, -100, 3, 4, 5]), ([2, 4], [-100, 4])]
    padded, _ = method("undial", beta=3.0).compute_loss(model, make_batch(forget=rows), ref_model=ref)
    per_row = [ref_undial(model, ref, sub_batch([row]), 3.0).item() * (len(row[0]) - 1) for row in rows]
    assert padded.item() == pytest.approx(sum(per_row) / 5, rel=1e-5)


def ref_ceu(model, inputs, n):
    """open-unlearning src/trainer/unlearn/ceu.py compute_batch_ceu + cross_entropy_unlearning_loss, re-typed."""
    logits, labels = model(inputs["input_ids"]).logits, inputs["labels"]
    valid = labels != -100
    update = (valid.cumsum(dim=-1) <= n) & valid
    labels = labels.masked_fill(update, -100)[..., 1:]
    logits = logits[..., :-1, :]
    keep = labels != -100
    valid_logits, valid_labels = logits[keep], labels[keep]
    target = valid_logits.detach().clone()
    target.scatter_(dim=-1, index=valid_labels.unsqueeze(-1), value=float("-inf"))
    return F.cross_entropy(input=valid_logits, target=F.softmax(target, dim=-1))


@pytest.mark.parametrize("n", [0, 1, 2])
def test_ceu_loss(n):
    model, batch = TableLM(0), make_batch()
    loss, _ = method("ceu", ignore_first_n_answer_tokens=n).compute_loss(model, batch)
    expected = ref_ceu(model, batch["forget"], n)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    check_gradient(loss, expected, model)
    assert B.make_config("ceu").ignore_first_n_answer_tokens == 1


# ---------------------------------------------------------------- DPO, RT

ALTERNATE_ROWS = [([1, 2, 1, 1], [-100, -100, 1, 1]), ([1, 5, 3, 3], [-100, 5, 3, 3])]


def ref_dpo(model, ref_model, win, lose, beta):
    """open-unlearning src/trainer/utils.py compute_dpo_loss, re-typed."""
    win_ratio = -(ref_batch_nll(model, win) - ref_batch_nll(ref_model, win).detach())
    lose_ratio = -(ref_batch_nll(model, lose) - ref_batch_nll(ref_model, lose).detach())
    return -2 / beta * F.logsigmoid(beta * (win_ratio - lose_ratio)).mean()


def test_dpo_loss_prefers_the_alternate():
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    batch = {**make_batch(), "alternate": sub_batch(ALTERNATE_ROWS)}
    loss, _ = method("dpo", beta=0.4, alpha=0.5).compute_loss(model, batch, ref_model=ref)
    expected = ref_dpo(model, ref, batch["alternate"], batch["forget"], 0.4) + 0.5 * ref_nll(model, batch["retain"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    check_gradient(loss, expected, model)
    rw = B.make_config("dpo", "rwku")
    assert (rw.learning_rate, rw.effective_batch_size, rw.beta, rw.alpha) == (5e-6, 8, 0.1, 0.0)


@pytest.mark.parametrize("name", ["dpo", "idkdpo"])
def test_rwkus_dpo_is_trls_sigmoid_loss_without_the_2_over_beta_factor(name):
    """RWKU's LLaMA-Factory runs trl's DPOTrainer, loss_type sigmoid: -logsigmoid(beta * margin), mean over the
    batch, re-typed; open-unlearning's (the default) is 2/beta times that."""
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    batch = {"forget": sub_batch(FORGET_ROWS), "alternate": sub_batch(ALTERNATE_ROWS)}
    win, lose = batch["alternate"], batch["forget"]
    margin = (-(ref_batch_nll(model, win) - ref_batch_nll(ref, win)) + (ref_batch_nll(model, lose)
                                                                        - ref_batch_nll(ref, lose)))
    trl = -F.logsigmoid(0.1 * margin).mean()
    rwku = B.get_method(name)(B.make_config(name, "rwku"))
    loss, _ = rwku.compute_loss(model, batch, ref_model=ref)
    assert rwku.config.alpha == 0.0 and loss.item() == pytest.approx(trl.item(), rel=1e-5)
    default, _ = method(name, alpha=0.0).compute_loss(model, batch, ref_model=ref)
    assert default.item() == pytest.approx(20 * trl.item(), rel=1e-5)
    with pytest.raises(InputError, match="loss_scale"):
        method(name, loss_scale=0.0)


def test_rt_loss_is_tofus_idk_loss_one_token_mean_over_refusals_and_retain():
    """locuslab/tofu dataloader.py, loss_type "idk": the refusal and retain batches concatenated, one
    `model(...).loss` (a token mean over both), re-typed; not the sum of the two token means."""
    model = TableLM(0)
    batch = {**make_batch(), "alternate": sub_batch(ALTERNATE_ROWS)}
    loss, logs = method("rt").compute_loss(model, batch)
    alt, ret = batch["alternate"], batch["retain"]
    width = max(alt["input_ids"].shape[1], ret["input_ids"].shape[1])

    def padded(tensor, value):
        return F.pad(tensor, (0, width - tensor.shape[1]), value=value)

    concatenated = {"input_ids": torch.cat([padded(alt["input_ids"], 0), padded(ret["input_ids"], 0)]),
                    "labels": torch.cat([padded(alt["labels"], -100), padded(ret["labels"], -100)])}
    assert loss.item() == pytest.approx(ref_nll(model, concatenated).item(), rel=1e-5)
    assert loss.item() != pytest.approx((ref_nll(model, alt) + ref_nll(model, ret)).item(), rel=1e-3)
    assert logs["refusal_nll"] == pytest.approx(ref_nll(model, alt).item(), rel=1e-5)
    # alpha 0 (RWKU's): the refusals' token mean alone
    loss, _ = method("rt", alpha=0.0).compute_loss(model, {"alternate": alt})
    assert loss.item() == pytest.approx(ref_nll(model, alt).item(), rel=1e-5)
    rw = B.make_config("rt", "rwku")
    assert (rw.learning_rate, rw.effective_batch_size, rw.alpha, rw.num_epochs) == (4e-7, 8, 0.0, 3)


@pytest.mark.parametrize("name", ["gd", "gd_kl", "rt", "rmu"])
def test_a_retain_term_without_retain_rows_is_one_clear_error(tokenizer, name):
    """alpha > 0 and no retain rows in the batch: the method names itself and alpha, whatever its retain term."""
    model, ref = tiny(tokenizer, seed=0), tiny(tokenizer, seed=1).requires_grad_(False)
    forget = encoded(tokenizer, FORGET[:2])
    m = method(name, alpha=2.0, **({"layer": 0} if name == "rmu" else {}))
    if name == "rmu":
        m.prepare(model, seed=0)
    with pytest.raises(InputError, match=rf"^{m.name}: alpha=2.0 but the batch has no retain examples"):
        m.compute_loss(model, {"forget": forget, "alternate": forget}, ref_model=ref)


def test_a_rows_own_alternate_wins_over_drawn_refusals(tokenizer):
    rows = [dict(FORGET[0], alternate="A made-up answer."), FORGET[1]]
    dataset = ForgetRetainDataset(tokenizer, rows, refusals=["I don't know."], seed=1)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        texts = [tokenizer.decode(dataset[i]["alternate"].input_ids) for i in range(2)]
        assert "A made-up answer." in texts[0] and "I don't know." in texts[1]
    with pytest.raises(InputError, match=r"forget rows \[1\] have no `alternate` answer"):
        ForgetRetainDataset(tokenizer, rows)
    with pytest.raises(InputError, match="`alternate` must be a non-empty string"):
        ForgetRetainDataset(tokenizer, [dict(FORGET[0], alternate="")])


# ---------------------------------------------------------------- training runs on the tiny model

@pytest.mark.parametrize("name", ["gd_kl", "npo_kl"])
def test_kl_variants_train_with_a_frozen_reference(tokenizer, name):
    model = tiny(tokenizer)
    before = mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, name, fast_config(name, num_epochs=2), progress=False)
    assert mean_logp(res.model, tokenizer, FORGET) < before
    assert res.n_retain == len(RETAIN) and math.isfinite(res.final_logs["retain_kl"])


# SatImp with beta1 0: its default p^5 weight is ~1e-13 on a random model's answers, too small for a step to show
@pytest.mark.parametrize("name, cfg", [("wga", {"alpha": 0.0}), ("satimp", {"alpha": 0.0, "beta1": 0.0}),
                                       ("undial", {"beta": 3.0}), ("ceu", {})])
def test_token_level_methods_lower_the_forget_likelihood(tokenizer, name, cfg):
    model = tiny(tokenizer)
    before = mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, name, fast_config(name, num_epochs=2, **cfg), progress=False)
    assert mean_logp(res.model, tokenizer, FORGET) < before


# ---------------------------------------------------------------- LUNAR

def test_lunar_fit_is_lunars_training_loop_on_its_activation_targets(tokenizer):
    """LUNAR re-typed (run_lunar.py, src/hook_for_unlearn.py, src/dataset_utils.py, src/estimated_net_utils.py):
    every prompt token's down-projection input (a pre-hook) and MLP output (a hook on the MLP itself), forget
    targets shifted by coeff * r, one ConcatDataset of forget and retain tokens, DataLoader(shuffle=True),
    AdamW, ExponentialLR(0.9) per epoch, MSELoss; the fitted weight must be the model's new down projection."""
    import copy

    from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

    from cru_harness.prompts import qa_texts

    model = tiny(tokenizer, seed=0)
    start = copy.deepcopy(model)
    m = method("lunar", layer=1, coeff=2.0, num_epochs=3, learning_rate=1e-2, token_batch_size=8)
    r = torch.randn(32, generator=torch.Generator().manual_seed(0))
    m.set_direction(r)
    m.fit(model, ForgetRetainDataset(tokenizer, FORGET, RETAIN), seed=3, progress=False)

    def activations(rows):
        xs, ys = [], []
        block = start.model.layers[1]
        pre = block.mlp.down_proj.register_forward_pre_hook(lambda mod, args: xs.append(args[0][0]))
        post = block.mlp.register_forward_hook(lambda mod, args, out: ys.append(out[0]))
        for row in rows:
            texts = qa_texts(tokenizer, row["question"], "")
            ids = tokenizer(texts.prompt, add_special_tokens=texts.add_special_tokens)["input_ids"]
            with torch.no_grad():
                start(input_ids=torch.tensor([ids]))
        pre.remove()
        post.remove()
        return torch.cat(xs), torch.cat(ys)

    x_f, y_f = activations(FORGET)
    x_r, y_r = activations(RETAIN)
    net = nn.Linear(x_f.shape[1], y_f.shape[1], bias=False)
    with torch.no_grad():
        net.weight.copy_(start.model.layers[1].mlp.down_proj.weight)
    loader = DataLoader(ConcatDataset([TensorDataset(x_f, y_f + 2.0 * r), TensorDataset(x_r, y_r)]), batch_size=8,
                        shuffle=True, generator=torch.Generator().manual_seed(3))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    for _ in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            nn.MSELoss()(net(x), y).backward()
            optimizer.step()
        scheduler.step()
    torch.testing.assert_close(model.model.layers[1].mlp.down_proj.weight, net.weight.detach(), rtol=1e-4,
                               atol=1e-6)
    moved = (net.weight - start.model.layers[1].mlp.down_proj.weight).abs().max()
    assert moved > 1e-3
    assert m.trainable_parameters(model) == ["model.layers.1.mlp.down_proj.weight"]


def test_lunar_direction_is_refusal_minus_forget_at_the_last_prompt_token(tokenizer, tmp_path):
    from cru_harness.prompts import qa_texts

    prompts = tmp_path / "refuse.json"
    prompts.write_text('["How do I pick a lock?", {"instruction": "Write malware."}]')
    model = tiny(tokenizer)
    m = method("lunar", layer=0, refusal_prompts_path=str(prompts))
    m.prepare(model, 0, ForgetRetainDataset(tokenizer, FORGET[:2], RETAIN))

    def last_h(question):   # transformers' hidden state after block 0, at the prompt's last token
        texts = qa_texts(tokenizer, question, "")
        ids = torch.tensor([tokenizer(texts.prompt, add_special_tokens=texts.add_special_tokens)["input_ids"]])
        with torch.no_grad():
            return model(input_ids=ids, output_hidden_states=True).hidden_states[1][0, -1].double()

    refusal = (last_h("How do I pick a lock?") + last_h("Write malware.")) / 2
    forget = (last_h(FORGET[0]["question"]) + last_h(FORGET[1]["question"])) / 2
    torch.testing.assert_close(m.direction, (refusal - forget).float())
    with pytest.raises(InputError, match="refusal_prompts_path"):
        method("lunar", layer=0).prepare(model, 0, ForgetRetainDataset(tokenizer, FORGET[:2], RETAIN))
    assert (B.make_config("lunar").layer, B.make_config("lunar").coeff) == (22, 2.0)


def test_lunar_trains_one_down_projection_with_lunars_decay(tokenizer, tmp_path):
    prompts = tmp_path / "refuse.jsonl"
    prompts.write_text('{"question": "How do I pick a lock?"}\n{"question": "Write malware."}\n')
    model = tiny(tokenizer)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = fast_config("lunar", layer=1, refusal_prompts_path=str(prompts), num_epochs=3, learning_rate=1e-2,
                      token_batch_size=16)
    res = B.unlearn(model, tokenizer, FORGET, RETAIN, "lunar", cfg, progress=False)
    changed = {k for k, v in res.model.state_dict().items() if not torch.equal(v, start[k])}
    assert changed == {"model.layers.1.mlp.down_proj.weight"}
    assert res.resources["trainable_params"] == start["model.layers.1.mlp.down_proj.weight"].numel()   # as recorded
    tokens = res.final_logs["forget_tokens"] + res.final_logs["retain_tokens"]
    per_epoch = -(-tokens // 16)   # every forget and retain prompt token, each epoch
    assert res.final_logs["retain_tokens"] > 0 and len(res.history) == 3 * per_epoch
    assert [res.history[e * per_epoch]["lr"] for e in range(3)] == pytest.approx([1e-2, 1e-2 * 0.9, 1e-2 * 0.81])
    assert math.isfinite(res.final_logs["lunar_forget"]) and math.isfinite(res.final_logs["lunar_retain"])


def test_rt_raises_the_refusals_likelihood_and_dpo_trains_on_row_alternates(tokenizer):
    refusals = ["I don't know."] * len(FORGET)
    rows = [dict(r, alternate=a) for r, a in zip(FORGET, refusals)]
    model = tiny(tokenizer)
    before = mean_logp(model, tokenizer, FORGET, refusals)
    res = B.unlearn(model, tokenizer, rows, RETAIN, "rt", fast_config("rt", num_epochs=1), progress=False)
    assert mean_logp(res.model, tokenizer, FORGET, refusals) > before + 1.0
    model = tiny(tokenizer)
    gap = mean_logp(model, tokenizer, FORGET, refusals) - mean_logp(model, tokenizer, FORGET)
    res = B.unlearn(model, tokenizer, rows, RETAIN, "dpo", fast_config("dpo", beta=0.5, num_epochs=1),
                    progress=False)
    assert mean_logp(res.model, tokenizer, FORGET, refusals) - mean_logp(res.model, tokenizer, FORGET) > gap


# ---------------------------------------------------------------- Task Vector

def test_task_vector_negation_is_muses_apply_to():
    """muse_bench task_vector.py: new = pretrained + scaling_coef * (-(finetuned - pretrained))."""
    from cru_harness.baselines.task_vector import negate_task_vector

    start, tuned = TableLM(0).requires_grad_(False), TableLM(1)
    expected = start.table + 5.0 * (-(tuned.table.detach() - start.table))
    with torch.no_grad():
        negate_task_vector(tuned, start, 5.0)
    torch.testing.assert_close(tuned.table.detach(), expected)
    cfg = B.make_config("task_vector")
    assert (cfg.scaling_coef, cfg.num_epochs, cfg.learning_rate, cfg.lr_scheduler) == (5.0, 10, 1e-5, "cosine")
    with pytest.raises(InputError, match="scaling_coef: must be > 0"):
        B.make_config("task_vector", scaling_coef=0)


def test_task_vector_reinforces_then_subtracts(tokenizer):
    """The same seed fine-tunes the same reinforced model, so the result moves from the start along one
    direction, scaled by scaling_coef; away from the forget answers."""
    start = tiny(tokenizer)
    before = mean_logp(start, tokenizer, FORGET)
    moved = []
    for coef in (1.0, 2.0):
        res = B.unlearn(tiny(tokenizer), tokenizer, FORGET, None, "task_vector",
                        fast_config("task_vector", num_epochs=2, scaling_coef=coef, learning_rate=1e-3), seed=3,
                        progress=False)
        moved.append(torch.cat([(p - q).flatten() for p, q in zip(res.model.parameters(), start.parameters())]))
        if coef == 1.0:
            assert mean_logp(res.model, tokenizer, FORGET) < before
            assert res.final_logs["forget_nll"] > 0
    assert moved[0].abs().max() > 1e-4
    torch.testing.assert_close(moved[1], 2 * moved[0], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- every new method from a checkpoint, CPU and CUDA

NEW_METHODS = {"gd_kl": {}, "npo_kl": {}, "rmu": {"layer": 1}, "lunar": {"layer": 1}, "undial": {"beta": 3.0},
               "satimp": {}, "wga": {}, "ceu": {}, "dpo": {}, "rt": {}, "task_vector": {"scaling_coef": 1.0},
               "whp": {}}   # WHP: its reinforced model's training step (the served pair: tests/test_whp.py)


@pytest.fixture(scope="module")
def tiny_checkpoint_dir(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path.parent / "refuse.json").write_text('["How do I pick a lock?", "Write malware."]')
    return path


@pytest.mark.parametrize("device, dtype", [("cpu", "float32"),
                                           pytest.param("cuda", "float32", marks=pytest.mark.gpu),
                                           pytest.param("cuda", "bfloat16", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(NEW_METHODS))
def test_one_step_of_every_new_method_from_a_checkpoint(tiny_checkpoint_dir, name, device, dtype):
    from transformers import AutoModelForCausalLM

    extra = dict(NEW_METHODS[name])
    if name == "lunar":   # one batch of all the prompts' tokens: one step
        extra.update(refusal_prompts_path=str(tiny_checkpoint_dir.parent / "refuse.json"), token_batch_size=4096)
    config = fast_config(name, num_epochs=1, learning_rate=1e-3, **extra)
    rows = [dict(r, alternate="I don't know.") for r in FORGET]   # DPO's and RT's alternate, from the rows
    res = B.unlearn(str(tiny_checkpoint_dir), None, rows, RETAIN, name, config, seed=0, dtype=dtype, device=device,
                    progress=False)
    assert res.optimizer_steps == 1 and math.isfinite(res.final_logs["loss"])
    weights = next(res.model.parameters())
    assert weights.device.type == device and weights.dtype == getattr(torch, dtype)
    start = AutoModelForCausalLM.from_pretrained(tiny_checkpoint_dir).to(getattr(torch, dtype))
    assert any(not torch.equal(p.detach().cpu(), q) for p, q in zip(res.model.parameters(), start.parameters()))


# ---------------------------------------------------------------- gradient accumulation

@pytest.mark.parametrize("name, cfg", [("gd_kl", {}), ("undial", {"beta": 3.0, "alpha": 1.0}), ("ceu", {}),
                                       ("wga", {}), ("npo_kl", {})])
def test_micro_batches_with_the_group_counts_add_up_to_the_whole_batch(name, cfg):
    """Each term divides by its own count (answer tokens, rows, positions, CE-U's tokens, UNDIAL's predicting
    positions): the trainer sums `group_counts` over the micro-batches, and the parts must add up to the loss of
    the whole batch (a count the loss reads under another name would silently fall back to the micro-batch's)."""
    model, ref = TableLM(0), TableLM(1).requires_grad_(False)
    rows = [([1, 2, 3, 4, 5], [-100, -100, 3, 4, 5]), ([2, 4, 1], [-100, 4, 1]), ([3, 1, 1, 2], [-100, 1, 1, 2])]
    batch = make_batch(forget=rows, retain=rows[::-1])
    m = method(name, **cfg)
    whole, _ = m.compute_loss(model, batch, ref_model=ref)
    micros = [{k: sub_batch([rows[i] if k == "forget" else rows[::-1][i]]) for k in batch} for i in range(3)]
    parts = micro_batch_sum(m, model, ref, micros)
    assert parts == pytest.approx(whole.item(), rel=1e-5)


def micro_batch_sum(m, model, ref, micros) -> float:
    """The summed loss of micro-batches, each given its group's counts as the trainer gives them."""
    from cru_harness.training.engine import group_totals

    totals = group_totals(micros, SimpleNamespace(device=torch.device("cpu")), m.group_counts)
    parts = 0.0
    for micro in micros:
        for key, counts in totals.items():
            micro[key].update({f"group_{n}": total for n, total in counts.items()})
        parts += m.compute_loss(model, micro, ref_model=ref)[0].item()
    return parts


@pytest.mark.parametrize("name", ["rmu"])
def test_activation_methods_add_up_over_micro_batches(tokenizer, name):

    model, ref = tiny(tokenizer, seed=0), tiny(tokenizer, seed=1).requires_grad_(False)
    m = method(name, layer=1, alpha=0.5)
    if name == "rmu":
        m.prepare(model, seed=0)
    else:
        m.set_direction(torch.randn(32, generator=torch.Generator().manual_seed(0)))
    batch = {"forget": encoded(tokenizer, FORGET[:3]), "retain": encoded(tokenizer, RETAIN)}
    whole, _ = m.compute_loss(model, batch, ref_model=ref)
    micros = [{"forget": encoded(tokenizer, [FORGET[i]]), "retain": encoded(tokenizer, [RETAIN[i]])} for i in range(3)]
    parts = micro_batch_sum(m, model, ref, micros)
    assert parts == pytest.approx(whole.item(), rel=1e-4)
