"""CRU options beyond the paper (issue 11): loss shapes, a learned router input scale, excluding extreme-magnitude
coordinates from selection, gating MLP neurons, and the batch composition (retain rows per forget row). Defaults must stay the paper's setting, bit for bit."""
import json
import math

import pytest
import torch
from torch import nn

from cru_harness.cli import main
from cru_harness.cru import (RouterBundle, RouterTrainingConfig, attach_bundles, find_decoder_blocks, localize,
                             routed, train_routers)
from cru_harness.cru.bundle import MANIFEST_NAME, WEIGHTS_NAME, BundleFileError
from cru_harness.cru.losses import cru_loss
from cru_harness.cru.train import GateRecorder, measure_gate_means
from cru_harness.cru.router import Router
from cru_harness.training.sites import GateSiteError, mlp_down_projection
from cru_harness.runner import config as cfg
from cru_harness.testbed.models import build_tiny_model, save_tiny_model

from cru_support import FORGET, RETAIN, FAST, llama, tokenizer  # noqa: F401 (fixtures)

torch.set_num_threads(1)  # 2 shared cores: one thread is ~10x faster than two under contention

NEW_FIELDS = ("suppress_loss", "pass_loss", "exclude_top_magnitude", "gate_site", "site_width", "excluded")


@pytest.fixture(scope="module")
def paper(llama, tokenizer):
    return train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST))


def _weights(bundle, directory):
    return (bundle.save_pretrained(directory) / WEIGHTS_NAME).read_bytes()


# -- loss shapes -------------------------------------------------------------------------------------------------
def test_loss_shapes_against_hand_computed_values():
    forget = {3: torch.tensor(0.2), 5: torch.tensor(0.4)}
    retain = {3: torch.tensor(0.9), 5: torch.tensor(0.5)}
    # f: mean(0.2, 0.4) = 0.3 or mean(0.04, 0.16) = 0.1; r: mean(0.01, 0.25) = 0.13 or mean(0.1, 0.5) = 0.3
    expected = {("linear", "quadratic"): 0.3 + 2 * 0.13, ("quadratic", "quadratic"): 0.1 + 2 * 0.13,
                ("linear", "linear"): 0.3 + 2 * 0.3, ("quadratic", "linear"): 0.1 + 2 * 0.3}
    for (suppress, keep), value in expected.items():
        loss = cru_loss(forget, retain, 2.0, suppress_loss=suppress, pass_loss=keep)
        assert loss.item() == pytest.approx(value, abs=1e-6), (suppress, keep)
    # the paper's pairing is the expression the code always computed, bit for bit
    paper = torch.stack(list(forget.values())).mean() + 2.0 * torch.stack(
        [(m - 1.0) ** 2 for m in retain.values()]).mean()
    assert torch.equal(cru_loss(forget, retain, 2.0), paper)
    # gradients (paper appendix): d w^2 / dw = 2w / |K|; d (1 - w) / dw = -1 / |K|
    w = torch.tensor(0.2, requires_grad=True)
    cru_loss({0: w, 1: torch.tensor(0.4)}, retain, 2.0, suppress_loss="quadratic").backward()
    assert w.grad.item() == pytest.approx(2 * 0.2 / 2)
    v = torch.tensor(0.9, requires_grad=True)
    cru_loss(forget, {0: v, 1: torch.tensor(0.5)}, 2.0, pass_loss="linear").backward()
    assert v.grad.item() == pytest.approx(-2.0 / 2)
    with pytest.raises(ValueError, match="suppress_loss must be one of linear, quadratic"):
        cru_loss(forget, retain, 1.0, suppress_loss="cubic")


# -- defaults: the paper, bit for bit ----------------------------------------------------------------------------
def test_explicit_defaults_train_the_same_routers_and_are_recorded(llama, tokenizer, paper, tmp_path):
    explicit = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(
        **FAST, suppress_loss="linear", pass_loss="quadratic", exclude_top_magnitude=0.0, gate_site="residual",
        input_norm="none"))
    assert _weights(paper, tmp_path / "a") == _weights(explicit, tmp_path / "b")
    manifest = json.loads((tmp_path / "a" / MANIFEST_NAME).read_text())
    assert {k: manifest[k] for k in NEW_FIELDS} == {
        "suppress_loss": "linear", "pass_loss": "quadratic", "exclude_top_magnitude": 0.0, "gate_site": "residual",
        "site_width": 64, "excluded": {}}
    assert manifest["training"]["gate_site"] == "residual" and manifest["training"]["pass_loss"] == "quadratic"
    # every option changes the routers it trains (same seed, same data)
    assert manifest["training"]["retain_batch_ratio"] == 1
    for option in (dict(suppress_loss="quadratic"), dict(pass_loss="linear"), dict(input_norm="rms_learned"),
                   dict(exclude_top_magnitude=5.0), dict(gate_site="mlp"), dict(retain_batch_ratio=2)):
        other = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, **option))
        key, value = next(iter(option.items()))
        assert (other.config.training if key == "retain_batch_ratio" else vars(other.config))[key] == value
        assert _weights(other, tmp_path / key) != (tmp_path / "a" / WEIGHTS_NAME).read_bytes(), option


def test_manifest_without_the_new_fields_loads_as_the_paper_setting(llama, tokenizer, paper, tmp_path):
    directory = paper.save_pretrained(tmp_path / "old")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    for key in NEW_FIELDS:
        del manifest[key]
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    old = RouterBundle.from_pretrained(directory, llama)
    assert (old.config.suppress_loss, old.config.pass_loss, old.config.gate_site,
            old.config.exclude_top_magnitude) == ("linear", "quadratic", "residual", 0.0)
    batch = tokenizer(FORGET[:3], return_tensors="pt", padding=True)
    with torch.no_grad(), routed(llama, paper):
        new_logits = llama(**batch).logits
    with torch.no_grad(), routed(llama, old):
        assert torch.equal(new_logits, llama(**batch).logits)
    assert main(["inspect", str(directory)]) == 0  # an old manifest shows the paper's defaults
    manifest.update(gate_site="mlp")  # an MLP bundle must say how wide its site is
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BundleFileError, match="must record site_width"):
        RouterBundle.from_pretrained(directory)


# -- input_norm="rms_learned" ------------------------------------------------------------------------------------
def test_rms_learned_scale_is_a_saved_counted_router_parameter(llama, tokenizer, tmp_path):
    torch.manual_seed(0)
    rms = Router(64, 5, 8, input_norm="rms")
    torch.manual_seed(0)
    learned = Router(64, 5, 8, input_norm="rms_learned")
    hidden = torch.randn(2, 3, 64) * 40
    assert torch.equal(learned.norm_scale, torch.ones(64))
    assert torch.equal(rms(hidden), learned(hidden))  # scale 1: exactly the parameter-free normalisation
    assert sum(p.numel() for p in learned.parameters()) == sum(p.numel() for p in rms.parameters()) + 64

    bundle = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, input_norm="rms_learned"))
    scales = [bundle.router(b).norm_scale for b in bundle.block_indices]
    assert all(not torch.equal(s, torch.ones(64)) for s in scales)  # trained
    directory = bundle.save_pretrained(tmp_path / "learned")
    assert bundle.config.router_parameters == sum(p.numel() for p in bundle.parameters())
    loaded = RouterBundle.from_pretrained(directory, llama)
    assert all(torch.equal(loaded.router(b).norm_scale, s) for b, s in zip(bundle.block_indices, scales))


def test_router_math_stays_float32_inside_an_autocast_region():
    """lm-eval's `mixed_precision_dtype` runs the model call under autocast; the routers must not follow it."""
    torch.manual_seed(0)
    router = Router(64, 5, 8)
    hidden = torch.randn(2, 3, 64) * 40
    plain = router(hidden)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = router(hidden)
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)


def test_a_router_runs_where_torch_has_no_autocast_for_the_device(monkeypatch):
    """mps before torch 2.5 (pyproject allows 2.4): `torch.autocast("mps", ...)` raises there, even disabled."""
    def unavailable(device_type):
        return False

    def refused(*args, **kwargs):
        raise RuntimeError("User specified an unsupported autocast device_type")

    router = Router(64, 5, 8)
    hidden = torch.randn(2, 3, 64)
    plain = router(hidden)
    monkeypatch.setattr(torch.amp, "is_autocast_available", unavailable)
    monkeypatch.setattr(torch, "autocast", refused)
    assert torch.equal(router(hidden), plain)


# -- exclude_top_magnitude ---------------------------------------------------------------------------------------
def _mean_abs_outputs(model, tokenizer, texts, blocks):
    """Mean |block output| per coordinate over all real tokens, from `output_hidden_states` (not the hooks)."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].unsqueeze(-1).double()
    return {b: (states[b + 1].double().abs() * mask).sum(dim=(0, 1)) / mask.sum() for b in blocks}


def test_excluded_coordinates_are_the_largest_and_never_selected(llama, tokenizer):
    blocks = [2, 5]  # not the last block: hidden_states[-1] is after the final norm
    plain = localize(llama, tokenizer, FORGET, blocks=blocks, percentile=80)
    loc = localize(llama, tokenizer, FORGET, blocks=blocks, percentile=80, exclude_top_magnitude=10.0)
    rand = localize(llama, tokenizer, FORGET, blocks=blocks, percentile=80, exclude_top_magnitude=10.0,
                    selection="random", seed=4)
    reference = _mean_abs_outputs(llama, tokenizer, FORGET, blocks)
    k = math.ceil(0.10 * 64)
    for block in blocks:
        excluded = set(loc.excluded[block].tolist())
        assert excluded == set(torch.topk(reference[block], k).indices.tolist())
        assert not excluded & set(loc.neurons[block].tolist())
        assert not excluded & set(rand.neurons[block].tolist())
        assert rand.sizes()[block] == loc.sizes()[block]
        # the percentile runs on the candidates: the selection is plain variance selection among them
        var = plain.variances[block].double()
        candidates = torch.tensor(sorted(set(range(64)) - excluded))
        threshold = torch.quantile(var[candidates], 0.8)
        assert loc.neurons[block].tolist() == [j for j in candidates.tolist() if var[j] > threshold]
    assert plain.excluded == {}
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN,
                           RouterTrainingConfig(**FAST, blocks=blocks, exclude_top_magnitude=10.0))
    assert {b: len(v) for b, v in bundle.config.excluded.items()} == {2: k, 5: k}
    with pytest.raises(ValueError, match="exclude_top_magnitude must be a percentage in"):
        RouterTrainingConfig(exclude_top_magnitude=100)


# -- gate_site="mlp" ---------------------------------------------------------------------------------------------
def _down_proj_inputs(model, blocks, texts, tokenizer):
    _, decoder = find_decoder_blocks(model)
    seen = {}
    handles = [mlp_down_projection(decoder[b], b).register_forward_pre_hook(
        lambda _m, args, b=b: seen.__setitem__(b, args[0].detach().clone())) for b in blocks]
    handles += [decoder[b].register_forward_pre_hook(
        lambda _m, args, kwargs, b=b: seen.__setitem__(("in", b), (args[0] if args else kwargs["hidden_states"])
                                                       .detach().clone()), with_kwargs=True) for b in blocks]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    try:
        with torch.no_grad():
            logits = model(**batch).logits
    finally:
        for handle in handles:
            handle.remove()
    return seen, logits


@pytest.mark.slow
def test_mlp_site_end_to_end_through_the_lm_eval_model(llama, tokenizer, tmp_path):
    """Localize on MLP neurons, train, save, load through lm-eval's `cru` model: the down projections' inputs
    are gated at the selected neurons only, by the routers applied to the blocks' inputs."""
    from cru_harness.lmeval.model import CRULM

    config = RouterTrainingConfig(**FAST, gate_site="mlp", last_k=3)
    loc = localize(llama, tokenizer, FORGET, last_k=3, percentile=80, site="mlp")
    assert loc.width() == 256 and all(int(n.max()) < 256 for n in loc.neurons.values())
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN, config)
    assert {b: bundle.config.neurons[b] for b in bundle.block_indices} == {
        b: loc.neurons[b].tolist() for b in loc.block_indices}
    assert bundle.config.gate_site == "mlp" and bundle.config.site_width == 256
    assert bundle.config.metrics["forget_gate_mean"] < bundle.config.metrics["retain_gate_mean"]
    # training's gated forward on the frozen prefix feeds the routers what a full forward does
    full = measure_gate_means(llama, tokenizer, bundle, FORGET, batch_size=6)
    for block, value in full["per_block"].items():
        assert bundle.config.metrics["forget_gate_mean_per_block"][block] == pytest.approx(value, abs=1e-5)

    class Counting(GateRecorder):   # a caller's own recorder sees every pass of the same measurement
        passes = 0

        def __call__(self, block, bundle, gates):
            super().__call__(block, bundle, gates)
            Counting.passes += 1

    assert measure_gate_means(llama, tokenizer, bundle, FORGET, batch_size=6, recorder=Counting()) == full
    assert Counting.passes == len(bundle.block_indices) * -(-len(FORGET) // 6)
    # the prefix cache (cached first gated block input, routers reading block inputs) changes nothing
    uncached = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, gate_site="mlp",
                                                                                     last_k=3, prefix_cache=False))
    assert _weights(bundle, tmp_path / "cached") == _weights(uncached, tmp_path / "uncached")

    base_dir = save_tiny_model(llama, tokenizer, tmp_path / "base")
    lm = CRULM(base=str(base_dir), routers=str(tmp_path / "cached"), device="cpu", batch_size=2)
    blocks = bundle.block_indices
    routed_seen, routed_logits = _down_proj_inputs(lm.model, blocks, FORGET[:3], tokenizer)
    base_seen, base_logits = _down_proj_inputs(llama, blocks, FORGET[:3], tokenizer)
    first = blocks[0]
    assert torch.equal(routed_seen[("in", first)], base_seen[("in", first)])  # nothing gated below
    loaded = RouterBundle.from_pretrained(tmp_path / "cached")
    neurons = torch.tensor(bundle.config.neurons[first])
    others = torch.ones(256, dtype=torch.bool)
    others[neurons] = False
    assert torch.equal(routed_seen[first][..., others], base_seen[first][..., others])
    with torch.no_grad():
        gates = loaded.router(first)(base_seen[("in", first)])
    torch.testing.assert_close(routed_seen[first][..., neurons], base_seen[first][..., neurons] * gates)
    assert not torch.equal(routed_logits, base_logits)


def test_mlp_site_split_model_and_detach(llama, tokenizer, tmp_path):
    """An accelerate device_map model (all on CPU here) is gated like the plain one; detaching restores it."""
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN,
                           RouterTrainingConfig(**{**FAST, "epochs": 1}, gate_site="mlp", blocks=[3, 6]))
    from transformers import AutoModelForCausalLM

    llama.save_pretrained(tmp_path / "base")
    split = AutoModelForCausalLM.from_pretrained(tmp_path / "base", device_map={"": "cpu"}, dtype=torch.float32)
    batch = tokenizer(FORGET[:3], return_tensors="pt", padding=True)
    with torch.no_grad():
        plain = split(**batch).logits
        with routed(llama, bundle):
            reference = llama(**batch).logits
        handle = attach_bundles(split, bundle)
        gated = split(**batch).logits
        handle.remove()
        assert torch.equal(plain, split(**batch).logits)
    torch.testing.assert_close(gated, reference)
    assert not torch.equal(gated, plain)


class _NoMLPBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.inner = block

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_mlp_site_without_a_findable_mlp_is_one_clear_line(tokenizer):
    model = build_tiny_model("llama", tokenizer)
    model.model.layers[7] = _NoMLPBlock(model.model.layers[7])
    with pytest.raises(GateSiteError, match="cannot find the MLP down projection of decoder block 7") as info:
        localize(model, tokenizer, FORGET, site="mlp")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="gate_site must be one of residual, mlp"):
        RouterTrainingConfig(gate_site="attention")


# -- runner config and CLI ---------------------------------------------------------------------------------------
def test_open_router_init_starts_every_gate_at_open_gate_and_training_moves_them(llama, tokenizer, paper):
    """`router_init="open"`: W2 = 0 and b2 = logit(OPEN_GATE), so every gate starts at 0.99 on any token (the
    default init shuts some from the start); W1 keeps the seeded default init; training then separates the gates."""
    from cru_harness.cru.train import OPEN_GATE, new_bundle

    config = RouterTrainingConfig(**FAST, router_init="open")
    localization = localize(llama, tokenizer, FORGET, last_k=FAST.get("last_k", 4), percentile=FAST["percentile"])
    fresh, default = new_bundle(llama, localization, config), new_bundle(llama, localization, RouterTrainingConfig(**FAST))
    for block in localization.block_indices:
        open_router, default_router = fresh.router(block), default.router(block)
        assert torch.equal(open_router.w1.weight, default_router.w1.weight)
        gates = open_router(torch.randn(3, 5, open_router.hidden_size) * 100)
        assert torch.allclose(gates, torch.full_like(gates, OPEN_GATE))
    assert paper.config.training["router_init"] == "default"
    # from the open start the tiny model's routers need more steps than FAST's 4 (20 at lr 0.1: forget 0.04, retain
    # 0.87); the point is that they leave 0.99 and separate the corpora
    trained = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(
        **{**FAST, "epochs": 10, "lr": 0.1}, router_init="open"))
    metrics = trained.config.metrics
    assert trained.config.training["router_init"] == "open"
    assert metrics["forget_gate_mean"] < 0.5 < metrics["retain_gate_mean"] < OPEN_GATE


def test_runner_accepts_the_options_and_names_a_bad_value(tmp_path):
    raw = {"name": "t", "output_dir": str(tmp_path / "run"), "models": [{"name": "m", "path": "zoo:llama"}],
           "benchmarks": {"tofu": {"splits": ["forget01"]}},
           "methods": [{"method": "CRU", "suppress_loss": "quadratic", "pass_loss": "linear",
                        "input_norm": "rms_learned", "exclude_top_magnitude": 0.1, "gate_site": "mlp",
                        "retain_batch_ratio": 4}]}
    hparams = cfg.validate_config(raw).methods[0].hparams
    RouterTrainingConfig(**hparams)  # what the runner builds from them
    for key, value, message in [("gate_site", "attn", "expected one of residual, mlp, got 'attn'"),
                                ("pass_loss", "square", "expected one of linear, quadratic"),
                                ("input_norm", "layer", "expected one of none, rms, rms_learned"),
                                ("exclude_top_magnitude", 100, "must be < 100, got 100"),
                                ("exclude_top_magnitude", -1, "must be >= 0"),
                                ("retain_batch_ratio", 0, "must be >= 1"),
                                ("retain_batch_ratio", 1.5, "expected an integer"),
                                ("router_init", "closed", "expected one of default, open")]:
        raw["methods"] = [{"method": "CRU", key: value}]
        with pytest.raises(cfg.ConfigError, match=message) as info:
            cfg.validate_config(raw)
        assert info.value.key == f"methods[0].{key}"


def test_unlearn_flags_and_inspect(llama, tokenizer, tmp_path, capsys):
    base = save_tiny_model(llama, tokenizer, tmp_path / "base")
    (tmp_path / "f.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in FORGET) + "\n")
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in RETAIN) + "\n")
    out = tmp_path / "bundle"
    args = ["unlearn", "--base", str(base), "--forget", str(tmp_path / "f.jsonl"), "--retain",
            str(tmp_path / "r.jsonl"), "--out", str(out), "--epochs", "1", "--percentile", "80", "--no-progress",
            "--suppress-loss", "quadratic", "--pass-loss", "linear", "--input-norm", "rms_learned",
            "--retain-batch-ratio", "2", "--exclude-top-magnitude", "2", "--gate-site", "mlp", "--router-init", "open",
            "--last-k", "2"]
    assert main(args) == 0
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert (manifest["suppress_loss"], manifest["pass_loss"], manifest["input_norm"], manifest["gate_site"],
            manifest["exclude_top_magnitude"]) == ("quadratic", "linear", "rms_learned", "mlp", 2.0)
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "loss shape     : suppress quadratic, pass linear" in text
    assert "gate site      : mlp (256 coordinates per block)" in text
    assert "excluded       : top 2.0% by mean |activation| (6: 6, 7: 6)" in text
    assert ("training       : 1 epochs, lr 0.001, batch 8 forget + 16 retain rows per step, routers started open"
            in text)
    assert manifest["training"]["retain_batch_ratio"] == 2 and manifest["training"]["router_init"] == "open"
    assert main(args[:-4] + ["--exclude-top-magnitude", "100", "--overwrite"]) == 2
    assert "exclude_top_magnitude must be a percentage in [0, 100)" in capsys.readouterr().err


def test_runner_accepts_every_value_the_library_does(tmp_path):
    """The runner's static choice lists (kept torch-free, read by the configs and by `unlearn`'s and `finetune`'s
    flags) are the library's, value for value."""
    from cru_harness.baselines.base import MIXED_PRECISION, SCHEDULERS
    from cru_harness.cru import GATE_SITES, INPUT_NORMS, LOSS_SHAPES
    from cru_harness.cru.localize import SELECTIONS
    from cru_harness.cru.prefix import CACHE_PLACEMENTS
    from cru_harness.cru.readings import BLOCK_OUTPUTS, LOCALIZATION_TOKENS, TOKEN_SCOPES
    from cru_harness.cru.train import ROUTER_INITS
    from cru_harness.baselines.lunar import PROMPT_STYLES
    from cru_harness.training.objective import PRECISIONS

    library = {"selection": SELECTIONS, "input_norm": INPUT_NORMS, "suppress_loss": LOSS_SHAPES,
               "pass_loss": LOSS_SHAPES, "gate_site": GATE_SITES, "router_init": ROUTER_INITS,
               "prefix_cache_placement": CACHE_PLACEMENTS, "lr_scheduler": SCHEDULERS,
               "mixed_precision": MIXED_PRECISION, "precision": PRECISIONS, "prompt_style": PROMPT_STYLES,
               "token_scope": TOKEN_SCOPES, "localization_tokens": LOCALIZATION_TOKENS, "block_output": BLOCK_OUTPUTS}
    assert {key: tuple(values) for key, values in cfg.HPARAM_CHOICES.items()} == \
        {key: tuple(values) for key, values in library.items()}
    for key in ("input_norm", "gate_site", "suppress_loss", "pass_loss", "router_init", "selection",
                "prefix_cache_placement", "token_scope", "localization_tokens", "block_output"):
        for value in library[key]:
            raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}],
                   "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": [{"method": "CRU", key: value}]}
            assert cfg.validate_config(raw).methods[0].hparams == {key: value}


@pytest.mark.parametrize("suppress, keep", [("linear", "quadratic"), ("quadratic", "quadratic"),
                                            ("linear", "linear"), ("quadratic", "linear")])
def test_collapsed_gate_minimises_the_tied_loss(suppress, keep):
    """The null line of the gate plots: the grid minimiser of cru_loss with one gate value on both corpora."""
    from cru_harness.cru.losses import collapsed_gate

    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    for lam in (0.3, 0.5, 1.0, 1.7, 10.0, 100.0):
        losses = torch.stack([cru_loss({0: w}, {0: w}, lam, suppress_loss=suppress, pass_loss=keep) for w in grid])
        value = collapsed_gate(lam, suppress_loss=suppress, pass_loss=keep)
        if (suppress, keep, lam) == ("linear", "linear", 1.0):
            assert math.isnan(value) and torch.allclose(losses, losses[0])
            continue
        assert value == pytest.approx(grid[int(torch.argmin(losses))].item(), abs=1e-3), lam
    assert collapsed_gate(1.0) == 0.5  # the paper's 1 - 1/(2 lambda) at lambda = 1
