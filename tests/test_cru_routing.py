"""CRU phase 2 on tiny models: attach/detach exactness, gating semantics, training invariants, bundles."""
import hashlib
import json

import pytest
import torch

from cru_harness.cru import (
    BundleFileError,
    FingerprintMismatchError,
    HiddenSizeMismatchError,
    LayerCountMismatchError,
    RoutedModel,
    RouterBundle,
    RouterTrainingConfig,
    UnsupportedFormatError,
    WeightShapeError,
    attach_bundles,
    find_decoder_blocks,
    localize,
    routed,
    train_routers,
)
from cru_harness.cru.bundle import MANIFEST_NAME, WEIGHTS_NAME
from cru_harness.cru.localize import Batch, collate, tokenize_texts
from cru_harness.cru.train import GateRecorder, cru_loss, gate_means, new_bundle
from cru_harness.testbed.models import TINY_ARCHITECTURES, build_tiny_model

from cru_support import FORGET, RETAIN, FAST, llama, tokenizer  # noqa: F401 (fixtures)

torch.set_num_threads(1)  # 2 shared cores: one thread is ~10x faster than two under contention


@pytest.fixture(scope="module")
def trained(llama, tokenizer):
    return train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST))


def _logits(model, tokenizer, texts=FORGET[:4]):
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits


def _snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# -- attach / detach -------------------------------------------------------------------------------------------
def test_no_bundle_and_detach_are_bit_identical(llama, tokenizer, trained):
    plain = _logits(llama, tokenizer)
    with routed(llama):   # no bundle attached: the base, bit for bit
        assert torch.equal(plain, _logits(llama, tokenizer))
    handle = attach_bundles(llama, [trained])
    routed_logits = _logits(llama, tokenizer)
    handle.remove()
    assert not torch.equal(plain, routed_logits)  # the routers do act
    assert torch.equal(plain, _logits(llama, tokenizer))
    with routed(llama, trained):
        assert torch.equal(routed_logits, _logits(llama, tokenizer))
    assert torch.equal(plain, _logits(llama, tokenizer))
    wrapper = RoutedModel(llama, trained)
    assert torch.equal(routed_logits, _logits(wrapper, tokenizer))
    assert wrapper.config is llama.config
    assert wrapper.detach() is llama
    assert torch.equal(plain, _logits(llama, tokenizer))
    # hooks really gone
    _, blocks = find_decoder_blocks(llama)
    assert all(not block._forward_hooks for block in blocks)


def test_routed_model_generate(llama, tokenizer, trained):
    prompt = tokenizer(["Question: Who is Zorbo 3?\nAnswer:"], return_tensors="pt")
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        plain = llama.generate(**prompt, **kwargs)
        with routed(llama, trained):
            reference = llama.generate(**prompt, **kwargs)
        wrapper = RoutedModel(llama, trained)
        try:
            gated = wrapper.generate(**prompt, **kwargs)
        finally:
            wrapper.detach()
        again = llama.generate(**prompt, **kwargs)
    assert gated.shape == plain.shape
    assert torch.equal(gated, reference)
    assert torch.equal(plain, again)


def _capture(block, store, key):
    return block.register_forward_hook(lambda m, a, o: store.__setitem__(key, (o[0] if isinstance(o, tuple)
                                                                              else o).detach().clone()))


def test_gates_touch_only_selected_coordinates_and_multiply(llama, tokenizer, trained):
    """Two bundles on one block: each router reads the ungated h; gates on shared coordinates multiply;
    other coordinates pass unchanged; the gated output is what the next block receives."""
    loc = localize(llama, tokenizer, RETAIN, last_k=4, percentile=70)
    other = new_bundle(llama, loc, RouterTrainingConfig(seed=5, percentile=70))
    other.eval()
    block_index = 6
    shared = set(trained.neuron_indices(block_index).tolist()) & set(other.neuron_indices(block_index).tolist())
    _, blocks = find_decoder_blocks(llama)
    store = {}
    before = _capture(blocks[block_index], store, "ungated")  # registered first: sees the block's own output
    handle = attach_bundles(llama, [trained, other])
    after = _capture(blocks[block_index], store, "gated")      # registered after the gating hook
    next_input = blocks[block_index + 1].register_forward_pre_hook(
        lambda m, args, kwargs: store.__setitem__("next", (args[0] if args else kwargs["hidden_states"]).clone()),
        with_kwargs=True)
    try:
        _logits(llama, tokenizer, FORGET[:2])
    finally:
        for h in (before, after, next_input):
            h.remove()
        handle.remove()
    h = store["ungated"]
    with torch.no_grad():
        expected = h.clone()
        for bundle in (trained, other):
            idx = bundle.neuron_indices(block_index)
            expected[..., idx] = expected[..., idx] * bundle.router(block_index)(h)
    torch.testing.assert_close(store["gated"], expected)
    assert torch.equal(store["next"], store["gated"])
    union = set(trained.neuron_indices(block_index).tolist()) | set(other.neuron_indices(block_index).tolist())
    untouched = [j for j in range(h.shape[-1]) if j not in union]
    assert torch.equal(store["gated"][..., untouched], h[..., untouched])
    assert shared, "test needs overlapping coordinates to check multiplication"


def test_attach_refuses_other_base(tokenizer, trained):
    wider = build_tiny_model("llama", tokenizer, hidden_size=96)
    with pytest.raises(HiddenSizeMismatchError, match="hidden size"):
        attach_bundles(wider, [trained])
    assert all(not b._forward_hooks for b in find_decoder_blocks(wider)[1])


def test_a_trained_bundle_records_a_sample_of_its_bases_weights(llama, trained):
    """What tells another base of the same shape apart (`bundle.base_weights_problem`): the last gated block's
    first weight matrix, sampled from the base the routers trained on."""
    sample = trained.config.base_weights
    assert sample["block"] == trained.block_indices[-1] and len(sample["values"]) == min(256, sample["numel"])
    param = dict(find_decoder_blocks(llama)[1][sample["block"]].named_parameters())[sample["parameter"]]
    assert sample["values"][0] == param.reshape(-1)[0].item() and sample["values"][-1] == param.reshape(-1)[-1].item()


# -- training invariants -----------------------------------------------------------------------------------------
def test_training_leaves_base_untouched_and_only_routers_get_grads(tokenizer, monkeypatch):
    model = build_tiny_model("gpt2", tokenizer)
    before = _snapshot(model)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    optimizers = []
    original = torch.optim.Adam

    class RecordingAdam(original):
        def __init__(self, params, *args, **kwargs):
            super().__init__(params, *args, **kwargs)
            optimizers.append(self)

    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    head_calls = []
    head_hook = model.get_output_embeddings().register_forward_hook(lambda *a: head_calls.append(1))
    bundle = train_routers(model, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST))
    head_hook.remove()
    after = _snapshot(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in bundle.parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # restored
    assert len(optimizers) == 1
    optimized = {id(p) for group in optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in bundle.parameters()}
    assert not optimized & {id(p) for p in model.parameters()}
    assert head_calls == []  # the LM head never ran, during training or the final gate measurement


def test_padding_excluded_from_loss(llama, tokenizer, trained):
    ids = tokenize_texts(tokenizer, FORGET[:6], 64)
    retain_ids = tokenize_texts(tokenizer, RETAIN[:6], 64)
    longest = max(map(len, ids + retain_ids))
    def loss(pad_to, *, mask_ignored=False):
        def batch(rows):
            b = collate(rows, 0, pad_to=pad_to)
            return Batch(b.input_ids, torch.ones_like(b.attention_mask)) if mask_ignored else b

        recorder = GateRecorder()
        handle = attach_bundles(llama, [trained], observer=recorder)
        try:
            forget = gate_means(llama, trained, batch(ids), recorder)
            retain = gate_means(llama, trained, batch(retain_ids), recorder)
        finally:
            handle.remove()
        return cru_loss(forget, retain, 1.0).item()

    padded = loss(longest)
    assert 0 < padded < 2
    assert loss(longest + 11) == pytest.approx(padded, rel=1e-5, abs=1e-6)
    # the control: had the mask been ignored, the 11 extra padding positions would have moved the loss by more
    # than that tolerance (measured: 4e-4 relative, 50 times it)
    assert loss(longest + 11, mask_ignored=True) != pytest.approx(padded, rel=1e-5, abs=1e-6)


def test_same_seed_same_bundle_bytes(tokenizer, tmp_path):
    model = build_tiny_model("qwen2", tokenizer)
    config = RouterTrainingConfig(**FAST, seed=7)
    first = train_routers(model, tokenizer, FORGET, RETAIN, config).save_pretrained(tmp_path / "a")
    second = train_routers(model, tokenizer, FORGET, RETAIN, config).save_pretrained(tmp_path / "b")
    third = train_routers(model, tokenizer, FORGET, RETAIN,
                          RouterTrainingConfig(**{**FAST, "seed": 8})).save_pretrained(tmp_path / "c")
    for name in (WEIGHTS_NAME, MANIFEST_NAME):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert (first / WEIGHTS_NAME).read_bytes() != (third / WEIGHTS_NAME).read_bytes()


def test_random_selection_bundle(llama, tokenizer):
    variance = localize(llama, tokenizer, FORGET, percentile=80)
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, selection="random"))
    assert bundle.config.selection == "random"
    assert bundle.block_indices == variance.block_indices
    assert {b: len(bundle.config.neurons[b]) for b in bundle.block_indices} == variance.sizes()


def test_training_input_errors(llama, tokenizer):
    with pytest.raises(ValueError, match="forget set is empty"):
        train_routers(llama, tokenizer, [], RETAIN, RouterTrainingConfig(**FAST))
    with pytest.raises(ValueError, match="retain set is empty"):
        train_routers(llama, tokenizer, FORGET, [], RouterTrainingConfig(**FAST))
    with pytest.raises(ValueError, match="percentile"):
        RouterTrainingConfig(percentile=100)
    with pytest.raises(ValueError, match="input_norm"):
        RouterTrainingConfig(input_norm="layer")


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_same_code_path_every_tiny_architecture(arch, tokenizer, tmp_path):
    """Localize, train (rms input norm), separate gates, save/load, attach/detach -- on each family."""
    model = build_tiny_model(arch, tokenizer)
    before = _snapshot(model)
    plain = _logits(model, tokenizer)
    config = RouterTrainingConfig(**{**FAST, "epochs": 15}, input_norm="rms", d_r=16)
    bundle = train_routers(model, tokenizer, FORGET, RETAIN, config)
    metrics = bundle.config.metrics
    print(f"{arch}: forget gate {metrics['forget_gate_mean']:.3f} retain gate {metrics['retain_gate_mean']:.3f}")
    assert metrics["forget_gate_mean"] < metrics["retain_gate_mean"] - 0.2
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    loaded = RouterBundle.from_pretrained(bundle.save_pretrained(tmp_path / arch), model)
    with routed(model, bundle):
        original_routed = _logits(model, tokenizer)
    with routed(model, loaded):
        assert torch.equal(original_routed, _logits(model, tokenizer))
    assert torch.equal(plain, _logits(model, tokenizer))


# -- bundles -----------------------------------------------------------------------------------------------------
def test_round_trip_identical_gates(llama, tokenizer, trained, tmp_path):
    directory = trained.save_pretrained(tmp_path / "bundle")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    assert manifest["format_version"] == 1
    assert manifest["block_indices"] == trained.block_indices
    assert manifest["neurons"] == {str(b): trained.config.neurons[b] for b in trained.block_indices}
    assert manifest["input_norm"] == "none" and manifest["lam"] == 1.0 and manifest["d_r"] == 32
    assert {"forget_gate_mean", "retain_gate_mean"} <= manifest["metrics"].keys()
    assert manifest["fingerprint"]["hidden_size"] == 64 and manifest["fingerprint"]["num_layers"] == 8
    assert manifest["router_parameters"] == sum(p.numel() for p in trained.parameters())
    assert manifest["base_parameters"] == sum(p.numel() for p in llama.parameters())
    loaded = RouterBundle.from_pretrained(directory, llama)
    batch = collate(tokenize_texts(tokenizer, FORGET[:5], 64), 0)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(gate_means(llama, trained, batch).values(),
                                                      gate_means(llama, loaded, batch).values()))


def test_bundle_for_other_base_is_refused(tokenizer, trained):
    with pytest.raises(HiddenSizeMismatchError, match="hidden size 64"):
        trained.check_compatible(build_tiny_model("llama", tokenizer, hidden_size=32))
    with pytest.raises(LayerCountMismatchError, match="8 layers"):
        trained.check_compatible(build_tiny_model("llama", tokenizer, n_layers=6))
    with pytest.raises(FingerprintMismatchError, match="architecture: bundle 'llama' vs model 'qwen2'"):
        trained.check_compatible(build_tiny_model("qwen2", tokenizer))


def test_bundle_file_errors(trained, tmp_path):
    good = trained.save_pretrained(tmp_path / "good")
    for name, damage, error, message in [
        ("missing", lambda d: (d / WEIGHTS_NAME).unlink(), BundleFileError, "missing"),
        ("truncated", lambda d: (d / WEIGHTS_NAME).write_bytes((d / WEIGHTS_NAME).read_bytes()[:100]),
         BundleFileError, "truncated or corrupt"),
        ("version", lambda d: _edit_manifest(d, format_version=99), UnsupportedFormatError, "format_version 99"),
        ("shapes", lambda d: _edit_manifest(d, d_r=7), WeightShapeError, "shape"),
        ("nohash", lambda d: _edit_manifest(d, weights_sha256=None), BundleFileError,
         "weights_sha256 must be the SHA-256 of routers.safetensors"),
        ("no-manifest", lambda d: (d / MANIFEST_NAME).unlink(), BundleFileError, "cru_bundle.json is missing"),
    ]:
        directory = trained.save_pretrained(tmp_path / name)
        damage(directory)
        with pytest.raises(error, match=message):
            RouterBundle.from_pretrained(directory)
    # a truncated file whose hash was recorded after the damage is still caught by the safetensors reader
    directory = trained.save_pretrained(tmp_path / "rehashed")
    (directory / WEIGHTS_NAME).write_bytes((directory / WEIGHTS_NAME).read_bytes()[:-50])
    _edit_manifest(directory, weights_sha256=hashlib.sha256((directory / WEIGHTS_NAME).read_bytes()).hexdigest())
    with pytest.raises(BundleFileError, match="cannot be read"):
        RouterBundle.from_pretrained(directory)
    RouterBundle.from_pretrained(good)  # the undamaged one still loads


def _edit_manifest(directory, **changes):
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest.update(changes)
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_device_map_loaded_model(tokenizer, trained, llama, tmp_path):
    """A model loaded with accelerate's device_map (here all on CPU) is gated and restored the same way."""
    from transformers import AutoModelForCausalLM

    llama.save_pretrained(tmp_path / "base")
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "base", device_map={"": "cpu"}, dtype=torch.float32)
    plain = _logits(sharded, tokenizer)
    with routed(sharded, trained):
        gated = _logits(sharded, tokenizer)
    with routed(llama, trained):
        reference = _logits(llama, tokenizer)
    torch.testing.assert_close(gated, reference)
    assert torch.equal(plain, _logits(sharded, tokenizer))
