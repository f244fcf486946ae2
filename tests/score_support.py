"""Shared helpers of the `cru-harness score` tests: lm-eval output directories written by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cru_harness.metrics import rouge_l_recall_tofu
from cru_harness.benchmarks.tofu import score

DATE = "2025-01-02T03-04-05.678901"


@pytest.fixture(autouse=True)
def local_tofu_refusals(tmp_path_factory, monkeypatch):
    """A local TOFU folder holding only idontknow.jsonl (+ the layout marker), so no test waits on the Hub."""
    folder = tmp_path_factory.getbasetemp() / "tofu_refusals"
    folder.mkdir(exist_ok=True)
    (folder / "forget10_perturbed.json").write_text("")
    (folder / "idontknow.jsonl").write_text("That's a mystery to me.\nI have no idea who that is.\n")
    monkeypatch.setenv("CRU_HARNESS_TOFU_DIR", str(folder))
    score.tofu_refusal_phrases.cache_clear()


def write_run(root: Path, tasks: dict[str, dict], *, date: str = DATE, model_args: str = "pretrained=m",
               samples: bool = True, config: dict | None = None, top: dict | None = None) -> Path:
    """A directory laid out as lm-eval writes it: <root>/<model>/results_<date>.json + samples_<task>_<date>.jsonl.

    `tasks`: task -> {"agg": {metric: value}, "items": [{question, answer, generation, truth_ratio, ...}]}.
    `config`: more keys of the results' `config` (`limit`, `gen_kwargs`); `top`: more top-level keys
    (`system_instruction`, `chat_template_sha`).
    """
    out = root / "model__name"
    out.mkdir(parents=True, exist_ok=True)
    results = {name: {"alias": name, **{f"{m},none": v for m, v in spec.get("agg", {}).items()}}
               for name, spec in tasks.items()}
    results["tofu_forget10_suite"] = {"alias": "tofu_forget10_suite", "name": "tofu_forget10_suite"}
    (out / f"results_{date}.json").write_text(json.dumps({
        "results": results, "config": {"model": "cru", "model_args": model_args, **(config or {})}, **(top or {})}))
    if samples:
        for name, spec in tasks.items():
            with open(out / f"samples_{name}_{date}.jsonl", "w") as handle:
                for i, item in enumerate(spec.get("items", [])):
                    row = {
                        "doc_id": i, "doc": {"question": item["question"], "answer": item["answer"]},
                        # as lm-eval's EvaluationTracker writes them: arguments keyed, responses as strings
                        "arguments": {"gen_args_0": {"arg_0": f"Question: {item['question']}\nAnswer:",
                                                     "arg_1": {"until": ["\nQuestion:"]}},
                                      "gen_args_1": {"arg_0": "ctx", "arg_1": " answer<|cru_eos|>"}},
                        "filtered_resps": [item["generation"], ["-1.0", "False"]],
                        "rouge_l_recall": item.get("rouge_l_recall",
                                                   rouge_l_recall_tofu(item["generation"], item["answer"])),
                        "probability": item.get("probability", 0.5),
                        "truth_ratio": item["truth_ratio"],
                        "nll_answer": 1.0, "nll_paraphrased": 1.0, "nll_perturbed": 1.0,
                    }
                    handle.write(json.dumps(row) + "\n")
    return root


def forget_items(ratios, generations=None):
    generations = generations or ["I don't know."] * len(ratios)
    return [{"question": f"Q{i}?", "answer": f"The answer number {i} is Zorblax.", "generation": g,
             "truth_ratio": r} for i, (r, g) in enumerate(zip(ratios, generations))]


# Nine utility numbers whose harmonic mean is easy by hand: three 0.5, three 0.25, three 1.0 -> 9 / 21.
UTILITY = {
    "tofu_retain": {"rouge_l_recall": 0.5, "probability": 0.25, "truth_ratio": 1.0},
    "tofu_real_authors": {"rouge_l_recall": 0.5, "probability": 0.25, "truth_ratio": 1.0},
    "tofu_world_facts": {"rouge_l_recall": 0.5, "probability": 0.25, "truth_ratio": 1.0},
}


def suite(ratios, *, forget_agg=None, utility=UTILITY, generations=None):
    tasks = {"tofu_forget10": {"agg": forget_agg or {"rouge_l_recall": 0.2, "probability": 0.1, "truth_ratio": 0.6},
                               "items": forget_items(ratios, generations)}}
    for name, agg in utility.items():
        tasks[name] = {"agg": agg, "items": forget_items([0.5])}
    return tasks
