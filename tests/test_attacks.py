"""The attack modules of issue 51 on the tiny testbed Llama: detach, quantize (int8 / int4 through optimum-quanto or
bitsandbytes), relearn (the slice and its held-out items, the base fine-tuned with the routers attached), the logit
lens and the recovery score. Each runs the attack's own `run` on a hand-built `CellContext`, as the runner calls it."""
from __future__ import annotations

import sys
import tomllib
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

torch.set_num_threads(1)  # 2 shared cores

from cru_harness import plugins  # noqa: E402
from cru_harness.api import CellContext  # noqa: E402
from cru_harness.attacks import detach, logit_lens, quantize, relearn  # noqa: E402
from cru_harness.metrics import recovery  # noqa: E402
from cru_harness.cru.bundle import BundleConfig, RouterBundle, base_fingerprint  # noqa: E402
from cru_harness.data.corpora import load_corpus_rows  # noqa: E402
from cru_harness.devices import load_causal_lm  # noqa: E402
from cru_harness.errors import InputError  # noqa: E402
from cru_harness.testbed.zoo import tiny_checkpoint, tiny_world_dir  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
GATED_BLOCK = 5
PLAIN = {"chat": False}   # the testbed checkpoints are trained on the plain template


def _load(path):
    return load_causal_lm(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def base():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def world():
    return tiny_world_dir()


@pytest.fixture(scope="module")
def bundle(base, tmp_path_factory):
    """A bundle that shuts (gate ~ 0) half the coordinates of one block: a visible change from that block on."""
    model, _ = _load(base)
    width = model.config.hidden_size
    config = BundleConfig(base_model=str(base), fingerprint=base_fingerprint(model), block_indices=[GATED_BLOCK],
                          neurons={GATED_BLOCK: list(range(0, width, 2))}, d_r=4, percentile=95.0, lam=1.0, seed=0)
    torch.manual_seed(0)
    made = RouterBundle(config)
    with torch.no_grad():
        made.router(GATED_BLOCK).w2.bias.fill_(-20.0)
    return str(made.save_pretrained(tmp_path_factory.mktemp("routers") / "bundle"))


def _ctx(tmp_path, model_path, attack, settings=None, *, routers=None, data_dir=None, seed=0):
    cell = SimpleNamespace(kind="attack", method="CRU" if routers else "GA", benchmark="tofu", split="forget01",
                           target=None, seed=seed, corpora={"forget_corpus": "forget01"},
                           model=SimpleNamespace(device_map=None, trust_remote_code=False),
                           extra={"attack": {"name": attack, "settings": settings or {}}, "attacked": "abc"})
    return CellContext(cell=cell, model_path=str(model_path), workdir=tmp_path, data_dir=data_dir,
                       outcome={"resources": {}, "details": {}, "artifacts": {}}, chat=False,
                       prompt_format={"chat": False, "preset": "open-unlearning", "family": None}, dtype="float32",
                       load_model=_load, device="cpu", routers=routers)


# ------------------------------------------------------------------------------------------- registration


def test_each_attack_is_registered_under_its_name_by_this_projects_entry_points():
    """This project's pyproject names each module's ATTACK; the registry then serves that object by name."""
    from cru_harness.api import Attack

    attacks = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "cru_harness.attacks"]
    assert {"identity", "detach", "quantize", "relearn"} <= set(attacks)
    for name, target in attacks.items():
        module, attribute = target.split(":")
        obj = getattr(import_module(module), attribute)
        assert isinstance(obj, Attack) and obj.name == name, target
        obj.check_settings({})   # the defaults validate
        added = name not in plugins.attacks.names()   # an install older than this pyproject lacks it
        if added:
            plugins.attacks.register(obj)
        try:
            assert plugins.attacks.get(name.upper()) is obj
        finally:
            if added:
                plugins.attacks.unregister(name)


@pytest.fixture()
def registered():
    """This project's attacks in the registry (an install made before they existed lacks their entry points)."""
    added = [a for a in (detach.ATTACK, quantize.ATTACK, relearn.ATTACK) if a.name not in plugins.attacks.names()]
    for attack in added:
        plugins.attacks.register(attack)
    yield
    for attack in added:
        plugins.attacks.unregister(attack.name)


# ------------------------------------------------------------------------------------------- detach


def test_detach_serves_the_base_without_its_bundle_and_is_the_identity_without_one(tmp_path, base, bundle):
    ctx = _ctx(tmp_path, base, "detach", routers=bundle)
    assert detach.ATTACK.run(ctx) == detach.Trained(str(base), routers=None)
    assert ctx.outcome["details"]["detach"]["identity"] is False
    plain = _ctx(tmp_path, "/trained/ga", "detach")
    assert detach.ATTACK.run(plain) == detach.Trained("/trained/ga", routers=None)
    assert plain.outcome["details"]["detach"]["identity"] is True
    assert "identity" in detach.ATTACK.summary


# ------------------------------------------------------------------------------------------- quantize


def test_quantize_config_refuses_an_unknown_width():
    with pytest.raises(InputError, match=r"weights 'int3': choose one of int8, int4"):
        quantize.QuantizeConfig(weights="int3")


@pytest.mark.parametrize("weights, levels", [("int8", 256), ("int4", 16)])
def test_quantize_rounds_each_linear_weight_to_its_grid_and_keeps_routers_and_head(tmp_path, base, bundle,
                                                                                    weights, levels):
    ctx = _ctx(tmp_path, base, "quantize", {"weights": weights}, routers=bundle)
    trained = quantize.ATTACK.run(ctx)
    assert trained.routers == bundle and Path(trained.model_path) != Path(base)
    before, _ = _load(base)
    after, _ = _load(trained.model_path)   # an ordinary checkpoint the `cru` model loads
    weight = after.model.layers[0].mlp.down_proj.weight
    original = before.model.layers[0].mlp.down_proj.weight
    assert not torch.equal(weight, original)
    # int8: one scale per output row, so at most 256 values a row; int4: at most 16 values per group of inputs
    group = weight.shape[1] if weights == "int8" else int(ctx.outcome["details"]["quantize"]["group_sizes"][0])
    distinct = max(len(torch.unique(chunk)) for chunk in weight.reshape(-1, group))
    assert distinct <= levels
    assert torch.equal(after.lm_head.weight, before.lm_head.weight)    # excluded by default
    assert torch.equal(after.model.norm.weight, before.model.norm.weight)
    details = ctx.outcome["details"]["quantize"]
    assert details["weights"] == weights and details["n_modules"] == 8 * 7 and details["routers_kept"] == bundle
    assert 0 < details["relative_weight_change"] < 0.5


def test_int4_moves_the_weights_further_than_int8(tmp_path, base):
    changes = {}
    for weights in ("int8", "int4"):
        model, _ = _load(base)
        changes[weights] = quantize.round_weights(model, quantize.QuantizeConfig(weights=weights))[
            "relative_weight_change"]
    assert 0 < changes["int8"] < changes["int4"]


def test_the_noise_floor_sets_the_unlearnings_weight_change_beside_the_roundings(tmp_path, base):
    """A model 'unlearned' by moving one module's weights by 1e-3 of their size, against its base: the record
    holds that move (relative L2, over every rounded module) beside int4's, which is far larger; the attacked
    model being its own base records no unlearning change (0), and a base that is no checkpoint says so."""
    model, tokenizer = _load(base)
    with torch.no_grad():
        weight = model.model.layers[0].mlp.down_proj.weight
        weight.add_(1e-3 * weight)
    moved = tmp_path / "moved"
    model.save_pretrained(moved)
    tokenizer.save_pretrained(moved)
    ctx = _ctx(tmp_path / "w", moved, "quantize", {"weights": "int4"})
    (tmp_path / "w").mkdir()
    ctx.base_path = str(base)
    quantize.ATTACK.run(ctx)
    details = ctx.outcome["details"]["quantize"]
    norms = [float(m.weight.float().pow(2).sum()) for n, m in _load(base)[0].named_modules()
             if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    one = float(_load(base)[0].model.layers[0].mlp.down_proj.weight.float().pow(2).sum())
    assert details["unlearning_weight_change"] == pytest.approx(1e-3 * (one / sum(norms)) ** 0.5, rel=1e-3)
    assert details["relative_weight_change"] > 10 * details["unlearning_weight_change"] > 0
    assert details["mean_abs_weight_change"] > details["unlearning_mean_abs_weight_change"] > 0
    own = _ctx(tmp_path / "o", base, "quantize", {"weights": "int4"})
    (tmp_path / "o").mkdir()
    own.base_path = str(base)
    quantize.ATTACK.run(own)
    assert own.outcome["details"]["quantize"]["unlearning_weight_change"] == 0.0
    assert "no unlearning change" in own.outcome["details"]["quantize"]["unlearning_change_note"]
    assert quantize.reference_weights("zoo:llama") is None   # not a local checkpoint: no reference to read


def test_a_head_tied_to_the_embedding_is_not_rounded_with_it(base):
    model, _ = _load(base)
    model.lm_head.weight = model.model.embed_tokens.weight     # tie them, as many small models are
    embedding = model.model.embed_tokens.weight.detach().clone()
    details = quantize.round_weights(model, quantize.QuantizeConfig(weights="int4", exclude=()))
    assert details["tied_to_embedding_left"] == ["lm_head"] and details["n_modules"] == 8 * 7
    assert torch.equal(model.model.embed_tokens.weight, embedding)


def test_bitsandbytes_int8_is_llm_int8s_row_grid_on_the_float16_weight(base):
    """LLM.int8 (`Int8Params`): the weight in float16, one absmax per output row, round(w * (127 / absmax))."""
    model, _ = _load(base)
    original = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    details = quantize.round_weights(model, quantize.QuantizeConfig(weights="int8", library="bitsandbytes"))
    half = original.to(torch.float16).float()
    absmax = half.abs().amax(dim=1, keepdim=True)
    expected = torch.round(half * (127 / absmax)) * absmax / 127
    torch.testing.assert_close(model.model.layers[0].mlp.up_proj.weight, expected, rtol=1e-6, atol=0)
    assert details["library"].startswith("bitsandbytes ") and details["group_sizes"] == ["per output channel"]


def test_bitsandbytes_int4_rounds_blocks_of_64_to_16_levels_and_its_two_grids_differ(tmp_path, base):
    """Linear4bit's grid: blocks of 64 weights (row-major), each at most 16 values, the block's largest magnitude
    kept; fp4 (transformers' default, Zhang et al.'s) and nf4 are different grids."""
    rounded = {}
    for quant_type in ("fp4", "nf4"):
        model, _ = _load(base)
        original = model.model.layers[1].self_attn.q_proj.weight.detach().clone()
        details = quantize.round_weights(model, quantize.QuantizeConfig(library="bitsandbytes",
                                                                        quant_type=quant_type))
        weight = model.model.layers[1].self_attn.q_proj.weight.detach()
        assert details["group_sizes"] == ["64"] and details["weights"] == f"int4 {quant_type}"
        blocks, before = weight.reshape(-1, 64), original.reshape(-1, 64)
        assert max(len(torch.unique(block)) for block in blocks) <= 16
        torch.testing.assert_close(blocks.abs().amax(dim=1), before.abs().amax(dim=1))
        rounded[quant_type] = weight
    assert not torch.equal(rounded["fp4"], rounded["nf4"])
    model, _ = _load(base)
    int8 = quantize.round_weights(model, quantize.QuantizeConfig(weights="int8", library="bitsandbytes"))
    assert 0 < int8["relative_weight_change"] < details["relative_weight_change"]
    for bad, match in (({"library": "gptq"}, "library 'gptq': choose one of optimum-quanto, bitsandbytes"),
                       ({"quant_type": "nf4"}, "quant_type picks bitsandbytes' 4-bit grid"),
                       ({"library": "bitsandbytes", "weights": "int8", "quant_type": "nf4"}, "needs library")):
        with pytest.raises(InputError, match=match):
            quantize.QuantizeConfig(**bad)


def test_quantize_without_bitsandbytes_names_the_library_and_the_extra(tmp_path, base, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes.functional", None)   # as if not installed
    with pytest.raises(quantize.MissingDependencyError,
                       match=r"needs bitsandbytes: pip install 'cru-harness\[attacks\]'"):
        quantize.ATTACK.run(_ctx(tmp_path, base, "quantize", {"library": "bitsandbytes"}))


def test_quantize_without_optimum_quanto_names_the_extra(tmp_path, base, monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.quanto", None)   # as if not installed
    with pytest.raises(quantize.MissingDependencyError, match=r"pip install 'cru-harness\[attacks\]'"):
        quantize.ATTACK.run(_ctx(tmp_path, base, "quantize"))


# ------------------------------------------------------------------------------------------- relearn


def test_relearn_slice_is_seeded_disjoint_and_leaves_items_out():
    config = relearn.RelearnConfig()
    chosen, held = relearn.relearn_slice(40, config, seed=3)
    assert len(chosen) == 10 and sorted(chosen + held) == list(range(40))
    assert relearn.relearn_slice(40, config, seed=3) == (chosen, held)
    assert relearn.relearn_slice(40, config, seed=4)[0] != chosen
    assert relearn.relearn_slice(40, relearn.RelearnConfig(slice_size=5), seed=3)[0].__len__() == 5
    with pytest.raises(InputError, match="leaves no held-out item"):
        relearn.relearn_slice(5, relearn.RelearnConfig(slice_size=5), seed=0)
    with pytest.raises(InputError, match=r"slice_fraction must be in \(0, 1\)"):
        relearn.RelearnConfig(slice_fraction=1.0)
    with pytest.raises(InputError, match="corpus must be a corpus source"):
        relearn.RelearnConfig(corpus="  ")


def test_held_out_forget_metrics_drop_the_slice_by_question_and_aggregate_as_tofu():
    rows = [{"question": f"q{i}", "rouge_l_recall": r, "probability": p, "truth_ratio": tr}
            for i, (r, p, tr) in enumerate([(1.0, 0.9, 0.5), (0.5, 0.5, 2.0), (0.0, 0.1, 1.0), (0.25, 0.3, 4.0)])]
    got = relearn.held_out_forget_metrics(rows, ["q0"], retain_truth_ratios={f"q{i}": 1.0 for i in range(4)})
    assert got["n_items"] == 3
    assert got["forget_rouge_l"] == pytest.approx(0.25) and got["forget_prob"] == pytest.approx(0.3)
    assert got["forget_truth_ratio"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)   # mean(min(R, 1/R))
    from scipy.stats import ks_2samp

    assert got["forget_quality"] == pytest.approx(ks_2samp([2.0, 1.0, 4.0], [1.0, 1.0, 1.0]).pvalue)
    assert got["n_slice_items_dropped"] == 1
    # a slice item outside the scored ones (a `limit`) drops nothing more
    assert relearn.held_out_forget_metrics(rows, ["q0", "q9"])["n_items"] == 3
    with pytest.raises(InputError, match="no held-out forget item"):
        relearn.held_out_forget_metrics(rows, ["q0", "q1", "q2", "q3"])


def _mean_nll(model, tokenizer, rows):
    from cru_harness.baselines.data import encode_qa, row_to_qa

    total = 0.0
    with torch.no_grad():
        for i, row in enumerate(rows):
            example = encode_qa(tokenizer, *row_to_qa(row, i), 512, chat=False)
            out = model(input_ids=torch.tensor([example.input_ids]), labels=torch.tensor([example.labels]))
            total += float(out.loss)
    return total / len(rows)


def test_relearn_fine_tunes_the_base_with_the_routers_attached_on_the_slice_only(tmp_path, base, world, bundle):
    settings = {"slice_size": 4, "learning_rate": 1e-3, "num_epochs": 2}
    ctx = _ctx(tmp_path, base, "relearn", settings, routers=bundle, data_dir=str(world), seed=1)
    trained = relearn.ATTACK.run(ctx)
    assert trained.routers == bundle
    details = ctx.outcome["details"]["relearn"]
    rows, _ = load_corpus_rows("forget01", world)
    chosen, held = relearn.relearn_slice(len(rows), relearn.RelearnConfig(**settings), seed=1)
    assert details["slice_indices"] == chosen and details["held_out_indices"] == held
    assert details["slice_questions"] == [rows[i]["question"] for i in chosen]
    assert details["optimizer_steps"] == 2 and details["routers_attached"] == bundle
    before, tokenizer = _load(base)
    after, _ = _load(trained.model_path)
    slice_rows = [rows[i] for i in chosen]
    # the relearned model fits its slice better than the model it started from
    assert _mean_nll(after, tokenizer, slice_rows) < _mean_nll(before, tokenizer, slice_rows)
    # the routers gated every training forward: without them the same slice and seed train other weights
    plain = _ctx(tmp_path / "plain", base, "relearn", settings, data_dir=str(world), seed=1)
    unrouted, _ = _load(relearn.ATTACK.run(plain).model_path)
    assert plain.outcome["details"]["relearn"]["slice_indices"] == chosen
    weight = after.model.layers[0].mlp.down_proj.weight
    assert not torch.allclose(unrouted.model.layers[0].mlp.down_proj.weight, weight)


def test_benign_relearn_trains_on_another_corpus_and_holds_every_forget_item_out(tmp_path, base, world):
    # rows the tiny model never saw (holdout authors): on rows it already fits (retain90, NLL ~0.05) two steps can
    # as well raise the NLL as lower it, by the machine's rounding (seen on an AMD EPYC)
    settings = {"corpus": "holdout01[:6]", "learning_rate": 1e-3, "num_epochs": 1}
    ctx = _ctx(tmp_path, base, "relearn", settings, data_dir=str(world))
    trained = relearn.ATTACK.run(ctx)
    details = ctx.outcome["details"]["relearn"]
    n_forget = len(load_corpus_rows("forget01", world)[0])
    assert details["slice_indices"] == [] and details["held_out_indices"] == list(range(n_forget))
    assert details["n_training_rows"] == 6 and "holdout01" in details["benign_corpus"]
    assert details["optimizer_steps"] == 2   # 6 rows in batches of 4
    before, tokenizer = _load(base)
    after, _ = _load(trained.model_path)
    other = load_corpus_rows("holdout01[:6]", world)[0]
    assert _mean_nll(after, tokenizer, other) < _mean_nll(before, tokenizer, other)


def test_a_benign_corpus_takes_the_attacked_cells_placeholders():
    tofu = SimpleNamespace(benchmark="tofu", split="forget05", target=None)
    rwku = SimpleNamespace(benchmark="rwku", split=None, target=7)
    assert relearn.benign_corpus("{retain_split}[:40]", tofu) == "retain95[:40]"
    assert relearn.benign_corpus("rwku:{target}:passage", rwku) == "rwku:7:passage"
    assert relearn.benign_corpus("retain90[:40]", tofu) == "retain90[:40]"
    with pytest.raises(InputError, match=r"\{target\} has no value for a tofu cell"):
        relearn.benign_corpus("rwku:{target}:passage", tofu)


@pytest.mark.shared_data
@pytest.mark.parametrize("corpus", [None, "rwku:{target}:passage[:2]"])
def test_relearn_on_rwku_trains_on_the_targets_passages_so_every_probe_is_held_out(tmp_path, base, shared_data,
                                                                                    corpus):
    """RWKU's forget corpus is the target's passages (text, no probe): the slice (or a benign relearn on the
    cell's own target's text) holds no question, so no probe is trained on and the report counts them all."""
    settings = {"slice_size": 2, "num_epochs": 1, "max_length": 64} if corpus is None else \
        {"corpus": corpus, "num_epochs": 1, "max_length": 64}
    ctx = _ctx(tmp_path, base, "relearn", settings, data_dir=str(shared_data))
    ctx.cell.benchmark, ctx.cell.split, ctx.cell.target = "rwku", None, 1
    ctx.cell.corpora = {"forget_corpus": "rwku:1:passage"}
    relearn.ATTACK.run(ctx)
    details = ctx.outcome["details"]["relearn"]
    n_passages = len(load_corpus_rows("rwku:1:passage", shared_data)[0])
    assert details["slice_questions"] == [] and details["n_training_rows"] == 2
    assert len(details["slice_indices"]) == (2 if corpus is None else 0)
    assert len(details["held_out_indices"]) == n_passages - len(details["slice_indices"])
    if corpus is not None:
        assert details["benign_corpus"].startswith("RWKU 1 passage")


# ------------------------------------------------------------------------------------------- logit lens


def test_logit_lens_last_layer_is_the_models_own_probability_and_routers_change_only_later_layers(base, world,
                                                                                                   bundle):
    model, tokenizer = _load(base)
    rows = load_corpus_rows("forget01", world)[0][:3]
    plain = logit_lens.logit_lens_scores(model, tokenizer, rows, prompt_format=PLAIN)
    assert len(plain.per_layer) == 8 and plain.best == max(plain.per_layer) and plain.best >= plain.final
    assert plain.per_layer[plain.best_layer] == plain.best
    # the last layer read through norm + head is the model's output: TOFU's probability of the answer
    from cru_harness.baselines.data import encode_qa, row_to_qa

    own = 0.0
    with torch.no_grad():
        for i, row in enumerate(rows):
            example = encode_qa(tokenizer, *row_to_qa(row, i), 512, chat=False)
            out = model(input_ids=torch.tensor([example.input_ids]), labels=torch.tensor([example.labels]))
            own += float(torch.exp(-out.loss))
    assert plain.final == pytest.approx(own / len(rows), rel=1e-4)
    routed = logit_lens.logit_lens_scores(model, tokenizer, rows, routers=bundle, prompt_format=PLAIN)
    assert routed.per_layer[:GATED_BLOCK] == pytest.approx(plain.per_layer[:GATED_BLOCK], rel=1e-5)
    assert routed.per_layer[GATED_BLOCK:] != pytest.approx(plain.per_layer[GATED_BLOCK:], rel=1e-3)
    # the routers and the lens's hooks are gone afterwards
    again = logit_lens.logit_lens_scores(model, tokenizer, rows, prompt_format=PLAIN)
    assert again.per_layer == pytest.approx(plain.per_layer)


def _lens_config(evaluation=None, **model):
    from cru_harness.runner import config as cfg

    return cfg.validate_config({
        "name": "lens", "output_dir": "unused", "device": "cpu", "seeds": [0],
        "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32", **model}],
        "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget01"], "limit": 3,
                                "tasks": ["tofu_{split}"]}},
        "methods": ["GA"], "evaluation": {"failure_classes": False, **(evaluation or {})}})


def test_the_lens_is_off_by_default_and_a_config_without_it_keeps_its_cell_hashes():
    from cru_harness.runner import config as cfg
    from cru_harness.runner.plan import build_plan

    plain = [c.hash for c in build_plan(_lens_config())]
    assert [c.hash for c in build_plan(_lens_config({"logit_lens": False}))] == plain
    lens = build_plan(_lens_config({"logit_lens": True}))
    assert all(c.evaluation["logit_lens"] is True for c in lens)
    assert not set(c.hash for c in lens) & set(plain)   # cells that record more are cells of their own
    with pytest.raises(cfg.ConfigError, match=r"evaluation\.logit_lens: expected true or false"):
        _lens_config({"logit_lens": "yes"})


@pytest.mark.parametrize("served", ["plain", "routed", "chat"])
def test_a_cell_asked_for_the_lens_records_its_best_layer_and_the_output_layer_is_lm_evals_probability(
        tmp_path, base, bundle, served):
    """A runner cell (evaluation.logit_lens) reads the lens on the model as it scored it: the last layer's value is
    the forget probability lm-eval's TOFU task gave the same items (an independent computation, through the `cru`
    model), with CRU's routers attached when the cell serves them and in the chat format when it is scored in it;
    the recorded best layer is the argmax."""
    import dataclasses

    from cru_harness.runner import execute
    from cru_harness.runner.plan import build_plan

    routed = served == "routed"
    model = {"chat_template": True} if served == "chat" else {}
    original = next(c for c in build_plan(_lens_config({"logit_lens": True}, **model)) if c.kind == "original")
    if routed:   # an identity attack on a CRU cell: its base served with its bundle
        cell = dataclasses.replace(original, kind="attack", label="CRU + identity",
                                   extra={"attack": {"name": "identity", "settings": {}}, "attacked": "cru"})
        outcome = execute.execute_cell(cell, tmp_path, attacked_result={
            "label": "CRU", "kind": "method", "artifacts": {"model": str(base), "routers": bundle}})
    else:
        outcome = execute.execute_cell(original, tmp_path)
    assert outcome["details"]["prompting"]["apply_chat_template"] is (served == "chat")
    lens = outcome["details"]["logit_lens"]
    assert lens["n_items"] == 3 and lens["n_layers"] == 8 and lens["routers"] == (bundle if routed else None)
    assert lens["final"] == pytest.approx(outcome["metrics"]["forget_prob"], rel=1e-4)
    per_layer = lens["per_layer"]
    assert lens["best_layer"] == max(range(len(per_layer)), key=per_layer.__getitem__)
    assert outcome["metrics"]["forget_best_layer_prob"] == lens["best"] == max(per_layer)
    assert lens["final"] == per_layer[-1]


# ------------------------------------------------------------------------------------------- recovery


def test_recovery_is_the_share_of_the_gap_closed_beside_the_oracles_change():
    got = recovery.recovery_score(0.9, 0.1, 0.5, oracle=0.2, oracle_attacked=0.3)
    assert got.gap == pytest.approx(0.8) and got.attacked_change == pytest.approx(0.4)
    assert got.score == pytest.approx(0.5)
    assert got.oracle_change == pytest.approx(0.1) and got.oracle_score == pytest.approx(0.125)
    assert got.excess == pytest.approx(0.375)
    # a metric where lower means more knowledge (an NLL): the same share
    nll = recovery.recovery_score(1.0, 3.0, 2.5, higher_is_knowledge=False)
    assert nll.score == pytest.approx(0.25) and nll.oracle_score is None and nll.excess is None
    assert recovery.recovery_score(0.4, 0.4, 0.6).score is None   # no gap: nothing to recover
    with pytest.raises(ValueError, match="give both oracle and oracle_attacked"):
        recovery.recovery_score(0.9, 0.1, 0.5, oracle=0.2)
    with pytest.raises(ValueError, match="attacked must be a finite number"):
        recovery.recovery_score(0.9, 0.1, float("nan"))


# ------------------------------------------------------------------------------------------- the command


def test_attack_command_quantizes_one_model_and_records_it(tmp_path, base, bundle, registered, capsys):
    import json

    from cru_harness.cli import main

    out = tmp_path / "out"
    assert main(["attack", "--attack", "quantize", "--model", str(base), "--routers", bundle, "--out", str(out),
                 "--set", "weights=int8", "--device", "cpu"]) == 0
    record = json.loads((out / "attack_record.json").read_text())
    assert record["settings"] == {"weights": "int8"} and record["attacked_routers"] == bundle
    assert record["details"]["quantize"]["weights"] == "int8"
    assert Path(record["attacked_model"]).parent == out and "quantize: attacked model" in capsys.readouterr().out
    # a setting the attack does not have, and a bad value, are one-line errors before any model is loaded
    assert main(["attack", "--attack", "quantize", "--model", str(base), "--out", str(tmp_path / "x"),
                 "--set", "bits=4"]) == 2
    assert ("--set bits: not a setting of attack quantize (its settings: weights, exclude, library, quant_type)"
            in capsys.readouterr().err)
    assert main(["attack", "--attack", "quantize", "--model", str(base), "--out", str(tmp_path / "x"),
                 "--set", "weights=int2"]) == 2
    assert "weights 'int2': choose one of int8, int4" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_lens_command_prints_each_layer_and_the_best(tmp_path, base, world, bundle, capsys):
    import json

    from cru_harness.cli import main

    out = tmp_path / "lens.json"
    assert main(["lens", "--model", str(base), "--routers", bundle, "--data", "forget01", "--data-dir", str(world),
                 "--limit", "2", "--prompt-format", "plain", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    scores = json.loads(out.read_text())
    assert scores["n_items"] == 2 and len(scores["per_layer"]) == 8 and scores["routers"] == bundle
    assert f"| {scores['best_layer']} | {scores['best']:.4f} (best) |" in printed
    model, tokenizer = _load(base)
    rows = load_corpus_rows("forget01", world)[0][:2]
    direct = logit_lens.logit_lens_scores(model, tokenizer, rows, routers=bundle, prompt_format=PLAIN)
    assert scores["per_layer"] == pytest.approx(direct.per_layer)
    assert main(["lens", "--model", str(base), "--data", "forget01", "--data-dir", str(world), "--limit", "0"]) == 2
