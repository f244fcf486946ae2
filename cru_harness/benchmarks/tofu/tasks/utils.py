"""TOFU probes for lm-eval 0.4.13: data loading, the combined generate + log-likelihood task, aggregations.

Every TOFU task scores each item three ways (ROUGE-L recall of a greedy generation, a normalised answer
probability, a truth ratio), so one item needs one `generate_until` request *and* several `loglikelihood`
requests. lm-eval's `ConfigurableTask` issues one request type per task; `TOFUTask` (used through
`class: !function utils.TOFUTask` in `_default_template_yaml`) keeps the whole YAML config and overrides
`construct_requests` to emit one generation + the log-likelihoods for the same doc (`idx` 0, 1, 2, ...).
lm-eval runs each request type in its own batches, then hands all of a doc's responses, in `idx` order, to the
YAML's `process_results` (below), so the per-item values stay together in one `--log_samples` sample.
Prompts and scored spans come from `cru_harness.prompts` under the TOFU preset named in the run's metadata
(`--metadata '{"tofu_preset": "legacy", "tofu_model_family": "phi"}'`; default `open-unlearning`), recorded in
the task config's `metadata` of every result. Likelihood requests carry `JOINT_MARKER` (the references'
whole-text span rule, applied by `--model cru`) and `EOS_MARKER`; under the legacy preset also TOFU's 200-token cut
(`max_length_marker`). The preset also picks the scoring epsilon (`prompts.tofu_epsilon`: open-unlearning's 1e-10
in the truth ratio, the forget aggregation and the multiple-choice probability; none for TOFU).

The privacy tasks (`tofu_privacy` group, `TOFUPrivacyTask`) score open-unlearning's MIA of a split's forget rows
against its holdout rows and memorization on the forget rows, from one answer log-likelihood per item (see
`cru_harness.metrics.privacy`; GradNorm and the reference attack need the model: `cru_harness.scoring.model_scores`).

This file is loaded by lm-eval from its path (not as `cru_harness.benchmarks.tofu.tasks.utils`), so imports are absolute.
"""
from __future__ import annotations

import functools
import logging
import math
import warnings
from copy import deepcopy

import datasets
import numpy as np
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from cru_harness import metrics as M
from cru_harness.errors import InputError
from cru_harness.lmeval.metadata import check_metadata_keys
# `cru` scores a continuation ending in EOS_MARKER with the tokenizer's EOS id appended (TOFU counts EOS).
from cru_harness.protocol import EOS_MARKER, MIA_MARKER, JOINT_MARKER, has_token_stats, max_length_marker, template_date
from cru_harness.lmeval.dataset import QuietCustomDataset
from cru_harness.lmeval.request_cache import UncachedRequests
from cru_harness import prompts as P
from cru_harness.benchmarks.tofu import prompts as TP

eval_logger = logging.getLogger(__name__)

# What each probe file is scored as: the forget set ("forget"), a utility set with paraphrased answers
# ("retain"), or a utility set whose truth ratio and probability compare the answer with perturbed ones ("mc").
PROBE_KINDS = {
    "forget01_perturbed": "forget",
    "forget05_perturbed": "forget",
    "forget10_perturbed": "forget",
    "retain_perturbed": "retain",
    "real_authors_perturbed": "mc",
    "world_facts_perturbed": "mc",
}

HF_NAN_WARNING = (
    "TOFU: the model returned plain log-likelihood tuples without token counts (lm-eval's `hf` model), so "
    "the per-token normalised probability and truth ratio cannot be computed exactly: they are reported as "
    "NaN. ROUGE-L recall is unaffected. Use `--model cru` (same arguments as `hf`) for all TOFU numbers."
)
_warned_plain_results = False


# --------------------------------------------------------------------------------------------- data


def load_tofu_dataset(tofu_config: str | None = None, data_dir: str | None = None, tofu_preset: str | None = None,
                      tofu_variant: str | None = None, tofu_icl_k=None, tofu_icl_slice_fraction=None,
                      tofu_icl_slice_size=None, tofu_icl_seed=None, tofu_authors=None, tofu_authors_set=None,
                      **metadata) -> datasets.DatasetDict:
    """`custom_dataset` of every TOFU task: `{"train": rows of tofu_config}`.

    lm-eval 0.4.13 calls it as `custom_dataset(**metadata, **dataset_kwargs)`: `tofu_config` comes from the
    task's `dataset_kwargs`; `data_dir` from the run's metadata (`--metadata '{"data_dir": "..."}'` or
    `TaskManager(metadata=...)`); other metadata keys (version, model args, RWKU's keys, ...) are ignored, but a
    misspelt `tofu_`/`rwku_` key is refused (`check_metadata_keys`): it would leave a default in force. Without a
    `data_dir`, `cru_harness.benchmarks.tofu.data.load_tofu` reads CRU_HARNESS_TOFU_DIR / CRU_HARNESS_DATA_DIR, else the Hub.

    `tofu_variant` (a forget task variant's `dataset_kwargs`, docs/protocol.md "Attacks"): `paraphrase` adds
    `asked`, the row's `paraphrased_question`, which the task asks instead of `question`; `in_context` keeps the
    held-out rows only, each with `shots`, the slice's question-answer pairs put before it (`in_context_docs`).
    `question` stays the file's, so items match across cells by question.

    `tofu_authors_set` (the `tofu_authors*` tasks' `dataset_kwargs`): `forget` keeps the rows of the author window
    `tofu_authors` (metadata, `3-4`), `retain` every other row (`author_window_rows`).
    """
    from cru_harness.benchmarks.tofu.data import load_tofu

    check_metadata_keys(metadata)
    if tofu_config not in PROBE_KINDS:
        raise ValueError(
            f"TOFU task: dataset_kwargs.tofu_config must be one of {', '.join(PROBE_KINDS)}; got {tofu_config!r}"
        )
    check_variant(tofu_variant, tofu_config)
    rows = load_tofu(tofu_config, data_dir=data_dir or None)
    if tofu_authors_set is not None:
        rows = author_window_rows(rows, tofu_config, tofu_authors, tofu_authors_set)
    shots = None
    if tofu_variant == "in_context":   # drawn over the whole file, as relearn draws its slice of the forget corpus
        shots = in_context_docs(len(rows), k=tofu_icl_k, fraction=tofu_icl_slice_fraction,
                                size=tofu_icl_slice_size, seed=tofu_icl_seed)
    rows_all = rows
    if TP.check_tofu_preset(tofu_preset) == "legacy":
        rows = rows[:TP.LEGACY_DS_SIZE]  # TOFU config/eval_everything.yaml:30 (ds_size: 300)
    kind = PROBE_KINDS[tofu_config]
    needed = ("question", "answer", "perturbed_answer") + (("paraphrased_answer",) if kind != "mc" else ())
    docs = []
    for index, row in enumerate(rows):
        missing = [field for field in needed if field not in row]
        if missing:
            raise ValueError(f"TOFU {tofu_config} row {index} lacks field(s): {', '.join(missing)}")
        perturbed = row["perturbed_answer"]
        if isinstance(perturbed, str) or not perturbed:
            raise ValueError(f"TOFU {tofu_config} row {index}: perturbed_answer must be a non-empty list")
        doc = {
            "question": row["question"],
            "answer": row["answer"],
            "paraphrased_answer": row.get("paraphrased_answer", row["answer"]) if kind != "mc" else row["answer"],
            "perturbed_answer": [str(p) for p in perturbed],
        }
        if tofu_variant == "paraphrase":
            if not row.get("paraphrased_question"):
                raise ValueError(f"TOFU {tofu_config} row {index} lacks field(s): paraphrased_question")
            doc["asked"] = row["paraphrased_question"]
        if shots is not None:
            if index not in shots:
                continue   # in the slice: shown in other items' prompts, never scored
            doc["shots"] = [{"question": rows_all[i]["question"], "answer": rows_all[i]["answer"]}
                            for i in shots[index]]
        docs.append(doc)
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(docs)})


AUTHOR_WINDOW_SETS = ("forget", "retain")


def author_window_rows(rows: list, tofu_config: str, window, author_set: str) -> list:
    """The `tofu_authors` unit's rows of `retain_perturbed` (`full`'s first authors, 20 rows each, in order):
    authors A..B of the metadata `tofu_authors` (`A-B`) for `forget`, the others for `retain`."""
    from cru_harness.benchmarks.tofu.data import AUTHOR_ROWS

    if author_set not in AUTHOR_WINDOW_SETS:
        raise ValueError(f"TOFU task: dataset_kwargs.tofu_authors_set must be one of {', '.join(AUTHOR_WINDOW_SETS)}; "
                         f"got {author_set!r}")
    if tofu_config != "retain_perturbed":
        raise ValueError(f"TOFU task: tofu_authors_set reads retain_perturbed, not {tofu_config!r}")
    parts = str(window or "").split("-")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise InputError(f"--metadata tofu_authors={window!r}: expected an author window such as 3-4")
    first, last = (int(part) for part in parts)
    n_authors = len(rows) // AUTHOR_ROWS
    if not 1 <= first <= last <= n_authors:
        raise InputError(f"--metadata tofu_authors={window!r}: expected authors within 1-{n_authors} of "
                         f"{tofu_config}, the first no later than the last")
    start, stop = (first - 1) * AUTHOR_ROWS, last * AUTHOR_ROWS
    return rows[start:stop] if author_set == "forget" else rows[:start] + rows[stop:]


#: The forget-task variants of the prompt attacks: `tofu_variant` of a variant task's `dataset_kwargs`.
VARIANTS = ("paraphrase", "in_context")
#: Between in-context pairs and before the question: lm-eval's default `fewshot_delimiter`.
SHOT_DELIMITER = "\n\n"


def check_variant(variant: str | None, tofu_config: str | None) -> None:
    """A variant exists for the forget probe files only (they hold `paraphrased_question` and are what the slice
    splits)."""
    if variant is None:
        return
    if variant not in VARIANTS:
        raise ValueError(f"TOFU task: dataset_kwargs.tofu_variant must be one of {', '.join(VARIANTS)}; got "
                         f"{variant!r}")
    if PROBE_KINDS.get(tofu_config) != "forget":
        raise ValueError(f"TOFU task: the {variant} variant is for the forget files, not {tofu_config!r}")


def in_context_docs(n_items: int, *, k=None, fraction=None, size=None, seed=None) -> dict[int, list[int]]:
    """Held-out row index -> the slice row indices whose pairs go before it, from the `tofu_icl_*` metadata (unset:
    the in_context attack's defaults, seed 0). The slice is `data.slices.forget_slice`, relearn's: one seed, one
    split."""
    from cru_harness.data.slices import DEFAULT_IN_CONTEXT_K, DEFAULT_SLICE_FRACTION, forget_slice, in_context_shots

    k = DEFAULT_IN_CONTEXT_K if k in (None, "") else _metadata_int(k, "tofu_icl_k")
    seed = 0 if seed in (None, "") else _metadata_int(seed, "tofu_icl_seed")
    size = None if size in (None, "") else _metadata_int(size, "tofu_icl_slice_size")
    fraction = DEFAULT_SLICE_FRACTION if fraction in (None, "") else fraction
    if isinstance(fraction, str):
        try:
            fraction = float(fraction)
        except ValueError:
            raise InputError(f"--metadata tofu_icl_slice_fraction={fraction!r}: expected a number in (0, 1)") from None
    chosen, held_out = forget_slice(n_items, fraction=fraction, size=size, seed=seed, what="in_context")
    return in_context_shots(chosen, held_out, k, seed)


def _metadata_int(value, key: str) -> int:
    """An integer metadata value (or its digits, as a shell gives it); anything else is an `InputError`."""
    if isinstance(value, bool) or not (isinstance(value, int) or str(value).strip().lstrip("-").isdigit()):
        raise InputError(f"--metadata {key}={value!r}: expected an integer")
    return int(value)


# --------------------------------------------------------------------------------------------- scoring


def avg_nll(result) -> float:
    """Mean token NLL of a continuation (EOS included) from a `loglikelihood` result; NaN for a plain tuple.

    `--model cru` returns `LoglikelihoodResult`s carrying the per-token log-probs; `--model hf` returns plain
    `(logprob_sum, is_greedy)` tuples without a token count: NaN, with a one-time warning.
    """
    global _warned_plain_results
    if not has_token_stats(result):
        if not _warned_plain_results:
            _warned_plain_results = True
            warnings.warn(HF_NAN_WARNING, RuntimeWarning, stacklevel=2)
            eval_logger.warning(HF_NAN_WARNING)
        return math.nan
    if result.n_tokens == 0:
        raise ValueError("a TOFU answer continuation was scored on zero tokens")
    return M.avg_nll(result.token_logprobs)


def process_results(doc: dict, results: list, tofu_preset: str | None = None, *, mc: bool = False
                    ) -> dict[str, float]:
    """Per-item values of one TOFU probe (the `process_results` of every TOFU task; `TOFUTask` passes its preset,
    which picks the scoring epsilon, `prompts.tofu_epsilon`).

    `results` are, in `idx` order, the generation then the log-likelihoods of `scored_continuations`:
    answer, [paraphrased answer,] perturbed answers. The paraphrased answer is present exactly when there are
    two log-likelihoods more than perturbed answers (forget / retain probes), absent on RA / WF (one more).
    `mc`: also the multiple-choice form of a forget item (`score_item`; the paraphrase variant's).
    """
    generation, *loglikelihoods = results
    if not isinstance(generation, str):
        raise TypeError(f"TOFU: the first result must be the generation, got {type(generation).__name__}")
    extra = len(loglikelihoods) - len(doc["perturbed_answer"])
    if extra not in (1, 2):
        raise ValueError(
            f"TOFU: {len(loglikelihoods)} log-likelihood results for {len(doc['perturbed_answer'])} perturbed answers"
        )
    return score_item("mc" if extra == 1 else "paraphrase", doc, generation, loglikelihoods,
                      epsilon=TP.tofu_epsilon(tofu_preset), mc=mc)


def score_item(kind: str, doc: dict, generation: str, results: list, *, epsilon: float = 0.0,
               mc: bool = False) -> dict[str, float]:
    """The per-item values from a generation and the log-likelihood results (see `process_results`).

    `kind` is "mc" (Real Authors / World Facts: the answer against the perturbed answers) or anything else
    (the paraphrased answer against the perturbed answers). `truth_ratio` is the raw R = P_wrong / P_right;
    the task's aggregation turns it into the reported number. `nll_*` are the per-token average NLLs
    (`nll_perturbed`: their mean over the perturbed answers) so other numbers can be re-derived later.
    `epsilon`: the preset's (`prompts.tofu_epsilon`), in the truth ratio and the multiple-choice probability.
    `mc`: add `mc_probability`, the answer against the perturbed answers as Real Authors scores it
    (`p_answer / (p_answer + sum p_perturbed)`), from the same log-likelihoods.
    """
    nlls = [avg_nll(r) for r in results]
    n_perturbed = len(doc["perturbed_answer"])
    nll_answer = nlls[0]
    nll_right, nll_perturbed = (nll_answer, nlls[1:]) if kind == "mc" else (nlls[1], nlls[2:])
    if len(nll_perturbed) != n_perturbed:
        raise ValueError(f"expected {n_perturbed} perturbed-answer results, got {len(nll_perturbed)}")
    values = {"rouge_l_recall": float(M.rouge_l_recall_tofu(generation, doc["answer"]))}
    if any(math.isnan(x) for x in nlls):  # plain `hf` results: nothing normalised can be computed
        nan = math.nan
        return values | {"probability": nan, "truth_ratio": nan, "nll_answer": nan, "nll_paraphrased": nan,
                         "nll_perturbed": nan} | ({"mc_probability": nan} if mc else {})
    if kind == "mc":
        probability = M.mc_probability(nll_answer, nll_perturbed, epsilon=epsilon)
    else:
        probability = M.probability_from_avg_nll(nll_answer)
    values |= {
        "probability": float(probability),
        "truth_ratio": float(M.truth_ratio(nll_right, nll_perturbed, epsilon=epsilon)),
        "nll_answer": float(nll_answer),
        "nll_paraphrased": float(nll_right),
        "nll_perturbed": float(np.mean(nll_perturbed)),
    }
    if mc:
        values["mc_probability"] = float(M.mc_probability(nll_answer, nll_perturbed, epsilon=epsilon))
    return values


def scored_continuations(kind: str, doc: dict) -> list[str]:
    """The answers whose log-likelihood each item needs, in the order `score_item` reads them."""
    right = [doc["answer"]] if kind == "mc" else [doc["answer"], doc["paraphrased_answer"]]
    return right + list(doc["perturbed_answer"])


# --------------------------------------------------------------------------------------------- aggregation


def truth_ratio_forget_agg(items, tofu_preset: str | None = None) -> float:
    """Forget set: mean(min(R, 1/(R + epsilon))) over items, epsilon the preset's (`TOFUTask.aggregation` binds
    it); NaN if any item is NaN, i.e. a plain `hf` run."""
    ratios = np.asarray(items, dtype=float)
    if np.isnan(ratios).any():
        return math.nan
    return float(M.truth_ratio_forget(ratios, epsilon=TP.tofu_epsilon(tofu_preset)))


def truth_ratio_utility_agg(items) -> float:
    """Retain / Real Authors / World Facts: mean(max(0, 1 - R)) over items (NaN if any item is NaN)."""
    ratios = np.asarray(items, dtype=float)
    return math.nan if np.isnan(ratios).any() else float(M.truth_ratio_utility(ratios))


# --------------------------------------------------------------------------------------------- task


class TOFUTask(QuietCustomDataset, UncachedRequests, ConfigurableTask):
    """A ConfigurableTask whose items each issue a greedy generation and the answer log-likelihoods.

    `output_type` stays `generate_until` so lm-eval applies `--gen_kwargs` to the generation request. The preset
    (`tofu_preset`, `tofu_model_family` in the metadata) decides prompt, scored span, stop rule and length:

    - open-unlearning, chat template: system "You are a helpful assistant." (unless `--system_instruction`
      names another), date 10 Apr 2025; the scored text is the rendered conversation after the prompt;
    - open-unlearning, no chat template: `Question: {q}\\nAnswer:` and " " + answer (an explicit
      `--system_instruction` goes first, with a warning: `prompts.with_system_instruction`);
    - open-unlearning with `tofu_model_family` (a model config without a chat template, e.g. Llama-2-7b-chat-hf):
      its tags verbatim (`[INST] q [/INST]` + answer);
    - legacy: the family's `[INST] q [/INST]` / `Question: q\\n` formats, `max_length` 200 in total, 300 items.
    Generation stops at EOS only (open-unlearning `configs/generation/default.yaml`, TOFU `evaluate_util.py:330`).
    """

    _system: str | None = None
    _warned_system = False   # once per process
    probe_kinds = PROBE_KINDS   # the files this task class scores, and as what

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        config.pop("class", None)
        tofu_config = (config.get("dataset_kwargs") or {}).get("tofu_config")
        if tofu_config not in self.probe_kinds:
            raise ValueError(
                f"TOFU task {config.get('task')!r}: dataset_kwargs.tofu_config must be one of "
                f"{', '.join(self.probe_kinds)}; got {tofu_config!r}"
            )
        self.tofu_config = tofu_config
        self.kind = self.probe_kinds[tofu_config]
        self.variant = (config.get("dataset_kwargs") or {}).get("tofu_variant")
        check_variant(self.variant, tofu_config)
        metadata = dict(config.get("metadata") or {})
        self.preset = TP.check_tofu_preset(metadata.get("tofu_preset"))
        self.family = metadata.get("tofu_model_family") or None
        # a fixed text format (legacy, or an open-unlearning family); an unknown family fails here
        self.format = TP.tofu_format(self.preset, self.family)
        if self.variant and (refusal := TP.tofu_preset_refusal(self.preset, f"tofu_{self.variant}")):
            raise P.PresetError(refusal)
        metadata["tofu_preset"] = self.preset  # recorded in the results' task config
        config["metadata"] = metadata
        generation = dict(config.get("generation_kwargs") or {})
        if self.preset == "legacy":
            generation["max_length"] = TP.LEGACY_MAX_LENGTH
            generation["max_gen_toks"] = TP.LEGACY_MAX_LENGTH
        if config.get("output_type", "generate_until") == "generate_until":   # not the privacy tasks
            config["generation_kwargs"] = generation
        super().__init__(config=config)

    def process_results(self, doc: dict, results: list) -> dict[str, float]:
        return process_results(doc, results, tofu_preset=self.preset, mc=self.variant == "paraphrase")

    @staticmethod
    def asked(doc: dict) -> str:
        """The question the prompt asks: the row's own, or its paraphrase (the paraphrase variant's `asked`)."""
        return doc.get("asked") or doc["question"]

    def shot_text(self, doc: dict) -> str:
        """The in_context variant's slice pairs before the question (no chat template), each written as the
        preset writes a scored question and answer, joined by lm-eval's few-shot delimiter; "" without `shots`."""
        texts = [self.format.text(shot["question"], shot["answer"]) if self.format is not None
                 else P.plain_prompt(shot["question"]) + " " + shot["answer"] for shot in doc.get("shots") or []]
        return "".join(text + SHOT_DELIMITER for text in texts)

    def messages(self, doc: dict, answer: str | None = None) -> list[dict[str, str]]:
        """The chat of one item: the system prompt, each slice pair as a user and an assistant turn (the
        in_context variant), the question asked, and the answer when given."""
        messages = P.qa_messages(self.asked(doc), answer, system_prompt=self._system)
        at = 1 if self._system else 0
        turns = [turn for shot in doc.get("shots") or [] for turn in
                 ({"role": "user", "content": shot["question"]}, {"role": "assistant", "content": shot["answer"]})]
        return messages[:at] + turns + messages[at:]

    def aggregation(self) -> dict:
        """The YAML's aggregations, the forget truth ratio's with the preset's epsilon. lm-eval loads this file
        once per `!function`, so the YAML's function is recognised by name, not identity."""
        aggregations = dict(super().aggregation())
        forget = aggregations.get("truth_ratio")
        if getattr(forget, "__name__", None) == truth_ratio_forget_agg.__name__:
            aggregations["truth_ratio"] = functools.partial(truth_ratio_forget_agg, tofu_preset=self.preset)
        return aggregations

    def fewshot_context(self, doc, num_fewshot, system_instruction=None, apply_chat_template=False,
                        chat_template=None, **kwargs):
        if self.format is not None:
            if apply_chat_template:
                raise P.PresetError(TP.format_refuses_chat_message(self.preset, self.family))
            if system_instruction:
                raise P.PresetError(TP.format_refuses_system_message(self.preset, self.family))
            return self.shot_text(doc) + self.format.generation_prompt(self.asked(doc))
        if apply_chat_template and chat_template is not None:
            # lm-eval calls fewshot_context right before construct_requests for the same doc: the scored
            # conversation reuses this system prompt.
            self._system = P.OPEN_UNLEARNING_SYSTEM_PROMPT if system_instruction is None else system_instruction
            with template_date(P.OPEN_UNLEARNING_DATE):
                return chat_template(self.messages(doc))
        if system_instruction and not TOFUTask._warned_system:
            TOFUTask._warned_system = True
            eval_logger.warning("TOFU's references write no system prompt without a chat template; putting the "
                                "given system instruction first anyway: the numbers are not the preset's.")
        return P.with_system_instruction(self.shot_text(doc) + P.plain_prompt(self.asked(doc)), system_instruction)

    def continuation_text(self, ctx: str, doc: dict, answer: str, chat_template=None) -> str:
        """What follows `ctx` in the text the reference tokenizes as a whole (see `cru_harness.prompts`)."""
        if self.format is not None:
            # the span starts after the question part's tokens (tofu data_module.py:13,30; open-unlearning
            # utils.py:106-116); ctx ends with the question part
            asked = self.asked(doc)
            return self.format.text(asked, answer)[len(self.format.question_text(asked)):]
        if chat_template is None:
            return " " + answer
        messages = self.messages(doc, answer)
        try:
            with template_date(P.OPEN_UNLEARNING_DATE):
                full = chat_template(messages, add_generation_prompt=False, close_final_turn=True)
        except TypeError:  # a model other than `cru` (e.g. `hf`): its likelihood numbers are NaN anyway
            return answer
        if not full.startswith(ctx):
            raise ValueError("TOFU: the chat template renders the finished conversation with a different prefix "
                             "than the prompt; the scored span cannot be located")
        return full[len(ctx):]

    def construct_requests(self, doc: dict, ctx: str, **kwargs) -> list[Instance]:
        chat_template = _pop_chat_template(kwargs)
        generation_kwargs = deepcopy(self.config.generation_kwargs)
        requests = [
            Instance(request_type="generate_until", doc=doc, arguments=(ctx, generation_kwargs), idx=0, **kwargs)
        ]
        return requests + self.likelihood_requests(doc, ctx, scored_continuations(self.kind, doc), chat_template,
                                                   start=1, **kwargs)

    def likelihood_requests(self, doc: dict, ctx: str, answers: list[str], chat_template, *, start: int,
                            marker: str = "", **kwargs) -> list[Instance]:
        """One `loglikelihood` request per answer (`idx` from `start`): the answer scored as the preset's
        reference scores it (`JOINT_MARKER`, `EOS_MARKER`; legacy: the 200-token cut)."""
        likelihood_ctx = ctx
        if self.format is not None:
            likelihood_ctx = self.shot_text(doc) + self.format.question_text(self.asked(doc))
        # legacy: the scored text is cut at 200 tokens (tofu evaluate_util.py:99-126 -> data_module.py:15-27)
        cut = max_length_marker(TP.LEGACY_MAX_LENGTH) if self.preset == "legacy" else ""
        requests = []
        for i, answer in enumerate(answers, start=start):
            cont = self.continuation_text(likelihood_ctx, doc, answer, chat_template)
            requests.append(
                Instance(request_type="loglikelihood", doc=doc,
                         arguments=(likelihood_ctx, f"{marker}{JOINT_MARKER}{cut}{cont}{EOS_MARKER}"), idx=i,
                         **kwargs)
            )
        return requests


def _pop_chat_template(kwargs: dict):
    """lm-eval's chat-template renderer from `construct_requests`' kwargs (None without --apply_chat_template);
    both keys are removed, as `Instance` does not take them."""
    apply_chat_template = kwargs.pop("apply_chat_template", False)
    chat_template = kwargs.pop("chat_template", None)
    return chat_template if apply_chat_template else None


# --------------------------------------------------------------------------------------------- privacy

# open-unlearning's TOFU MIA data (configs/eval/tofu_metrics/mia_*.yaml, data TOFU_MIA): the split's
# `forgetXX_perturbed` rows against `holdoutXX`, question + answer, the answer scored.
PRIVACY_HOLDOUT = {"forget01_perturbed": "holdout01", "forget05_perturbed": "holdout05",
                   "forget10_perturbed": "holdout10"}
PRIVACY_SETS = ("forget", "holdout")   # labels 0 and 1 (open-unlearning mia/utils.py:mia_auc)
PRIVACY_ATTACKS = ("mia_loss", "mia_zlib", "mia_min_k", "mia_min_k_plus_plus", "mia_gradnorm", "mia_reference")
PRIVACY_MEMORIZATION = ("exact_memorization", "extraction_strength")


def _check_privacy_preset(tofu_preset: str | None) -> str:
    if refusal := TP.tofu_preset_refusal(tofu_preset, "tofu_privacy"):
        raise P.PresetError(refusal)
    return TP.check_tofu_preset(tofu_preset)


def load_tofu_privacy_dataset(tofu_config: str | None = None, data_dir: str | None = None,
                              tofu_preset: str | None = None, **metadata) -> datasets.DatasetDict:
    """`custom_dataset` of the privacy tasks: the split's forget rows (`set: forget`) and its holdout rows
    (`set: holdout`), each `{question, answer, set}`, alternating (so `--limit` keeps both sets; the AUC does not
    depend on the order)."""
    from cru_harness.benchmarks.tofu.data import load_tofu

    check_metadata_keys(metadata)
    _check_privacy_preset(tofu_preset)
    if tofu_config not in PRIVACY_HOLDOUT:
        raise ValueError(f"TOFU privacy task: dataset_kwargs.tofu_config must be one of "
                         f"{', '.join(PRIVACY_HOLDOUT)}; got {tofu_config!r}")
    sets = []
    for name, config in zip(PRIVACY_SETS, (tofu_config, PRIVACY_HOLDOUT[tofu_config])):
        docs = []
        for index, row in enumerate(load_tofu(config, data_dir=data_dir or None)):
            missing = [field for field in ("question", "answer") if field not in row]
            if missing:
                raise ValueError(f"TOFU {config} row {index} lacks field(s): {', '.join(missing)}")
            docs.append({"question": row["question"], "answer": row["answer"], "set": name})
        sets.append(docs)
    forget, holdout = sets
    docs = [doc for pair in zip(forget, holdout) for doc in pair]
    docs += forget[len(holdout):] + holdout[len(forget):]
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(docs)})


def process_privacy_results(doc: dict, results: list) -> dict[str, list]:
    """Per-item `[label, score]` of each attack (label 0 = forget, 1 = holdout; open-unlearning's loss-like
    scores, `cru_harness.metrics.privacy`) and of exact memorization / extraction strength, from the answer's
    `LoglikelihoodResult`. LOSS and ZLib use every scored token (EOS included); Min-K%, Min-K%++ and the two
    memorization numbers leave out the EOS prediction (open-unlearning's `tokenwise_logprobs`). A plain `hf`
    result gives NaN scores (with the one-time warning)."""
    (result,) = results
    label = PRIVACY_SETS.index(doc["set"])
    if math.isnan(avg_nll(result)):   # no per-token arrays: `--model hf`
        return {name: [label, math.nan] for name in PRIVACY_ATTACKS + PRIVACY_MEMORIZATION}
    if not result.token_greedy or result.text is None:
        raise ValueError("TOFU privacy: the log-likelihood result lacks token_greedy / text (an old cached result?)")
    lp = np.asarray(result.token_logprobs)
    head = M.without_eos(lp)
    greedy = M.without_eos(np.asarray(result.token_greedy, dtype=bool))
    em = M.exact_memorization(greedy)
    return {
        "mia_loss": [label, M.loss_attack(lp)],
        "mia_zlib": [label, M.zlib_attack(lp, result.text)],
        "mia_min_k": [label, M.min_k_attack(head)],
        "mia_min_k_plus_plus": [label, M.min_k_plus_plus_attack(head, M.without_eos(result.token_mu),
                                                                M.without_eos(result.token_sigma))],
        # None: a result computed without the marker (a cached one); the AUC is then NaN, never a wrong number
        "mia_gradnorm": [label, math.nan if getattr(result, "gradnorm", None) is None else result.gradnorm],
        # NaN without a reference model (`--model_args reference=...`): no AUC rather than a wrong one
        "mia_reference": [label, math.nan if getattr(result, "reference_loss", None) is None
                          else M.loss_attack(lp) - result.reference_loss],
        "exact_memorization": [label, None if em is None else float(em)],
        "extraction_strength": [label, float(M.extraction_strength(greedy))],
    }


def forget_holdout_auc_agg(items) -> float:
    """MIA AUC of forget (label 0) vs holdout (label 1) as open-unlearning computes it (`forget_holdout_auc`);
    NaN if any score is NaN (a plain `hf` run)."""
    labels = np.asarray([item[0] for item in items], dtype=int)
    scores = np.asarray([item[1] for item in items], dtype=float)
    if np.isnan(scores).any():
        return math.nan
    if not (labels == 0).any() or not (labels == 1).any():
        warnings.warn("TOFU privacy: the MIA AUC needs forget and holdout items (a --limit below 2?): NaN",
                      RuntimeWarning, stacklevel=2)
        return math.nan
    return M.forget_holdout_auc(scores[labels == 0], scores[labels == 1])


def forget_mean_agg(items) -> float:
    """Mean over the forget items (open-unlearning scores memorization on the forget set only); an item without
    answer tokens (`None`) is left out, as there; NaN if any forget score is NaN (a plain `hf` run)."""
    values = np.asarray([score for label, score in items if label == 0 and score is not None], dtype=float)
    if values.size == 0 or np.isnan(values).any():
        return math.nan
    return float(values.mean())


class TOFUPrivacyTask(TOFUTask):
    """One log-likelihood request per item: the answer, written and scored as the TOFU probes score it (chat
    template, plain prompt or a model family's tags; `JOINT_MARKER` + `EOS_MARKER`). Needs `--model cru` (the
    per-token arrays); open-unlearning preset only."""

    def __init__(self, config: dict | None = None):
        _check_privacy_preset((dict(config or {}).get("metadata") or {}).get("tofu_preset"))
        super().__init__(config=config)

    def process_results(self, doc: dict, results: list) -> dict[str, list]:
        return process_privacy_results(doc, results)

    def construct_requests(self, doc: dict, ctx: str, **kwargs) -> list[Instance]:
        chat_template = _pop_chat_template(kwargs)
        # MIA_MARKER: `cru` adds the text's GradNorm score (a backward pass), and with `reference=` that model's loss
        return self.likelihood_requests(doc, ctx, [doc["answer"]], chat_template, start=0, marker=MIA_MARKER,
                                        **kwargs)


# --------------------------------------------------------------------------------------------- single author

# LUNAR's single-author split (cru_harness.benchmarks.tofu.data.load_author_rows): the author's 20 rows of `full` ("forget")
# and the first 200 rows of the other authors ("retain"), scored as LUNAR scores them: ROUGE-1 recall of a greedy
# generation (LUNAR src/eval_util.py eval_rouge_recall), from which the report derives the deviation score.
AUTHOR_SETS = ("forget", "retain")


def load_tofu_author_dataset(tofu_config: str | None = None, tofu_author_set: str | None = None,
                             tofu_author=None, data_dir: str | None = None, **metadata) -> datasets.DatasetDict:
    """`custom_dataset` of `tofu_author_forget` / `tofu_author_retain`: `{question, answer}` rows of author
    `tofu_author` (metadata; default 1, LUNAR's `author_1`) or of the others. `tofu_config` (full) and
    `tofu_author_set` come from the task's YAML."""
    from cru_harness.benchmarks.tofu.data import AUTHOR_RETAIN_EVAL_ROWS, load_author_rows

    check_metadata_keys(metadata)
    if tofu_author_set not in AUTHOR_SETS:
        raise ValueError(f"TOFU author task: dataset_kwargs.tofu_author_set must be one of {', '.join(AUTHOR_SETS)}; "
                         f"got {tofu_author_set!r}")
    author = 1 if tofu_author in (None, "") else tofu_author
    if isinstance(author, str) and author.strip().isdigit():   # from a shell or an env var
        author = int(author)
    rows = load_author_rows(author, data_dir or None, others=tofu_author_set == "retain")
    if tofu_author_set == "retain":
        rows = rows[:AUTHOR_RETAIN_EVAL_ROWS]
    docs = [{"question": row["question"], "answer": row["answer"]} for row in rows]
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(docs)})


def process_author_results(doc: dict, results: list) -> dict[str, float]:
    """ROUGE-1 recall (LUNAR's deviation score reads it) and ROUGE-L recall (the protocol's) of the generation."""
    (generation,) = results
    return {"rouge1_recall": float(M.rouge1_recall(generation, doc["answer"])),
            "rouge_l_recall": float(M.rouge_l_recall_tofu(generation, doc["answer"]))}


class TOFUAuthorTask(TOFUTask):
    """A TOFU probe of one greedy generation per item, written as the preset writes TOFU's prompts."""

    probe_kinds = {"full": "author"}

    def process_results(self, doc: dict, results: list) -> dict[str, float]:
        return process_author_results(doc, results)

    def construct_requests(self, doc: dict, ctx: str, **kwargs) -> list[Instance]:
        _pop_chat_template(kwargs)
        return [Instance(request_type="generate_until", doc=doc,
                         arguments=(ctx, deepcopy(self.config.generation_kwargs)), idx=0, **kwargs)]
