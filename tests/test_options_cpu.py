"""Issue 11's options study at the reduced CPU scale (configs/studies/options_cpu.yaml, the choice, and
options_report_cpu.yaml, the report): what makes the choice honest (an author the report never forgets and its
model never saw), the report's reuse of results/cpu_smollm2's cells, one option changed at a time, and a retain
corpus that never trains on an evaluated probe."""
from pathlib import Path

import pytest

from cru_harness.data.corpora import load_corpus_rows
from cru_harness.benchmarks.tofu.data import load_tofu
from cru_harness.runner import config as cfg
from cru_harness.runner.plan import build_plan
from cru_harness.studies.config import load_study

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER = {"lam": 1, "percentile": 95, "d_r": 32, "last_k": 4}


def _load(name):
    return load_study(CONFIGS / "studies" / name).config


#: The methods the studies ran beside CRU's options; the run configs gained the field's other methods later.
STUDIED = {"GA", "GD", "NPO", "SimNPO", "IdkDPO", "CRU"}


def as_studied(name, seeds=None):
    """A run config as the studies ran on it: without the TOFU privacy task and the methods added after them (the
    studies' cells carry that plan's hashes; those additions change a cell's tasks, not its other settings)."""
    import copy

    raw = copy.deepcopy(cfg.load_config(CONFIGS / name).raw)
    tofu = raw["benchmarks"]["tofu"]
    tofu["tasks"] = [task for task in tofu["tasks"] if not task.startswith("tofu_privacy")]
    raw["methods"] = [m for m in raw["methods"] if m["method"] in STUDIED]
    raw.pop("attacks", None)
    raw.get("evaluation", {}).pop("logit_lens", None)
    if seeds is not None:
        raw["seeds"] = seeds
    return cfg.validate_config(raw, source=str(CONFIGS / name))


def test_the_report_computes_cpu_smollm2s_own_cells_and_adds_only_cru_options():
    reduced = as_studied("cpu_smollm2.yaml")
    report = _load("options_report_cpu.yaml")
    assert report.output_dir == Path("results/studies/options_report-cpu_smollm2")
    shared = {c.hash for c in build_plan(reduced)}
    cells = build_plan(report)
    assert len(shared) == 9 and shared <= {c.hash for c in cells}
    added = [c for c in cells if c.hash not in shared]
    assert report.seeds == (0, 1, 2) and reduced.seeds == (0,)
    assert len(added) == 7 + 13 * 2 and {c.method for c in added if c.seed == 0} == {"CRU"}
    # cpu_smollm2 at seeds 0-2 (the README's three-seed table) is exactly the report's cells of its methods
    every_seed = {c.hash for c in build_plan(as_studied("cpu_smollm2.yaml", seeds=[0, 1, 2]))}
    assert len(every_seed) == 21 and every_seed <= {c.hash for c in cells}


def test_the_forget01_report_is_cpu_smollm2_forget01s_run_with_the_options_that_survived_the_choice():
    """options_report_forget01_cpu.yaml: configs/cpu_smollm2_forget01.yaml's 21 cells (the same hashes, so they
    are reused), plus the three options of options_report_cpu.yaml its header names, each at seeds 0-2 and
    changed from the paper setting exactly as there."""
    run = as_studied("cpu_smollm2_forget01.yaml")
    report = _load("options_report_forget01_cpu.yaml")
    assert report.output_dir == Path("results/studies/options_report-cpu_smollm2_forget01")
    shared = {c.hash for c in build_plan(run)}
    cells = build_plan(report)
    assert len(shared) == 21 and shared <= {c.hash for c in cells} and report.seeds == run.seeds == (0, 1, 2)
    added = [c for c in cells if c.hash not in shared]
    options = {"CRU-mlp-site", "CRU-exclude-top1pct", "CRU-lambda10"}
    assert len(added) == 3 * 3 and {c.label for c in added} == options
    smaller = {m.label: m for m in _load("options_report_cpu.yaml").methods}
    for method in (m for m in report.methods if m.method == "CRU"):   # the baselines: cpu_smollm2_forget01's
        assert (method.hparams, method.corpora) == (smaller[method.label].hparams, smaller[method.label].corpora)


def test_the_choice_forgets_an_author_the_report_never_does(tofu_dir):
    choice, report = _load("options_cpu.yaml"), _load("options_report_cpu.yaml")
    assert choice.output_dir == Path("results/studies/options-cpu_smollm2") and choice.seeds == (0,)
    assert choice.benchmarks["tofu"]["splits"] == ["forget05"] and report.benchmarks["tofu"]["splits"] == ["forget01"]
    questions = {}
    for name, config in (("choice", choice), ("report", report)):
        (cell,) = [c for c in build_plan(config) if c.kind == "method" and c.method == "GA" and c.seed == 0]
        questions[name] = {r["question"] for r in load_corpus_rows(cell.corpora["forget_corpus"], tofu_dir)[0]}
        tuned = {r["question"] for r in load_corpus_rows(config.models[0].finetune["data"], tofu_dir)[0]}
        assert questions[name] <= tuned                 # each run forgets what its own model was fine-tuned on
        questions[f"{name} model"] = tuned
    assert len(questions["choice"]) == len(questions["report"]) == 20
    assert not questions["choice"] & questions["report model"]   # the reported model never saw the choice's author
    assert not questions["report"] & questions["choice model"]   # and the choice never saw the reported author


def test_both_configs_compare_the_same_options_each_one_change_from_the_paper():
    choice, report = _load("options_cpu.yaml"), _load("options_report_cpu.yaml")
    assert [(m.label, m.hparams, m.corpora) for m in choice.methods] == \
           [(m.label, m.hparams, m.corpora) for m in report.methods]
    cru = [m for m in choice.methods if m.method == "CRU"]
    paper = cru[0]
    assert paper.label == "CRU" and paper.hparams == PAPER and not paper.corpora
    for option in cru[1:]:
        changed = {k for k in {**option.hparams, **PAPER} if option.hparams.get(k) != PAPER.get(k)}
        assert len(changed) + len(option.corpora) == 1, option.label
    assert {m.label for m in cru} >= {"CRU-mlp-site", "CRU-rms-learned-input", "CRU-exclude-top1pct",
                                      "CRU-retain-cover"}


def test_the_retain_cover_corpus_never_trains_on_an_evaluated_probe(tofu_dir):
    for name in ("options_cpu.yaml", "options_report_cpu.yaml"):
        config = _load(name)
        limit = config.benchmarks["tofu"]["limit"]
        (cover,) = [m for m in config.methods if m.label == "CRU-retain-cover"]
        trained = {r["question"] for r in load_corpus_rows(cover.corpora["retain_corpus"], tofu_dir)[0]}
        for evaluated_set, source in (("real_authors_perturbed", "real_authors"),
                                      ("world_facts_perturbed", "world_facts")):
            scored = {r["question"] for r in load_tofu(evaluated_set, tofu_dir)[:limit]}
            assert len(scored) == limit and not scored & trained
            assert len(trained & {r["question"] for r in load_tofu(source, tofu_dir)}) == 20


@pytest.mark.parametrize("name, reference, n_shared, label, change", [
    ("retain_batch_choice_cpu.yaml", "options_cpu.yaml", 4, "CRU-retain-batch4", {"retain_batch_ratio": 4}),
    ("retain_batch_cpu.yaml", "options_report_cpu.yaml", 3 + 3, "CRU-retain-batch4", {"retain_batch_ratio": 4}),
    ("router_init_choice_cpu.yaml", "options_cpu.yaml", 4, "CRU-open-init", {"router_init": "open"}),
    ("router_init_cpu.yaml", "options_report_cpu.yaml", 3 + 3, "CRU-open-init", {"router_init": "open"}),
])
def test_later_option_studies_share_the_options_cells_and_change_one_thing(name, reference, n_shared, label,
                                                                               change):
    """The batch-composition and router-init studies: the paper setting's cells are options_cpu's /
    options_report_cpu's (same hashes, so the recomputation is a reproduction check), and the option changes one
    hyperparameter."""
    cells, shared = build_plan(_load(name)), {c.hash for c in build_plan(_load(reference))}
    added = [c for c in cells if c.hash not in shared]
    assert {c.label for c in added} == {label} and len(added) == len(_load(name).seeds)
    assert len(cells) - len(added) == n_shared
    assert {c.kind for c in cells if c.hash in shared} == {"finetune", "retain", "original", "method"}
    (paper,) = {c.hash: c for c in cells if c.label == "CRU" and c.seed == 0}.values()
    for cell in added:
        assert cell.hparams == {**paper.hparams, **change} and cell.corpora == paper.corpora


def test_the_rwku_report_is_options_reports_rwku_rows_reduced_only_as_its_header_says():
    """options_report_rwku_cpu.yaml: the GPU report's RWKU methods (IdkDPO and CRU-lambda10 are TOFU only there), at
    the same hyperparameters but for the stated cuts (128-token passages; the baselines' one swept learning rate,
    rows *-scaled); every CRU option one change from the paper's RWKU setting; the cover joins as many neighbour
    questions of the GPU list as retain passages."""
    reduced, full = _load("options_report_rwku_cpu.yaml"), _load("options_report.yaml")
    assert reduced.output_dir == Path("results/studies/options_report_rwku-cpu_smollm2")
    assert reduced.seeds == full.seeds == (0, 1, 2)
    targets = {"SmolLM2-135M": [2]}
    cells = [c for c in build_plan(reduced, targets) if c.kind == "method" and c.seed in (0, None)]
    reference = {c.label: c for c in build_plan(full, targets)
                 if c.kind == "method" and c.seed in (0, None) and c.benchmark == "rwku"}
    scaled = {f"{m}-scaled": m for m in ("GA", "GD", "NPO", "SimNPO")}
    assert {scaled.get(c.label, c.label) for c in cells} == set(reference) == {
        "GA", "GD", "NPO", "SimNPO", "ICU", "CRU-paper", "CRU-mlp-site", "CRU-rms-input", "CRU-rms-learned-input",
        "CRU-exclude-top1pct", "CRU-epochs20", "CRU-retain-batch4", "CRU-retain-cover"}
    rates = set()
    for cell in cells:
        cut = {"max_length": 128} if cell.method != "ICU" else {}
        if cell.label in scaled:
            rates.add(cell.hparams["learning_rate"])
            cut["learning_rate"] = cell.hparams["learning_rate"]
        assert cell.hparams == {**reference[scaled.get(cell.label, cell.label)].hparams, **cut}, cell.label
    # one for all four: the rate cpu_smollm2_rwku_lr.yaml's rule chooses on its committed cells
    from cru_harness.reporting.lr_sweep import sweep_choices
    from cru_harness.store import load_results

    (choice,) = sweep_choices(load_results(Path(__file__).resolve().parents[1] / "results" / "cpu_smollm2_rwku_lr"))
    assert rates == {choice["chosen"]} == {1e-4}
    rwku_paper = {"lam": 50, "percentile": 90, "d_r": 256, "last_k": 4, "max_length": 128}
    by_label = {c.label: c for c in cells}
    assert {k: by_label["CRU-paper"].hparams.get(k) for k in rwku_paper} == rwku_paper
    for label, cell in by_label.items():
        if label.startswith("CRU-") and label != "CRU-paper":
            paper = by_label["CRU-paper"]
            changed = {k for k in {**cell.hparams, **paper.hparams} if cell.hparams.get(k) != paper.hparams.get(k)}
            changed |= {k for k in {**cell.corpora, **paper.corpora} if cell.corpora.get(k) != paper.corpora.get(k)}
            assert len(changed) == 1, (label, changed)
    assert by_label["CRU-paper"].corpora["retain_corpus"] == "rwku:21:passage[:24]"
    cover = by_label["CRU-retain-cover"].corpora["retain_corpus"]
    full_cover = reference["CRU-retain-cover"].corpora["retain_corpus"]
    assert cover.split(" + ")[0] == "rwku:21:passage[:24]"
    assert cover.split(" + ")[1].replace("[:24]", "") == full_cover.split(" + ")[1].replace("[:63]", "")


def test_the_rwku_baselines_learning_rate_is_swept_on_targets_the_report_never_scores():
    """configs/cpu_smollm2_rwku_lr.yaml: one grid for the four RWKU baselines, each otherwise at the report's
    hyperparameters, on candidate targets disjoint from the report's (and from its retain target 21)."""
    sweep = cfg.load_config(CONFIGS / "cpu_smollm2_rwku_lr.yaml")
    report = _load("options_report_rwku_cpu.yaml")
    assert set(sweep.benchmarks["rwku"]["targets"]).isdisjoint({*report.benchmarks["rwku"]["targets"], 21})
    for key in ("select_known", "limit", "forget_corpus", "retain_corpus"):
        assert sweep.benchmarks["rwku"][key] == report.benchmarks["rwku"][key], key
    assert set(sweep.benchmarks["rwku"]["tasks"]) <= set(report.benchmarks["rwku"]["tasks"])
    swept = [c for c in build_plan(sweep, {"SmolLM2-135M": [25]}) if c.kind == "method"]
    reported = {c.method: c for c in build_plan(report, {"SmolLM2-135M": [2]})
                if c.kind == "method" and c.seed == 0 and c.label.endswith("-scaled")}
    grid = {}
    for cell in swept:
        grid.setdefault(cell.method, set()).add(cell.hparams["learning_rate"])
        assert cell.hparams == {**reported[cell.method].hparams, "learning_rate": cell.hparams["learning_rate"]}
    assert set(grid) == {"GA", "GD", "NPO", "SimNPO"} and all(v == {1e-6, 1e-5, 1e-4} for v in grid.values())
    header = (CONFIGS / "cpu_smollm2_rwku_lr.yaml").read_text().split("\nname:")[0]
    assert "Selection rule" in header and "LARGEST" in header
