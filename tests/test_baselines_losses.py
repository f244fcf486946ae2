"""Each baseline loss against values computed by hand on a 2-example batch.

The fake model ignores its input: at every position its next-token distribution over a 4-token vocabulary is
P = [0.1, 0.2, 0.3, 0.4], so the log-prob of token t is log P[t] wherever it appears. The "reference" fake is
uniform (log 0.25 everywhere). Vocabulary: 0 = pad, 1 = a question token, 2 = an answer token, 3 = EOS.

Forget batch (labels aligned with input_ids; -100 = masked):
  A: input [1, 2, 3, 0, 0]  labels [-100, 2, 3, -100, -100]   answer 2,3   log p = ln(.3*.4)    = ln .12
  B: input [1, 1, 2, 2, 3]  labels [-100, -100, 2, 2, 3]      answer 2,2,3 log p = ln(.3*.3*.4) = ln .036
  token-mean NLL = -(ln .12 + ln .036) / 5 = 1.0889
Question tokens (1, p=.2) and padding (0, p=.1) have different probabilities, so counting either would
change every number below.
Retain batch: C: [1, 3] labels [-100, 3]; D: [1, 1, 3, 0] labels [-100, -100, 3, -100] -> NLL = -ln .4 = 0.9163
Alternate (refusal) batch: A': [1, 1, 3] labels [-100, 1, 3]; B': [1, 1, 1, 3] labels [-100, -100, 1, 3]
  both log p = ln(.2*.4) = ln .08; under the reference 2 ln .25.
"""
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cru_harness.baselines import get_method

P = [0.1, 0.2, 0.3, 0.4]
LN = math.log


def logsigmoid(x):
    return -math.log1p(math.exp(-x))


class FakeLM(nn.Module):
    def __init__(self, probs):
        super().__init__()
        self.logp = nn.Parameter(torch.log(torch.tensor(probs, dtype=torch.float64)).float())

    def forward(self, input_ids, attention_mask=None):
        b, t = input_ids.shape
        return SimpleNamespace(logits=self.logp.expand(b, t, -1))


def sub_batch(rows):
    """rows: list of (input_ids, labels); right-padded with pad 0 / label -100 / attention 0."""
    width = max(len(i) for i, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    att = torch.zeros(len(rows), width, dtype=torch.long)
    for r, (i, lab) in enumerate(rows):
        ids[r, :len(i)] = torch.tensor(i)
        labels[r, :len(lab)] = torch.tensor(lab)
        att[r, :len(i)] = 1
    return {"input_ids": ids, "attention_mask": att, "labels": labels}


@pytest.fixture
def batch():
    return {
        "forget": sub_batch([([1, 2, 3], [-100, 2, 3]), ([1, 1, 2, 2, 3], [-100, -100, 2, 2, 3])]),
        "retain": sub_batch([([1, 3], [-100, 3]), ([1, 1, 3], [-100, -100, 3])]),
        "alternate": sub_batch([([1, 1, 3], [-100, 1, 3]), ([1, 1, 1, 3], [-100, -100, 1, 3])]),
    }


LOGP_A, LOGP_B = LN(.3 * .4), LN(.3 * .3 * .4)          # -2.1203, -3.3242
FORGET_NLL = -(LOGP_A + LOGP_B) / 5                     # 1.0889
RETAIN_NLL = -LN(.4)                                    # 0.9163
REF_A, REF_B = 2 * LN(.25), 3 * LN(.25)                 # -2.7726, -4.1589


def method(name, **cfg):
    cls = get_method(name)
    return cls(cls.Config(**cfg))


def test_ga_loss(batch):
    loss, logs = method("ga").compute_loss(FakeLM(P), batch)
    assert loss.item() == pytest.approx(-FORGET_NLL, rel=1e-5)    # -1.0889
    assert logs["forget_nll"] == pytest.approx(FORGET_NLL, rel=1e-5)


def test_gd_loss_uses_alpha(batch):
    loss, logs = method("gd", alpha=2.0).compute_loss(FakeLM(P), batch)
    assert loss.item() == pytest.approx(-FORGET_NLL + 2.0 * RETAIN_NLL, rel=1e-5)   # 0.7437
    assert logs["retain_nll"] == pytest.approx(RETAIN_NLL, rel=1e-5)


def test_npo_loss(batch):
    beta = 0.1
    # log-ratios: ln(.12/.0625) = 0.6523, ln(.036/.015625) = 0.8346
    ra, rb = LOGP_A - REF_A, LOGP_B - REF_B
    forget = (-(2 / beta) * logsigmoid(-beta * ra) - (2 / beta) * logsigmoid(-beta * rb)) / 2   # 14.6205
    m = method("npo", beta=beta, alpha=0.5)
    loss, logs = m.compute_loss(FakeLM(P), batch, ref_model=FakeLM([.25] * 4).requires_grad_(False))
    assert forget == pytest.approx(14.6205, abs=1e-4)
    assert loss.item() == pytest.approx(forget + 0.5 * RETAIN_NLL, rel=1e-5)
    assert logs["forget_logratio"] == pytest.approx((ra + rb) / 2, rel=1e-5)


def test_npo_requires_reference(batch):
    with pytest.raises(ValueError, match="reference model"):
        method("npo").compute_loss(FakeLM(P), batch)


@pytest.mark.parametrize("gamma", [0.0, 5.0])
def test_simnpo_loss(batch, gamma):
    beta = 4.5
    # length-normalised log-probs: ln(.12)/2 = -1.0601, ln(.036)/3 = -1.1081
    per = [-(2 / beta) * logsigmoid(-beta * lp / n - gamma) for lp, n in ((LOGP_A, 2), (LOGP_B, 3))]
    forget = sum(per) / 2              # gamma 0: 0.003388
    loss, logs = method("simnpo", beta=beta, gamma=gamma, forget_weight=0.125, alpha=1.0).compute_loss(FakeLM(P), batch)
    assert loss.item() == pytest.approx(0.125 * forget + RETAIN_NLL, rel=1e-5)
    assert logs["simnpo_forget"] == pytest.approx(forget, rel=1e-4)


def test_idkdpo_loss(batch):
    beta = 0.1
    win = LN(.2 * .4) - 2 * LN(.25)                     # refusal log-ratio: ln(.08/.0625) = 0.2469
    lose_a, lose_b = LOGP_A - REF_A, LOGP_B - REF_B
    forget = (-(2 / beta) * logsigmoid(beta * (win - lose_a)) - (2 / beta) * logsigmoid(beta * (win - lose_b))) / 2
    assert forget == pytest.approx(14.3659, abs=1e-4)
    ref = FakeLM([.25] * 4).requires_grad_(False)
    loss, logs = method("idkdpo", beta=beta, alpha=1.0).compute_loss(FakeLM(P), batch, ref_model=ref)
    assert loss.item() == pytest.approx(forget + RETAIN_NLL, rel=1e-5)
    assert logs["dpo_margin"] == pytest.approx(win - (lose_a + lose_b) / 2, rel=1e-5)


def test_loss_gradients_reach_policy_not_reference(batch):
    policy, ref = FakeLM(P), FakeLM([.25] * 4).requires_grad_(False)
    loss, _ = method("idkdpo").compute_loss(policy, batch, ref_model=ref)
    loss.backward()
    assert policy.logp.grad is not None and policy.logp.grad.abs().sum() > 0
    assert ref.logp.grad is None


def test_masked_positions_do_not_matter(batch):
    """Two models that agree on the answer tokens' probabilities (P[2], P[3]) but not on the pad / question
    tokens' (P[0], P[1]) give the same loss: only answer positions are scored."""
    other = FakeLM([0.25, 0.05, 0.3, 0.4])  # same P[2], P[3]; different pad / question probabilities
    l1, _ = method("ga").compute_loss(FakeLM(P), batch)
    l2, _ = method("ga").compute_loss(other, batch)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-6)


def test_group_totals_normalise_like_one_big_batch(batch):
    """With the accumulation-group totals set, each micro-batch contributes its share of the big-batch mean."""
    m = method("gd", alpha=1.0)
    whole, _ = m.compute_loss(FakeLM(P), batch)
    parts = 0.0
    for i in range(2):
        micro = {k: {kk: vv[i:i + 1] for kk, vv in v.items()} for k, v in batch.items()}
        for k in micro:
            micro[k]["group_tokens"] = (batch[k]["labels"][:, 1:] != -100).sum()
            micro[k]["group_seqs"] = torch.tensor(2)
        # drop the trailing padding column of the shorter example: it must not matter
        parts = parts + m.compute_loss(FakeLM(P), micro)[0].item()
    assert parts == pytest.approx(whole.item(), rel=1e-5)
