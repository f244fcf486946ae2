"""The one prompt builder: protocol presets, and the prompt / scored text of every question-answer pair.

Training data (baselines `baselines.data.encode_qa`, CRU corpora `data.corpora.load_corpus(..., tokenizer=)`,
fine-tuning) and the TOFU evaluation tasks all go through `qa_texts`, so a method trains on exactly the text it
is evaluated on. References (read, not copied; file:line at the commits in docs/protocol.md):

- `tofu: open-unlearning` (default): locuslab/open-unlearning `src/data/utils.py:17-140`
  (`preprocess_chat_instance`). Chat models: system prompt "You are a helpful assistant." and, for templates that
  read one, the date 10 Apr 2025 (`configs/model/Llama-3.2-1B-Instruct.yaml:7-15`); the scored tokens are the
  whole conversation's tokens after the prompt's token count, plus EOS when the conversation does not already end
  with it (`utils.py:61-124`). Models without a chat template: `Question: {q}\\nAnswer:` and the answer after one
  space, scored the same way.
  `tofu_model_family` names one of open-unlearning's model configs that set `apply_chat_template: False`
  (`configs/model/Llama-2-7b-chat-hf.yaml`, ...): its `template_args` tags, verbatim (`utils.py:72-111`).
- `tofu: legacy`: locuslab/tofu `config/model_config.yaml` (per model family), `data_module.py:8-32` (span:
  the tokens of `question_start + q + question_end + answer_tag + a` after those of the question part, plus one
  EOS), `evaluate_util.py:304-332` (generation prompt; `max_length` 200 in total, `config/eval_everything.yaml:
  24-30`, first 300 items `ds_size: 300`). The scored text is cut at the same 200 tokens (`get_dataloader` passes
  `generation.max_length` to `TextDatasetQA`; `data_module.py:15-27`: a cut text gets no EOS).
- Scoring: open-unlearning adds 1e-10 to the truth ratio's and the Real Authors / World Facts probability's
  denominators, TOFU adds nothing (`tofu_epsilon`, `cru_harness.metrics.tofu`).
- `rwku: reference` (default): jinzhuoran/RWKU `LLaMA-Factory/src/llmtuner/eval/eval_*.py` (no system turn; see
  benchmarks/rwku/tasks/utils.py). Its question probes' prompts (`rwku_probe_prompt`) are built here: the RWKU tasks ask with
  them, and an RWKU cell's question-answer training rows (`qa_texts(..., benchmark="rwku")`) are written with them,
  the answer after the probe's `Answer:`. RWKU itself trains only on passages, so those rows have no reference.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from cru_harness.protocol import PINNED_DATE, SYSTEM_PROMPT, pinned_clock, template_date

from .errors import InputError, UserError

__all__ = [
    "TOFU_PRESETS", "DEFAULT_TOFU_PRESET", "RWKU_PRESETS", "DEFAULT_RWKU_PRESET", "PresetError",
    "check_tofu_preset", "check_rwku_preset", "LegacyFormat", "LEGACY_FORMATS", "legacy_format", "TagFormat",
    "OPEN_UNLEARNING_FORMATS", "tofu_format", "format_refuses_chat_message", "format_refuses_system_message",
    "with_system_instruction",
    "LEGACY_MAX_LENGTH", "LEGACY_DS_SIZE", "tofu_epsilon", "OPEN_UNLEARNING_SYSTEM_PROMPT", "OPEN_UNLEARNING_DATE", "RWKU_DATE",
    "PLAIN_PROMPT", "plain_prompt", "tofu_messages", "render_chat", "QATexts", "qa_texts", "uses_chat", "writes_chat",
    "encode_qa_ids", "encode_text", "adds_special_tokens", "PROMPT_FORMATS", "add_prompt_format_argument",
    "prompt_format_choice", "TRAINING_RECORDS", "ATTACK_RECORD", "recorded_prompt_format", "recorded_choice", "BENCHMARKS", "RWKU_FB_INSTRUCTION", "RWKU_QA_INSTRUCTION", "RWKU_ANSWER_PREFIX",
    "RWKU_QUESTION_PROBES", "RWKU_INSTRUCTION_PROBE", "rwku_probe_prompt", "rwku_plain_prompt", "rwku_qa_texts", "check_benchmark",
]

TOFU_PRESETS = ("open-unlearning", "legacy")
DEFAULT_TOFU_PRESET = "open-unlearning"
RWKU_PRESETS = ("reference",)
DEFAULT_RWKU_PRESET = "reference"

#: open-unlearning `configs/model/*-Instruct.yaml` `template_args.system_prompt` (every chat model it configures).
OPEN_UNLEARNING_SYSTEM_PROMPT = SYSTEM_PROMPT   # defined once, in cru_harness.protocol (stdlib only)
#: open-unlearning `configs/model/Llama-3.2-1B-Instruct.yaml:15` `date_string: 10 Apr 2025`.
OPEN_UNLEARNING_DATE = _dt.datetime(2025, 4, 10)
#: RWKU passes no date; Llama 3.1's template then falls back to 26 Jul 2024 (the project pins the same).
RWKU_DATE = PINNED_DATE

#: The plain prompt of models without a chat template (open-unlearning `configs/model/Llama-2-7b-hf.yaml:8-12`
#: has "Question: {q}\n" + "Answer: "; the answer tag's trailing space goes with the answer here, see docs).
PLAIN_PROMPT = "Question: {question}\nAnswer:"

#: RWKU's question probes (`eval_forget.py`, `eval_neighbor.py`): an instruction line, then `Question: {query}`; the
#: answer is opened with `Answer:` (glued after the chat template's generation prompt).
RWKU_FB_INSTRUCTION = "Please complete the blank in the following question.\n"
RWKU_QA_INSTRUCTION = "Please briefly answer the following question.\n"
RWKU_ANSWER_PREFIX = "Answer:"
RWKU_QUESTION_PROBES = ("fb", "qa", "aa", "neighbor_fb", "neighbor_qa")
#: RWKU's own training corpora (LLaMA-Factory's pair / reject files): the prompt is the user turn as it is, with no
#: instruction line and no answer prefix (LLaMA-Factory's template around `prompt` / `instruction`).
RWKU_INSTRUCTION_PROBE = "instruction"
#: The benchmarks whose question format `qa_texts` writes (the benchmark a runner cell evaluates).
BENCHMARKS = ("tofu", "rwku")

# TOFU config/eval_everything.yaml:24-26 `generation.max_length`: prompt + generation, and the scored text's cut
LEGACY_MAX_LENGTH = 200
LEGACY_DS_SIZE = 300     # TOFU config/eval_everything.yaml:30 `ds_size`


class PresetError(UserError, ValueError):
    """An unknown preset name, or a TOFU model family the preset has no format for."""


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
    from .metrics.tofu import OPEN_UNLEARNING_EPSILON   # lazy: prompts stays light for training code

    return OPEN_UNLEARNING_EPSILON if check_tofu_preset(preset) == "open-unlearning" else 0.0


def check_rwku_preset(name: str | None) -> str:
    name = DEFAULT_RWKU_PRESET if name in (None, "") else str(name)
    if name not in RWKU_PRESETS:
        raise PresetError(f"unknown RWKU preset {name!r}; valid: {', '.join(RWKU_PRESETS)}")
    return name


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


def plain_prompt(question: str) -> str:
    return PLAIN_PROMPT.format(question=question)


def with_system_instruction(prompt: str, system_instruction: str | None) -> str:
    """A prompt for a model without a chat template, with an explicit `--system_instruction` first and a blank
    line after it (no reference writes one there; the TOFU and RWKU tasks warn)."""
    return system_instruction + "\n\n" + prompt if system_instruction else prompt


def tofu_messages(question: str, answer: str | None = None, system_prompt: str | None = OPEN_UNLEARNING_SYSTEM_PROMPT
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


def rwku_probe_prompt(probe: str, query: str, aa_type: str = "") -> tuple[str, str]:
    """`(user message, answer prefix)` of an RWKU question probe (`eval_forget.py`, `eval_neighbor.py`); the prefix
    opens the assistant turn ("" for none). `aa_type`: the adversarial-attack row's `type`."""
    if probe in ("fb", "neighbor_fb"):
        return f"{RWKU_FB_INSTRUCTION}Question: {query}\n", RWKU_ANSWER_PREFIX
    if probe == "aa" and aa_type == "affirmative suffix":
        # the query ends with the start of an affirmative answer: no newline, no "Answer:"
        return f"{RWKU_QA_INSTRUCTION}Question: {query}", ""
    if probe == "aa" and aa_type == "incontext learning":   # the query holds its own "Question: ..." examples
        return f"{RWKU_QA_INSTRUCTION}{query}\n", RWKU_ANSWER_PREFIX
    if probe in ("qa", "neighbor_qa", "aa"):
        return f"{RWKU_QA_INSTRUCTION}Question: {query}\n", RWKU_ANSWER_PREFIX
    if probe == RWKU_INSTRUCTION_PROBE:
        return query, ""
    raise InputError(f"unknown RWKU question probe {probe!r}; valid: "
                     f"{', '.join((*RWKU_QUESTION_PROBES, RWKU_INSTRUCTION_PROBE))}")


def rwku_plain_prompt(user: str, prefix: str, system_instruction: str | None = None) -> str:
    """An RWKU prompt for a model without a chat template (RWKU always renders one, so the project's own layout):
    the user text, then the answer prefix on its own line."""
    text = user
    if prefix:
        text += ("" if text[-1:] in ("\n", " ") else "\n") + prefix
    return with_system_instruction(text, system_instruction)


PROMPT_FORMATS = {"auto": None, "chat": True, "plain": False}  # the `chat` argument each CLI choice means


def add_prompt_format_argument(parser, *, evaluated_with: str = "--apply_chat_template") -> None:
    """`--prompt-format auto|chat|plain|<open-unlearning family>`, the same on every command that writes
    question/answer rows (read back with `prompt_format_choice`)."""
    parser.add_argument("--prompt-format", choices=(*PROMPT_FORMATS, *OPEN_UNLEARNING_FORMATS), default="auto",
                        help="how question/answer rows are written (cru_harness.prompts), as the evaluation will "
                             "show them. auto: the format the model learned (its training record; plain for a zoo: "
                             "model), else the chat template when the tokenizer has one (evaluate with "
                             f"{evaluated_with}); plain: Question:/Answer:; a model config name "
                             f"({', '.join(OPEN_UNLEARNING_FORMATS)}): open-unlearning's tags for that model "
                             "(evaluate with --metadata '{\"tofu_model_family\": NAME}') (default: auto)")


def prompt_format_choice(choice: str, benchmark: str = "tofu") -> dict:
    """`{"chat": ..., "family": ...}` for `qa_texts` from a `--prompt-format` value (open-unlearning preset), with
    `"benchmark"` when it is RWKU (whose probes have no per-model format)."""
    if check_benchmark(benchmark) == "rwku":
        if choice not in PROMPT_FORMATS:
            raise PresetError(f"--prompt-format {choice} names a TOFU model config; RWKU's question rows take "
                              f"{', '.join(PROMPT_FORMATS)}")
        return {"chat": PROMPT_FORMATS[choice], "benchmark": "rwku"}
    if choice in PROMPT_FORMATS:
        return {"chat": PROMPT_FORMATS[choice], "family": None}
    tofu_format(DEFAULT_TOFU_PRESET, choice)   # an unknown name fails naming the valid ones
    return {"chat": False, "family": choice}


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


def recorded_choice(label: str, benchmark: str = "tofu") -> dict | None:
    """`prompt_format_choice`'s dict for a recorded `prompt_format` label, or None for one it cannot take (a legacy
    preset's family). RWKU's probes have no per-model tags: a model trained on a TOFU model config's tags is prompted
    plain there."""
    if label in PROMPT_FORMATS:
        return prompt_format_choice(label, benchmark)
    if label not in OPEN_UNLEARNING_FORMATS:
        return None
    return prompt_format_choice("plain" if check_benchmark(benchmark) == "rwku" else label, benchmark)


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


def check_benchmark(benchmark: str) -> str:
    """`benchmark` if this module writes its question format (`BENCHMARKS`) or a registered plugin does
    (`Benchmark.qa_texts`); an unknown name is an `InputError` naming the valid ones."""
    if benchmark in BENCHMARKS:
        return benchmark
    from . import plugins

    if benchmark not in plugins.benchmarks:
        valid = ", ".join(dict.fromkeys([*BENCHMARKS, *plugins.benchmarks.names()]))
        raise InputError(f"unknown benchmark {benchmark!r} for question-answer rows; valid: {valid}")
    return benchmark


def writes_chat(tokenizer, *, preset: str = DEFAULT_TOFU_PRESET, family: str | None = None,
                chat: bool | None = None, benchmark: str = "tofu") -> bool:
    """Whether `qa_texts` writes through the chat template: never under a fixed TOFU format (legacy, or an
    open-unlearning family), where `chat=True` is an error; otherwise as `uses_chat`."""
    if check_benchmark(benchmark) not in BENCHMARKS[:1]:   # the fixed formats are TOFU's presets'
        return uses_chat(tokenizer, chat)
    preset = check_tofu_preset(preset)
    if tofu_format(preset, family) is not None:
        if chat:
            raise PresetError(format_refuses_chat_message(preset, family))
        return False
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


def qa_texts(tokenizer, question: str, answer: str, *, preset: str = DEFAULT_TOFU_PRESET,
             family: str | None = None, chat: bool | None = None, benchmark: str = "tofu", probe: str | None = None,
             aa_type: str = "") -> QATexts:
    """The prompt and full text of one question-answer pair as `benchmark`'s evaluation asks it: under a TOFU
    preset (see the module docstring), or as the RWKU question `probe` (default `qa`) asks it (`rwku_qa_texts`).
    `probe`, `aa_type`: a row's RWKU probe (`data.corpora.row_prompt`); TOFU has one question format."""
    if check_benchmark(benchmark) == "rwku":
        if family not in (None, "") or check_tofu_preset(preset) != DEFAULT_TOFU_PRESET:
            raise PresetError("a TOFU preset or model family does not apply to RWKU's question rows")
        return rwku_qa_texts(tokenizer, question, answer, probe=probe or "qa", aa_type=aa_type, chat=chat)
    if benchmark not in BENCHMARKS:   # a plugin's own question format (`Benchmark.qa_texts`), else the generic one
        from . import plugins

        extra = {key: value for key, value in (("probe", probe), ("aa_type", aa_type)) if value}
        written = plugins.benchmarks.get(benchmark).qa_texts(tokenizer, question, answer, chat=chat, **extra)
        if written is not None:
            return written
        preset, family = DEFAULT_TOFU_PRESET, None
    if writes_chat(tokenizer, preset=preset, family=family, chat=chat):
        prompt = render_chat(tokenizer, tofu_messages(question), add_generation_prompt=True)
        text = render_chat(tokenizer, tofu_messages(question, answer), add_generation_prompt=False)
        return QATexts(prompt, text, prompt, False, True)
    fmt = tofu_format(preset, family)
    if fmt is not None:
        return QATexts(fmt.question_text(question), fmt.text(question, answer), fmt.generation_prompt(question),
                       True, False)
    prompt = plain_prompt(question)
    return QATexts(prompt, f"{prompt} {answer}", prompt, True, False)


def rwku_qa_texts(tokenizer, question: str, answer: str, *, probe: str = "qa", aa_type: str = "",
                  chat: bool | None = None) -> QATexts:
    """One question-answer pair as the RWKU task asks `probe` (`rwku_probe_prompt`; no system turn, RWKU's date,
    the answer prefix as the open assistant turn) with the answer after the prefix and one space, then the
    template's end of turn; without a chat template, `rwku_plain_prompt` and the answer after one space. Both are
    tokenized as the evaluation encodes a context (`adds_special_tokens`)."""
    user, prefix = rwku_probe_prompt(probe, question, aa_type)
    if uses_chat(tokenizer, chat):
        turn = [{"role": "user", "content": user}]
        reply = f"{prefix} {answer}" if prefix else answer
        opening = [{"role": "assistant", "content": prefix}] if prefix else []   # lm-eval's gen_prefix rendering
        prompt = render_chat(tokenizer, [*turn, *opening], add_generation_prompt=not prefix,
                             continue_final_message=bool(prefix), date=RWKU_DATE)
        text = render_chat(tokenizer, [*turn, {"role": "assistant", "content": reply}], add_generation_prompt=False,
                           date=RWKU_DATE)
        return QATexts(prompt, text, prompt, adds_special_tokens(tokenizer, text), True)
    prompt = rwku_plain_prompt(user, prefix)
    text = f"{prompt} {answer}"
    return QATexts(prompt, text, prompt, adds_special_tokens(tokenizer, text), False)


def encode_qa_ids(tokenizer, texts: QATexts, max_length: int | None = None) -> tuple[list[int], int]:
    """`(input_ids, n_prompt)`: the ids of `texts.text` (+ EOS when missing), the first `n_prompt` being prompt.

    open-unlearning `src/data/utils.py:99-124` / TOFU `data_module.py:13-30`: tokenize the whole text once and mask
    the first `len(tokenize(prompt))` positions, so the answer's first token is tokenized as in context.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InputError("the tokenizer has no EOS token; TOFU scores and trains on the answer + EOS")
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
