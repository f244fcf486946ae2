"""The `cru` lm-eval model in-process: equality with HFLM, extended results, EOS marker, caching, date pinning."""
from __future__ import annotations

import datetime as dt
import math
import pickle

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from test_lmeval_support import shared_tiny_dir

from cru_harness.lmeval.model import CRULM
from cru_harness.lmeval.routers import parse_router_spec
from cru_harness.protocol import (
    EOS_MARKER,
    PINNED_DATE,
    TOKENIZER_EOS,
    UNK_STOP,
    LoglikelihoodResult,
    RollingResult,
    has_token_stats,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return shared_tiny_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return HFLM(pretrained=str(tiny_dir), device="cpu", batch_size=3)


@pytest.fixture(scope="module")
def cru(tiny_dir):
    return CRULM(base=str(tiny_dir), device="cpu", batch_size=3)


def _ll(pairs):
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def _greedy_continuation(lm, context: str, n: int = 3) -> str:
    ids = torch.tensor([lm.tok_encode(context)])
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                pad_token_id=lm.tokenizer.pad_token_id)
    return lm.tokenizer.decode(out[0, ids.shape[1]:])


def _argmax(lm, ctx_ids, cont_ids) -> list[int]:
    """The model's argmax at each continuation position, from one unbatched forward pass."""
    ids = torch.tensor([ctx_ids + cont_ids])
    with torch.no_grad():
        logits = lm.model(ids).logits[0]
    return logits[len(ctx_ids) - 1: len(ctx_ids) + len(cont_ids) - 1].argmax(-1).tolist()


def _reference(lm, ctx_ids, cont_ids):
    """log p, mu, sigma per continuation token, straight from one unbatched forward pass (float64 statistics)."""
    ids = torch.tensor([ctx_ids + cont_ids])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(ids).logits[0].double(), -1)
    rows = logp[len(ctx_ids) - 1: len(ctx_ids) + len(cont_ids) - 1]
    lp = rows.gather(1, torch.tensor(cont_ids)[:, None])[:, 0]
    p = rows.exp()
    mu = (p * rows).sum(-1)
    sigma = ((p * rows * rows).sum(-1) - mu ** 2).sqrt()
    return lp.tolist(), mu.tolist(), sigma.tolist()


PAIRS = [
    ("Question: What colour is the sky?\nAnswer:", " blue"),
    ("Question: What colour is the sky?\nAnswer:", " green"),   # same context: one-token cache group
    ("Question: What colour is the sky?\nAnswer:", " red"),
    ("Question: How many legs has a cat?\nAnswer:", " four legs and a long tail"),
    ("", "Fish live in water."),                               # empty context -> prefix token
    ("Bees make honey from", " the nectar of flowers"),
]


def test_loglikelihood_equals_hflm_and_carries_token_stats(hf, cru):
    greedy = _greedy_continuation(cru, "Question: Where do fish live?\nAnswer:")
    pairs = PAIRS + [("Question: Where do fish live?\nAnswer:", greedy)]
    ours, theirs = cru.loglikelihood(_ll(pairs)), hf.loglikelihood(_ll(pairs))
    assert [tuple(r) for r in ours] == [tuple(r) for r in theirs]  # exact: same batches, same arithmetic
    assert ours[-1][1] is True and ours[0][1] is False  # is_greedy is exercised both ways
    for (ctx, cont), res in zip(pairs, ours):
        assert isinstance(res, LoglikelihoodResult) and has_token_stats(res)
        ctx_ids, cont_ids = cru._encode_pair(ctx, cont) if ctx else ([cru.prefix_token_id],
                                                                      cru.tok_encode(cont, add_special_tokens=False))
        assert res.n_tokens == len(cont_ids)
        lp, mu, sigma = _reference(cru, ctx_ids, cont_ids)
        assert res.token_logprobs == pytest.approx(lp, abs=1e-4)
        assert res.token_mu == pytest.approx(mu, abs=1e-4)
        assert res.token_sigma == pytest.approx(sigma, abs=1e-4)
        assert math.fsum(res.token_logprobs) == pytest.approx(res[0], abs=1e-4)
        assert all(s > 0 for s in res.token_sigma) and all(m < 0 for m in res.token_mu)
        # per-token argmax flags (teacher forcing) and the scored tokens' text (open-unlearning's ZLib text)
        logits_argmax = _argmax(cru, ctx_ids, cont_ids)
        assert list(res.token_greedy) == [a == t for a, t in zip(logits_argmax, cont_ids)]
        assert res.is_greedy == all(res.token_greedy)
        assert res.text == cru.tokenizer.decode(cont_ids, skip_special_tokens=True)
    assert ours[-1].token_greedy and all(ours[-1].token_greedy) and not all(ours[0].token_greedy)


def test_loglikelihood_equals_hflm_without_logits_cache_and_auto_batch(tiny_dir, hf):
    lm = CRULM(base=str(tiny_dir), device="cpu", batch_size="auto", max_batch_size=4, logits_cache=False)
    assert [tuple(r) for r in lm.loglikelihood(_ll(PAIRS))] == [tuple(r) for r in hf.loglikelihood(_ll(PAIRS))]


def test_eos_marker_appends_the_eos_token(hf, cru):
    ctx = "Question: What colour is the sky?\nAnswer:"
    res, = cru.loglikelihood(_ll([(ctx, " blue" + EOS_MARKER)]))
    plain, = cru.loglikelihood(_ll([(ctx, " blue")]))
    eos = cru.tokenizer.eos_token_id
    ctx_ids, cont_ids = cru._encode_pair(ctx, " blue")
    assert res.n_tokens == plain.n_tokens + 1
    assert res.token_logprobs[:-1] == pytest.approx(plain.token_logprobs, abs=1e-5)
    ref_lp, _, _ = _reference(cru, ctx_ids, cont_ids + [eos])
    assert res.token_logprobs[-1] == pytest.approx(ref_lp[-1], abs=1e-4)
    # HFLM scoring the same token ids agrees on the sum
    (hf_sum, hf_greedy), = hf._loglikelihood_tokens([((ctx, " blue"), ctx_ids, cont_ids + [eos])])
    assert res[0] == pytest.approx(hf_sum, abs=1e-5) and res[1] == hf_greedy
    # only EOS (empty answer), and EOS after an empty context
    only, = cru.loglikelihood(_ll([(ctx, EOS_MARKER)]))
    assert only.n_tokens == 1
    empty_ctx, = cru.loglikelihood(_ll([("", "Fish live in water." + EOS_MARKER)]))
    assert empty_ctx.n_tokens == len(cru.tok_encode("Fish live in water.", add_special_tokens=False)) + 1


def test_rolling_equals_hflm_and_carries_token_stats(hf, cru):
    texts = ["The sky is blue and the grass is green.", "Bees make honey from the nectar of flowers. " * 3]
    reqs = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    ours, theirs = cru.loglikelihood_rolling(reqs), hf.loglikelihood_rolling(reqs)
    assert [float(x) for x in ours] == theirs
    for text, res in zip(texts, ours):
        assert isinstance(res, RollingResult) and has_token_stats(res)
        assert res.n_tokens == len(cru.tok_encode(text))
        assert math.fsum(res.token_logprobs) == pytest.approx(float(res), abs=1e-4)
        lp, mu, sigma = _reference(cru, [cru.prefix_token_id], cru.tok_encode(text))
        assert res.token_mu == pytest.approx(mu, abs=1e-4)
        assert res.token_sigma == pytest.approx(sigma, abs=1e-4)


def test_rolling_across_several_windows(tiny_dir):
    lm = CRULM(base=str(tiny_dir), device="cpu", batch_size=2, max_length=16)
    ref = HFLM(pretrained=str(tiny_dir), device="cpu", batch_size=2, max_length=16)
    text = "Fish live in water, birds fly in the sky. Bees make honey from the nectar of flowers. " * 2
    req = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    res, = lm.loglikelihood_rolling(req)
    assert res.n_tokens == len(lm.tok_encode(text)) > 16  # several windows, concatenated in order
    assert float(res) == ref.loglikelihood_rolling(req)[0]


def test_a_continuation_longer_than_max_length_is_one_clear_error(tiny_dir):
    """HFLM asserts it (a bare AssertionError); `cru` names the lengths and the fix."""
    from cru_harness.errors import InputError

    lm = CRULM(base=str(tiny_dir), device="cpu", batch_size=2, max_length=16)
    long = " bees make honey from the nectar of flowers" * 4
    with pytest.raises(InputError, match=r"a scored continuation is \d+ tokens, more than the model's max_length 16"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("Question: what?\nAnswer:", long), 0)])


def test_results_survive_pickle_and_caching_lm(tmp_path, cru):
    from lm_eval.api.model import CachingLM

    ctx = "Question: What colour is the sky?\nAnswer:"
    res, = cru.loglikelihood(_ll([(ctx, " blue" + EOS_MARKER)]))
    back = pickle.loads(pickle.dumps(res))
    assert back == res and back.token_sigma == res.token_sigma and isinstance(back, LoglikelihoodResult)
    assert back.token_greedy == res.token_greedy and back.text == res.text == " blue"

    cached = CachingLM(cru, str(tmp_path / "cache.db"))
    first = cached.loglikelihood(_ll([(ctx, " blue" + EOS_MARKER), (ctx, " red")]))
    calls = []
    original = cru._loglikelihood_tokens
    cru._loglikelihood_tokens = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        second = cached.loglikelihood(_ll([(ctx, " blue" + EOS_MARKER), (ctx, " red")]))
    finally:
        del cru._loglikelihood_tokens
    assert not calls, "second call should come from the cache"
    for a, b in zip(first, second):
        assert isinstance(b, LoglikelihoodResult) and tuple(a) == tuple(b)
        assert a.token_logprobs == b.token_logprobs and a.token_mu == b.token_mu

    rolled = cached.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("Bees make honey.",), 0)])
    cru._loglikelihood_tokens = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        again = cached.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("Bees make honey.",), 0)])
    finally:
        del cru._loglikelihood_tokens
    assert not calls, "the second rolling call should come from the cache"
    assert isinstance(again[0], RollingResult) and again[0].token_mu == rolled[0].token_mu


DATE_TEMPLATE = (
    "{{ 'Today: ' + strftime_now('%Y-%m-%d') + ' | ' + (date_string if date_string is defined else 'none') }}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_chat_template_date_is_pinned(cru, hf, monkeypatch):
    chat = [{"role": "user", "content": "hi"}]
    for lm in (cru, hf):
        monkeypatch.setattr(lm.tokenizer, "chat_template", DATE_TEMPLATE)
    today = dt.datetime.now().strftime("%Y-%m-%d")
    unpinned = hf.apply_chat_template(chat)
    assert unpinned.startswith(f"Today: {today} | none")  # the template really injects today's date

    pinned = cru.apply_chat_template(chat)
    assert pinned.startswith(f"Today: {PINNED_DATE:%Y-%m-%d} | {PINNED_DATE:%d %b %Y}<|user|>hi<|assistant|>")
    # not a coincidence of today's date: shift the clock transformers' strftime_now reads
    import transformers.utils.chat_template_utils as ctu

    class _Future(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2031, 1, 2, 3, 4, 5)

    monkeypatch.setattr(ctu, "datetime", _Future, raising=False)
    assert cru.apply_chat_template(chat) == pinned
    assert cru.chat_template_args == {}  # the pinning does not leak into the instance


def test_router_spec_parsing():
    assert parse_router_spec(None) == [] and parse_router_spec("") == []
    assert parse_router_spec("runs/a") == ["runs/a"]
    assert parse_router_spec("runs/a + runs/b") == ["runs/a", "runs/b"]
    assert parse_router_spec(["x+y", "z"]) == ["x+y", "z"]  # a list is taken literally
    with pytest.raises(ValueError, match="empty bundle directory"):
        parse_router_spec("runs/a++runs/b")


def test_base_alias_and_errors(tiny_dir):
    with pytest.raises(ValueError, match="needs base="):
        CRULM(device="cpu")
    with pytest.raises(ValueError, match="give the base model once"):
        CRULM(base=str(tiny_dir), pretrained="other", device="cpu")


def test_constructed_instance_in_simple_evaluate(cru):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from test_lmeval_support import TASKS_DIR

    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    out = lm_eval.simple_evaluate(model=cru, tasks=["cru_lmeval_test_eos"], task_manager=tm, limit=2)
    res = out["results"]["cru_lmeval_test_eos"]
    assert res["has_stats,none"] == 1.0 and res["sigma_positive,none"] == 1.0
    assert res["n_tokens,none"] >= 2.0  # answer tokens + EOS


def test_token_stats_on_a_hand_made_distribution_with_an_impossible_token():
    """mu / sigma of log p under p, by hand: p = (1/2, 1/4, 1/4, 0); the -inf entry contributes nothing."""
    from cru_harness.lmeval.model import token_stats

    logp = torch.log(torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]]))
    token_lp, mu, sigma = token_stats(logp, torch.tensor([1, 3]))
    l2, l4 = math.log(0.5), math.log(0.25)
    mu0 = 0.5 * l2 + 0.5 * l4
    assert token_lp == pytest.approx([l4, l4])
    assert mu == pytest.approx([mu0, l4])
    assert sigma == pytest.approx([math.sqrt(0.5 * l2 ** 2 + 0.5 * l4 ** 2 - mu0 ** 2), 0.0], abs=1e-6)
    assert logp.isinf().sum() == 1  # the caller's tensor is not modified


def test_bf16_scoring_with_float32_softmax_is_finer_than_bf16_softmax(tiny_dir):
    """softmax_dtype=float32 (set by the runner for bf16/fp16 scoring) passes through `cru` to HFLM: per-token
    log-probs are no longer rounded to bf16's grid."""
    coarse = CRULM(base=str(tiny_dir), device="cpu", batch_size=3, dtype="bfloat16")
    fine = CRULM(base=str(tiny_dir), device="cpu", batch_size=3, dtype="bfloat16", softmax_dtype="float32")
    assert fine.softmax_dtype == torch.float32 and coarse.softmax_dtype is None

    def off_grid(results):  # token log-probs a bf16 number cannot hold exactly
        values = [v for r in results for v in r.token_logprobs]
        return sum(torch.tensor(v, dtype=torch.float32).to(torch.bfloat16).float().item() != v for v in values)

    assert off_grid(coarse.loglikelihood(_ll(PAIRS))) == 0
    assert off_grid(fine.loglikelihood(_ll(PAIRS))) > 0


NO_SYSTEM_TEMPLATE = (  # Gemma-style: no system role
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<{{ m['role'] }}>{{ m['content'] }}<end>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_without_a_system_role_renders_prompt_and_scored_turn_alike(cru, monkeypatch):
    """lm-eval drops the system turn when a template refuses it (Gemma); the finished conversation TOFU scores
    must drop it too, or it crashes (and its prefix would differ from the prompt's)."""
    monkeypatch.setattr(cru.tokenizer, "chat_template", NO_SYSTEM_TEMPLATE)
    chat = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Who?"}]
    prompt = cru.apply_chat_template(chat)
    finished = cru.apply_chat_template(chat + [{"role": "assistant", "content": "Her."}], add_generation_prompt=False,
                                       close_final_turn=True)
    assert prompt == "<user>Who?<end><assistant>" and finished == "<user>Who?<end><assistant>Her.<end>"


def test_generation_ends_at_a_stop_token_the_decoding_drops(cru, hf, monkeypatch):
    """A stop string that is one special token other than EOS (`<|eot_id|>` where EOS is `<|end_of_text|>`): the
    decoded text drops it, so lm-eval's cut on text cannot see it, and a batch goes on until every sequence has
    stopped. `cru` ends each sequence at its first such id (as RWKU's generate call does); HFLM keeps what follows."""
    tok = cru.tokenizer
    stop = next(t for t in tok.all_special_tokens if t not in (tok.eos_token, tok.pad_token, tok.bos_token))
    stop_id = tok.convert_tokens_to_ids(stop)
    words = [i for t, i in sorted(tok.get_vocab().items()) if t.isalpha() and len(t) > 2][:2]
    after_stop = {"one": [words[0], stop_id, words[1], words[1]], "two": [words[0], words[1], words[1], words[0]]}

    def fake_generate(self, context, max_length, stop, **kwargs):   # what a model would generate for each context
        rows = [after_stop["one" if row[-len(self.tok_encode("one")):].tolist() == self.tok_encode("one") else "two"]
                for row in context]
        return torch.cat([context, torch.tensor(rows)], dim=1)

    monkeypatch.setattr(HFLM, "_model_generate", fake_generate)
    requests = [Instance("generate_until", {}, (ctx, {"until": [stop], "max_gen_toks": 4}), i)
                for i, ctx in enumerate(["one", "two"])]
    assert cru.dropped_stop_ids([stop, "not a token"]) == [stop_id]
    assert cru.dropped_stop_ids([tok.eos_token]) == [tok.eos_token_id]   # lm-eval adds EOS to every task's stops
    assert cru.generate_until(requests) == [tok.decode([words[0]]), tok.decode(after_stop["two"])]
    assert hf.generate_until(requests)[0] == tok.decode(after_stop["one"], skip_special_tokens=True)   # the rest kept


def test_resolved_stop_markers_leave_the_callers_requests_as_they_were(cru, tmp_path, monkeypatch):
    """The protocol's stop markers (every RWKU generation task) are resolved on copies: lm-eval's `--use_cache`
    looks a request up under the arguments it stored it with, and `--log_samples` records them."""
    from lm_eval.api.model import CachingLM

    calls = []

    def fake_generate(self, context, max_length, stop, **kwargs):
        calls.append((stop, kwargs.get("eos_token_id")))
        return torch.cat([context, torch.full((len(context), 2), self.tokenizer.eos_token_id)], dim=1)

    monkeypatch.setattr(HFLM, "_model_generate", fake_generate)
    arguments = ("Who?", {"until": ["\n", UNK_STOP, TOKENIZER_EOS], "max_gen_toks": 2})
    request = Instance("generate_until", {}, arguments, 0)
    cru.generate_until([request])
    assert request.arguments == arguments                             # untouched
    (stop, eos), = calls
    assert UNK_STOP not in stop and TOKENIZER_EOS not in stop and eos == cru.tokenizer.eos_token_id   # resolved

    cached = CachingLM(cru, str(tmp_path / "cache"))
    for _ in range(2):
        cached.generate_until([Instance("generate_until", {}, arguments, 0)])
    assert len(calls) == 2                                            # the second run came from the cache
