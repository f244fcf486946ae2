"""`cru` with router bundles attached: scores change, `+` joins bundles, mismatches raise the bundle's error."""
from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance
from test_lmeval_support import CORPUS, shared_tiny_dir

from cru_harness.lmeval.model import CRULM

FORGET = [t for t in CORPUS if "cat" in t or "bees" in t.lower()]
RETAIN = [t for t in CORPUS if t not in FORGET]
PAIRS = [("Question: How many legs has a cat?\nAnswer:", " four"),
         ("Question: What colour is the sky?\nAnswer:", " blue")]


def _train_bundle(model_dir, out_dir, seed):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cru_harness.cru.train import RouterTrainingConfig, train_routers

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = RouterTrainingConfig(last_k=2, percentile=75.0, d_r=4, epochs=1, lr=5e-2, batch_size=8,
                               max_length=64, seed=seed, progress=False)
    bundle = train_routers(model, tok, FORGET, RETAIN, cfg)
    bundle.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = shared_tiny_dir(tmp_path_factory)
    other_dir = shared_tiny_dir(tmp_path_factory, name="tiny_qwen2", arch="qwen2")
    root = tmp_path_factory.mktemp("bundles")
    a = _train_bundle(model_dir, root / "a", seed=0)
    b = _train_bundle(model_dir, root / "b", seed=1)
    foreign = _train_bundle(other_dir, root / "foreign", seed=0)
    return model_dir, a, b, foreign


def _scores(lm):
    return [tuple(r) for r in lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(PAIRS)])]


def test_routers_change_scores_and_detach_cleanly(setup):
    model_dir, a, b, _ = setup
    base = _scores(CRULM(base=str(model_dir), device="cpu", batch_size=2))
    routed = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=2)
    assert routed.has_routers and routed.get_model_info()["cru_routers"] == [str(a)]
    with_routers = _scores(routed)
    assert with_routers != base
    with routed.without_routers():
        assert _scores(routed) == base
    assert _scores(routed) == with_routers  # re-attached

    both = CRULM(base=str(model_dir), routers=f"{a}+{b}", device="cpu", batch_size=2)
    assert len(both.bundles) == 2
    two = _scores(both)
    assert two != with_routers and two != base


def test_bundle_for_another_base_raises_the_bundle_error(setup):
    from cru_harness.cru.bundle import BundleError

    model_dir, _, _, foreign = setup
    with pytest.raises(BundleError, match="bundle"):
        CRULM(base=str(model_dir), routers=str(foreign), device="cpu")


def test_missing_bundle_directory_is_named(setup, tmp_path):
    from cru_harness.cru.bundle import BundleError

    model_dir = setup[0]
    with pytest.raises(BundleError, match="nope"):
        CRULM(base=str(model_dir), routers=str(tmp_path / "nope"), device="cpu")


def test_routed_scores_and_generations_do_not_depend_on_the_batch(setup):
    """Batches pad: gates run on every position, pad tokens included, and generation pads on the left. A routed
    model must still score and answer each request as it does alone (pads are masked, positions follow the mask)."""
    model_dir, a, _, _ = setup
    prompts = ["Question: How many legs has a cat?\nAnswer:", "Question: Why?\nAnswer:",
               "Question: What colour is the sky over the sea at noon in summer?\nAnswer:", "Bees"]
    pairs = [(p, " four") for p in prompts] + PAIRS
    gen = [Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 8, "do_sample": False}), i)
           for i, p in enumerate(prompts)]
    likelihood = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    one = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=1)
    many = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=len(pairs))
    assert one.generate_until(gen) == many.generate_until(gen)
    alone, batched = one.loglikelihood(likelihood), many.loglikelihood(likelihood)
    assert [r[1] for r in alone] == [r[1] for r in batched]
    assert [r[0] for r in alone] == pytest.approx([r[0] for r in batched], abs=1e-4)
    with many.without_routers():
        assert [r[0] for r in many.loglikelihood(likelihood)] != pytest.approx([r[0] for r in batched], abs=1e-4)


def test_use_cache_refuses_a_cache_another_model_wrote(setup, tmp_path):
    """lm-eval keys `--use_cache` by the requests alone: a cache written with bundle A must not answer for B, the
    base alone, or another dtype; the model that wrote it reads it back (and gets its own numbers)."""
    from lm_eval.api.model import CachingLM

    from cru_harness.lmeval.arguments import ModelArgumentError

    model_dir, a, b, _ = setup
    db = str(tmp_path / "cache.db")
    routed_a = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=2)
    first = _scores(CachingLM(routed_a, db))
    for other, differ in ((dict(routers=str(b)), "routers"), ({}, "routers"), (dict(routers=str(a), dtype="bfloat16"),
                                                                               "dtype")):
        lm = CRULM(base=str(model_dir), device="cpu", batch_size=2, **other)
        with pytest.raises(ModelArgumentError, match=f"written by another model \\(its .*{differ}"):
            CachingLM(lm, db)
    again = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=2)
    assert _scores(CachingLM(again, db)) == first

    from sqlitedict import SqliteDict

    foreign = str(tmp_path / "foreign.db")
    with SqliteDict(foreign, autocommit=True) as written:   # as `--model hf` leaves one: no identity entry
        written["0" * 64] = (-1.0, True)
    with pytest.raises(ModelArgumentError, match="holds results of a model it does not name"):
        CachingLM(again, foreign)


def test_a_bundle_trained_on_another_prompt_format_is_warned_about_once(setup, caplog):
    """Routers trained on plain prompts scored through the chat template (or the reverse) measure a format change:
    one warning line, once per model; a bundle that records no format (made before bundles recorded it), or the
    same format, gives none."""
    import logging

    model_dir, a, _, _ = setup
    lm = CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=2)
    bundle = lm.bundles[0]
    assert "prompt_format" not in bundle.config.training   # trained by train_routers alone: not recorded

    def warnings_after_scoring(trained: str | None, chat: bool) -> list[str]:
        bundle.config.training.pop("prompt_format", None)
        if trained is not None:
            bundle.config.training["prompt_format"] = trained
        lm.routers._format_checked, lm._chat_rendered = False, chat
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cru_harness.lmeval.routers"):
            _scores(lm)
            _scores(lm)
        return [r.getMessage() for r in caplog.records if "prompt" in r.getMessage()]

    said = warnings_after_scoring("chat", chat=False)
    assert len(said) == 1 and str(a) in said[0] and "no chat template" in said[0], said
    said = warnings_after_scoring("plain", chat=True)
    assert len(said) == 1 and "plain prompts" in said[0] and "with the chat template" in said[0], said
    assert warnings_after_scoring("plain", chat=False) == []
    assert warnings_after_scoring("chat", chat=True) == []
    assert warnings_after_scoring(None, chat=True) == []


def test_prompt_format_label_records_what_training_used():
    from cru_harness.prompts import prompt_format_label

    class Tok:
        chat_template = "{{ messages }}"

    assert prompt_format_label({"chat": None, "family": None}, Tok()) == "chat"   # auto: the tokenizer decides
    assert prompt_format_label({"chat": False, "family": None}, Tok()) == "plain"
    assert prompt_format_label({"chat": False, "family": "Llama-2-7b-chat-hf"}) == "Llama-2-7b-chat-hf"
    assert prompt_format_label({"chat": True, "benchmark": "rwku"}) == "chat"


def test_base_takes_a_testbed_name(setup, monkeypatch):
    """`--model_args base=zoo:llama:finetuned` (as runner configs name the testbed's models) loads that checkpoint."""
    from cru_harness.testbed import zoo

    model_dir, a, _, _ = setup
    asked = []
    monkeypatch.setattr(zoo, "tiny_checkpoint", lambda arch, variant, **_: asked.append((arch, variant)) or model_dir)
    named = CRULM(base="zoo:llama:finetuned", routers=str(a), device="cpu", batch_size=2)
    assert asked == [("llama", "finetuned")]
    assert _scores(named) == _scores(CRULM(base=str(model_dir), routers=str(a), device="cpu", batch_size=2))
