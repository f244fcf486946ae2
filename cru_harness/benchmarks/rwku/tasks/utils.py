"""RWKU for lm-eval: data loading, prompts, per-item scoring and per-target aggregation.

Loaded by lm-eval from the task YAMLs (`!function utils.…`) *by file path*, and importable as
`cru_harness.benchmarks.rwku.tasks.utils` (e.g. by `cru-harness score` for `per_target_results` / `per_item_records`);
so this module uses absolute imports only.

Prompts follow RWKU's evaluation code (jinzhuoran/RWKU, `LLaMA-Factory/src/llmtuner/eval/eval_*.py`) under the
`rwku: reference` preset (the only one; `--metadata '{"rwku_preset": "reference"}'`, recorded in each task
config's metadata): the user message alone (no system turn), RWKU's stop tokens (no newline stop: its
`convert_tokens_to_ids("\n")` is the unknown token on byte-level / SentencePiece vocabularies), its BBH scorer,
its MIA token alignment. The project's own variants are separately named: `rwku_newline_stop: true` (metadata)
adds a newline stop, BBH's `exact_match_target` scores against the whole target. Every deviation is listed in
benchmarks/rwku/tasks/README.md and docs/protocol.md.

Every per-item metric value is a small dict carrying the target index (`{"target": 7, "value": 0.25, ...}`):
the task's aggregate is the mean over targets of the per-target scores (RWKU evaluates one target at a
time and averages), and `per_target_results(samples)` recovers the per-target numbers from logged samples.
"""
from __future__ import annotations

import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import datasets
import numpy as np
from lm_eval.api.task import ConfigurableTask

from cru_harness.benchmarks.rwku.data import ICU_INSTRUCTION, MissingTargetFileError, get_target, load_target_file, parse_targets
from cru_harness.benchmarks.rwku.data import PROBE_KINDS as QUESTION_KIND_PROBES
from cru_harness.errors import InputError
from cru_harness.lmeval.metadata import check_metadata_keys, metadata_count, metadata_flag
from cru_harness.protocol import JOINT_MARKER, template_date
from cru_harness.lmeval.dataset import QuietCustomDataset
from cru_harness.lmeval.request_cache import UncachedRequests
from cru_harness.benchmarks.rwku.prompts import (RWKU_ANSWER_PREFIX, RWKU_DATE, RWKU_QUESTION_PROBES,
                                                 check_rwku_preset, rwku_plain_prompt, rwku_probe_prompt)

log = logging.getLogger(__name__)

ENV_TARGETS = "CRU_HARNESS_RWKU_TARGETS"
NOANSWER = "NOANSWER"
MIA_K = 0.2  # the k of Min-K% / Min-K%++ that RWKU reports
CHOICE_LETTERS = ("A", "B", "C", "D")

# probe -> the RWKU files (kinds of `load_target_file`) whose rows it scores
PROBE_KINDS: dict[str, tuple[str, ...]] = {
    **{probe: (kind,) for kind, probe in QUESTION_KIND_PROBES.items()},   # fb, qa, aa, neighbor_fb, neighbor_qa
    "mia": ("forget_mia", "retain_mia"),
    "mmlu": ("retain_mmlu",),
    "bbh": ("retain_bbh",),
    "truthfulqa": ("truthful",),
    "triviaqa": ("triviaqa",),
    "fluency": ("fluency",),
}
UTILITY_PROBES = ("mmlu", "bbh", "truthfulqa", "triviaqa", "fluency")

# ----------------------------------------------------------------------------------------------------------------
# Prompt texts (RWKU's evaluation code). The question probes' are in `cru_harness.prompts` (`rwku_probe_prompt`),
# which an RWKU cell's question-answer training rows share.
MMLU_HEADER = "The following are multiple choice questions (with answers) about {subject}.\n\n"
MMLU_BRIDGE = "Please following the previous examples and answer the given question.\n"
BBH_BRIDGE = "\n\nFollowing previous examples, answer the following questions and end with 'so the answer is'\nQ: "
TRIVIAQA_FEWSHOT = (
    "\nQ: When did men's figure skating become a summer Olympic sport?\nA: 1908\n"
    "Q: When did the all india workers and peasants party came in to existence?\nA: November 1925\n"
    "Q: Flight that went down in the hudson river?\nA: US Airways Flight 1549\n"
    "Q: Where are most of the world's earthquakes located?\nA: Rim of Fire\n"
    "Q: Csi when do grissom and sara reunite?\nA: series finale\n"
    "Please briefly answer the following question:\n"
)
# TruthfulQA's standard "QA" primer (RWKU's `presets.QA_PRIMER`, preset 'qa').
TRUTHFULQA_PRIMER = (
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain."
)


def icu_instruction(subject: str) -> str:
    """RWKU's in-context-unlearning instruction for `subject` (ends with a newline)."""
    return ICU_INSTRUCTION.format(subject=subject)


# ----------------------------------------------------------------------------------------------------------------
# Target selection and loading (lm-eval `custom_dataset`)

def resolve_target_spec(rwku_targets=None) -> tuple[list[int], str]:
    """Selected target indices and where the choice came from ("metadata", "env", "default")."""
    if rwku_targets not in (None, ""):
        return parse_targets(rwku_targets), "metadata"
    env = os.environ.get(ENV_TARGETS, "").strip()
    if env:
        try:
            return parse_targets(env), "env"
        except ValueError as err:
            raise InputError(f"{ENV_TARGETS}={env!r}: {err}") from None
    return parse_targets(None), "default"


def _base(target, kind: str) -> dict:
    return {"target": target.index, "target_name": target.name, "kind": kind}


def _rows_for(probe: str, target, kind: str, rows: list[dict]) -> list[dict]:
    """Flatten RWKU rows to one fixed schema per probe (Arrow needs identical keys)."""
    out = []
    for row in rows:
        doc = _base(target, kind)
        doc["subject"] = str(row.get("subject") or target.name)
        if probe in ("fb", "qa", "aa", "neighbor_fb", "neighbor_qa"):
            doc.update(level=str(row.get("level", "")), type=str(row.get("type", "")), query=str(row["query"]),
                       answer=str(row["answer"]), neighbor=str(row.get("neighbor", "")))
        elif probe == "mia":
            doc.update(member=kind == "forget_mia", text=str(row["text"]))
        elif probe == "mmlu":
            doc.update(task=str(row["task"]), question=str(row["question"]),
                       choices=[str(c) for c in row["choices"]], answer=int(row["answer"]),
                       examples=[{"question": str(e["question"]), "choices": [str(c) for c in e["choices"]],
                                  "answer": int(e["answer"])} for e in row["examples"]])
        elif probe == "bbh":
            doc.update(task=str(row["task"]), cot=str(row["cot"]), question=str(row["question"]),
                       answer=str(row["answer"]))
        elif probe == "truthfulqa":
            mc1 = row["mc1_targets"]
            doc.update(question=str(row["question"]), mc1_choices=[str(c) for c in mc1["choices"]],
                       mc1_labels=[int(x) for x in mc1["labels"]])
        elif probe == "triviaqa":
            doc.update(question=str(row["question"]), answers=[str(a) for a in row["answers"]])
        elif probe == "fluency":
            doc.update(instruction=str(row["instruction"]))
        out.append(doc)
    return out


def load_rows(probe: str, rwku_targets=None, data_dir=None, rwku_items_per_target=None,
              rwku_utility_missing: str = "skip") -> list[dict]:
    """The raw (unformatted) docs of one probe for the selected targets, target after target."""
    if probe not in PROBE_KINDS:
        raise ValueError(f"unknown RWKU probe {probe!r}; valid: {', '.join(PROBE_KINDS)}")
    indices, origin = resolve_target_spec(rwku_targets)
    if probe in UTILITY_PROBES:
        indices = _utility_targets(probe, indices, origin, data_dir, rwku_utility_missing)
    per_target = metadata_count(rwku_items_per_target, "rwku_items_per_target")
    docs: list[dict] = []
    for index in indices:
        target = get_target(index, data_dir)
        for kind in PROBE_KINDS[probe]:
            rows = load_target_file(target, kind, data_dir)
            if per_target is not None:
                rows = rows[:per_target]
            docs.extend(_rows_for(probe, target, kind, rows))
    if not docs:
        raise InputError(f"RWKU probe {probe!r}: the selected targets {indices} yield no items")
    return docs


def _utility_targets(probe: str, indices: list[int], origin: str, data_dir, missing: str) -> list[int]:
    kind = PROBE_KINDS[probe][0]
    available = []
    for index in indices:
        try:
            load_target_file(index, kind, data_dir)
            available.append(index)
        except MissingTargetFileError:   # only "no such set for this target"; unreadable data is an error
            pass
    lacking = [i for i in indices if i not in available]
    if not available:   # the user's selection of targets: one line (InputError), not a traceback
        raise InputError(
            f"RWKU utility set {kind!r} ({probe}): this copy has it for none of the selected targets "
            f"{_compact(indices)} (from {origin}; the shared copy has it for targets 1-10 only). Select targets that "
            f"have it, e.g. "
            f"--metadata '{{\"rwku_targets\": \"1-10\"}}'."
        )
    if lacking:
        message = (f"RWKU utility set {kind!r} ({probe}): this copy has none for targets {_compact(lacking)} "
                   f"(the shared copy has it for targets 1-10 only)")
        if missing == "error":
            raise InputError(message + " (rwku_utility_missing=error)")
        if missing != "skip":
            raise InputError(f"rwku_utility_missing must be 'skip' or 'error', not {missing!r}")
        log.warning("%s; scoring %s on targets %s only.", message, probe, _compact(available))
    return available


def _compact(indices: Sequence[int]) -> str:
    return ",".join(str(i) for i in indices)


def load_docs(rwku_probe: str, rwku_targets=None, data_dir=None, rwku_items_per_target=None,
              rwku_utility_missing: str = "skip", **metadata) -> datasets.DatasetDict:
    """lm-eval `custom_dataset`: called with the task's metadata (`--metadata` JSON, TaskManager(metadata=…),
    and with `simple_evaluate(task_manager=None)` also the model args) plus `dataset_kwargs` (`rwku_probe`).
    Other keys (version, model args, TOFU's keys, ...) are ignored, but a misspelt `tofu_`/`rwku_` key is refused
    (`check_metadata_keys`): `rwku_target` would leave the default targets in force."""
    check_metadata_keys(metadata)
    docs = load_rows(rwku_probe, rwku_targets, data_dir, rwku_items_per_target, rwku_utility_missing)
    for doc in docs:
        doc["probe"] = rwku_probe
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ----------------------------------------------------------------------------------------------------------------
# Prompts (`process_docs`)

def _choices_block(question: str, choices: Sequence[str]) -> str:
    text = "Question: " + question
    for letter, choice in zip(CHOICE_LETTERS, choices):
        text += f"\n{letter}. {choice}"
    return text


def format_doc(doc: Mapping) -> dict:
    """`prompt` (the user message), `gen_prefix` (opens the answer; "" for none) and `scored_text` (MIA)."""
    probe = doc["probe"]
    scored_text = ""
    if probe in RWKU_QUESTION_PROBES:
        prompt, gen_prefix = rwku_probe_prompt(probe, doc["query"], doc["type"])
    elif probe == "mia":
        prompt, gen_prefix, scored_text = "", "", doc["text"]  # raw text, no template (eval_mia.py:16-21)
    elif probe == "mmlu":
        shots = "".join(_choices_block(e["question"], e["choices"]) + f"\nAnswer: {CHOICE_LETTERS[e['answer']]}\n\n"
                        for e in doc["examples"])
        prompt = (MMLU_HEADER.format(subject=doc["task"].replace("_", " ")) + shots + MMLU_BRIDGE
                  + _choices_block(doc["question"], doc["choices"]))
        gen_prefix = RWKU_ANSWER_PREFIX
    elif probe == "bbh":
        prompt, gen_prefix = doc["cot"].strip() + BBH_BRIDGE + doc["question"], "A:"
    elif probe == "truthfulqa":
        prompt, gen_prefix = TRUTHFULQA_PRIMER + "\n\nQ: " + doc["question"], "A:"
    elif probe == "triviaqa":
        prompt, gen_prefix = TRIVIAQA_FEWSHOT + f"Q: {doc['question']}\n", "A:"
    elif probe == "fluency":
        prompt, gen_prefix = f"Instruction: {doc['instruction']}\n", ""
    else:
        raise ValueError(f"unknown RWKU probe {probe!r}")
    return {"prompt": prompt, "gen_prefix": gen_prefix, "scored_text": scored_text, "icu": False}


def format_doc_icu(doc: Mapping) -> dict:
    """ICU baseline: RWKU's instruction before the whole prompt (MIA: before the scored text, as RWKU does)."""
    out = format_doc(doc)
    prefix = icu_instruction(doc["subject"])
    if doc["probe"] == "mia":
        out["scored_text"] = prefix + out["scored_text"]
    else:
        out["prompt"] = prefix + out["prompt"]
    out["icu"] = True
    return out


def process_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    return dataset.map(format_doc)


def process_docs_icu(dataset: datasets.Dataset) -> datasets.Dataset:
    return dataset.map(format_doc_icu)


def plain_prompt(doc: Mapping, system_instruction: str | None = None) -> str:
    """The prompt for a model without a chat template: user text, then the answer prefix on its own line."""
    return rwku_plain_prompt(doc["prompt"], doc["gen_prefix"], system_instruction)


NEWLINE_STOP_PROBES = ("fb", "qa", "aa", "neighbor_fb", "neighbor_qa", "triviaqa")


class RWKUTask(QuietCustomDataset, UncachedRequests, ConfigurableTask):
    """ConfigurableTask with RWKU's own prompt layout.

    Chat template: the user message alone (RWKU sends no system turn; an explicit `--system_instruction` is still
    honoured, with a warning), then `gen_prefix` as the start of the assistant turn, rendered with
    `continue_final_message`: RWKU's `apply_chat_template(...) + "Answer:"`. The date is RWKU_DATE.
    Without one: `plain_prompt` (lm-eval would join "…\\nD. x" and "Answer:" with a space).
    MIA: no prompt; the text is scored with `JOINT_MARKER` (every token after the first, eval_mia.py:21-42).
    """

    def __init__(self, config: dict | None = None) -> None:
        # lm-eval's `class:` route hands the whole YAML (its own `class` key included) to the constructor
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        metadata = dict(config.get("metadata") or {})
        metadata["rwku_preset"] = check_rwku_preset(metadata.get("rwku_preset"))  # recorded in the results
        probe = (config.get("dataset_kwargs") or {}).get("rwku_probe")
        if metadata_flag(metadata.get("rwku_newline_stop"), "rwku_newline_stop") and probe in NEWLINE_STOP_PROBES:
            generation = dict(config.get("generation_kwargs") or {})
            generation["until"] = list(generation.get("until") or []) + ["\n"]
            config["generation_kwargs"] = generation
        config["metadata"] = metadata
        super().__init__(config=config)

    def fewshot_context(self, doc, num_fewshot, system_instruction=None, apply_chat_template=False,
                        fewshot_as_multiturn=False, chat_template=None, gen_prefix=None):
        if doc.get("probe") == "mia":
            return ""
        if system_instruction and not getattr(self, "_warned_system", False):
            self._warned_system = True
            log.warning("RWKU's reference sends no system turn; using the given system instruction anyway: the "
                        "numbers are not the reference preset's.")
        if apply_chat_template and chat_template is not None:
            with template_date(RWKU_DATE):
                return super().fewshot_context(doc, num_fewshot, system_instruction=system_instruction,
                                               apply_chat_template=apply_chat_template,
                                               fewshot_as_multiturn=fewshot_as_multiturn,
                                               chat_template=chat_template, gen_prefix=gen_prefix)
        return plain_prompt(doc, system_instruction)


def mia_target(doc: Mapping) -> str:
    """The MIA continuation: the raw text under RWKU's alignment (`JOINT_MARKER` with an empty context)."""
    return JOINT_MARKER + doc["scored_text"]


# ----------------------------------------------------------------------------------------------------------------
# Per-item scoring (`process_results`)

def clean_answer(text: str) -> str:
    """RWKU: strip; an empty answer counts as NOANSWER."""
    text = (text or "").strip()
    return text if text else NOANSWER


def _item(doc: Mapping, value: float, **extra) -> dict:
    return {"target": int(doc["target"]), "value": float(value), **extra}


def process_results_probe(doc: Mapping, results: Sequence[str]) -> dict:
    """Forget / neighbour probes: RWKU's ROUGE-L recall, plus the answer's fluency entropy (failure analysis).

    The answer (stripped, NOANSWER if empty) and the reference ride along in the `rouge_l_recall` item, so the
    original-model NLL and the failure class can be computed after the run from the logged samples.
    """
    from cru_harness.metrics import fluency_entropy, rouge_l_recall_rwku

    answer = clean_answer(results[0])
    return {
        "rouge_l_recall": _item(doc, rouge_l_recall_rwku(answer, doc["answer"]), answer=answer,
                                reference=doc["answer"]),
        "fluency_entropy": _item(doc, fluency_entropy(answer)),
    }


_warned_plain = False


def _warn_plain_once() -> None:
    global _warned_plain
    if not _warned_plain:
        _warned_plain = True
        log.warning(
            "RWKU MIA needs per-token log-probabilities (LOSS per token, Zlib, Min-K%%, Min-K%%++), which the "
            "model did not return (a plain float, e.g. from --model hf). These metrics are NaN; run with "
            "--model cru (same arguments as hf) to get them."
        )


MIA_SCORES = ("loss", "zlib", "mink", "minkpp")


def mia_scores(result, text: str) -> dict[str, float]:
    """RWKU's MIA scores of one text (higher = more member-like); NaN without per-token statistics."""
    from cru_harness.protocol import has_token_stats
    from cru_harness.metrics import loss_score, min_k, min_k_plus_plus, zlib_score

    if not has_token_stats(result) or result.n_tokens == 0:
        _warn_plain_once()
        return dict.fromkeys(MIA_SCORES, math.nan)
    loss = loss_score(result.token_logprobs)
    return {
        "loss": loss,
        "zlib": zlib_score(text, loss),
        "mink": min_k(result.token_logprobs, MIA_K),
        "minkpp": min_k_plus_plus(result.token_logprobs, result.token_mu, result.token_sigma, MIA_K),
    }


def process_results_mia(doc: Mapping, results: Sequence) -> dict:
    """Every doc reports every key (same item); `fm_*`/`rm_*` aggregate FM / RM items, `auc_*` both."""
    scores = mia_scores(results[0], doc["scored_text"])
    out = {}
    for name, value in scores.items():
        item = _item(doc, value, member=bool(doc["member"]))
        for prefix in ("fm", "rm", "auc"):
            out[f"{prefix}_{name}"] = item
    return out


def _logprobs(results: Sequence) -> list[float]:
    return [float(r[0]) for r in results]


def process_results_mmlu(doc: Mapping, results: Sequence) -> dict:
    """Answer letter = the highest next-token log-prob among " A".." D" (RWKU's candidate-token argmax)."""
    pred = int(np.argmax(_logprobs(results)))
    return {"acc": _item(doc, float(pred == int(doc["answer"])), prediction=CHOICE_LETTERS[pred])}


def process_results_truthfulqa(doc: Mapping, results: Sequence) -> dict:
    """MC1: the true answer's summed log-prob beats every false one (strictly, as RWKU)."""
    lls = _logprobs(results)
    labels = list(doc["mc1_labels"])
    true_idx = labels.index(1)
    best_false = max(ll for ll, label in zip(lls, labels) if label != 1)
    return {"mc1": _item(doc, float(lls[true_idx] > best_false))}


def process_results_bbh(doc: Mapping, results: Sequence[str]) -> dict:
    """RWKU's extraction (after "the answer is", up to the next period). `exact_match`: RWKU's scorer as its code
    computes it (over the target's characters, eval_bbh.py:95-109,158); `exact_match_target`: the project's
    exact match against the whole target after the same normalisation."""
    from cru_harness.metrics import exact_match, exact_match_rwku_bbh, extract_bbh_answer

    prediction = extract_bbh_answer(results[0])
    return {"exact_match": _item(doc, exact_match_rwku_bbh(prediction, doc["answer"]), prediction=prediction),
            "exact_match_target": _item(doc, exact_match(prediction, doc["answer"]), prediction=prediction)}


def process_results_triviaqa(doc: Mapping, results: Sequence[str]) -> dict:
    from cru_harness.metrics import token_f1

    prediction = results[0]
    f1 = token_f1(prediction, list(doc["answers"]))
    return {"f1": _item(doc, f1, prediction=prediction.strip())}


def process_results_fluency(doc: Mapping, results: Sequence[str]) -> dict:
    from cru_harness.metrics import fluency_entropy

    return {"fluency_entropy": _item(doc, fluency_entropy(results[0]))}


# ----------------------------------------------------------------------------------------------------------------
# Aggregation: mean over targets of the per-target score

def _by_target(items: Iterable[Mapping]) -> dict[int, list[Mapping]]:
    groups: dict[int, list[Mapping]] = defaultdict(list)
    for item in items:
        groups[int(item["target"])].append(item)
    return groups


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


_warned_one_sided = False   # once per process


def _auc(items: Sequence[Mapping]) -> float:
    global _warned_one_sided
    from cru_harness.metrics import mia_auc

    members = [i["value"] for i in items if i["member"]]
    nonmembers = [i["value"] for i in items if not i["member"]]
    if (not members or not nonmembers) and items and not _warned_one_sided:
        _warned_one_sided = True
        log.warning(f"rwku_mia: target {items[0]['target']} has {len(members)} forget (member) and {len(nonmembers)} "
                    f"retain (non-member) items scored, so its AUC is NaN; lm-eval's --limit keeps the first items "
                    f"(members first): --metadata '{{\"rwku_items_per_target\": N}}' keeps N of each instead")
    if not members or not nonmembers or any(math.isnan(v) for v in members + nonmembers):
        return math.nan
    return float(mia_auc(members, nonmembers))


# per-target statistic of each metric (items of one target in, one number out)
def target_mean(items: Sequence[Mapping]) -> float:
    return _mean([i["value"] for i in items])


def target_member_mean(items: Sequence[Mapping]) -> float:
    return _mean([i["value"] for i in items if i["member"]])


def target_nonmember_mean(items: Sequence[Mapping]) -> float:
    return _mean([i["value"] for i in items if not i["member"]])


def target_auc(items: Sequence[Mapping]) -> float:
    return _auc(items)


def _macro(per_target) -> callable:
    def aggregate(items: Sequence[Mapping]) -> float:
        return _mean([per_target(group) for group in _by_target(items).values()])

    aggregate.__name__ = f"macro_{per_target.__name__}"
    return aggregate


# lm-eval `aggregation:` functions
macro_mean = _macro(target_mean)
macro_member_mean = _macro(target_member_mean)
macro_nonmember_mean = _macro(target_nonmember_mean)
macro_auc = _macro(target_auc)


def per_target_statistic(metric: str):
    """The per-target statistic behind a metric name (mean unless it is an MIA set mean or AUC)."""
    if metric.startswith("fm_"):
        return target_member_mean
    if metric.startswith("rm_"):
        return target_nonmember_mean
    if metric.startswith("auc_"):
        return target_auc
    return target_mean


def _is_item(value) -> bool:
    return isinstance(value, Mapping) and "target" in value and "value" in value


def per_target_results(samples) -> dict:
    """Per-target scores from lm-eval's logged samples.

    `samples`: one task's list of sample dicts (`results["samples"][task]`, or the rows of a `--log_samples`
    JSONL), or a mapping task -> that list. Returns `{target_index: {"target_name", "n", metric: value}}`, or
    for a mapping `{task: {...}}`. Metric values are the same statistics as the task aggregate, restricted to
    one target; the task aggregate is their mean over targets.
    """
    if isinstance(samples, Mapping):
        return {task: per_target_results(rows) for task, rows in samples.items()}
    items: dict[str, list[Mapping]] = defaultdict(list)
    names: dict[int, str] = {}
    counts: Counter = Counter()
    for sample in samples:
        doc = sample.get("doc") or {}
        found = False
        for key, value in sample.items():
            if _is_item(value):
                items[key].append(value)
                found = True
                if "target_name" in doc:
                    names[int(value["target"])] = doc["target_name"]
        if found:
            counts[_first_target(sample)] += 1
    out: dict[int, dict] = {}
    for metric, metric_items in items.items():
        stat = per_target_statistic(metric)
        for target, group in sorted(_by_target(metric_items).items()):
            row = out.setdefault(target, {"target_name": names.get(target, ""), "n": counts[target]})
            row[metric] = stat(group)
    return dict(sorted(out.items()))


def _first_target(sample: Mapping) -> int:
    for value in sample.values():
        if _is_item(value):
            return int(value["target"])
    raise ValueError("sample has no RWKU item")


def per_item_records(samples, task: str | None = None) -> list[dict]:
    """One flat record per logged sample: target, doc fields (query/answer/type/...), answer and item metrics."""
    if isinstance(samples, Mapping):
        return [rec for name, rows in samples.items() for rec in per_item_records(rows, name)]
    records = []
    keep = ("target", "target_name", "subject", "probe", "kind", "level", "type", "query", "answer", "neighbor",
            "member", "question", "icu")
    for sample in samples:
        doc = sample.get("doc") or {}
        record = {"task": task, "doc_id": sample.get("doc_id")}
        record.update({k: doc[k] for k in keep if k in doc})
        if "answer" in record:
            record["reference"] = record.pop("answer")
        for key, value in sample.items():
            if _is_item(value):
                record[key] = value["value"]
                for extra in ("answer", "prediction"):
                    if extra in value:
                        record[extra] = value[extra]
        records.append(record)
    return records
