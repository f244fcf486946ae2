"""CRU phase 1: block discovery, mask-aware pooling, percentile selection, controls."""
import copy

import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, MistralConfig, OPTConfig

from cru_harness.cru import DecoderBlocksNotFoundError, compare_localizations, find_decoder_blocks, localize
from cru_harness.training.blocks import resolve_block_indices
from cru_harness.cru.localize import collate, localize_batches, select_neurons, tokenize_texts
from cru_harness.testbed.models import TINY_ARCHITECTURES, build_tiny_model
from cru_harness.testbed.tokenizer import TINY_CHAT_TEMPLATE

from cru_support import FORGET, RETAIN, llama, tokenizer  # noqa: F401 (fixtures)

torch.set_num_threads(1)  # 2 shared cores: one thread is ~10x faster than two under contention



EXPECTED_PATHS = {"llama": "model.layers", "qwen2": "model.layers", "phi3": "model.layers",
                  "gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers"}


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_find_decoder_blocks_every_tiny_family(arch, tokenizer):
    model = build_tiny_model(arch, tokenizer, n_layers=5)
    path, blocks = find_decoder_blocks(model)
    assert path == EXPECTED_PATHS[arch]
    assert len(blocks) == 5


@pytest.mark.parametrize("config_cls,expected", [(OPTConfig, "model.decoder.layers"),
                                                 (MistralConfig, "model.layers")])
def test_find_decoder_blocks_opt_and_mistral(config_cls, expected):
    if config_cls is OPTConfig:
        config = OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, ffn_dim=64, num_attention_heads=2,
                           word_embed_proj_dim=32, max_position_embeddings=64)
    else:
        config = MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config)
    path, blocks = find_decoder_blocks(model)
    assert path == expected and len(blocks) == 3
    # localization runs on them too (generic hooks)
    texts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [3, 3, 9]]
    loc = localize_batches(model, [collate(texts, 0)], block_indices=[1, 2], percentile=80)
    assert loc.block_indices == [1, 2]
    for block in (1, 2):   # the coordinates above the 80th variance percentile of each block's 32
        var = loc.variances[block].double().numpy()
        assert loc.neurons[block].tolist() == np.flatnonzero(var > np.percentile(var, 80)).tolist()
        assert 5 <= len(loc.neurons[block]) <= 7


def test_find_decoder_blocks_clear_error():
    class NotADecoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Cfg", (), {"num_hidden_layers": 6})()
            self.stack = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

    with pytest.raises(DecoderBlocksNotFoundError, match="length 6.*stack \\(len 3\\)"):
        find_decoder_blocks(NotADecoder())


def test_resolve_block_indices():
    assert resolve_block_indices(8, None, 4) == [4, 5, 6, 7]
    assert resolve_block_indices(8, [-1, 0, 0], None) == [0, 7]
    with pytest.raises(ValueError, match="out of range"):
        resolve_block_indices(8, [8])
    with pytest.raises(ValueError, match="last_k"):
        resolve_block_indices(8, None, 9)


def test_selected_size_matches_percentile(llama, tokenizer):
    for percentile in (50.0, 90.0, 95.0):
        loc = localize(llama, tokenizer, FORGET, last_k=3, percentile=percentile, batch_size=5)
        assert loc.block_indices == [5, 6, 7]
        for block in loc.block_indices:
            var = loc.variances[block].double().numpy()
            expected = np.flatnonzero(var > np.percentile(var, percentile))  # independent reimplementation
            assert loc.neurons[block].tolist() == expected.tolist()
            d = var.size
            assert abs(len(expected) - d * (1 - percentile / 100)) <= 1


def test_variance_is_over_mask_aware_pooled_means(llama, tokenizer):
    """The variance equals the variance of per-example means computed one example at a time (no padding)."""
    loc = localize(llama, tokenizer, FORGET[:6], blocks=[2], percentile=90, batch_size=6)
    pooled = []
    _, blocks = find_decoder_blocks(llama)
    captured = {}
    handle = blocks[2].register_forward_hook(lambda m, a, o: captured.update(h=o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            for text in FORGET[:6]:
                llama(**tokenizer(text, return_tensors="pt"))
                pooled.append(captured["h"][0].float().mean(dim=0))
    finally:
        handle.remove()
    expected = torch.stack(pooled).var(dim=0)
    torch.testing.assert_close(loc.variances[2], expected, rtol=1e-4, atol=1e-7)


def test_padding_does_not_change_localization(llama, tokenizer):
    ids = tokenize_texts(tokenizer, FORGET, 64)
    longest = max(map(len, ids))
    tight = localize_batches(llama, [collate(ids[:6], 0), collate(ids[6:], 0)], block_indices=[4, 7])
    padded = localize_batches(llama, [collate(ids[:6], 0, pad_to=longest + 9), collate(ids[6:], 0,
                                                                                        pad_to=longest + 17)],
                              block_indices=[4, 7])
    for block in (4, 7):
        assert tight.neurons[block].tolist() == padded.neurons[block].tolist()
        torch.testing.assert_close(tight.variances[block], padded.variances[block], rtol=1e-4, atol=1e-7)


def test_random_control_same_blocks_and_sizes(llama, tokenizer):
    variance = localize(llama, tokenizer, FORGET, last_k=4, percentile=80)
    random_a = localize(llama, tokenizer, FORGET, last_k=4, percentile=80, selection="random", seed=3)
    random_b = localize(llama, tokenizer, FORGET, last_k=4, percentile=80, selection="random", seed=3)
    random_c = localize(llama, tokenizer, FORGET, last_k=4, percentile=80, selection="random", seed=4)
    assert random_a.block_indices == variance.block_indices
    assert random_a.sizes() == variance.sizes()
    assert all(torch.equal(random_a.neurons[b], random_b.neurons[b]) for b in variance.block_indices)
    assert any(not torch.equal(random_a.neurons[b], random_c.neurons[b]) for b in variance.block_indices)
    assert any(not torch.equal(random_a.neurons[b], variance.neurons[b]) for b in variance.block_indices)


def test_compare_localizations(llama, tokenizer):
    forget = localize(llama, tokenizer, FORGET, last_k=2, percentile=80)
    retain = localize(llama, tokenizer, RETAIN, last_k=2, percentile=80)
    same = compare_localizations(forget, forget)
    assert all(c.overlap == 1.0 and c.spearman_rho == pytest.approx(1.0) for c in same.values())
    cross = compare_localizations(forget, retain)
    for block, comparison in cross.items():
        f, r = set(forget.neurons[block].tolist()), set(retain.neurons[block].tolist())
        assert comparison.overlap == pytest.approx(len(f & r) / len(f))
        assert -1.0 <= comparison.spearman_rho <= 1.0


@pytest.mark.parametrize("percentile", [0, 100, -5, 150, "high"])
def test_percentile_must_be_inside_0_100(llama, tokenizer, percentile):
    with pytest.raises(ValueError, match="percentile"):
        localize(llama, tokenizer, FORGET, percentile=percentile)


def test_empty_and_too_small_forget_sets(llama, tokenizer):
    with pytest.raises(ValueError, match="empty"):
        localize(llama, tokenizer, [])
    with pytest.raises(ValueError, match="at least 2 examples"):
        localize(llama, tokenizer, FORGET[:1])


def test_selection_name_validated():
    with pytest.raises(ValueError, match="selection"):
        select_neurons({0: torch.rand(10)}, 90, selection="magnitude")


def test_localization_never_runs_the_lm_head(llama, tokenizer):
    calls = []
    handle = llama.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    try:
        localize(llama, tokenizer, FORGET, last_k=2)
    finally:
        handle.remove()
    assert calls == []


def test_texts_that_carry_their_bos_get_no_second_one(tokenizer):
    """A Llama-3-style tokenizer adds BOS and its chat template renders one too: CRU's localization and router
    training tokenize such text as the evaluation does (lm-eval's tok_encode: no BOS added to text that starts
    with it), and as the baselines' encode_qa_ids does, so they gate the tokens that are scored."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from cru_harness.prompts import encode_qa_ids, encode_text, qa_texts

    bos_adding = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(tokenizer.backend_tokenizer),
                                         bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    bos = bos_adding.bos_token_id
    bos_adding.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", bos)])
    bos_adding.chat_template = "{{ bos_token }}" + TINY_CHAT_TEMPLATE
    assert bos_adding("x")["input_ids"][0] == bos   # it does add BOS to plain text
    chat = qa_texts(bos_adding, "Who is Zorbo 1?", "A painter.")
    assert chat.chat and chat.text.startswith("<|bos|>")
    (ids,) = tokenize_texts(bos_adding, [chat.text], 128)
    assert ids.count(bos) == 1 and ids[0] == bos
    trained, _ = encode_qa_ids(bos_adding, chat)
    assert ids == trained[:len(ids)] and trained[len(ids):] == [bos_adding.eos_token_id]
    (plain,) = tokenize_texts(bos_adding, ["Question: Who is Zorbo 1?\nAnswer: A painter."], 128)
    assert plain[0] == bos and plain.count(bos) == 1   # text without one gets the tokenizer's
    assert encode_text(bos_adding, chat.text, max_length=3) == ids[:3]
