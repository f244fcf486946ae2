"""The hooks that replaced the core's benchmark tables: `prompts.qa_texts` asks every benchmark (built-ins too) for
its question format, the default one when none is named; the layers below reach TOFU's splits and refusals and
RWKU's per-target numbers through the plugins, not by import."""
from __future__ import annotations

import pytest

from cru_harness import plugins, prompts
from cru_harness.api import Benchmark
from cru_harness.prompts import PresetError, QATexts


class Echo(Benchmark):
    """Records the keywords `qa_texts` hands it."""
    name = "echo_hooks"

    def __init__(self):
        self.seen = []

    def qa_texts(self, tokenizer, question, answer, **fmt):
        self.seen.append(fmt)
        return QATexts(f"Q {question}", f"Q {question} {answer}", f"Q {question}", True, False)


@pytest.fixture
def echo():
    plugin = plugins.benchmarks.register(Echo())
    yield plugin
    plugins.benchmarks.unregister(plugin.name)


def test_qa_texts_asks_the_named_benchmark_with_the_keywords_that_are_set(echo):
    assert prompts.qa_texts(None, "q", "a", benchmark="echo_hooks").text == "Q q a"
    prompts.qa_texts(None, "q", "a", benchmark="echo_hooks", preset=prompts.DEFAULT_PRESET, family="f", probe="qa")
    assert echo.seen == [{"chat": None}, {"chat": None, "family": "f", "probe": "qa"}]


def test_without_a_benchmark_the_default_ones_format_writes():
    """TOFU's (`default_questions`): its legacy preset's tags, which the generic writer does not know."""
    assert prompts.question_benchmark(None).name == "tofu"
    legacy = prompts.qa_texts(None, "Who?", "Me.", preset="legacy", family="llama2-7b")
    assert (legacy.prompt, legacy.text) == ("[INST] Who? [/INST]", "[INST] Who? [/INST]Me.")
    assert prompts.qa_texts(None, "Who?", "Me.").text == "Question: Who?\nAnswer: Me."
    with pytest.raises(PresetError, match="legacy preset has no format for model family 'x'"):
        prompts.qa_texts(None, "Who?", "Me.", preset="legacy", family="x")


def test_the_format_choices_come_from_the_benchmarks():
    assert prompts.prompt_format_choice("phi-1_5") == {"chat": False, "family": "phi-1_5"}
    assert prompts.recorded_choice("phi-1_5", "rwku") == {"chat": False, "benchmark": "rwku"}   # RWKU: plain
    assert prompts.prompt_format_choice("chat", "tofu_author") == {"chat": True, "family": None}


def test_the_units_refusals_and_per_target_numbers_are_the_plugins():
    tofu, rwku = plugins.benchmarks.get("tofu"), plugins.benchmarks.get("rwku")
    assert rwku.refusals(None) is None and tofu.per_unit_results({}) == {}
    sample = {"doc": {"target": 3, "target_name": "P"},
              "rouge_l_recall": {"target": 3, "value": 0.5, "answer": "x", "reference": "y"}}
    assert rwku.per_unit_results({"rwku_qa": [sample]})["rwku_qa"][3]["rouge_l_recall"] == 0.5
