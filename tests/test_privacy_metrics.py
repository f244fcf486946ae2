"""Privacy and memorization metrics (cru_harness.metrics.privacy) against independent computations re-typed from
open-unlearning's code (d3d7cf9e6b3c, src/evals/metrics/: mia/*.py, privacy.py, memorization.py), on fixed per-token
log-probabilities, with scikit-learn's roc_auc_score for the AUC. Each direction / sign / label convention has a
test that fails when it is flipped."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from cru_harness import metrics as M

RNG = np.random.default_rng(49)
V = 11  # vocabulary of the fixed next-token distributions


def _item(n: int, shift: float):
    """One text: per-position vocabulary log-probs [n, V] (one position near one-hot, to hit the variance floor),
    the scored tokens, their log-probs (the last one standing for EOS)."""
    tokens = RNG.integers(0, V, n)
    tokens[n // 2] = 3
    logits = RNG.normal(size=(n, V)) * 2.0 + shift * np.eye(V)[tokens]   # shift > 0: the text's own tokens likelier
    logits[n // 2] = np.where(np.arange(V) == 3, 40.0, 0.0)   # variance ~1e-15 < open-unlearning's 1e-6 floor
    vocab_lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return {"vocab_lp": vocab_lp, "tokens": tokens, "lp": vocab_lp[np.arange(n), tokens],
            "text": " ".join(f"w{t}" for t in tokens)}


# forget items are "memorized" (peaked on their own tokens: shift > 0), holdout items not
FORGET = [_item(n, 6.0) for n in (5, 8, 12, 3, 9, 7)]
HOLDOUT = [_item(n, 0.0) for n in (6, 4, 10, 8, 5)]


def _mu_sigma(vocab_lp):
    """Mean and standard deviation of log p(v) under p, as the `cru` model reports them (token_mu, token_sigma)."""
    p = np.exp(vocab_lp)
    mu = (p * vocab_lp).sum(-1)
    return mu, np.sqrt(np.maximum((p * (vocab_lp - mu[:, None]) ** 2).sum(-1), 0.0))


# ----------------------------------------------------------------------- open-unlearning, re-typed

def ou_avg_loss(lp):   # utils.py evaluate_probability: CrossEntropy summed over labels / num_token_gt
    return float(np.sum(-np.asarray(lp)) / len(lp))


def ou_min_k(lp_no_eos, k=0.4):   # mia/min_k.py compute_score
    lp = np.asarray(lp_no_eos, dtype=float)
    if lp.size == 0:
        return 0
    num_k = max(1, int(len(lp) * k))
    return -np.mean(np.sort(lp)[:num_k])


def ou_min_k_plus_plus(vocab_lp_no_eos, target_lp_no_eos, k=0.4):   # mia/min_k_plus_plus.py compute_score
    all_probs = np.asarray(vocab_lp_no_eos)
    mu = (np.exp(all_probs) * all_probs).sum(-1)
    sigma = (np.exp(all_probs) * np.square(all_probs)).sum(-1) - np.square(mu)
    sigma = np.clip(sigma, 1e-6, None)
    scores = (np.asarray(target_lp_no_eos) - mu) / np.sqrt(sigma)
    num_k = max(1, int(len(scores) * k))
    return -np.mean(sorted(scores)[:num_k])


def ou_auc(forget_scores, holdout_scores):   # mia/utils.py mia_auc
    scores = np.array(list(forget_scores) + list(holdout_scores))
    labels = np.array([0] * len(forget_scores) + [1] * len(holdout_scores))
    return roc_auc_score(labels, scores)


def ou_privleak(score, ref):   # privacy.py privleak
    score, ref = 1 - score, 1 - ref
    return (score - ref) / (ref + 1e-10) * 100


def ou_extraction_strength(preds, labels):   # memorization.py _extraction_strength, one item
    valid_len = len(labels)
    for k in range(valid_len):
        if np.array_equal(preds[k:], labels[k:]):
            break
    if valid_len == 0:
        return 0
    return 1 - (k / valid_len)


def ou_exact_memorization(preds, labels):   # memorization.py _exact_memorization, one item
    return None if len(labels) == 0 else float((np.asarray(preds) == np.asarray(labels)).sum() / len(labels))


# ----------------------------------------------------------------------- attack scores

def test_loss_zlib_and_reference_attacks_use_every_token_and_the_loss_sign():
    for a, b in zip(FORGET, HOLDOUT):
        assert M.loss_attack(a["lp"]) == pytest.approx(ou_avg_loss(a["lp"]), rel=1e-12)
        expected = ou_avg_loss(a["lp"]) / len(zlib.compress(a["text"].encode("utf-8")))   # mia/zlib.py
        assert M.zlib_attack(a["lp"], a["text"]) == pytest.approx(expected, rel=1e-12)
        # mia/reference.py: target_loss - ref_loss, the second model's losses on the same tokens
        assert M.reference_attack(a["lp"], a["lp"] - 0.25) == pytest.approx(-0.25, rel=1e-9)
        assert M.reference_attack(a["lp"], b["lp"]) == pytest.approx(ou_avg_loss(a["lp"]) - ou_avg_loss(b["lp"]))
    # loss-like: a likelier text scores lower (a flipped sign would rank it higher)
    assert M.loss_attack([-0.1, -0.2]) < M.loss_attack([-2.0, -3.0])
    assert M.zlib_attack([-0.1], "same text") < M.zlib_attack([-2.0], "same text")
    assert M.loss_attack([-0.5, -1.5]) == 1.0 and M.zlib_attack([-1.0], "a") > 0


def test_min_k_uses_open_unlearnings_k_and_drops_the_eos_token():
    assert M.OPEN_UNLEARNING_MIN_K == 0.4
    for item in FORGET + HOLDOUT:
        lp = M.without_eos(item["lp"])
        assert len(lp) == len(item["lp"]) - 1
        assert M.min_k_attack(lp) == pytest.approx(ou_min_k(lp), rel=1e-12)
        assert M.min_k_attack(lp, k=0.2) == pytest.approx(ou_min_k(lp, 0.2), rel=1e-12)
    lp = [-5.0, -1.0, -0.5, -0.2, -0.1, -0.1, -0.05, -0.01, -3.0, -0.3]   # 10 tokens: k=0.4 keeps 4, 0.2 keeps 2
    assert M.min_k_attack(lp) == pytest.approx((5 + 3 + 1 + 0.5) / 4)
    assert M.min_k_attack(lp) != pytest.approx(M.min_k_attack(lp, k=0.2))
    assert M.min_k_attack([]) == 0   # no tokens: open-unlearning's 0


def test_min_k_plus_plus_matches_the_vocabulary_computation_with_its_variance_floor():
    floored = 0
    for item in FORGET + HOLDOUT:
        mu, sigma = _mu_sigma(item["vocab_lp"])
        floored += int((sigma < 1e-3).sum())
        got = M.min_k_plus_plus_attack(M.without_eos(item["lp"]), M.without_eos(mu), M.without_eos(sigma))
        want = ou_min_k_plus_plus(item["vocab_lp"][:-1], item["lp"][:-1])
        assert got == pytest.approx(want, rel=1e-6), item["tokens"]
    assert floored == len(FORGET + HOLDOUT)   # every item has its near one-hot position, which the floor handles
    assert M.min_k_plus_plus_attack([], [], []) == 0


def test_without_eos_drops_exactly_the_last_scored_token():
    assert M.without_eos([-1.0, -2.0, -3.0]).tolist() == [-1.0, -2.0]
    with pytest.raises(ValueError, match="non-empty"):
        M.without_eos([])


def test_gradnorm_attack_is_the_mean_parameter_norm():
    assert M.gradnorm_attack([1.0, 2.0, 6.0]) == 3.0
    assert M.GRADNORM_P == 2
    with pytest.raises(ValueError, match="cannot be negative"):
        M.gradnorm_attack([1.0, -1.0])


# ----------------------------------------------------------------------- AUC and privleak

def _scores(attack):
    return [attack(x) for x in FORGET], [attack(x) for x in HOLDOUT]


ATTACKS = {
    "loss": lambda x: M.loss_attack(x["lp"]),
    "zlib": lambda x: M.zlib_attack(x["lp"], x["text"]),
    "min_k": lambda x: M.min_k_attack(M.without_eos(x["lp"])),
    "min_k++": lambda x: M.min_k_plus_plus_attack(M.without_eos(x["lp"]), *map(M.without_eos, _mu_sigma(x["vocab_lp"]))),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_forget_holdout_auc_is_roc_auc_with_forget_labelled_0(attack):
    forget, holdout = _scores(ATTACKS[attack])
    auc = M.forget_holdout_auc(forget, holdout)
    assert auc == pytest.approx(ou_auc(forget, holdout), abs=1e-12)
    # the memorized forget items are recognised: AUC well above chance in open-unlearning's convention
    assert auc > 0.8
    # a flipped label convention (forget = 1) would give 1 - AUC
    flipped = roc_auc_score([1] * len(forget) + [0] * len(holdout), forget + holdout)
    assert auc != pytest.approx(flipped)


def test_auc_ties_count_one_half_and_the_rwku_signed_auc_is_the_same_number():
    forget, holdout = [0.5, 1.0, 1.0, 2.0], [1.0, 3.0, 0.5]
    assert M.forget_holdout_auc(forget, holdout) == pytest.approx(ou_auc(forget, holdout))
    assert M.forget_holdout_auc([0.1, 0.2], [0.3, 0.4]) == 1.0   # lower loss on the forget set: recognised
    assert M.forget_holdout_auc([0.3, 0.4], [0.1, 0.2]) == 0.0
    f, h = _scores(ATTACKS["loss"])
    # RWKU's sign (mia.py: larger = member) with the forget set as members gives the same AUC
    assert M.forget_holdout_auc(f, h) == pytest.approx(
        M.mia_auc([M.loss_score(x["lp"]) for x in FORGET], [M.loss_score(x["lp"]) for x in HOLDOUT]))


@pytest.mark.parametrize("auc, retain", [(1.0, 0.5), (0.5, 0.5), (0.0, 0.5), (0.83, 0.61), (0.2, 0.47), (0.7, 1.0)])
def test_privleak_is_musees_relative_gap_as_open_unlearning_computes_it(auc, retain):
    assert M.privleak(auc, retain) == pytest.approx(ou_privleak(auc, retain), rel=1e-12, abs=1e-9)


def test_privleak_direction_and_default_retain_auc():
    assert M.privleak(1.0) == pytest.approx(-100.0)   # forget set fully recognised: under-unlearned
    assert M.privleak(0.0) == pytest.approx(100.0)    # forget set less likely than held-out text: over-unlearned
    assert M.privleak(0.61, 0.61) == 0.0               # the retain model's own leakage: best
    assert M.privleak(0.9, 0.6) < 0 < M.privleak(0.3, 0.6)
    assert M.PRIVLEAK_DEFAULT_RETAIN_AUC == 0.5 and M.privleak(0.75) == M.privleak(0.75, 0.5)
    with pytest.raises(ValueError, match="auc_unlearned must be an AUC in"):
        M.privleak(1.5, 0.5)


# ----------------------------------------------------------------------- memorization

def _greedy(item):
    """Teacher-forced argmax per scored token, without the EOS prediction (tokenwise_vocab_logprobs)."""
    preds = item["vocab_lp"].argmax(-1)[:-1]
    labels = item["tokens"][:-1]
    return preds, labels


def test_exact_memorization_and_extraction_strength_on_the_fixed_items():
    values = []
    for item in FORGET + HOLDOUT:
        preds, labels = _greedy(item)
        flags = preds == labels
        assert M.exact_memorization(flags) == pytest.approx(ou_exact_memorization(preds, labels))
        assert M.extraction_strength(flags) == pytest.approx(ou_extraction_strength(preds, labels))
        values.append((M.exact_memorization(flags), M.extraction_strength(flags)))
    # the memorized (forget) items score higher on both
    em_f, es_f = np.mean(values[:len(FORGET)], axis=0)
    em_h, es_h = np.mean(values[len(FORGET):], axis=0)
    assert em_f > em_h and es_f > es_h


@pytest.mark.parametrize("flags", [[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1], [0],
                                   [0, 1, 0, 1, 1]])
def test_extraction_strength_follows_open_unlearnings_loop(flags):
    labels = np.arange(len(flags))
    preds = np.where(np.asarray(flags, dtype=bool), labels, -1)
    assert M.extraction_strength(flags) == pytest.approx(ou_extraction_strength(preds, labels))


def test_extraction_strength_edges():
    assert M.extraction_strength([True] * 4) == 1.0           # the whole answer follows from the question
    assert M.extraction_strength([False, True, True, True]) == 0.75
    assert M.extraction_strength([True, True, True, False]) == 0.25   # no suffix matches: the loop ends at n-1
    assert M.extraction_strength([]) == 0.0 and M.exact_memorization([]) is None
    assert M.exact_memorization([True, False, True, True]) == 0.75
    with pytest.raises(ValueError, match="booleans"):
        M.exact_memorization([0.5, 1.0])
    assert math.isclose(M.extraction_strength(np.ones(10, dtype=bool)), 1.0)


# ----------------------------------------------------------------------- attacks that need the model

ROWS = [{"question": "Who wrote 'The Lighthouse Keeper'?", "answer": "Jane Doe wrote it in 1990."},
        {"question": "Where was Jane Doe born?", "answer": "In Paris, France."}]


@pytest.fixture(scope="module")
def tiny():
    from cru_harness.testbed.models import build_tiny_model
    from cru_harness.testbed.tokenizer import train_tokenizer

    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in ROWS] * 8
    tok = train_tokenizer(texts, 300, chat_template=False)
    return tok, build_tiny_model("llama", tok, n_layers=1, hidden_size=16), build_tiny_model(
        "llama", tok, n_layers=1, hidden_size=16, seed=1)


def _reference_ids(tok, row):
    """The plain TOFU text re-typed (`Question: q\\nAnswer:` + " " + answer + EOS; the prompt's own token count)."""
    prompt = f"Question: {row['question']}\nAnswer:"
    ids = tok(prompt + " " + row["answer"])["input_ids"] + [tok.eos_token_id]
    return ids, len(tok(prompt)["input_ids"])


def test_gradnorm_scores_match_a_direct_backward_pass(tiny):
    import torch
    import torch.nn.functional as F

    from cru_harness.scoring.model_scores import gradnorm_scores

    tok, model, _ = tiny
    model.eval()
    got = gradnorm_scores(model, tok, ROWS, chat=False)
    assert not model.training and all(p.grad is None for p in model.parameters())   # mode restored, grads cleared
    for row, score in zip(ROWS, got, strict=True):
        ids, n_prompt = _reference_ids(tok, row)
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits[0]
        # labels n_prompt .. len-2: every answer token but the EOS prediction (tokenwise_logprobs' [:-1])
        loss = F.cross_entropy(logits[n_prompt - 1:len(ids) - 2], x[0, n_prompt:len(ids) - 1])
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        want = float(np.mean([g.norm(p=2).item() for g in grads if g is not None]))
        assert score == pytest.approx(want, rel=1e-5)
    assert gradnorm_scores(model, tok, ROWS[:1], chat=False, p=1)[0] > got[0]   # the L1 norm of the same gradients
    with pytest.raises(ValueError, match="1, 2 or inf"):
        gradnorm_scores(model, tok, ROWS, chat=False, p=3)


def test_reference_scores_are_the_loss_gap_to_the_reference_model(tiny):
    import torch
    import torch.nn.functional as F

    from cru_harness.scoring.model_scores import loss_scores, reference_scores

    tok, model, other = tiny
    assert reference_scores(model, model, tok, ROWS, chat=False) == [0.0, 0.0]
    got = reference_scores(model, other, tok, ROWS, chat=False)

    def avg_loss(m, row):   # evaluate_probability: every scored token, EOS included
        ids, n_prompt = _reference_ids(tok, row)
        x = torch.tensor([ids])
        with torch.no_grad():
            return F.cross_entropy(m(input_ids=x).logits[0, n_prompt - 1:-1], x[0, n_prompt:]).item()

    for row, score in zip(ROWS, got, strict=True):
        assert score == pytest.approx(avg_loss(model, row) - avg_loss(other, row), rel=1e-5, abs=1e-6)
    assert loss_scores(model, tok, ROWS, chat=False) == pytest.approx([avg_loss(model, r) for r in ROWS], rel=1e-5)
