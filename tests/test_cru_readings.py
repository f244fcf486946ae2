"""The readings of the CRU paper it leaves open (`cru.readings`): answer-only token scope, content-only
localization, and HF's hidden_states reading of "the output of block l", on the tiny Llama of cru_support."""
from __future__ import annotations

import pytest
import torch

from cru_harness.cru.attach import attach_bundles
from cru_harness.cru.bundle import RouterBundle
from cru_harness.cru.localize import collate, localize, pad_token_id, tokenize_texts
from cru_harness.cru.readings import content_mask, final_norm, prompt_template, scope_mask, scope_start
from cru_harness.cru.train import GateRecorder, RouterTrainingConfig, train_routers
from cru_harness.errors import InputError
from cru_harness.training.blocks import find_decoder_blocks

from cru_support import FAST, FORGET, RETAIN, llama, tokenizer  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def template(tokenizer):  # noqa: F811
    return prompt_template(tokenizer)


def _answer_start(tokenizer, text: str) -> int:
    """Position of the token ":" that ends "Answer:" (the marker's last token), found by decoding."""
    ids = tokenize_texts(tokenizer, [text], 256)[0]
    for position in range(len(ids)):
        if tokenizer.decode(ids[:position + 1]).rstrip().endswith("Answer:"):
            return position
    raise AssertionError(text)


def test_scope_starts_at_the_prompts_end_marker(tokenizer, template):  # noqa: F811
    ids = tokenize_texts(tokenizer, FORGET[:3], 256)
    for text, row in zip(FORGET, ids):
        assert scope_start(row, template.marker) == _answer_start(tokenizer, text)
    batch = collate(ids, pad_token_id(tokenizer))
    mask = scope_mask(batch.input_ids, batch.attention_mask, template.marker, require=True)
    for row, text in enumerate(FORGET[:3]):
        start, length = _answer_start(tokenizer, text), len(ids[row])
        assert mask[row, :start].sum() == 0 and mask[row, start:length].eq(1).all()
        assert mask[row, length:].sum() == 0                         # padding never in scope
    with pytest.raises(InputError, match="no answer"):               # a training row without the marker
        scope_mask(torch.tensor([[5, 6, 7]]), None, template.marker, require=True)


def test_answer_scope_gates_and_loss_only_on_answer_positions(llama, tokenizer, template):  # noqa: F811
    config = RouterTrainingConfig(**FAST, token_scope="answer")
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN, config, template=template)
    assert bundle.config.token_scope == "answer" and bundle.config.answer_marker == list(template.marker)
    ids = tokenize_texts(tokenizer, FORGET[:2], 256)
    batch = collate(ids, pad_token_id(tokenizer))
    _, blocks = find_decoder_blocks(llama)
    first = bundle.block_indices[0]
    seen: dict = {}
    hook = blocks[first].register_forward_hook(lambda _m, _a, out: seen.__setitem__("h", out[0] if isinstance(
        out, tuple) else out))
    try:
        with torch.no_grad():
            base = llama(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            with attach_bundles(llama, [bundle]):
                gated = llama(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                gated_hidden = seen["h"]
    finally:
        hook.remove()
    for row, text in enumerate(FORGET[:2]):
        start = _answer_start(tokenizer, text)
        # before the answer scope nothing is gated: the logits there are the base's, bit for bit
        assert torch.equal(gated[row, :start], base[row, :start])
        assert not torch.allclose(gated[row, start:len(ids[row])], base[row, start:len(ids[row])])
    assert gated_hidden.shape[1] == batch.input_ids.shape[1]
    # the loss's statistics read the answer scope only: the recorder's count is scope positions x coordinates
    recorder = GateRecorder()
    from cru_harness.cru.train import gate_means

    with attach_bundles(llama, [bundle], observer=recorder):
        gate_means(llama, bundle, batch, recorder)
    in_scope = sum(len(ids[r]) - _answer_start(tokenizer, FORGET[r]) for r in range(2))
    assert recorder.counts[first] == in_scope * len(bundle.config.neurons[first])
    # a cached generation step follows the prompt: its positions are gated as the full forward gates them
    prompt = torch.tensor([ids[0][:_answer_start(tokenizer, FORGET[0]) + 1]])
    with torch.no_grad(), attach_bundles(llama, [bundle]):
        out = llama.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=pad_token_id(tokenizer),
                             output_logits=True, return_dict_in_generate=True)
        full = llama(input_ids=out.sequences[:, :-1]).logits
    steps = torch.stack(out.logits, dim=1)[0]
    assert torch.allclose(steps, full[0, -3:], atol=1e-4)
    with torch.no_grad():
        plain = llama(input_ids=out.sequences[:, :-1]).logits
    assert not torch.allclose(steps[1:], plain[0, -2:], atol=1e-4)      # the cached steps were gated


def test_answer_scope_bundle_round_trips_and_default_manifest_is_unchanged(llama, tokenizer, template,  # noqa: F811
                                                                          tmp_path):
    default = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST))
    text = default.config.to_json()
    for name in ("token_scope", "answer_marker", "localization_tokens", "block_output"):
        assert f'"{name}"' not in text                      # a default bundle's manifest: as before the options
    scoped = train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, token_scope="answer"),
                           template=template)
    scoped.save_pretrained(tmp_path / "b")
    loaded = RouterBundle.from_pretrained(tmp_path / "b")
    assert loaded.config.token_scope == "answer" and loaded.config.answer_marker == list(template.marker)
    assert loaded.config.training["token_scope"] == "answer"
    with pytest.raises(InputError, match="template"):
        train_routers(llama, tokenizer, FORGET, RETAIN, RouterTrainingConfig(**FAST, token_scope="answer"))


def test_content_localization_excludes_template_positions(llama, tokenizer, template):  # noqa: F811
    ids = tokenize_texts(tokenizer, FORGET[:2], 256)
    mask = content_mask(ids, template, max(map(len, ids)))
    for row, text in enumerate(FORGET[:2]):
        kept = [token for token, keep in zip(ids[row], mask[row]) if keep]
        decoded = tokenizer.decode(kept)
        assert "Question" not in decoded and "Answer" not in decoded     # template words pooled out
        assert "Zorbo" in decoded and "paints" in decoded                # question and answer kept
    every = localize(llama, tokenizer, FORGET, percentile=80)
    content = localize(llama, tokenizer, FORGET, percentile=80, tokens="content", template=template)
    assert content.tokens == "content" and every.tokens == "all"
    assert any(not torch.equal(every.variances[b], content.variances[b]) for b in every.block_indices)
    # the pooled values equal a mean over the content positions only, computed by hand for one block
    from cru_harness.cru.localize import iter_batches, pooled_activations

    block = every.block_indices[-1]
    pooled, _ = pooled_activations(llama, iter_batches(tokenizer, FORGET[:2], 8, 256), [block], template=template)
    _, blocks = find_decoder_blocks(llama)
    seen = []
    hook = blocks[block].register_forward_hook(lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple)
                                                                                else out))
    try:
        with torch.no_grad():
            llama(input_ids=torch.tensor([ids[0]]))
    finally:
        hook.remove()
    keep = mask[0, :len(ids[0])].bool()
    assert torch.allclose(pooled[block][0], seen[0][0][keep].float().mean(dim=0), atol=1e-5)
    with pytest.raises(InputError, match="template"):
        localize(llama, tokenizer, FORGET, tokens="content")


def test_hf_reading_selects_the_post_norm_tensor_for_the_last_block(llama, tokenizer):  # noqa: F811
    _, blocks = find_decoder_blocks(llama)
    last = len(blocks) - 1
    ids = torch.tensor(tokenize_texts(tokenizer, FORGET[:1], 256))
    with torch.no_grad():
        hidden = llama(input_ids=ids, output_hidden_states=True).hidden_states
    captured = {}

    from cru_harness.cru.localize import Batch, pooled_activations

    batch = Batch(ids, torch.ones_like(ids))
    for reading in ("block", "hf_hidden_states"):
        pooled, _ = pooled_activations(llama, [batch], [last - 1, last], block_output=reading)
        captured[reading] = pooled
    # HF's last entry is after the final norm; the block reading is the block's raw output
    assert torch.allclose(captured["hf_hidden_states"][last][0], hidden[-1][0].float().mean(dim=0), atol=1e-5)
    assert not torch.allclose(captured["block"][last][0], hidden[-1][0].float().mean(dim=0), atol=1e-3)
    raw = []
    hook = blocks[last].register_forward_hook(lambda _m, _a, out: raw.append(out[0] if isinstance(out, tuple)
                                                                               else out))
    try:
        with torch.no_grad():
            llama(input_ids=ids)
    finally:
        hook.remove()
    assert torch.allclose(captured["block"][last][0], raw[0][0].float().mean(dim=0), atol=1e-5)
    # entries below the last: HF's entry l is block l-1's output, the same tensor under both readings
    assert torch.equal(captured["block"][last - 1], captured["hf_hidden_states"][last - 1])
    assert torch.allclose(captured["block"][last - 1][0], hidden[last][0].float().mean(dim=0), atol=1e-5)
    # blocks=[...] under the HF reading names hidden_states entries 1..L
    loc = localize(llama, tokenizer, FORGET, blocks=[len(blocks)], percentile=80, block_output="hf_hidden_states")
    assert loc.block_indices == [last] and loc.block_output == "hf_hidden_states"
    with pytest.raises(InputError, match="entries 1"):
        localize(llama, tokenizer, FORGET, blocks=[0], block_output="hf_hidden_states")


def test_hf_reading_gates_the_final_norm_output(llama, tokenizer, tmp_path):  # noqa: F811
    config = RouterTrainingConfig(**FAST, block_output="hf_hidden_states")
    bundle = train_routers(llama, tokenizer, FORGET, RETAIN, config)
    assert bundle.config.block_output == "hf_hidden_states"
    bundle.save_pretrained(tmp_path / "b")
    bundle = RouterBundle.from_pretrained(tmp_path / "b")
    norm = final_norm(llama)
    ids = torch.tensor(tokenize_texts(tokenizer, FORGET[:1], 256))
    seen = []
    hook = norm.register_forward_hook(lambda _m, _a, out: seen.append(out))   # registered first: sees ungated
    try:
        with torch.no_grad(), attach_bundles(llama, [bundle]):
            gated = llama(input_ids=ids).logits
    finally:
        hook.remove()
    _, blocks = find_decoder_blocks(llama)
    last = len(blocks) - 1
    neurons = bundle.neuron_indices(last)
    router = bundle.router(last)
    with torch.no_grad():
        expected_hidden = seen[0].clone()
        expected_hidden[..., neurons] = seen[0][..., neurons] * router(seen[0]).to(seen[0].dtype)
        expected = llama.get_output_embeddings()(expected_hidden)
    assert torch.allclose(gated, expected, atol=1e-5)   # the router reads and gates the post-norm tensor


def test_options_are_validated_and_refused_together_with_mlp():
    with pytest.raises(InputError, match="token_scope"):
        RouterTrainingConfig(token_scope="question")
    with pytest.raises(InputError, match="localization_tokens"):
        RouterTrainingConfig(localization_tokens="none")
    with pytest.raises(InputError, match="block_output"):
        RouterTrainingConfig(block_output="hidden")
    with pytest.raises(InputError, match="gate_site"):
        RouterTrainingConfig(block_output="hf_hidden_states", gate_site="mlp")
