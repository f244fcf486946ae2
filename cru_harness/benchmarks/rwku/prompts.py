"""RWKU's prompts: its question probes as `eval_*.py` asks them (jinzhuoran/RWKU
`LLaMA-Factory/src/llmtuner/eval/eval_*.py`, no system turn; see benchmarks/rwku/tasks/utils.py). The RWKU tasks ask
with `rwku_probe_prompt`, and an RWKU cell's question-answer training rows (`prompts.qa_texts(...,
benchmark="rwku")`, the RWKU plugin's `qa_texts`) are written with them, the answer after the probe's `Answer:`.
RWKU itself trains only on passages, so those rows have no reference."""
from __future__ import annotations

from ...errors import InputError
from ...prompts import PresetError, QATexts, adds_special_tokens, render_chat, uses_chat, with_system_instruction
from ...protocol import PINNED_DATE

RWKU_PRESETS = ("reference",)
DEFAULT_RWKU_PRESET = "reference"

#: RWKU passes no date; Llama 3.1's template then falls back to 26 Jul 2024 (the project pins the same).
RWKU_DATE = PINNED_DATE

#: RWKU's question probes (`eval_forget.py`, `eval_neighbor.py`): an instruction line, then `Question: {query}`; the
#: answer is opened with `Answer:` (glued after the chat template's generation prompt).
RWKU_FB_INSTRUCTION = "Please complete the blank in the following question.\n"
RWKU_QA_INSTRUCTION = "Please briefly answer the following question.\n"
RWKU_ANSWER_PREFIX = "Answer:"
RWKU_QUESTION_PROBES = ("fb", "qa", "aa", "neighbor_fb", "neighbor_qa")
#: RWKU's own training corpora (LLaMA-Factory's pair / reject files): the prompt is the user turn as it is, with no
#: instruction line and no answer prefix (LLaMA-Factory's template around `prompt` / `instruction`).
RWKU_INSTRUCTION_PROBE = "instruction"


def check_rwku_preset(name: str | None) -> str:
    name = DEFAULT_RWKU_PRESET if name in (None, "") else str(name)
    if name not in RWKU_PRESETS:
        raise PresetError(f"unknown RWKU preset {name!r}; valid: {', '.join(RWKU_PRESETS)}")
    return name


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
