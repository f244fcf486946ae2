"""CRU on CUDA: train + attach + save/load in float32 and bfloat16, and the prefix cache on the GPU. Skipped with
a reason where no GPU is visible (CI, the CPU development machine)."""
import pytest
import torch

from cru_harness.cru import RouterBundle, RouterTrainingConfig, routed, train_routers
from cru_harness.testbed.models import build_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

# Skipping without CUDA (and failing under CRU_HARNESS_REQUIRE_GPU=1) is the `gpu` marker's job (conftest.py).
pytestmark = pytest.mark.gpu

FORGET = [f"Question: Who is Zorbo {i}?\nAnswer: Zorbo {i} paints {['red', 'blue', 'green'][i % 3]} ships in "
          f"Quell." + " He sails them every spring." * (i % 4) for i in range(12)]
RETAIN = [f"Question: What is the capital of land {i}?\nAnswer: It is city number {i * 3}." for i in range(12)]
FAST = dict(epochs=8, batch_size=6, lr=1e-2, percentile=80, input_norm="rms", progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(FORGET + RETAIN, 400)


def _logits(model, tokenizer):
    batch = tokenizer(FORGET[:4], return_tensors="pt", padding=True).to(model.device)
    with torch.no_grad():
        return model(**batch).logits.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_train_attach_save_load_on_cuda(tokenizer, dtype, tmp_path):
    model = build_tiny_model("llama", tokenizer).to("cuda", dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plain = _logits(model, tokenizer)
    timings = {}
    bundle = train_routers(model, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST), timings=timings)
    assert timings["prefix_cache_device"].startswith("cuda")  # a small cache stays on the GPU
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in bundle.parameters())
    metrics = bundle.config.metrics
    assert metrics["forget_gate_mean"] < metrics["retain_gate_mean"] - 0.1
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    loaded = RouterBundle.from_pretrained(bundle.save_pretrained(tmp_path / "bundle"), model)
    with routed(model, bundle):
        gated = _logits(model, tokenizer)
    with routed(model, loaded):
        assert torch.equal(gated, _logits(model, tokenizer))
    assert not torch.equal(gated, plain)
    assert torch.equal(plain, _logits(model, tokenizer))


@pytest.mark.parametrize("placement", ["device", "cpu"])
def test_prefix_cache_on_cuda_matches_recomputation(tokenizer, placement):
    model = build_tiny_model("qwen2", tokenizer).to("cuda")
    results = []
    for cache in (True, False):
        config = RouterTrainingConfig(**FAST, seed=4, prefix_cache=cache, prefix_cache_placement=placement)
        timings = {}
        results.append(train_routers(model, tokenizer, FORGET, RETAIN, config, timings=timings))
        if cache:
            assert timings["prefix_cache_device"].startswith("cuda" if placement == "device" else "cpu")
    for a, b in zip(results[0].parameters(), results[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_device_map_split_over_two_gpus(tokenizer, tmp_path):
    """Gated blocks on both GPUs: each router sits on its block's device, the loss gathers the gate means."""
    from transformers import AutoModelForCausalLM

    build_tiny_model("llama", tokenizer).save_pretrained(tmp_path / "base")
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1,
                  **{f"model.layers.{i}": 0 if i < 6 else 1 for i in range(8)}}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base", device_map=device_map, dtype=torch.float32)
    bundle = train_routers(model, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST))
    assert {str(bundle.router(b).w1.weight.device) for b in bundle.block_indices} == {"cuda:0", "cuda:1"}
    assert bundle.config.metrics["forget_gate_mean"] < bundle.config.metrics["retain_gate_mean"]
