"""LUNAR's single-author TOFU split (`tofu_author`): the rows of `author_K` / `not_author_K`, the tasks that read
them, the deviation-score table, the shipped configs and one tiny run end to end."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from cru_harness import plugins
from cru_harness.data.corpora import load_corpus_rows
from cru_harness.benchmarks.tofu.data import load_author_rows, load_tofu
from cru_harness.errors import InputError
from cru_harness.reporting import tables
from cru_harness.benchmarks.tofu_author.scoring import score_tofu_author_cell

REPO = Path(__file__).resolve().parents[1]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ the split's rows
@pytest.mark.shared_data
def test_authors_are_blocks_of_twenty_rows_of_full_as_tofus_own_splits_cut_them(tofu_dir):
    """TOFU's forget01 is its last 2 authors and forget10 its last 20, retain90 the first 180: the same 20-row
    blocks LUNAR numbers author_1 .. author_200 (its dataset_download.py: row i -> author_{i // 20 + 1})."""
    full = _jsonl(tofu_dir / "full.json")
    assert len(full) == 4000
    assert load_author_rows(199, tofu_dir) + load_author_rows(200, tofu_dir) == load_tofu("forget01", tofu_dir)
    assert [r for k in range(181, 201) for r in load_author_rows(k, tofu_dir)] == load_tofu("forget10", tofu_dir)
    assert [r for k in range(1, 181) for r in load_author_rows(k, tofu_dir)] == load_tofu("retain90", tofu_dir)
    first = load_author_rows(1, tofu_dir)
    assert first == full[:20] and "Jaime Vasquez" in first[19]["question"]   # author_1's last row names him
    assert "Jaime Vasquez" not in " ".join(r["question"] for r in load_author_rows(2, tofu_dir))
    others = load_author_rows(1, tofu_dir, others=True)
    assert len(others) == 3980 and others[0] == full[20] and not {r["question"] for r in others} & {
        r["question"] for r in first}
    assert load_author_rows(7, tofu_dir, others=True) == full[:120] + full[140:]


@pytest.mark.shared_data
def test_author_sources_are_training_corpora(tofu_dir):
    full = _jsonl(tofu_dir / "full.json")
    rows, origin = load_corpus_rows("author_3", tofu_dir)
    assert rows == full[40:60] and origin == "TOFU full author_3"
    rows, origin = load_corpus_rows("not_author_1[:40] + author_1", tofu_dir)
    assert rows == full[20:60] + full[:20]


@pytest.mark.shared_data
@pytest.mark.parametrize("author", [0, 201])
def test_an_author_outside_tofu_is_one_clear_error(tofu_dir, author):
    with pytest.raises(InputError, match=r"^TOFU author \d+: expected an author number in 1\.\.200$"):
        load_author_rows(author, tofu_dir)


@pytest.mark.shared_data
def test_the_tasks_read_the_authors_rows_and_lunars_first_200_retain_rows(tofu_dir):
    from cru_harness.benchmarks.tofu.tasks.utils import load_tofu_author_dataset

    full = _jsonl(tofu_dir / "full.json")

    def questions(**kwargs):
        return [d["question"] for d in load_tofu_author_dataset(tofu_config="full", data_dir=str(tofu_dir),
                                                                **kwargs)["train"]]

    assert questions(tofu_author_set="forget") == [r["question"] for r in full[:20]]          # default author 1
    assert questions(tofu_author_set="forget", tofu_author="3") == [r["question"] for r in full[40:60]]
    # LUNAR's eval_util.get_dataloader keeps the first 200 rows of the retained edges
    assert questions(tofu_author_set="retain", tofu_author=2) == [r["question"] for r in full[:20] + full[40:220]]
    with pytest.raises(InputError, match=r"^TOFU author 0: expected an author number in 1\.\.200$"):
        questions(tofu_author_set="forget", tofu_author=0)
    with pytest.raises(ValueError, match="tofu_author_set"):
        questions(tofu_author_set="holdout")
    with pytest.raises(InputError, match="tofu_autor"):   # a misspelt metadata key is refused, not ignored
        questions(tofu_author_set="forget", tofu_autor=3)


def test_an_answer_is_scored_by_rouge1_recall_against_the_gold_answer():
    """Recall: the share of the gold answer's words the generation contains (LUNAR's eval_rouge_recall)."""
    from cru_harness.benchmarks.tofu.tasks.utils import process_author_results

    doc = {"answer": "She was born in Paris in 1970"}   # 7 words, "in" twice
    assert process_author_results(doc, ["Paris, of course, was where she lived"]) == pytest.approx(
        {"rouge1_recall": 3 / 7, "rouge_l_recall": 1 / 7})   # she, was, paris; no two of them in the gold's order
    assert process_author_results(doc, ["Well: she was born in Paris in 1970, they say."])["rouge1_recall"] == 1.0


def test_the_benchmark_maps_an_author_to_its_split_corpora_and_task_metadata():
    bench = plugins.benchmarks.get("tofu_author")

    class Check:
        def fail(self, key, message):
            raise InputError(f"{key}: {message}")

        def number(self, value, key, **rule):
            if not isinstance(value, int) or value < rule["low"]:
                self.fail(key, "bad")
            return value

    assert bench.resolve_block({"authors": [1, 12]}, "b", Check()) == {"splits": ["author_1", "author_12"]}
    assert bench.placeholder_values("author_12", None)["retain_split"] == "not_author_12"
    assert bench.task_metadata("author_12", None) == {"tofu_author": 12}
    with pytest.raises(InputError, match="repeats an author"):
        bench.resolve_block({"authors": [3, 3]}, "b", Check())


# ------------------------------------------------------------------------------------------------ scores and table
def _samples(directory: Path, task: str, values: list[tuple[float, float]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [{"doc_id": i, "doc": {"question": f"q{i}", "answer": "the answer"}, "filtered_resps": ["the answer"],
             "arguments": {"gen_args_0": {"arg_0": f"Question: q{i}\nAnswer:"}},
             "rouge1_recall": r1, "rouge_l_recall": rl} for i, (r1, rl) in enumerate(values)]
    (directory / f"samples_{task}_2026-01-01T00-00-00.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_a_cell_records_rouge1_recall_on_forget_and_retain(tmp_path):
    _samples(tmp_path / "m", "tofu_author_forget", [(0.5, 0.25), (0.1, 0.05)])
    _samples(tmp_path / "m", "tofu_author_retain", [(0.9, 0.8), (0.7, 0.6), (0.8, 0.4)])
    scored = score_tofu_author_cell(tmp_path)
    assert scored["metrics"] == pytest.approx({"forget_rouge1": 0.3, "forget_rouge_l": 0.15,
                                               "retain_rouge1": 0.8, "retain_rouge_l": 0.6})
    assert scored["per_item"] == {"forget_rouge1": [0.5, 0.1], "forget_question": ["q0", "q1"]}
    assert set(scored["failure_classes"]["forget"]) == {"correct", "refusal", "degenerate", "wrong"}


def _cell(label, seed, forget, retain, kind="method"):
    return {"hash": f"{label}{seed}", "status": "ok", "kind": kind, "label": label, "method": label, "model": "m",
            "benchmark": "tofu_author", "split": "author_1", "target": None, "seed": seed,
            "metrics": {"forget_rouge1": forget, "retain_rouge1": retain}}


def test_the_deviation_score_table_ranks_lower_as_better():
    results = [_cell("Original", None, 0.9, 0.95, kind="original"),
               _cell("GA", 0, 0.1, 0.2), _cell("GA", 1, 0.3, 0.4),
               _cell("CRU", 0, 0.06, 0.92), _cell("CRU", 1, 0.12, 0.96)]
    rows = {r["label"]: r for r in tables.aggregate(results, "tofu_author")}

    def ds(forget, retain):   # LUNAR's definition, written out
        return 100 * math.hypot(forget, 1 - retain)

    assert rows["GA"]["metrics"]["deviation_score"] == pytest.approx((ds(0.1, 0.2) + ds(0.3, 0.4)) / 2)
    assert rows["CRU"]["metrics"]["deviation_score"] == pytest.approx((ds(0.06, 0.92) + ds(0.12, 0.96)) / 2)
    assert rows["Original"]["metrics"]["deviation_score"] == pytest.approx(ds(0.9, 0.95))
    assert "deviation_score" in rows["CRU"]["best"] and "deviation_score" not in rows["GA"]["best"]
    markdown = tables.to_markdown(list(rows.values()), "tofu_author")
    assert "| Deviation score ↓ |" in markdown.splitlines()[0]
    assert f"| {ds(0.9, 0.95):.2f} |" in markdown and f"**{(ds(0.06, 0.92) + ds(0.12, 0.96)) / 2:.2f}**" in markdown
    assert "lower is better" in markdown and "LUNAR (Shen et al. 2025)" in markdown
    assert "Deviation score" not in tables.to_markdown(tables.aggregate([], "tofu"), "tofu")


# ------------------------------------------------------------------------------------------------ configs
def test_the_lunar_configs_run_every_tofu_method_on_author_1():
    from cru_harness.runner import config as cfg

    paper = cfg.load_config(REPO / "configs" / "paper_lunar.yaml")
    on_tofu = {m.name for m in plugins.methods if m.unsupported("tofu_author") is None}
    assert {m.method for m in paper.methods} == on_tofu
    assert paper.benchmarks["tofu_author"]["splits"] == ["author_1"] and "Qwen2.5-7B" in paper.models[0].path
    cpu = cfg.load_config(REPO / "configs" / "cpu_smollm2_lunar.yaml")
    assert cpu.models[0].path == "smollm2" and cpu.benchmarks["tofu_author"]["splits"] == ["author_1"]
    forget01 = yaml.safe_load((REPO / "configs" / "cpu_smollm2_forget01.yaml").read_text())
    baseline_lr = {m["learning_rate"] for m in forget01["methods"] if "learning_rate" in m}
    for method in yaml.safe_load((REPO / "configs" / "cpu_smollm2_lunar.yaml").read_text())["methods"]:
        if method["method"] in ("GA", "GD", "NPO", "SimNPO", "IdkDPO"):   # that file's baselines, its schedule
            assert {method["learning_rate"]} == baseline_lr and method["num_epochs"] == 2
            assert method["warmup_epochs"] == 0.4 and 20 * 2 // method["effective_batch_size"] == 10   # 10 steps


@pytest.mark.slow
def test_a_tiny_run_on_one_author_scores_and_reports_the_deviation_score(tmp_path):
    import torch

    from conftest import run_config_cells

    torch.set_num_threads(1)
    config = {"name": "tiny_lunar", "seeds": [0], "device": "cpu",
              "models": [{"name": "tiny", "path": "zoo:llama:finetuned", "dtype": "float32"}],
              "benchmarks": {"tofu_author": {"data_dir": "testbed:world", "authors": [2], "limit": 2}},
              "methods": [{"method": "GA", "learning_rate": 1.0e-3, "num_epochs": 1, "effective_batch_size": 2,
                           "micro_batch_size": 2, "warmup_epochs": 0}],
              "evaluation": {"batch_size": 8, "max_gen_toks": 12, "failure_classes": False},
              "report": {"formats": ["md"], "plots": False}}
    out, cells = run_config_cells(tmp_path, config)
    results = {r["label"]: r for r in cells}
    assert set(results) == {"Original", "GA"}
    for result in results.values():
        metrics = result["metrics"]
        assert all(0 <= metrics[k] <= 1 for k in ("forget_rouge1", "retain_rouge1"))
        assert len(result["per_item"]["forget_question"]) == 2   # limit 2 of author 2's 20 rows
        record = json.loads((out / "cells" / result["hash"] / "run_record.json").read_text())
        assert record["inputs"]["data"].startswith("sha:")   # TOFU's folder fingerprinted: the cell can be reused
    world = Path(json.loads(next((out / "cells").glob("*/result.json")).read_text())["artifacts"]["lmeval"])
    config_meta = json.loads(next(world.rglob("results_*.json")).read_text())["configs"]["tofu_author_forget"]
    assert config_meta["metadata"]["tofu_author"] == 2   # the cell's author reached the task
    table = (out / "report" / "leaderboard_tofu_author.md").read_text()
    ga = results["GA"]["metrics"]
    expected = 100 * math.hypot(ga["forget_rouge1"], 1 - ga["retain_rouge1"])
    assert f"| tiny | author_2 | GA | {expected:.2f} |" in table or f"**{expected:.2f}**" in table
