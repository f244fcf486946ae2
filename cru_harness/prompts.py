"""The one prompt builder: the prompt / scored text of every question-answer pair, through its benchmark.

Training data (baselines `baselines.data.encode_qa`, CRU corpora `data.corpora.load_corpus(..., tokenizer=)`,
fine-tuning) and the evaluation tasks all go through `qa_texts`, so a method trains on exactly the text it is
evaluated on. `qa_texts` asks the benchmark that evaluates the rows (`Benchmark.qa_texts`, found in the registry:
TOFU's presets sit in `benchmarks/tofu/prompts.py`, RWKU's probes in `benchmarks/rwku/prompts.py`); without a
benchmark, the one whose format is the default (`Benchmark.default_questions`); a benchmark without a format of its
own gets the generic one here. References (read, not copied; file:line at the commits in docs/protocol.md):

- the generic format is open-unlearning's (`DEFAULT_PRESET`): locuslab/open-unlearning `src/data/utils.py:17-140`
  (`preprocess_chat_instance`). Chat models: system prompt "You are a helpful assistant." and, for templates that
  read one, the date 10 Apr 2025 (`configs/model/Llama-3.2-1B-Instruct.yaml:7-15`); the scored tokens are the
  whole conversation's tokens after the prompt's token count, plus EOS when the conversation does not already end
  with it (`utils.py:61-124`). Models without a chat template: `Question: {q}\\nAnswer:` and the answer after one
  space, scored the same way.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from cru_harness.protocol import PINNED_DATE, SYSTEM_PROMPT, pinned_clock, template_date

from .errors import InputError, UserError

__all__ = [
    "DEFAULT_PRESET", "DEFAULT_TOFU_PRESET", "PresetError", "with_system_instruction", "OPEN_UNLEARNING_SYSTEM_PROMPT",
    "OPEN_UNLEARNING_DATE", "PINNED_DATE", "PLAIN_PROMPT", "plain_prompt", "qa_messages", "render_chat", "QATexts",
    "qa_texts", "uses_chat", "writes_chat", "encode_qa_ids", "encode_text", "adds_special_tokens", "PROMPT_FORMATS",
    "add_prompt_format_argument", "prompt_format_choice", "TRAINING_RECORDS", "ATTACK_RECORD",
    "recorded_prompt_format", "recorded_choice", "check_benchmark", "question_benchmark",
]

#: The generic question format's name: open-unlearning's (TOFU's default preset), which every benchmark without a
#: format of its own is asked in. A benchmark's presets (TOFU's `legacy`) live in its package.
DEFAULT_PRESET = "open-unlearning"
DEFAULT_TOFU_PRESET = DEFAULT_PRESET   # the name the training code's defaults import (the TOFU package's, too)

#: open-unlearning `configs/model/*-Instruct.yaml` `template_args.system_prompt` (every chat model it configures).
OPEN_UNLEARNING_SYSTEM_PROMPT = SYSTEM_PROMPT   # defined once, in cru_harness.protocol (stdlib only)
#: open-unlearning `configs/model/Llama-3.2-1B-Instruct.yaml:15` `date_string: 10 Apr 2025`.
OPEN_UNLEARNING_DATE = _dt.datetime(2025, 4, 10)

#: The plain prompt of models without a chat template (open-unlearning `configs/model/Llama-2-7b-hf.yaml:8-12`
#: has "Question: {q}\n" + "Answer: "; the answer tag's trailing space goes with the answer here, see docs).
PLAIN_PROMPT = "Question: {question}\nAnswer:"


class PresetError(UserError, ValueError):
    """An unknown preset name, or a model family a benchmark's preset has no format for."""


def plain_prompt(question: str) -> str:
    return PLAIN_PROMPT.format(question=question)


def with_system_instruction(prompt: str, system_instruction: str | None) -> str:
    """A prompt for a model without a chat template, with an explicit `--system_instruction` first and a blank
    line after it (no reference writes one there; the TOFU and RWKU tasks warn)."""
    return system_instruction + "\n\n" + prompt if system_instruction else prompt


def qa_messages(question: str, answer: str | None = None, system_prompt: str | None = OPEN_UNLEARNING_SYSTEM_PROMPT
                  ) -> list[dict[str, str]]:
    """open-unlearning's chat (`src/data/utils.py:52-58`): system (if any), user question, assistant answer."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def render_chat(tokenizer, messages: list[dict[str, str]], *, add_generation_prompt: bool,
                date: _dt.datetime | None = OPEN_UNLEARNING_DATE, continue_final_message: bool = False) -> str:
    """The template text of `messages` with `date` pinned (`date_string` and the `strftime_now` clock).
    `continue_final_message`: the last (assistant) message stays open, as lm-eval renders a `gen_prefix`."""
    with template_date(date), pinned_clock():
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message,
                                             date_string=(date or PINNED_DATE).strftime("%d %b %Y"))


PROMPT_FORMATS = {"auto": None, "chat": True, "plain": False}  # the `chat` argument each CLI choice means


def _families() -> dict[str, object]:
    """Every `--prompt-format` model config a benchmark defines (`Benchmark.prompt_families`) -> that benchmark."""
    from . import plugins

    return {name: plugin for plugin in plugins.benchmarks for name in plugin.prompt_families}


def add_prompt_format_argument(parser, *, evaluated_with: str = "--apply_chat_template") -> None:
    """`--prompt-format auto|chat|plain|<a benchmark's model config>`, the same on every command that writes
    question/answer rows (read back with `prompt_format_choice`)."""
    families = _families()
    settings = ", ".join(dict.fromkeys(plugin.prompt_family_setting for plugin in families.values()
                                       if plugin.prompt_family_setting))
    named = (f"; a model config name ({', '.join(families)}): open-unlearning's tags for that model"
             + (f" (evaluate with {settings})" if settings else "")) if families else ""
    parser.add_argument("--prompt-format", choices=(*PROMPT_FORMATS, *families), default="auto",
                        help="how question/answer rows are written (cru_harness.prompts), as the evaluation will "
                             "show them. auto: the format the model learned (its training record; plain for a zoo: "
                             "model), else the chat template when the tokenizer has one (evaluate with "
                             f"{evaluated_with}); plain: Question:/Answer:{named} (default: auto)")


def prompt_format_choice(choice: str, benchmark: str | None = None) -> dict:
    """The `qa_texts` keywords (`{"chat": ..., ...}`) of a `--prompt-format` value for `benchmark`'s rows (None:
    the default benchmark's): its own (`Benchmark.prompt_format_choice`: a model config's tags, RWKU's probes),
    else `{"chat": ..., "family": None}`."""
    plugin = question_benchmark(benchmark)
    made = plugin.prompt_format_choice(choice) if plugin is not None else None
    if made is not None:
        return made
    if choice not in PROMPT_FORMATS:
        raise PresetError(f"--prompt-format {choice}: not a format of {benchmark or 'the default benchmark'}'s "
                          f"rows; valid: {', '.join(PROMPT_FORMATS)}")
    return {"chat": PROMPT_FORMATS[choice], "family": None}


#: The records a trained model's directory holds (`cru-harness unlearn --method`, `finetune`): each names its base,
#: its method and the prompt format it trained on (`prompt_format`, a `prompt_format_label`).
TRAINING_RECORDS = ("unlearn_record.json", "finetune_record.json")
#: `cru-harness attack --out DIR`'s record: the attacked model lies in a folder of DIR and is prompted as it names.
ATTACK_RECORD = "attack_record.json"


def _read_record(path) -> dict:
    import json

    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def recorded_prompt_format(model) -> str | None:
    """The prompt format a model directory's training record names (`chat`, `plain` or an open-unlearning model
    config name), or None (a Hub id, or a directory no command of this project wrote). An attacked model is read from
    the attack record beside it."""
    from pathlib import Path

    directory = Path(str(model)).expanduser()
    if not directory.is_dir():
        return None
    for name in TRAINING_RECORDS:
        record = _read_record(directory / name)
        if isinstance(record.get("prompt_format"), str):
            return record["prompt_format"]
        if name == "finetune_record.json" and isinstance(record.get("chat_template"), bool):   # older records
            return "chat" if record["chat_template"] else (record.get("family") or "plain")
    for candidate in (directory / ATTACK_RECORD, directory.parent / ATTACK_RECORD):
        record = _read_record(candidate)
        attacked = record.get("attacked_model")
        if isinstance(record.get("prompt_format"), str) and attacked and (
                candidate.parent == directory or Path(attacked).expanduser().resolve() == directory.resolve()):
            return record["prompt_format"]
    return None


def recorded_choice(label: str, benchmark: str | None = None) -> dict | None:
    """`prompt_format_choice`'s dict for a recorded `prompt_format` label, or None for one it cannot take (a legacy
    preset's family). A model trained on a model config's tags is prompted plain by a benchmark that has no such
    tags (RWKU's probes)."""
    if label in PROMPT_FORMATS:
        return prompt_format_choice(label, benchmark)
    if label not in _families():
        return None
    plugin = question_benchmark(benchmark)
    mine = plugin is not None and label in plugin.prompt_families
    return prompt_format_choice(label if mine else "plain", benchmark)


def prompt_format_label(fmt: dict, tokenizer=None) -> str:
    """What a router bundle records of the prompts its routers trained on (manifest `training.prompt_format`):
    `chat` (the tokenizer's chat template), an open-unlearning model config name (its tags), or `plain`. `fmt` is a
    `prompt_format_choice` / runner format dict; its `chat` None (auto) is decided by `tokenizer` as training did."""
    chat = uses_chat(tokenizer, fmt.get("chat")) if tokenizer is not None else bool(fmt.get("chat"))
    if chat:
        return "chat"
    return fmt.get("family") or "plain"


def uses_chat(tokenizer, chat: bool | None = None) -> bool:
    """Whether prompts use the chat template: `chat` if given, else whether the tokenizer has one."""
    if chat is None:
        return bool(getattr(tokenizer, "chat_template", None))
    if chat and not getattr(tokenizer, "chat_template", None):
        raise InputError("chat=True but the tokenizer has no chat template")
    return bool(chat)


def question_benchmark(benchmark: str | None = None):
    """The registered benchmark whose question format `qa_texts` writes: `benchmark`, or with None the one whose
    format is the default (`Benchmark.default_questions`), or None when no plugin claims it. An unknown name is an
    `InputError` naming the valid ones."""
    from . import plugins

    if benchmark is None:
        return next((plugin for plugin in plugins.benchmarks if plugin.default_questions), None)
    if benchmark not in plugins.benchmarks:
        raise InputError(f"unknown benchmark {benchmark!r} for question-answer rows; valid: "
                         f"{', '.join(plugins.benchmarks.names())}")
    return plugins.benchmarks.get(benchmark)


def check_benchmark(benchmark: str) -> str:
    """`benchmark` if it is registered (its question format, or the generic one, writes its rows); an unknown name is
    an `InputError` naming the valid ones."""
    question_benchmark(benchmark)
    return benchmark


def writes_chat(tokenizer, *, preset: str | None = None, family: str | None = None, chat: bool | None = None,
                benchmark: str | None = None) -> bool:
    """Whether `qa_texts` writes through the chat template (never under a fixed format, where `chat=True` is an
    error; otherwise as `uses_chat`): the format's own answer, on an empty pair. A template that refuses what the
    format renders (a system turn, in Gemma's) still means the format writes through it."""
    from jinja2.exceptions import TemplateError

    try:
        return qa_texts(tokenizer, "", "", preset=preset, family=family, chat=chat, benchmark=benchmark).chat
    except TemplateError:   # only a chat template raises it
        return uses_chat(tokenizer, chat)


@dataclass(frozen=True)
class QATexts:
    """`prompt`: what the model is given; `text`: prompt + answer (+ the template's end of turn) as the reference
    tokenizes it in one piece; the scored / trained tokens are those of `text` after `len(tokenize(prompt))`,
    plus EOS when missing. `generation_prompt`: what generation starts from (differs only for legacy formats).
    `add_special_tokens`: how the reference tokenizes both (False for template text, which carries its own)."""

    prompt: str
    text: str
    generation_prompt: str
    add_special_tokens: bool
    chat: bool


def qa_texts(tokenizer, question: str, answer: str, *, preset: str | None = None, family: str | None = None,
             chat: bool | None = None, benchmark: str | None = None, probe: str | None = None,
             aa_type: str = "") -> QATexts:
    """The prompt and full text of one question-answer pair as `benchmark`'s evaluation asks it (None: the default
    benchmark, `question_benchmark`): its `Benchmark.qa_texts`, given `chat` and the keywords that are set
    (`preset` / `family`: a benchmark's preset and model config, TOFU's; `probe` / `aa_type`: the question probe a
    row carries, RWKU's, `data.corpora.row_prompt`); where it has no format of its own, the generic one (the chat
    template with open-unlearning's system prompt and date, else `Question: {q}\\nAnswer:` and the answer after a
    space)."""
    plugin = question_benchmark(benchmark)
    if plugin is not None:
        extra = {key: value for key, value in (("preset", None if preset == DEFAULT_PRESET else preset),
                                               ("family", family), ("probe", probe), ("aa_type", aa_type)) if value}
        written = plugin.qa_texts(tokenizer, question, answer, chat=chat, **extra)
        if written is not None:
            return written
    if uses_chat(tokenizer, chat):
        prompt = render_chat(tokenizer, qa_messages(question), add_generation_prompt=True)
        text = render_chat(tokenizer, qa_messages(question, answer), add_generation_prompt=False)
        return QATexts(prompt, text, prompt, False, True)
    prompt = plain_prompt(question)
    return QATexts(prompt, f"{prompt} {answer}", prompt, True, False)


def encode_qa_ids(tokenizer, texts: QATexts, max_length: int | None = None) -> tuple[list[int], int]:
    """`(input_ids, n_prompt)`: the ids of `texts.text` (+ EOS when missing), the first `n_prompt` being prompt.

    open-unlearning `src/data/utils.py:99-124` / TOFU `data_module.py:13-30`: tokenize the whole text once and mask
    the first `len(tokenize(prompt))` positions, so the answer's first token is tokenized as in context.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InputError("the tokenizer has no EOS token; the references score and train on the answer + EOS")
    special = {"add_special_tokens": texts.add_special_tokens}
    ids = list(tokenizer(texts.text, **special)["input_ids"])
    n_prompt = len(tokenizer(texts.prompt, **special)["input_ids"])
    if max_length is not None:
        ids = ids[:max_length]
    if not ids or ids[-1] != eos:
        ids.append(eos)
    return ids, n_prompt


def encode_text(tokenizer, text: str, *, max_length: int | None = None) -> list[int]:
    """The ids of a whole text (a context, a training text) as lm-eval's `hf` / `cru` models encode a context:
    with the tokenizer's special tokens (e.g. BOS), except when the text already starts with the token lm-eval
    checks for (BOS, else EOS), as chat-template text does: never a doubled BOS (lm-eval `HFLM.tok_encode`).
    `max_length` truncates on the right."""
    kwargs = {"truncation": True, "max_length": max_length} if max_length else {}
    return list(tokenizer(text, add_special_tokens=adds_special_tokens(tokenizer, text), **kwargs)["input_ids"])


def adds_special_tokens(tokenizer, text: str) -> bool:
    """Whether lm-eval's encoding of a context adds the tokenizer's special tokens: unless the text already starts
    with the token it checks for (BOS, else EOS), as chat-template text does (`encode_text`)."""
    prefix = tokenizer.bos_token if tokenizer.bos_token_id is not None else tokenizer.eos_token
    return not (prefix and text.startswith(prefix))
