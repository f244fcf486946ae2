"""WMDP's package: lm-eval's own WMDP / MMLU tasks by name (and pointed at a local copy), WMDP's corpora (Hub
or local root, the gated bio corpus's error), and the scorer. Data: the fictitious fixture `wmdp_fixtures` writes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from cru_harness.baselines import make_config
from cru_harness.benchmarks.wmdp import data, scoring, tasks
from cru_harness.data.sources import DataSourceError
from cru_harness.errors import InputError, UserError

from wmdp_fixtures import mmlu_subjects, write_wmdp_root


@pytest.fixture(scope="module")
def wmdp_root(tmp_path_factory):
    return write_wmdp_root(tmp_path_factory.mktemp("wmdp"), questions=4, passages=6)


@pytest.fixture(scope="module")
def task_index():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=tasks.lmeval_task_dirs(), include_defaults=False)


def test_tasks_are_lm_evals_own(task_index):
    """Every name the package uses is a task (or group) of the installed lm-eval, read from its own folders."""
    names = set(task_index.all_tasks)
    assert set(tasks.FORGET_TASKS.values()) <= names
    assert set(tasks.MMLU_SUBJECTS.values()) <= names
    assert "mmlu" in task_index.all_groups
    assert set(tasks.DEFAULT_TASKS) <= names
    assert tasks.CHANCE == 0.25
    config = task_index._index["wmdp_bio"]
    assert "lm_eval" in str(config.yaml_path)   # lm-eval's file, not a copy


def test_hub_by_name_without_local_root():
    with tasks.lmeval_tasks(["wmdp_bio", "mmlu"], None) as (dirs, names):
        assert names == ["wmdp_bio", "mmlu"]
        assert dirs == tasks.lmeval_task_dirs()


def test_local_root_wraps_the_tasks_with_dataset_path(wmdp_root, task_index):
    from lm_eval.tasks import TaskManager

    with tasks.lmeval_tasks(["wmdp_cyber", "mmlu", "tofu_forget01"], wmdp_root) as (dirs, names):
        assert names == [tasks.LOCAL_GROUP, "tofu_forget01"]
        wrapper = yaml.safe_load((Path(dirs[-1]) / f"{tasks.LOCAL_GROUP}.yaml").read_text())
        assert wrapper["task"] == [{"task": "wmdp_cyber", "dataset_path": str(wmdp_root.resolve() / "wmdp")},
                                   {"group": "mmlu", "dataset_path": str(wmdp_root.resolve() / "mmlu")}]
        manager = TaskManager(include_path=dirs, include_defaults=False)
        loaded = manager.load([tasks.LOCAL_GROUP])
    # the group's override reached every member task, MMLU's 57 subjects through its sub-groups
    assert len(loaded["tasks"]) == 1 + len(mmlu_subjects())
    assert {task.config.dataset_path for task in loaded["tasks"].values()} == {
        str(wmdp_root.resolve() / "wmdp"), str(wmdp_root.resolve() / "mmlu")}
    assert loaded["tasks"]["wmdp_cyber"].config.doc_to_choice == ["A", "B", "C", "D"]   # lm-eval's config kept
    assert len(loaded["tasks"]["wmdp_cyber"].eval_docs) == 4                            # the fixture's questions


@pytest.mark.parametrize("name", sorted(data.CORPORA))
def test_corpora_from_a_local_root(wmdp_root, name):
    rows, origin = data.load_corpus_rows(name, wmdp_root)
    assert len(rows) == 6 and all(set(row) == {"text"} and len(row["text"]) > data.MIN_CHARS for row in rows)
    assert data.CORPORA[name].repo in origin


def test_wikitext_keeps_rmus_rows_only(wmdp_root):
    """rmu/utils.py keeps texts longer than 50 characters: wikitext's blank lines and headings go."""
    rows, _ = data.load_corpus_rows("wikitext", wmdp_root)
    assert not any("Heading" in row["text"] for row in rows)


def test_local_root_resolution(wmdp_root, tmp_path, monkeypatch):
    monkeypatch.delenv(data.ENV_DIR, raising=False)
    monkeypatch.delenv(data.ENV_DATA_DIR, raising=False)
    assert data.resolve_root(None) is None
    assert data.resolve_root(wmdp_root) == wmdp_root
    monkeypatch.setenv(data.ENV_DIR, str(wmdp_root))
    assert data.resolve_root(None) == wmdp_root
    with pytest.raises(DataSourceError, match="holds no wmdp data"):
        data.resolve_root(tmp_path)
    (tmp_path / "wmdp").mkdir()
    with pytest.raises(DataSourceError, match=r"has no wmdp-corpora/ \(cais/wmdp-corpora\)"):
        data.load_corpus_rows("cyber-forget", tmp_path)


def test_sources(wmdp_root):
    assert data.parse_source("wmdp:cyber-forget") == ("cyber-forget", 0, None)
    assert data.parse_source("wmdp:cyber-forget[:600]") == ("cyber-forget", 0, 600)
    assert data.parse_source("forget10") is None
    with pytest.raises(InputError, match="no chemistry corpus.*wmdp:bio-forget, wmdp:cyber-forget"):
        data.parse_source("wmdp:chem-forget")
    with pytest.raises(InputError, match="WMDP's corpora are"):
        data.parse_source("wmdp:cyber")
    with pytest.raises(InputError, match="B > A"):
        data.parse_source("wmdp:wikitext[4:2]")
    rows, origin = data.load_source("wmdp:cyber-forget[1:3]", wmdp_root)
    assert len(rows) == 2 and rows[0] == data.load_corpus_rows("cyber-forget", wmdp_root)[0][1]
    assert origin.endswith("rows 1-2")
    with pytest.raises(UserError, match="none from row 10 on"):
        data.load_source("wmdp:cyber-forget[10:12]", wmdp_root)


def test_gated_bio_corpus_names_the_request_page_and_local_option(monkeypatch):
    import datasets

    def refuse(*args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError(
            "Dataset 'cais/wmdp-bio-forget-corpus' is a gated dataset on the Hub. You must be authenticated")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.delenv(data.ENV_DIR, raising=False)
    monkeypatch.delenv(data.ENV_DATA_DIR, raising=False)
    with pytest.raises(UserError) as caught:
        data.load_corpus_rows("bio-forget")
    message = str(caught.value)
    assert "\n" not in message
    assert "https://huggingface.co/datasets/cais/wmdp-bio-forget-corpus" in message
    assert "data_dir" in message and data.ENV_DIR in message
    # an open corpus the Hub does not serve: the local option, no access request
    with pytest.raises(UserError, match="could not load cais/wmdp-corpora") as caught:
        data.load_corpus_rows("cyber-forget")
    assert "request access" not in str(caught.value)


def _results(**accs):
    results = {task: {"acc,none": value} for task, value in accs.items()}
    return {"results": results, "n-samples": {task: {"original": 10, "effective": 10} for task in accs}}


def test_scorer_reads_lm_evals_accuracies(tmp_path):
    found = _results(wmdp_bio=0.31, wmdp_cyber=0.4, mmlu=0.55, mmlu_virology=0.5, mmlu_college_biology=0.6)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "results_2026-01-01T00-00-00.json").write_text(json.dumps(found))
    scored = scoring.score_cell(tmp_path, "bio")
    metrics = scored["metrics"]
    assert metrics["forget_acc"] == metrics["wmdp_bio_acc"] == 0.31
    assert metrics["wmdp_cyber_acc"] == 0.4 and "wmdp_chem_acc" not in metrics   # not run: not a column of nulls
    assert metrics["mmlu_acc"] == 0.55 and metrics["mmlu_virology_acc"] == 0.5
    assert metrics["mmlu_computer_security_acc"] is None
    assert scored["details"]["items"]["wmdp_bio"] == 10
    assert scoring.score_cell(tmp_path, "chem")["metrics"]["forget_acc"] is None


def test_scorer_without_results(tmp_path):
    with pytest.raises(UserError, match="no lm-eval results"):
        scoring.score_cell(tmp_path, "bio")


@pytest.mark.slow
def test_lm_eval_scores_the_local_fixture(wmdp_root, tmp_path):
    """lm-eval's own wmdp_bio and mmlu tasks, read from the fixture, on the tiny model; the scorer's MMLU is
    lm-eval's group (weighted by subject size: here one question per subject, so the plain mean)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from cru_harness.lmeval.registration import register
    from cru_harness.testbed.zoo import tiny_checkpoint

    register()
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    with tasks.lmeval_tasks(["wmdp_bio", "mmlu"], wmdp_root) as (dirs, names):
        results = lm_eval.simple_evaluate(
            model="cru", model_args={"pretrained": str(tiny_checkpoint("llama", "finetuned"))}, tasks=names,
            task_manager=TaskManager(include_path=dirs, include_defaults=False), batch_size=16, bootstrap_iters=0,
            evaluation_tracker=tracker)
    tracker.save_results_aggregated(results=results, samples={})
    metrics = scoring.score_cell(tmp_path / "out", "bio")["metrics"]
    subjects = [results["results"][f"mmlu_{s}"]["acc,none"] for s in mmlu_subjects()]
    assert metrics["mmlu_acc"] == pytest.approx(sum(subjects) / len(subjects))
    assert metrics["forget_acc"] in (0.0, 0.25, 0.5, 0.75, 1.0)   # 4 questions
    assert metrics["mmlu_virology_acc"] in (0.0, 1.0)


def test_rmu_at_wmdps_zephyr_setting():
    """RMU's WMDP cells train with WMDP's README run for Zephyr-7B (rmu/unlearn.py), stated in their hparams."""
    from cru_harness import plugins

    rmu = plugins.methods.get("RMU")
    setting = plugins.benchmarks.get("wmdp").method_settings("RMU", "bio")
    assert {k: setting[k] for k in ("layer", "steering_coeff", "alpha", "learning_rate", "effective_batch_size",
                                    "num_epochs")} == {"layer": 7, "steering_coeff": 6.5, "alpha": 1200.0,
                                                       "learning_rate": 5e-5, "effective_batch_size": 4,
                                                       "num_epochs": 1}
    config = make_config("rmu", "wmdp", "bio", **setting)
    assert config.layers_trained == (5, 6, 7) and config.trainable_params == (r"mlp\.down_proj\.weight",)
    # WMDP steps transformers' AdamW at its defaults (eps 1e-6), RWKU takes WMDP's run; elsewhere open-unlearning's
    assert config.adam_eps == 1e-6 and plugins.benchmarks.get("rwku").method_settings("RMU", None) == setting
    assert not plugins.benchmarks.get("tofu").method_settings("RMU", None)
    assert {k: rmu.benchmark_defaults["*"][k] for k in ("steering_coeff", "alpha", "learning_rate", "adam_eps")} == \
        {"steering_coeff": 2.0, "alpha": 1.0, "learning_rate": 1e-5, "adam_eps": 1e-8}


@pytest.mark.parametrize("method", ["GA", "GD", "NPO", "SimNPO"])
def test_passage_methods_share_rmus_budget_on_wmdp(method):
    """The protocol's rule on WMDP: RMU's schedule and batch, each method's own learning rate (swept)."""
    from cru_harness import plugins

    plugin = plugins.methods.get(method)
    config = make_config(method, "wmdp", "cyber")
    assert (config.num_epochs, config.effective_batch_size, config.lr_scheduler, config.warmup_epochs,
            config.weight_decay, config.max_length) == (1, 4, "constant", 0.0, 0.0, 512)
    assert config.learning_rate == plugin.trainer.Config().learning_rate
    tofu = make_config(method, "tofu", "forget10")
    assert (tofu.num_epochs, tofu.effective_batch_size) != (1, 4)


def test_cru_on_wmdp_uses_its_passage_setting():
    from cru_harness import plugins

    wmdp, rwku = (plugins.benchmarks.get(name).method_settings("CRU", None) for name in ("wmdp", "rwku"))
    assert wmdp == rwku == {"lam": 50, "percentile": 90, "d_r": 256}


def test_plugin_units_corpora_and_scores(wmdp_root, tmp_path):
    from cru_harness.benchmarks.wmdp.plugin import BENCHMARK, FORGET_PASSAGES
    from cru_harness.validation import ConfigChecker, ConfigError

    check = ConfigChecker("config.yaml")
    block = BENCHMARK.resolve_block({"domains": ["cyber"]}, "benchmarks.wmdp", check)
    assert BENCHMARK.units(block) == [("cyber", None)]
    assert BENCHMARK.units(BENCHMARK.resolve_block({}, "benchmarks.wmdp", check)) == [("bio", None), ("cyber", None)]
    with pytest.raises(ConfigError, match=r"benchmarks.wmdp.domains\[0\].*no domain 'biology'"):
        BENCHMARK.resolve_block({"domains": ["biology"]}, "benchmarks.wmdp", check)
    forget = BENCHMARK.fill(BENCHMARK.default_corpora["forget_corpus"], "cyber", None)
    assert forget == f"wmdp:cyber-forget[:{FORGET_PASSAGES}]"
    rows, _ = BENCHMARK.corpus_rows(forget, wmdp_root)
    assert len(rows) == 6   # the fixture holds fewer than 600
    assert BENCHMARK.corpus_rows("forget10", wmdp_root) is None
    assert BENCHMARK.forgetting_utility({"forget_acc": 0.25, "mmlu_acc": 0.5}) == (0.75, 0.5)
    assert BENCHMARK.kept_score({"metrics": {"mmlu_acc": 0.5}}) == 0.5


def test_plot_draws_the_chance_line():
    from cru_harness.benchmarks.wmdp.report import accuracy_figure

    rows = [{"model": "m", "unit": "bio", "label": "Original", "reference": True,
             "metrics": {"wmdp_bio_acc": 0.6, "mmlu_acc": 0.55}},
            {"model": "m", "unit": "bio", "label": "RMU", "reference": False,
             "metrics": {"wmdp_bio_acc": 0.3, "wmdp_cyber_acc": 0.4, "mmlu_acc": 0.5}}]
    fig = accuracy_figure(rows)
    ax = fig.axes[0]
    chance = [line for line in ax.get_lines() if list(line.get_xdata()) == [0.25, 0.25]]
    assert chance and "chance (0.25)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert accuracy_figure([{"model": "m", "unit": "bio", "label": "x", "metrics": {}}]) is None


def test_the_core_reads_wmdp_corpora_as_raw_passages(wmdp_root):
    """Through the core's corpus loader (the `corpus_rows` hook), a WMDP source gives `text` rows, which CRU and the
    baselines train on as raw text: no question template, no chat template."""
    from transformers import AutoTokenizer

    from cru_harness.data.corpora import load_corpus, load_corpus_rows
    from cru_harness.testbed.zoo import tiny_checkpoint

    rows, origin = load_corpus_rows("wmdp:cyber-forget[:3]", wmdp_root)
    assert len(rows) == 3 and "cais/wmdp-corpora" in origin
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint("llama", "finetuned"))
    texts = load_corpus("wmdp:cyber-forget[:3]", wmdp_root, tokenizer=tokenizer, chat=True, benchmark="wmdp")
    assert texts == [row["text"] for row in rows]


def test_joint_unit_config_corpora_and_score(wmdp_root):
    """`bio+cyber` is one unit (WMDP's headline run): its corpus interleaves the domains' passages, tagged, so that
    `[:N]` keeps N/2 of each; its forget_acc is the mean of the two domains' accuracies."""
    from cru_harness.benchmarks.wmdp.plugin import BENCHMARK
    from cru_harness.data.corpora import load_corpus_rows
    from cru_harness.validation import ConfigChecker, ConfigError

    check = ConfigChecker("config.yaml")
    block = BENCHMARK.resolve_block({"domains": ["bio+cyber", "chem"]}, "benchmarks.wmdp", check)
    assert BENCHMARK.units(block) == [("bio+cyber", None), ("chem", None)]
    for bad in ("bio+bio", "bio+biology"):
        with pytest.raises(ConfigError, match=r"benchmarks.wmdp.domains\[0\]"):
            BENCHMARK.resolve_block({"domains": [bad]}, "benchmarks.wmdp", check)
    source = BENCHMARK.fill(BENCHMARK.default_corpora["forget_corpus"], "bio+cyber", None)
    assert source == "wmdp:bio+cyber-forget[:600]"
    rows, origin = load_corpus_rows("wmdp:bio+cyber-forget[:4]", wmdp_root)
    assert [r["domain"] for r in rows] == ["bio", "cyber", "bio", "cyber"]
    alone = {d: load_corpus_rows(f"wmdp:{d}-forget[:2]", wmdp_root)[0] for d in ("bio", "cyber")}
    assert [r["text"] for r in rows] == [alone[d][i]["text"] for i in range(2) for d in ("bio", "cyber")]
    assert "wmdp-bio-forget-corpus" in origin and "wmdp-corpora" in origin
    assert "domain" not in alone["bio"][0]   # a lone domain's rows are as before
    with pytest.raises(InputError, match="no chemistry corpus"):
        load_corpus_rows("wmdp:bio+chem-forget", wmdp_root)
    results = {"results": {"wmdp_bio": {"acc,none": 0.5}, "wmdp_cyber": {"acc,none": 0.25}, "mmlu": {"acc,none": 0.4}}}
    assert scoring.metrics_from_results(results, "bio+cyber")[0]["forget_acc"] == pytest.approx(0.375)
    assert scoring.metrics_from_results(results, "cyber")[0]["forget_acc"] == 0.25


def test_rmu_trains_a_joint_unit_as_wmdps_script(wmdp_root, monkeypatch):
    """RMU on a joint unit follows rmu/unlearn.py: one seeded direction per domain (the first a lone domain's),
    batches alternating bio, cyber, ... in corpus order and unshuffled, each domain's b-th batch with the b-th batch
    of its retain corpus (Wikitext for both, or each domain's own when the retain rows are tagged), each row steered
    to its own domain's direction."""
    from transformers import AutoTokenizer

    from cru_harness.baselines._activations import block_output, masked_mse_per_sequence
    from cru_harness.baselines.api import unlearn
    from cru_harness.baselines.rmu import RMU
    from cru_harness.data.corpora import load_corpus_rows
    from cru_harness.testbed.zoo import tiny_checkpoint

    path = str(tiny_checkpoint("llama", "finetuned"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    forget = load_corpus_rows("wmdp:bio+cyber-forget[:8]", wmdp_root)[0]   # 4 of each: 2 batches of 2 per domain
    wikitext = load_corpus_rows("wmdp:wikitext", wmdp_root)[0]
    setting = dict(layer=1, effective_batch_size=2, micro_batch_size=1, alpha=10.0, learning_rate=1e-3,
                   steering_coeff=6.5)   # WMDP's c (its method_settings; the dataclass default is TOFU's 2)
    method = RMU(make_config("rmu", "wmdp", "bio+cyber", **setting))
    dataset = method.make_dataset(tokenizer, forget, wikitext, max_length=64, seed=0)
    assert dataset.domains == ["bio", "cyber"] and len(dataset) == 8
    # rows of the interleaved corpus: bio 0, 2, 4, 6 and cyber 1, 3, 5, 7; batch b of each with Wikitext's batch b
    expected = [(0, 0), (2, 1), (1, 0), (3, 1), (4, 2), (6, 3), (5, 2), (7, 3)]
    for i, (f, r) in enumerate(expected):
        item = dataset[i]
        assert item["forget"] is dataset.forget[f] and item["retain"] is dataset.retain[r]
        assert item["domain"] == (0 if f % 2 == 0 else 1)
    own = method.make_dataset(tokenizer, forget, load_corpus_rows("wmdp:bio+cyber-retain", wmdp_root)[0],
                              max_length=64, seed=0)
    # tagged retain rows interleave as the forget rows do: bio's retain j sits where bio's forget j does
    assert [own[i]["retain"] is own.retain[f] for i, (f, _) in enumerate(expected)] == [True] * 8

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    method.prepare(model, 3, dataset)
    lone = RMU(make_config("rmu", "wmdp", "bio", **setting))
    untagged = lone.make_dataset(tokenizer, [{"text": r["text"]} for r in forget], wikitext, max_length=64, seed=0)
    assert not getattr(untagged, "ordered", False)   # a lone domain's rows: the baselines' shuffled pairs, as before
    lone.prepare(model, 3, untagged)
    vectors = method.control_vectors
    assert vectors.shape[0] == 2 and not torch.allclose(vectors[0], vectors[1])
    assert torch.equal(vectors[0], lone.control_vector) and lone.control_vectors.shape[0] == 1
    assert torch.allclose(vectors.norm(dim=-1), torch.tensor([6.5, 6.5]))
    cyber = dataset.collate([dataset[2], dataset[3]])
    assert cyber["forget"]["domain"].tolist() == [1, 1]
    _, logs = method.compute_loss(model, cyber, ref_model=model)
    with torch.no_grad():
        acts = block_output(model, cyber["forget"], 1)
        mask = cyber["forget"]["labels"] != -100
        steered = [masked_mse_per_sequence(acts, v, mask).mean().item() for v in vectors]
    assert logs["rmu_forget"] == pytest.approx(steered[1], rel=1e-5) and steered[0] != pytest.approx(steered[1])

    seen = []
    compute_loss = RMU.compute_loss

    def spy(self, model, batch, ref_model=None):
        seen.append(batch["forget"]["domain"].tolist())
        return compute_loss(self, model, batch, ref_model)

    monkeypatch.setattr(RMU, "compute_loss", spy)
    result = unlearn(path, None, forget, wikitext, "rmu", make_config("rmu", "wmdp", "bio+cyber", **setting), seed=0,
                     progress=False, dtype="float32", device="cpu")
    assert seen == [[0], [0], [1], [1], [0], [0], [1], [1]]   # micro-batches of 1, steps of 2: bio, cyber, bio, cyber
    assert result.optimizer_steps == 4


def test_accuracies_are_held_to_the_unit_interval_through_the_benchmark_hook():
    """The store refuses a WMDP cell whose accuracy is outside [0, 1], by WMDP's `metric_range` hook (no name
    table in the core): the same name under a benchmark declaring no range passes."""
    from cru_harness import plugins
    from cru_harness.store import metric_range, metrics_problem

    assert plugins.benchmarks.get("wmdp").metric_range("mmlu_virology_acc") == (0.0, 1.0)
    assert metric_range("wmdp_bio_acc", "wmdp") == (0.0, 1.0) and metric_range("wmdp_bio_acc") is None
    assert "outside its range [0, 1]" in metrics_problem({"wmdp_bio_acc": 1.5, "mmlu_acc": 0.5}, "wmdp")
    assert metrics_problem({"wmdp_bio_acc": 0.3, "forget_acc": 0.3}, "wmdp") is None
    assert metrics_problem({"wmdp_bio_acc": 1.5}, "tofu") is None


def test_tradeoff_plot_draws_the_benchmarks_chance_line(tmp_path, monkeypatch):
    """The core's trade-off plot draws a dotted line where the benchmark declares chance (WMDP: forgetting 0.75)
    and none for a benchmark without one (TOFU)."""
    from cru_harness.reporting import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    monkeypatch.setattr(plots.plt, "close", lambda fig: None)
    rows = [{"model": "m", "unit": "bio", "label": label, "reference": label == "Original",
             "metrics": {"forgetting": x, "utility": y}}
            for label, x, y in (("Original", 0.4, 0.6), ("RMU", 0.7, 0.58), ("GA", 0.8, 0.3))]
    for benchmark in ("wmdp", "tofu"):
        plots.tradeoff_plots(rows, benchmark, tmp_path)
    wmdp_ax, tofu_ax = (fig.axes[0] for fig in figures)
    chance = [line for line in wmdp_ax.get_lines() if list(line.get_xdata()) == [0.75, 0.75]]
    assert chance and "chance (0.75)" in [t.get_text() for t in wmdp_ax.get_legend().get_texts()]
    assert not any("chance" in t.get_text() for t in tofu_ax.get_legend().get_texts())


@pytest.mark.parametrize("method", ["IdkDPO", "DPO", "RT", "LUNAR"])
def test_question_answer_methods_are_refused_on_passages(method, tmp_path):
    """A method that needs question / answer rows (`Method.needs_qa_rows`) is refused in one line at config
    validation on a benchmark whose corpora are passages (`Benchmark.passage_corpora`: WMDP); it still runs on
    TOFU, and a passage method runs on WMDP."""
    from cru_harness import plugins
    from cru_harness.runner.config import load_config
    from cru_harness.validation import ConfigError

    plugin = plugins.methods.get(method)
    assert plugin.unsupported("tofu") is None and plugins.methods.get("GA").unsupported("wmdp") is None
    assert "question / answer rows" in plugin.unsupported("wmdp")
    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "wmdp_zephyr.yaml").read_text())
    config["methods"] = [{"method": method}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=rf"methods\[0\]\.method.*{method} cannot run on wmdp: it trains on question"):
        load_config(path)
