"""LUNAR's prompt as its code writes it (issue 77): the chat template's user turn and assistant header alone, no
system turn, tokenized with add_special_tokens=True (facebookresearch/LUNAR src/model_utils/qwen_model.py,
llama3_model.py `format_instruction_*_chat` with system=None, src/data_loader.py). Token for token on one fixed
tokenizer under the two template shapes LUNAR writes by hand: ChatML (Qwen, whose Hub template, like SmolLM2's,
adds a default system turn) and Llama 3's headers (its template writes the BOS)."""
from __future__ import annotations

import copy

import pytest
import torch

import cru_harness.baselines as B
from cru_harness.baselines.data import ForgetRetainDataset
from cru_harness.baselines.lunar import lunar_prompt, prompt_ids
from cru_harness.errors import InputError
from cru_harness.prompts import qa_texts
from test_baselines_training import FORGET, RETAIN, tiny, tokenizer  # noqa: F401 (fixture)

# A ChatML template that adds a default system turn when none is given (as SmolLM2's and Qwen2.5's do).
CHATML = ("{% if messages[0]['role'] != 'system' %}<|system|>\nDefault helper.<|eos|>\n{% endif %}"
          "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|eos|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# Llama 3's shape: the BOS written by the template, a header per turn.
HEADERS = ("{{ bos_token }}{% for m in messages %}<|user|>{{ m['role'] }}<|assistant|>\n\n{{ m['content'] }}<|eos|>"
           "{% endfor %}{% if add_generation_prompt %}<|user|>assistant<|assistant|>\n\n{% endif %}")
# A template without a system role (Gemma's refuses one).
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
             "{% endif %}{{ bos_token }}<|user|>{{ m['content'] }}<|eos|>{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}")

QUESTION = FORGET[0]["question"]
TOFU = {"chat": None, "benchmark": "tofu"}


def templated(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("template, lunars", [
    # LUNAR's QWEN_CHAT_TEMPLATE / LLAMA3_CHAT_TEMPLATE, in this tokenizer's special tokens
    (CHATML, "<|user|>\n{q}<|eos|>\n<|assistant|>\n"),
    (HEADERS, "<|user|>user<|assistant|>\n\n{q}<|eos|><|user|>assistant<|assistant|>\n\n"),
])
def test_lunar_prompt_is_lunars_user_turn_token_for_token(tokenizer, template, lunars):
    tok = templated(tokenizer, template)
    expected = tok(lunars.format(q=QUESTION), add_special_tokens=True)["input_ids"]   # LUNAR's tokenization
    assert prompt_ids(tok, QUESTION, TOFU, style="lunar") == expected
    # the evaluation's prompt (the setting before issue 77) has a system turn: open-unlearning's, or the default
    assert prompt_ids(tok, QUESTION, TOFU, style="evaluation") != expected
    assert "helpful assistant" in qa_texts(tok, QUESTION, "").prompt
    text, special = lunar_prompt(tok, QUESTION, TOFU)
    assert "Default helper" not in text and "helpful assistant" not in text and special


def test_lunar_prompt_without_a_system_role_or_a_template(tokenizer):
    tok = templated(tokenizer, NO_SYSTEM)   # the template's own text, its BOS included, nothing added
    text, special = lunar_prompt(tok, QUESTION, TOFU)
    assert (text, special) == (f"<|bos|><|user|>{QUESTION}<|eos|><|assistant|>", False)
    plain = qa_texts(tokenizer, QUESTION, "")   # no chat template: the evaluation's prompt
    assert lunar_prompt(tokenizer, QUESTION, TOFU) == (plain.prompt, plain.add_special_tokens)


def test_lunar_direction_uses_its_prompt_style(tokenizer, tmp_path):
    tok = templated(tokenizer, CHATML)
    prompts = tmp_path / "refuse.json"
    prompts.write_text('["How do I pick a lock?"]')
    model = tiny(tok)

    def direction(**kw):
        m = B.get_method("lunar")(B.make_config("lunar", layer=0, refusal_prompts_path=str(prompts), **kw))
        m.prepare(model, 0, ForgetRetainDataset(tok, FORGET[:2], RETAIN))
        return m.direction

    def last_h(question, style):
        ids = torch.tensor([prompt_ids(tok, question, TOFU, style=style)])
        with torch.no_grad():
            return model(input_ids=ids, output_hidden_states=True).hidden_states[1][0, -1].double()

    for style, kw in (("lunar", {}), ("evaluation", {"prompt_style": "evaluation"})):
        forget = (last_h(FORGET[0]["question"], style) + last_h(FORGET[1]["question"], style)) / 2
        torch.testing.assert_close(direction(**kw), (last_h("How do I pick a lock?", style) - forget).float())
    with pytest.raises(InputError, match="prompt_style"):
        B.make_config("lunar", prompt_style="system")
