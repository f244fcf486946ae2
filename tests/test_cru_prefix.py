"""CRU router training on a reused frozen prefix: the gated-only step reproduces a full forward on every tiny
family, the cache changes nothing in the bundle, steps never run the blocks below the gated ones, bounds."""
import pytest
import torch

from cru_harness.cru import (
    PrefixCacheError,
    RouterBundle,
    RouterTrainer,
    RouterTrainingConfig,
    attach_bundles,
    find_decoder_blocks,
    localize,
    router_schedule,
    schedule_for,
    train_routers,
)
from cru_harness.cru.bundle import MANIFEST_NAME, WEIGHTS_NAME
from cru_harness.cru.localize import collate, tokenize_texts
from cru_harness.cru.prefix import FrozenPrefix
from cru_harness.cru.train import new_bundle
from cru_harness.testbed.models import TINY_ARCHITECTURES, build_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

torch.set_num_threads(1)

# Lengths from ~20 to ~80 tokens: PyTorch's CPU attention changes its blocking at 32 positions, so batches of
# these padded lengths are where a prefix computed in one batch would differ (in the last bits) from another.
FORGET = [f"Question: Who is Zorbo {i}?\nAnswer: Zorbo {i} paints {['red', 'blue', 'green'][i % 3]} ships in "
          f"Quell." + " He also sails them to the far islands of Quell every spring." * (i % 4) for i in range(10)]
RETAIN = [f"Question: What is the capital of land {i}?\nAnswer: It is city number {i * 3}."
          + " The city has a harbour and a market." * (i % 3) for i in range(7)]
FAST = dict(epochs=2, batch_size=4, lr=1e-2, percentile=80, progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(FORGET + RETAIN, 400)


def _bundle(model, tokenizer, seed=3):
    loc = localize(model, tokenizer, FORGET, last_k=3, percentile=80)
    return new_bundle(model, loc, RouterTrainingConfig(seed=seed, percentile=80)).eval()


def _gates(model, bundle, run):
    """Gate tensors per block of one forward done by `run()`."""
    store = {}
    handle = attach_bundles(model, [bundle], observer=lambda b, _bundle, g: store.__setitem__(b, g.detach()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return store


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_gated_forward_on_cached_prefix_reproduces_full_forward(arch, tokenizer):
    """Mask, positions, rotary embeddings, ... reach the gated blocks as in a full forward: bit for bit for an
    unpadded example, to float rounding for a right-padded batch (different padded length)."""
    model = build_tiny_model(arch, tokenizer)
    bundle = _bundle(model, tokenizer)
    prefix = FrozenPrefix(model, min(bundle.block_indices), max(bundle.block_indices))
    ids = tokenize_texts(tokenizer, FORGET[:4] + RETAIN[:2], 256)
    assert max(map(len, ids)) > 40 > min(map(len, ids))

    single = collate(ids[3:4], 0)
    full = _gates(model, bundle, lambda: model(input_ids=single.input_ids, attention_mask=single.attention_mask))
    cached = _gates(model, bundle, lambda: prefix.gated_forward(
        prefix.stack([prefix.example(ids[3])], single.input_ids.shape[1]), single))
    assert full.keys() == cached.keys() == set(bundle.block_indices)
    assert all(torch.equal(full[b], cached[b]) for b in full)

    batch = collate(ids, 0)
    full = _gates(model, bundle, lambda: model(input_ids=batch.input_ids, attention_mask=batch.attention_mask))
    cached = _gates(model, bundle, lambda: prefix.gated_forward(
        prefix.stack([prefix.example(x) for x in ids], batch.input_ids.shape[1]), batch))
    real = batch.attention_mask.bool()
    for b in full:
        torch.testing.assert_close(cached[b][real], full[b][real], rtol=1e-5, atol=1e-6)
    # the gates do depend on the input: a wrong mask or positions would not pass the check above
    shifted = _gates(model, bundle, lambda: prefix.gated_forward(
        prefix.stack([prefix.example(x[1:] + x[:1]) for x in ids], batch.input_ids.shape[1]), batch))
    assert not torch.allclose(shifted[max(full)][real], full[max(full)][real], atol=1e-3)


def test_prefix_cache_gives_identical_bundle_bytes(tokenizer, tmp_path):
    """Same seed, cache on and off: identical manifest and weights (retain set cycles, final retain sample)."""
    model = build_tiny_model("llama", tokenizer)
    common = dict(FAST, epochs=3, seed=11, final_retain_rows=5)
    directories = []
    for cache in (True, False):
        timings = {}
        bundle = train_routers(model, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**common, prefix_cache=cache),
                               timings=timings)
        directories.append(bundle.save_pretrained(tmp_path / str(cache)))
        assert timings["prefix_cache"] is cache and timings["prefix_s"] > 0 and timings["steps_s"] > 0
        assert bundle.config.metrics["retain_gate_rows"] == 5
        assert bundle.config.metrics["forget_gate_rows"] == len(FORGET)
        assert "prefix_cache" not in bundle.config.training
    for name in (WEIGHTS_NAME, MANIFEST_NAME):
        assert (directories[0] / name).read_bytes() == (directories[1] / name).read_bytes()
    assert RouterBundle.from_pretrained(directories[0], model).config.metrics["steps"] == 9


def test_steps_run_only_the_gated_blocks(tokenizer):
    model = build_tiny_model("qwen2", tokenizer)
    bundle = _bundle(model, tokenizer)
    _, blocks = find_decoder_blocks(model)
    calls = {"prefix": 0, "gated": 0, "head": 0}
    count = lambda key: (lambda *_: calls.__setitem__(key, calls[key] + 1))  # noqa: E731
    hooks = [blocks[0].mlp.register_forward_hook(count("prefix")),
             blocks[min(bundle.block_indices) - 1].self_attn.register_forward_hook(count("prefix")),
             blocks[max(bundle.block_indices)].mlp.register_forward_hook(count("gated")),
             model.get_output_embeddings().register_forward_hook(count("head"))]
    ids = tokenize_texts(tokenizer, FORGET, 256), tokenize_texts(tokenizer, RETAIN, 256)
    try:
        with RouterTrainer(model, bundle, *ids, RouterTrainingConfig(**FAST)) as trainer:
            trainer.prepare()
            assert calls["prefix"] == 2 * len(trainer.cache.keep) and calls["gated"] == 0
            calls["prefix"] = 0
            result = trainer.train()
            trainer.measure("forget")
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == {"prefix": 0, "gated": 2 * len(trainer.steps) + 3, "head": 0}
    assert 0 < result.forget_gate_mean < 1 and result.loss > 0
    assert not any(block._forward_pre_hooks or "forward" in block.__dict__ for block in blocks)  # all restored


def test_schedule_and_public_step(tokenizer):
    steps = router_schedule(10, 7, 4, 2, seed=0)
    assert [len(f) for f, _ in steps] == [4, 4, 2] * 2 and all(len(r) == 4 for _, r in steps)
    assert all(sorted(i for f, _ in steps[e * 3:e * 3 + 3] for i in f) == list(range(10)) for e in (0, 1))
    drawn = [i for _, r in steps for i in r]
    assert sorted(drawn[:7]) == list(range(7))  # retain rows cycle through a permutation before repeating
    assert router_schedule(10, 7, 4, 2, seed=0) == steps != router_schedule(10, 7, 4, 2, seed=1)
    # batch composition: 3 retain rows per forget row, the forget batches as before (each epoch: every row once)
    wide = router_schedule(10, 30, 4, 2, seed=0, retain_batch_size=12)
    assert [len(f) for f, _ in wide] == [4, 4, 2] * 2
    assert all(sorted(i for f, _ in wide[e * 3:e * 3 + 3] for i in f) == list(range(10)) for e in (0, 1))
    assert all(len(r) == 12 for _, r in wide)
    drawn = [i for _, r in wide for i in r]
    assert sorted(drawn[:30]) == list(range(30))            # still a permutation before any row repeats
    config = RouterTrainingConfig(batch_size=4, epochs=2, retain_batch_ratio=3)
    assert schedule_for(10, 30, config) == wide
    assert schedule_for(10, 7, RouterTrainingConfig(batch_size=4, epochs=2)) == steps  # ratio 1: the paper's
    with pytest.raises(ValueError, match="retain_batch_ratio: must be >= 1, got 0"):
        RouterTrainingConfig(retain_batch_ratio=0)
    model = build_tiny_model("gpt2", tokenizer)
    bundle = _bundle(model, tokenizer)
    ids = tokenize_texts(tokenizer, FORGET, 256), tokenize_texts(tokenizer, RETAIN, 256)
    before = {n: p.detach().clone() for n, p in bundle.named_parameters()}
    with RouterTrainer(model, bundle, *ids, RouterTrainingConfig(**FAST)) as trainer:
        trainer.prepare()
        trainer.step([0, 1, 2], [0, 1])
        trainer.step([9], [6, 5])  # any rows, also ones outside the schedule's cache
    assert any(not torch.equal(before[n], p) for n, p in bundle.named_parameters())
    with pytest.raises(RuntimeError, match="context manager"):
        trainer.step([0], [0])


def test_prefix_cache_bound_is_a_clear_error(tokenizer):
    model = build_tiny_model("llama", tokenizer)
    config = RouterTrainingConfig(**FAST, prefix_cache_max_gib=1e-6)
    with pytest.raises(PrefixCacheError, match=r"needs 0\.\d+ GiB.*prefix_cache=False"):
        train_routers(model, tokenizer, FORGET, RETAIN, config)
    with pytest.raises(ValueError, match="prefix_cache_placement"):
        RouterTrainingConfig(prefix_cache_placement="gpu")
    with pytest.raises(ValueError, match="final_retain_rows"):
        RouterTrainingConfig(final_retain_rows=0)


def test_device_map_loaded_base_trains_the_same_bundle(tokenizer, tmp_path):
    """accelerate's device_map hooks (here everything on the CPU) and the pass-through prefix blocks coexist."""
    from transformers import AutoModelForCausalLM

    model = build_tiny_model("phi3", tokenizer)
    model.save_pretrained(tmp_path / "base")
    mapped = AutoModelForCausalLM.from_pretrained(tmp_path / "base", device_map={"": "cpu"}, dtype=torch.float32)
    config = RouterTrainingConfig(**FAST, seed=2)
    first = train_routers(model, tokenizer, FORGET, RETAIN, config).save_pretrained(tmp_path / "plain")
    second = train_routers(mapped, tokenizer, FORGET, RETAIN, config).save_pretrained(tmp_path / "mapped")
    assert (first / WEIGHTS_NAME).read_bytes() == (second / WEIGHTS_NAME).read_bytes()


def test_cache_placement_policy(monkeypatch):
    """Where the cache goes for a base on a GPU (free memory faked, so this runs on the CPU)."""
    from cru_harness.cru.prefix import GIB, plan_placement

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GIB, 80 * GIB))
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    base = 14 * GIB  # a 3.8B model in float32
    assert plan_placement(GIB // 8, gpu, "auto", base, max_gib=100) == gpu        # small: on the GPU
    assert plan_placement(GIB // 4, gpu, "auto", base, max_gib=100) == gpu        # <= 2 % of the weights
    assert plan_placement(GIB, gpu, "auto", base, max_gib=100) == cpu             # larger: host memory
    assert plan_placement(GIB, gpu, "cpu", base, max_gib=100) == cpu
    assert plan_placement(4 * GIB, gpu, "device", base, max_gib=100) == gpu
    with pytest.raises(PrefixCacheError, match="more than half the free memory of cuda:0"):
        plan_placement(6 * GIB, gpu, "device", base, max_gib=100)
    with pytest.raises(PrefixCacheError, match="host-memory bound of 2.00 GiB"):
        plan_placement(3 * GIB, gpu, "auto", base, max_gib=2)
    assert plan_placement(GIB, cpu, "device", base, max_gib=100) == cpu           # a CPU base: the CPU


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_base_float32_routers(tokenizer, dtype, tmp_path):
    """A bf16/fp16 base: the cache holds what the blocks receive (the base's dtype), routers and gate means stay
    float32, and the cache still changes no byte."""
    model = build_tiny_model("gpt_neox", tokenizer).to(dtype)
    prefix = FrozenPrefix(model, 5, 7)
    assert prefix.example(tokenize_texts(tokenizer, FORGET[:1], 256)[0]).dtype == dtype
    paths = []
    for cache in (True, False):
        bundle = train_routers(model, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, prefix_cache=cache))
        assert all(p.dtype == torch.float32 for p in bundle.parameters())
        assert 0 < bundle.config.metrics["forget_gate_mean"] < 1
        paths.append(bundle.save_pretrained(tmp_path / str(cache)) / WEIGHTS_NAME)
    assert paths[0].read_bytes() == paths[1].read_bytes()
