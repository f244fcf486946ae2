"""A third-party benchmark package, built in the test, installed with pip and run end to end through `cru-harness run`
with no edit of the harness: its own data schema and folder (`DataSource`), corpus names, question format, evaluation
and lm-eval metadata key, its own lm-eval task folder and metric, its scorer and report columns. Not a TOFU subclass:
nothing of it comes from a built-in benchmark."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_plugins import install_plugin

PLUGIN = '''
"""Cloze: a fictitious benchmark whose data is a list of cloze facts, each a cue the model completes with a fill."""
from __future__ import annotations

import json
from pathlib import Path

from cru_harness.api import Benchmark, DataSource
from cru_harness.data.sources import read_json_records, resolve_local_dir
from cru_harness.errors import InputError
from cru_harness.prompts import QATexts
from cru_harness.reporting.tables import Column

#: A folder holding `cloze.jsonl` (rows: {"cue", "fill", "side": "forget" | "keep"}), or $CLOZE_DIR.
SOURCE = DataSource(folder="cloze", marker="cloze.jsonl", hub_id=None, env_var="CLOZE_DIR")
SIDES = ("forget", "keep")


def load_facts(data_dir, side):
    folder = resolve_local_dir(SOURCE, data_dir)
    if folder is None:
        raise InputError("cloze has no Hub copy: give data_dir or CLOZE_DIR")
    return [row for row in read_json_records(folder / SOURCE.marker) if row["side"] == side]


class Cloze(Benchmark):
    name = "cloze"
    summary = "cloze facts: the fill's log-likelihood on forget and keep facts"
    unit = "split"
    config_keys = ("tasks", "limit", "forget_corpus", "retain_corpus", "data_dir")
    default_tasks = ("cloze_forget", "cloze_keep")
    default_corpora = {"forget_corpus": "cloze:forget", "retain_corpus": "cloze:keep"}
    data = SOURCE
    corpus_help = "a cloze side (cloze:forget, cloze:keep)"
    task_folder = str(Path(__file__).parent / "tasks")
    evaluation_defaults = {"cloze_lead": "Fill in:"}
    metadata_keys = ("cloze_lead",)
    metadata_prefixes = ("cloze_",)
    task_keys = {"cloze_side": "the cloze task chooses the side"}
    columns = (Column("forget_fill_ll", "forget fill log-lik. ↓", "forget$\\\\downarrow$", "down", "Forget"),
               Column("keep_fill_ll", "keep fill log-lik. ↑", "keep$\\\\uparrow$", "up", "Keep"))
    order = 90

    def resolve_block(self, block, where, check):
        return {"splits": ["facts"]}

    def units(self, block, selected=None):
        return [("facts", None)]

    def corpus_rows(self, source, data_dir):
        if not source.startswith("cloze:"):
            return None
        side = source.split(":", 1)[1]
        if side not in SIDES:
            raise InputError(f"cloze corpus {source!r}: the side is one of {', '.join(SIDES)}")
        return [{"question": row["cue"], "answer": row["fill"]} for row in load_facts(data_dir, side)], f"cloze {side}"

    def qa_texts(self, tokenizer, question, answer, **fmt):
        prompt = f"Fill in: {question}"   # the evaluation's prompt (the default `cloze_lead`)
        return QATexts(prompt, f"{prompt} {answer}", prompt, True, False)

    def forgetting_utility(self, metrics):
        forget, keep = metrics.get("forget_fill_ll"), metrics.get("keep_fill_ll")
        return (-forget if forget is not None else None), keep

    def score(self, cell, lmeval_dir, *, data_dir, original_model, retain_result, device, batch_size):
        from cru_harness.scoring.cell_scores import load_samples

        samples = load_samples(lmeval_dir)
        metrics, prompts = {}, {}
        for side in SIDES:
            rows = samples.get(f"cloze_{side}") or []
            values = [row["fill_ll"] for row in rows]
            metrics[f"{side}_fill_ll"] = sum(values) / len(values) if values else None
            prompts[side] = sorted({row["doc"]["prompt"] for row in rows})
        return {"metrics": metrics, "per_item": {}, "failure_classes": {}, "details": {"prompts": prompts}}


BENCHMARK = Cloze()
'''

TASK_UTILS = '''
import datasets

from cru_harness.lmeval.metadata import check_metadata_keys


def load_cloze(data_dir=None, cloze_side="forget", cloze_lead="Fill in:", **metadata):
    from cru_cloze import load_facts

    check_metadata_keys(metadata)
    rows = [{"prompt": f"{cloze_lead} {row['cue']}", "fill": row["fill"]} for row in load_facts(data_dir, cloze_side)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def fill_ll(doc, results):
    """Its own metric: the fill's summed log-likelihood after the prompt."""
    return {"fill_ll": float(results[0][0])}
'''

TASK = '''
task: cloze_{side}
custom_dataset: !function utils.load_cloze
dataset_kwargs:
  cloze_side: {side}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{prompt}}}}"
doc_to_target: " {{{{fill}}}}"
process_results: !function utils.fill_ll
metric_list:
  - metric: fill_ll
    aggregation: mean
    higher_is_better: false
metadata:
  version: 1.0
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "cru-cloze"
version = "0.0.1"

[project.entry-points."cru_harness.benchmarks"]
cloze = "cru_cloze:BENCHMARK"

[tool.setuptools]
packages = ["cru_cloze"]

[tool.setuptools.package-data]
cru_cloze = ["tasks/*.yaml", "tasks/*.py"]
'''

FACTS = [("The lighthouse keeper of Varno is", "Amelie Strand"), ("The river that feeds Lake Quillon is the", "Osk"),
         ("The first mayor of Tarrow was", "Benedikt Hale"), ("The bell of Morrin Abbey is called", "Old Sela"),
         ("The painter of the Glass Orchard is", "Ivo Renn"), ("The ferry to Kesh leaves from", "Pell Harbour"),
         ("The guild of weavers meets in", "Corran Hall"), ("The oldest oak in Vell is named", "Grandfather Ash")]


def build_package(root: Path) -> dict[str, str]:
    """The cloze package written and installed; the environment of a `cru-harness` process that finds it."""
    source = root / "cloze_src"
    tasks = source / "cru_cloze" / "tasks"
    tasks.mkdir(parents=True)
    (source / "cru_cloze" / "__init__.py").write_text(PLUGIN)
    (tasks / "utils.py").write_text(TASK_UTILS)
    for side in ("forget", "keep"):
        (tasks / f"cloze_{side}.yaml").write_text(TASK.format(side=side))
    (source / "pyproject.toml").write_text(PYPROJECT)
    return install_plugin(source, root)


def write_data(root: Path) -> Path:
    folder = root / "data" / "cloze"
    folder.mkdir(parents=True)
    rows = [{"cue": cue, "fill": fill, "side": "forget" if i < 4 else "keep"} for i, (cue, fill) in enumerate(FACTS)]
    (folder / "cloze.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root / "data"


@pytest.mark.slow
def test_a_third_party_benchmark_package_runs_end_to_end(tmp_path):
    env = build_package(tmp_path)
    data = write_data(tmp_path)
    cli = [sys.executable, "-m", "cru_harness"]
    listed = subprocess.run([*cli, "benchmarks"], env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "cloze" in listed.stdout, listed.stderr

    out = tmp_path / "run"
    config = tmp_path / "cloze_run.yaml"
    config.write_text(textwrap.dedent(f"""
        name: cloze_run
        output_dir: {out}
        seeds: [0]
        device: cpu
        data_dir: {data}
        models: [{{name: tiny, path: "zoo:llama:finetuned", dtype: float32}}]
        benchmarks:
          cloze: {{}}
        methods:
          - {{method: GA, learning_rate: 1.0e-3, num_epochs: 3, effective_batch_size: 4, micro_batch_size: 4,
              warmup_epochs: 0}}
        evaluation: {{batch_size: 4, failure_classes: false, cloze_lead: "Complete:"}}
        report: {{formats: [md], plots: false, stats: false}}
    """))
    done = subprocess.run([*cli, "run", str(config)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {r["label"]: r for r in (json.loads(p.read_text()) for p in (out / "cells").glob("*/result.json"))}
    assert set(results) == {"Original", "GA"}
    assert all(r["status"] == "ok" and r["benchmark"] == "cloze" for r in results.values())
    original, ga = results["Original"]["metrics"], results["GA"]["metrics"]
    assert isinstance(original["forget_fill_ll"], float) and isinstance(original["keep_fill_ll"], float)
    # GA trained on the plugin's corpus (its rows, written by its question format) and pushed the forget fills down
    assert ga["forget_fill_ll"] < original["forget_fill_ll"] - 1.0
    # the config's `evaluation.cloze_lead` reached the plugin's tasks as lm-eval metadata
    assert results["GA"]["details"]["scoring"]["prompts"]["forget"][0].startswith("Complete: ")
    table = (out / "report" / "leaderboard_cloze.md").read_text()
    assert "forget fill log-lik. ↓" in table and "| GA |" in table


def test_a_misspelt_key_of_a_registered_benchmark_is_refused(tmp_path):
    """In process: the plugin's evaluation key is a config key, its metadata prefix guards misspellings, its corpus
    names are corpus sources; nothing of this is in the harness."""
    from cru_harness import plugins
    from cru_harness.data.corpora import load_corpus_rows
    from cru_harness.errors import InputError
    from cru_harness.lmeval.metadata import check_metadata_keys
    from cru_harness.runner import config as cfg

    sys.path.insert(0, str(tmp_path))
    (tmp_path / "cru_cloze").mkdir()
    (tmp_path / "cru_cloze" / "__init__.py").write_text(PLUGIN)
    try:
        import cru_cloze

        plugins.benchmarks.register(cru_cloze.BENCHMARK)
        data = write_data(tmp_path)
        rows, origin = load_corpus_rows("cloze:forget", str(data))
        assert origin == "cloze forget" and rows[0] == {"question": FACTS[0][0], "answer": FACTS[0][1]}
        with pytest.raises(InputError, match="a cloze side"):
            load_corpus_rows("cloze-forget", str(data))
        check_metadata_keys({"cloze_lead": "x", "data_dir": "d"})
        with pytest.raises(InputError, match=r"unknown --metadata key 'cloze_led' \(did you mean 'cloze_lead'\?\)"):
            check_metadata_keys({"cloze_led": "x"})
        with pytest.raises(InputError, match="is not a setting: the cloze task chooses the side"):
            check_metadata_keys({"cloze_side": "keep"})
        raw = {"name": "t", "output_dir": str(tmp_path / "o"), "models": [{"name": "m", "path": "zoo:llama"}],
               "benchmarks": {"cloze": {"data_dir": str(data)}}, "methods": ["GA"]}
        config = cfg.validate_config(raw)
        assert config.evaluation["cloze_lead"] == "Fill in:"
        tofu_only = cfg.validate_config({**raw, "benchmarks": {"tofu": {}}})
        assert "cloze_lead" not in tofu_only.evaluation   # installing it moves no other benchmark's cell hash
        with pytest.raises(cfg.ConfigError, match=r"evaluation\.cloze_leed"):
            cfg.validate_config({**raw, "evaluation": {"cloze_leed": "x"}})
    finally:
        plugins.benchmarks.unregister("cloze")
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cru_cloze", None)
