"""WHP (MUSE's `WHPModelForCausalLM`): the `cru` model scores and generates with v_b - alpha * ReLU(v_r - v_b),
`cru-harness unlearn --method WHP` writes what it scores, and single-checkpoint loaders refuse the pair."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from test_lmeval_support import build_tiny_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from cru_harness.baselines import make_config
from cru_harness.baselines.whp import METHOD, WHPConfig, WHPError, read_whp, save_whp
from cru_harness.errors import InputError
from cru_harness.lmeval.arguments import ModelArgumentError
from cru_harness.lmeval.model import CRULM
from cru_harness.locations import ModelPathError

ALPHA = 2.5
PAIRS = [("Question: What colour is the sky?\nAnswer:", " blue"),
         ("The sky is", " blue and the grass is green.")]
PROMPTS = ["Question: Where do fish live?\nAnswer:", "Bees make"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny baseline, a reinforced model (the baseline with its final norm doubled: v_r = 2 v_b, so the ReLU
    offset lowers exactly the positive logits, and a random model's greedy tokens change), the WHP directory."""
    root = tmp_path_factory.getbasetemp() / "whp_models"
    base = build_tiny_dir(root / "base", seed=0)
    other, whp = root / "reinforced", root / "whp"
    if not whp.exists():
        reinforced = AutoModelForCausalLM.from_pretrained(base)
        with torch.no_grad():
            reinforced.model.norm.weight.mul_(2)
        tokenizer = AutoTokenizer.from_pretrained(base)
        reinforced.save_pretrained(other)
        tokenizer.save_pretrained(other)
        save_whp(whp, reinforced, tokenizer, baseline=str(base), alpha=ALPHA)
    return base, other, whp


def combined(base, reinforced, ids: torch.Tensor) -> torch.Tensor:
    """v_b - alpha * max(v_r - v_b, 0), computed here from the two checkpoints."""
    with torch.no_grad():
        v_b, v_r = base(ids).logits.float(), reinforced(ids).logits.float()
    return v_b - ALPHA * (v_r - v_b).clamp(min=0)


def test_loglikelihood_is_the_combined_logits(models):
    base_dir, other_dir, whp_dir = models
    lm = CRULM(base=str(whp_dir), device="cpu", batch_size=2)
    assert lm.get_model_info()["cru_whp"]["alpha"] == ALPHA
    base, other = (AutoModelForCausalLM.from_pretrained(d).eval() for d in (base_dir, other_dir))
    results = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)])
    plain = HFLM(pretrained=str(base_dir), device="cpu", batch_size=2).loglikelihood(
        [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)])
    for (context, continuation), result, alone in zip(PAIRS, results, plain):
        ctx, cont = lm.encode_request(context, continuation)
        logp = torch.log_softmax(combined(base, other, torch.tensor([ctx + cont])), dim=-1)[0]
        expected = sum(float(logp[len(ctx) - 1 + i, token]) for i, token in enumerate(cont))
        assert result[0] == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert abs(result[0] - alone[0]) > 1e-3   # the reinforced model moved it


def _greedy(base, reinforced, ids: list[int], n: int, eos: int) -> list[int]:
    """Greedy decoding on the combined logits, the whole sequence recomputed at every step (MUSE's wrapper)."""
    out = []
    for _ in range(n):
        token = int(combined(base, reinforced, torch.tensor([ids + out]))[0, -1].argmax())
        if token == eos:
            break
        out.append(token)
    return out


def test_generation_takes_the_combined_logits_at_every_step(models):
    base_dir, other_dir, whp_dir = models
    lm = CRULM(base=str(whp_dir), device="cpu", batch_size=2)   # both prompts in one left-padded batch
    base, other = (AutoModelForCausalLM.from_pretrained(d).eval() for d in (base_dir, other_dir))
    requests = [Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 6, "do_sample": False}), i)
                for i, p in enumerate(PROMPTS)]
    texts = lm.generate_until(requests)
    for prompt, text in zip(PROMPTS, texts):
        tokens = _greedy(base, other, lm.tok_encode(prompt), 6, lm.tokenizer.eos_token_id)
        assert text == lm.tok_decode(tokens)
    hf = HFLM(pretrained=str(base_dir), device="cpu", batch_size=2).generate_until(requests)
    assert hf != texts   # the baseline alone answers otherwise


def test_a_pair_of_equal_models_generates_as_hf_generates(models, tmp_path):
    """alpha * ReLU(0) = 0: the loop's padding, positions, caches and stops are HF generate's."""
    base_dir = models[0]
    same = tmp_path / "same"
    save_whp(same, AutoModelForCausalLM.from_pretrained(base_dir), AutoTokenizer.from_pretrained(base_dir),
             baseline=str(base_dir), alpha=ALPHA)
    requests = [Instance("generate_until", {}, (p, {"until": ["fish"], "max_gen_toks": 6, "do_sample": False}), i)
                for i, p in enumerate(PROMPTS)]
    ours = CRULM(base=str(same), device="cpu", batch_size=2).generate_until(requests)
    assert ours == HFLM(pretrained=str(base_dir), device="cpu", batch_size=2).generate_until(requests)


@pytest.mark.gpu
def test_the_pair_scores_on_cuda_as_on_the_cpu(models):
    """Both checkpoints of the pair go to the GPU and the combined logits match the CPU's."""
    whp_dir = models[2]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
    cpu = CRULM(base=str(whp_dir), device="cpu", batch_size=2).loglikelihood(requests)
    lm = CRULM(base=str(whp_dir), device="cuda", batch_size=2)
    assert {p.device.type for p in lm.model.parameters()} == {"cuda"}
    for on_gpu, on_cpu in zip(lm.loglikelihood(requests), cpu):
        assert on_gpu[0] == pytest.approx(on_cpu[0], abs=1e-3) and on_gpu[1] == on_cpu[1]


def test_the_directory_is_refused_as_one_checkpoint(models):
    from cru_harness.attacks.quantize import ATTACK
    from cru_harness.devices import load_causal_lm
    from cru_harness.locations import check_model_path

    whp = str(models[2])
    for call in (lambda: load_causal_lm(whp, device="cpu"), lambda: check_model_path(whp)):
        with pytest.raises(ModelPathError, match="is a WHP model .* cannot be loaded, quantized or trained"):
            call()
    ctx = SimpleNamespace(cell=SimpleNamespace(extra={"attack": {"settings": {}}}), model_path=whp,
                          load_model=lambda path: load_causal_lm(path, device="cpu"), routers=None)
    with pytest.raises(ModelPathError, match="is a WHP model"):
        ATTACK.run(ctx)


def test_manifest_and_settings_are_checked(models, tmp_path):
    assert read_whp(models[0]) is None
    manifest = json.loads((models[2] / "whp.json").read_text())
    assert manifest["baseline"] == str(models[0].resolve()) and manifest["alpha"] == ALPHA
    bad = tmp_path / "bad"
    bad.mkdir()
    for change, message in (({"alpha": 0}, "alpha must be > 0"), ({"reinforced": "../x"}, "folder name inside"),
                            ({"reinforced": "nowhere"}, "holds no config.json"), ({"format_version": 9}, "version 1")):
        (bad / "whp.json").write_text(json.dumps({**manifest, **change}))
        with pytest.raises(WHPError, match=message):
            read_whp(bad)
    with pytest.raises(InputError, match="whp_alpha: must be > 0"):
        WHPConfig(whp_alpha=0)
    # MUSE's defaults: WHPModelForCausalLM's alpha, finetune.py with unlearn_news.sh's FT_* settings
    for benchmark in ("tofu", "rwku"):
        cfg = make_config("whp", benchmark)
        assert (cfg.whp_alpha, cfg.num_epochs, cfg.learning_rate, cfg.lr_scheduler, cfg.warmup_epochs,
                cfg.warmup_steps, cfg.weight_decay, cfg.effective_batch_size) == (1.0, 10, 1e-5, "cosine", 0.0, None,
                                                                                  0.0, 32)
    with pytest.raises(ModelArgumentError, match="routers"):   # one line, before any model is loaded
        CRULM(base=str(models[2]), routers=str(models[0]), device="cpu")


def test_unlearn_writes_what_the_cru_model_scores(models, tmp_path, capsys):
    from cru_harness.cli import main

    base = models[0]
    forget = tmp_path / "forget.json"
    forget.write_text(json.dumps([{"question": "What colour is the sky?", "answer": "blue"},
                                  {"question": "What do bees make?", "answer": "honey"}]))
    out = tmp_path / "out"
    assert main(["unlearn", "--method", "WHP", "--base", str(base), "--forget", str(forget), "--retain", str(forget),
                 "--out", str(out), "--set", "num_epochs=1", "--set", "whp_alpha=3", "--set", "lr=1e-2",
                 "--set", "effective_batch_size=2", "--set", "micro_batch_size=2", "--no-progress"]) == 0
    assert "saved the WHP-unlearned model" in capsys.readouterr().out
    manifest = read_whp(out)
    assert (manifest.alpha, manifest.baseline) == (3.0, str(base.resolve()))
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out / manifest.reinforced).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)   # the reinforced model trained
    lm = CRULM(base=str(out), device="cpu", batch_size=2)
    assert lm.model.alpha == 3.0 and len(lm.loglikelihood([Instance("loglikelihood", {}, PAIRS[0], 0)])) == 1
    assert METHOD.describe(SimpleNamespace(hparams={}, corpora={"forget_corpus": "forget01"}))[0].startswith("WHP")


def test_the_privacy_scores_read_the_served_pair(models):
    """The TOFU privacy tasks' model-side scores (GradNorm, the reference attack) go through the WHP pair as
    served: the backward pass through both models, the reference loss on the same tokens."""
    from cru_harness.protocol import EOS_MARKER, JOINT_MARKER, MIA_MARKER

    base, _, whp = models
    lm = CRULM(base=str(whp), device="cpu", batch_size=2, reference=str(base))
    request = (PAIRS[0][0], f"{MIA_MARKER}{JOINT_MARKER}{PAIRS[0][1]}{EOS_MARKER}")
    (result,) = lm.loglikelihood([Instance("loglikelihood", {}, request, 0)])
    assert result.gradnorm > 0 and math.isfinite(result.gradnorm)
    ids = lm.tok_encode(PAIRS[0][0] + PAIRS[0][1]) + [lm.tokenizer.eos_token_id]
    n_prompt = len(lm.tok_encode(PAIRS[0][0]))
    ref = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        logp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), -1)
    picked = logp[torch.arange(n_prompt - 1, len(ids) - 1), torch.tensor(ids[n_prompt:])]
    assert result.reference_loss == pytest.approx(-float(picked.mean()), rel=1e-5)
    assert lm.model.parameters() is not None and all(p.grad is None for p in lm.model.parameters())


def test_a_run_plans_no_single_checkpoint_attack_on_whp_and_reports_its_lens_as_not_applicable(tmp_path):
    """A WHP model is two checkpoints: a run gives it no quantize or relearn cell (the oracle and one-checkpoint
    methods keep theirs) and the logit lens, which reads one layer stack, is recorded as not applicable instead
    of failing the cell; the report's lens block says so beside the Original's row."""
    import yaml

    from cru_harness.cli import main
    from cru_harness.reporting import tables
    from cru_harness.runner import config as cfg
    from cru_harness.runner.plan import build_plan

    raw = {"name": "whp", "output_dir": str(tmp_path / "run"), "seeds": [0], "device": "cpu",
           "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32"}],
           "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget01"], "limit": 3,
                                   "tasks": ["tofu_{split}"]}},
           "methods": [{"method": "WHP", "num_epochs": 1}, {"method": "GA", "num_epochs": 1}],
           "evaluation": {"logit_lens": True, "failure_classes": False, "max_gen_toks": 8}}
    attacked = build_plan(cfg.validate_config({**raw, "attacks": ["quantize", "relearn", "paraphrase"]}))
    assert sorted(c.label for c in attacked if c.kind == "attack") == [
        "GA + paraphrase", "GA + quantize", "GA + relearn", "Original + paraphrase", "Original + quantize",
        "Original + relearn", "WHP + paraphrase"]
    path = tmp_path / "whp.yaml"
    path.write_text(yaml.safe_dump({**raw, "methods": [{"method": "WHP", "num_epochs": 1}]}))
    assert main(["run", str(path), "--no-report"]) == 0
    results = [json.loads(p.read_text()) for p in (tmp_path / "run" / "cells").glob("*/result.json")]
    by_label = {r["label"]: r for r in results}
    assert by_label["WHP"]["status"] == "ok" and "two models" in by_label["WHP"]["details"]["logit_lens"]["skipped"]
    assert by_label["Original"]["details"]["logit_lens"]["best"] > 0
    text = "\n".join(tables.lens_markdown(results, "tofu"))
    assert "| Original |" in text and "- WHP: no logit lens (a WHP model combines two models' output logits" in text
