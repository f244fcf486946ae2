"""TOFU's prompt presets (docs/protocol.md "TOFU"): `open-unlearning` (the default, also the project's generic
question format: `cru_harness.prompts`) and `legacy` (locuslab/tofu), open-unlearning's fixed tags for model configs
without a chat template, and how a TOFU question-answer pair is written under them (`tofu_qa_texts`, the TOFU
plugin's `qa_texts`). References (read, not copied; file:line at the commits in docs/protocol.md):

- `tofu: open-unlearning` (default): locuslab/open-unlearning `src/data/utils.py:17-140`
  (`preprocess_chat_instance`); see `cru_harness.prompts` for the chat and plain writers it shares.
  `tofu_model_family` names one of open-unlearning's model configs that set `apply_chat_template: False`
  (`configs/model/Llama-2-7b-chat-hf.yaml`, ...): its `template_args` tags, verbatim (`utils.py:72-111`).
- `tofu: legacy`: locuslab/tofu `config/model_config.yaml` (per model family), `data_module.py:8-32` (span:
  the tokens of `question_start + q + question_end + answer_tag + a` after those of the question part, plus one
  EOS), `evaluate_util.py:304-332` (generation prompt; `max_length` 200 in total, `config/eval_everything.yaml:
  24-30`, first 300 items `ds_size: 300`). The scored text is cut at the same 200 tokens (`get_dataloader` passes
  `generation.max_length` to `TextDatasetQA`; `data_module.py:15-27`: a cut text gets no EOS).
- Scoring: open-unlearning adds 1e-10 to the truth ratio's and the Real Authors / World Facts probability's
  denominators, TOFU adds nothing (`tofu_epsilon`, `cru_harness.metrics.tofu`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...prompts import DEFAULT_PRESET, PresetError, QATexts, plain_prompt, qa_messages, render_chat, uses_chat

TOFU_PRESETS = (DEFAULT_PRESET, "legacy")
DEFAULT_TOFU_PRESET = DEFAULT_PRESET

# TOFU config/eval_everything.yaml:24-26 `generation.max_length`: prompt + generation, and the scored text's cut
LEGACY_MAX_LENGTH = 200
LEGACY_DS_SIZE = 300     # TOFU config/eval_everything.yaml:30 `ds_size`


def check_tofu_preset(name: str | None) -> str:
    name = DEFAULT_TOFU_PRESET if name in (None, "") else str(name)
    if name not in TOFU_PRESETS:
        raise PresetError(f"unknown TOFU preset {name!r}; valid: {', '.join(TOFU_PRESETS)}")
    return name


def tofu_preset_refusal(preset: str | None, task: str) -> str | None:
    """Why a TOFU preset cannot score `task` (an lm-eval task name), or None: the privacy tasks are
    open-unlearning's metrics, and the in_context variant's pairs would be cut by legacy's 200-token limit. The one
    rule both the tasks (`benchmarks/tofu/tasks/utils.py`) and the runner's config check apply."""
    preset = check_tofu_preset(preset)
    if task.startswith("tofu_privacy") and preset != "open-unlearning":
        return (f"the TOFU privacy tasks are open-unlearning's metrics (TOFU's own code has none): run them with "
                f"tofu_preset=open-unlearning, not {preset}")
    if task.endswith("_in_context") and preset == "legacy":
        return ("the in_context variant puts question-answer pairs before each question; the legacy preset cuts the "
                "text at 200 tokens: run it with tofu_preset=open-unlearning")
    return None


def tofu_epsilon(preset: str | None) -> float:
    """What a TOFU preset's reference adds to the truth ratio's and the multiple-choice probability's denominators:
    open-unlearning's 1e-10 (`src/evals/metrics/memorization.py`), TOFU's nothing."""
    from ...metrics.tofu import OPEN_UNLEARNING_EPSILON   # lazy: the prompts stay light for training code

    return OPEN_UNLEARNING_EPSILON if check_tofu_preset(preset) == "open-unlearning" else 0.0


@dataclass(frozen=True)
class LegacyFormat:
    """One family of TOFU's `config/model_config.yaml`. `generation_prompt` is what `evaluate_util.py:306-312`
    feeds `generate`: the decoded text up to `split_symbol`, which Llama-2 keeps and the others drop."""

    question_start: str
    question_end: str
    answer_tag: str
    split_symbol: str
    keep_split_symbol: bool

    def question_text(self, question: str) -> str:
        return self.question_start + question + self.question_end

    def text(self, question: str, answer: str) -> str:
        return self.question_text(question) + self.answer_tag + answer

    def generation_prompt(self, question: str) -> str:
        full = self.question_text(question) + self.answer_tag
        head = full.split(self.split_symbol)[0]
        return head + self.split_symbol if self.keep_split_symbol else head


_QA_FORMAT = dict(question_start="Question: ", question_end="\n", answer_tag="Answer: ", split_symbol="Answer: ",
                  keep_split_symbol=False)
LEGACY_FORMATS: dict[str, LegacyFormat] = {
    # TOFU config/model_config.yaml:1-8 and evaluate_util.py:307-312
    "llama2-7b": LegacyFormat("[INST] ", " [/INST]", "", " [/INST]", True),
    "phi": LegacyFormat(**_QA_FORMAT),         # model_config.yaml:9-16
    "stablelm": LegacyFormat(**_QA_FORMAT),    # model_config.yaml:17-24
    "pythia-1.4": LegacyFormat(**_QA_FORMAT),  # model_config.yaml:25-31
}


def legacy_format(family: str | None) -> LegacyFormat:
    if family not in LEGACY_FORMATS:
        raise PresetError(
            f"the TOFU legacy preset has no format for model family {family!r}; valid: {', '.join(LEGACY_FORMATS)} "
            f"(set tofu_model_family, or use tofu_preset=open-unlearning)"
        )
    return LEGACY_FORMATS[family]


@dataclass(frozen=True)
class TagFormat:
    """open-unlearning's `template_args` for a model it runs without a chat template (`src/data/utils.py:72-111`):
    the prompt is `user_start + q + user_end + asst_start`, the answer follows it directly, and the scored span
    is the answer's tokens after the prompt's. Same methods as `LegacyFormat`, so one code path serves both."""

    user_start: str
    user_end: str
    asst_start: str

    def question_text(self, question: str) -> str:   # what the scored span starts after
        return self.user_start + question + self.user_end + self.asst_start

    def text(self, question: str, answer: str) -> str:
        return self.question_text(question) + answer

    def generation_prompt(self, question: str) -> str:   # `predict_with_generate`: the prompt's ids (utils.py:119-120)
        return self.question_text(question)


_OU_QA_TAGS = TagFormat("Question: ", "\n", "Answer: ")
#: open-unlearning's model configs with `apply_chat_template: False`, by file name (`configs/model/<name>.yaml`).
#: Their tags are used verbatim, the trailing space of `Answer: ` included (unlike `PLAIN_PROMPT`, see docs).
OPEN_UNLEARNING_FORMATS: dict[str, TagFormat] = {
    "Llama-2-7b-chat-hf": TagFormat("[INST] ", " [/INST]", ""),   # Llama-2-7b-chat-hf.yaml:7-14
    "Llama-2-7b-hf": _OU_QA_TAGS,                                # Llama-2-7b-hf.yaml:7-12
    "Llama-2-13b-hf": _OU_QA_TAGS,                               # Llama-2-13b-hf.yaml:7-12
    "phi-1_5": _OU_QA_TAGS,                                      # phi-1_5.yaml:5-10
}


def tofu_format(preset: str | None, family: str | None) -> LegacyFormat | TagFormat | None:
    """The fixed text format a TOFU preset and model family prescribe, or None where the prompt is the chat
    template or the plain prompt (open-unlearning without a family). The one place that checks a family: an unknown
    one fails naming the valid ones."""
    preset = check_tofu_preset(preset)
    if preset == "legacy":
        return legacy_format(family)
    if family in (None, ""):
        return None
    if family not in OPEN_UNLEARNING_FORMATS:
        raise PresetError(
            f"the TOFU open-unlearning preset has no format for model family {family!r}; valid: "
            f"{', '.join(OPEN_UNLEARNING_FORMATS)} (open-unlearning's model configs without a chat template; leave "
            f"tofu_model_family unset for a model whose chat template open-unlearning applies)"
        )
    return OPEN_UNLEARNING_FORMATS[family]


def format_refuses_chat_message(preset: str, family: str | None) -> str:
    """The one line that says a fixed format and `--apply_chat_template` do not go together."""
    what = ("TOFU's own per-family formats" if check_tofu_preset(preset) == "legacy"
            else f"open-unlearning's own format for {family}")
    return f"tofu_preset={preset} with tofu_model_family={family} writes {what}: run it without --apply_chat_template"


def format_refuses_system_message(preset: str, family: str | None) -> str:
    """The one line that says a fixed format has no place for `--system_instruction`."""
    return (f"tofu_preset={preset} with tofu_model_family={family} writes a fixed format without a system prompt: "
            f"run it without --system_instruction")


def tofu_writes_chat(tokenizer, *, preset: str | None = DEFAULT_TOFU_PRESET, family: str | None = None,
                     chat: bool | None = None) -> bool:
    """Whether a TOFU pair is written through the chat template: never under a fixed format (legacy, or an
    open-unlearning family), where `chat=True` is an error; otherwise as `prompts.uses_chat`."""
    preset = check_tofu_preset(preset)
    if tofu_format(preset, family) is not None:
        if chat:
            raise PresetError(format_refuses_chat_message(preset, family))
        return False
    return uses_chat(tokenizer, chat)


def tofu_qa_texts(tokenizer, question: str, answer: str, *, preset: str | None = DEFAULT_TOFU_PRESET,
                  family: str | None = None, chat: bool | None = None) -> QATexts:
    """One question-answer pair under a TOFU preset (see the module docstring): the chat template (open-unlearning's
    system prompt and date), a fixed format's tags, or the plain prompt."""
    if tofu_writes_chat(tokenizer, preset=preset, family=family, chat=chat):
        prompt = render_chat(tokenizer, qa_messages(question), add_generation_prompt=True)
        text = render_chat(tokenizer, qa_messages(question, answer), add_generation_prompt=False)
        return QATexts(prompt, text, prompt, False, True)
    fmt = tofu_format(preset, family)
    if fmt is not None:
        return QATexts(fmt.question_text(question), fmt.text(question, answer), fmt.generation_prompt(question),
                       True, False)
    prompt = plain_prompt(question)
    return QATexts(prompt, f"{prompt} {answer}", prompt, True, False)
