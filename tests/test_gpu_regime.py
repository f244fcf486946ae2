"""Issue 12: the SmolLM2 regime configs (GPU run, its learning-rate sweep, the CPU fallback), what the runner
records on a GPU, the report's regime check and failed cells, and a report that regenerates byte for byte."""
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from cru_harness.benchmarks.tofu import report as tofu_report
from cru_harness.reporting import tables
from cru_harness.reporting.cli import write_report
from cru_harness.runner import config as cfg
from cru_harness.store import CellStore
from cru_harness.runner.loop import run_one
from cru_harness.runner.plan import build_plan

from conftest import load_benchmark
from test_report import synthetic_blocks, tofu_result, write_cells

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BASELINES = ("GA", "GD", "NPO", "SimNPO", "IdkDPO")


def _tofu_lr(method: cfg.MethodSpec, split: str) -> float:
    return method.hparams_for("tofu", split)["learning_rate"]


def test_gpu_config_is_the_issues_protocol():
    config = cfg.load_config(CONFIGS / "gpu_smollm2.yaml")
    assert config.seeds == (0, 1, 2) and config.device == "cuda"
    tofu_model, rwku_model = config.models
    assert tofu_model.path == rwku_model.path == "smollm2"
    assert tofu_model.benchmarks == ("tofu",) and rwku_model.benchmarks == ("rwku",) and rwku_model.finetune is None
    assert tofu_model.finetune["data"] == "full"
    # the oracles: the same recipe on the split's retain set, from the same model
    for split, data in (("forget01", "retain99"), ("forget10", "retain90")):
        spec = tofu_model.retain[split]
        assert spec.kind == "finetune" and spec.value == {**tofu_model.finetune, "data": data}
    tofu = config.benchmarks["tofu"]
    assert tofu["splits"] == ["forget01", "forget10"] and tofu["limit"] is None and config.evaluation["limit"] is None
    rwku = config.benchmarks["rwku"]
    assert rwku["targets"] == list(range(1, 21)) and rwku["limit"] is None
    assert rwku["select_known"]["top"] == 5 and rwku["select_known"]["rows"] is None
    assert "rwku_utility" in rwku["tasks"]
    methods = {m.method: m for m in config.methods}
    assert set(methods) == {*BASELINES, "ICU", "CRU"}
    # ONE learning rate for every TOFU baseline, on both splits
    assert len({_tofu_lr(methods[m], s) for m in BASELINES for s in tofu["splits"]}) == 1
    cru = methods["CRU"]
    tofu_cru, rwku_cru = cru.hparams_for("tofu", "forget10"), cru.hparams_for("rwku", None)
    assert (tofu_cru["lam"], tofu_cru["percentile"], tofu_cru["d_r"], tofu_cru["last_k"]) == (1, 95, 32, 4)
    assert (rwku_cru["lam"], rwku_cru["percentile"], rwku_cru["d_r"]) == (50, 90, 256)
    assert methods["IdkDPO"].benchmarks == ("tofu",) and methods["ICU"].benchmarks == ("rwku",)
    cells = build_plan(config, {"SmolLM2-135M": [1, 2, 3, 4, 5]})
    trained = [c for c in cells if c.kind == "method" and c.method != "ICU"]
    assert {c.seed for c in trained} == {0, 1, 2}
    assert sum(c.kind == "finetune" for c in cells) == 1 and sum(c.kind == "retain" for c in cells) == 2


def test_lr_sweep_is_on_an_unreported_split_with_the_same_model():
    sweep = cfg.load_config(CONFIGS / "gpu_smollm2_lr.yaml")
    main = cfg.load_config(CONFIGS / "gpu_smollm2.yaml")
    assert sweep.benchmarks["tofu"]["splits"] == ["forget05"]
    assert "forget05" not in main.benchmarks["tofu"]["splits"]
    assert sweep.models[0].identity() == main.models[0].identity()   # same fine-tuned model (same finetune cell)
    grid = {}
    for method in sweep.methods:
        grid.setdefault(method.method, set()).add(_tofu_lr(method, "forget05"))
    assert set(grid) == set(BASELINES) and len({frozenset(v) for v in grid.values()}) == 1   # one grid for all
    chosen = _tofu_lr(next(m for m in main.methods if m.method == "GA"), "forget10")
    assert chosen in grid["GA"]
    text = (CONFIGS / "gpu_smollm2_lr.yaml").read_text()
    assert "Selection rule" in text and "LARGEST" in text   # the rule is written down beside the grid


@pytest.mark.parametrize("name", ["cpu_smollm2", "cpu_smollm2_forget01"])
def test_cpu_config_is_a_stated_reduction_of_the_gpu_one(name):
    config = cfg.load_config(CONFIGS / f"{name}.yaml")
    assert config.device == "cpu" and config.output_dir == Path(f"results/{name}")
    model = config.models[0]
    assert model.path == "smollm2" and " + " in model.finetune["data"]
    assert config.benchmarks["tofu"]["limit"] or config.evaluation["limit"]
    assert {m.method for m in config.methods} >= {*BASELINES, "CRU"}
    header = (CONFIGS / f"{name}.yaml").read_text().split("\nname:")[0]
    assert "measured" in header and "GPU" in header   # the arithmetic, and what is owed


def test_cpu_forget01_config_changes_only_the_scale_its_header_states():
    """cpu_smollm2_forget01 is cpu_smollm2 on both forget01 authors: the data, the limit and the baselines' batch
    (so that they still make 10 steps, 2 of warm-up, in 2 epochs) change; the recipe, methods and evaluation do not."""
    from cru_harness.baselines.registry import make_config
    from cru_harness.training.engine import step_counts

    small, whole = (cfg.load_config(CONFIGS / f"{name}.yaml") for name in ("cpu_smollm2", "cpu_smollm2_forget01"))
    recipe = {**small.models[0].finetune, "data": None}
    assert {**whole.models[0].finetune, "data": None} == recipe
    assert whole.models[0].finetune["data"] == "retain99[:40] + forget01"
    assert whole.models[0].retain["forget01"].value == {**small.models[0].retain["forget01"].value,
                                                         "data": "retain99[:40]"}
    def block(config):   # the privacy task reaches both configs one after the other (each recomputed with it)
        tasks = [task for task in config.benchmarks["tofu"]["tasks"] if not task.startswith("tofu_privacy")]
        return {**config.benchmarks["tofu"], "limit": None, "forget_corpus": None, "retain_corpus": None,
                "tasks": tasks}

    assert block(whole) == block(small)
    assert whole.benchmarks["tofu"]["limit"] == 40   # forget01's whole evaluation set (40 rows)
    assert (whole.benchmarks["tofu"]["forget_corpus"], whole.benchmarks["tofu"]["retain_corpus"]) == \
        ("{split}", "retain99[:40]")
    lensless = [{k: v for k, v in c.evaluation.items() if k != "logit_lens"} for c in (whole, small)]
    assert lensless[0] == lensless[1] and (small.seeds, whole.seeds) == ((0,), (0, 1, 2))
    assert not whole.attacks and not small.attacks   # forget01's attacks: cpu_smollm2_forget01_robustness.yaml
    # forget01 adds the field's other methods at the baselines' rule (LUNAR at its own fit); the ones both run
    # change only the batch
    methods = [m.method for m in whole.methods]
    assert [m.method for m in small.methods] == [m for m in methods if m in {s.method for s in small.methods}]
    baseline_rule = {"learning_rate": 1e-4, "num_epochs": 2, "effective_batch_size": 8, "micro_batch_size": 8,
                     "warmup_epochs": 0.4}
    for m in whole.methods:
        if m.method not in {s.method for s in small.methods}:
            assert m.hparams_for("tofu", "forget01") == (baseline_rule if m.method != "LUNAR" else
                                                         {"refusal_prompts_path": "data/lunar/harmful.json"}), m.method
    for s in small.methods:
        w = next(m for m in whole.methods if m.method == s.method)
        hs, hw = s.hparams_for("tofu", "forget01"), w.hparams_for("tofu", "forget01")
        batch = ("effective_batch_size", "micro_batch_size")
        assert {k: v for k, v in hw.items() if k not in batch} == {k: v for k, v in hs.items() if k not in batch}
        if s.method in BASELINES:
            assert [hw[k] for k in batch] == [2 * hs[k] for k in batch]
            # 20 forget rows in micro-batches of 4, 40 in micro-batches of 8: the same steps
            assert step_counts(make_config(s.method, "tofu", "forget01", **hs), 20 // hs["micro_batch_size"], 1) == \
                step_counts(make_config(w.method, "tofu", "forget01", **hw), 40 // hw["micro_batch_size"], 1) == (10, 2)


def test_cpu_forget01_robustness_config_is_forget01_with_its_attacks():
    """The robustness run is forget01's run plus the attacks: the same settings besides name, output and
    `attacks:`, so its plan holds forget01's 57 cells under the same hashes (reused with --reuse) and an attack
    cell per (attack, attacked cell)."""
    import yaml

    whole, robust = (cfg.load_config(CONFIGS / f"{name}.yaml")
                     for name in ("cpu_smollm2_forget01", "cpu_smollm2_forget01_robustness"))
    raws = [yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
            for name in ("cpu_smollm2_forget01", "cpu_smollm2_forget01_robustness")]
    others = ("name", "output_dir", "attacks")
    assert {k: v for k, v in raws[0].items() if k not in others} == \
        {k: v for k, v in raws[1].items() if k not in others}
    assert {a.attack for a in robust.attacks} == {"detach", "quantize", "relearn", "in_context", "paraphrase"}
    plain, attacked = build_plan(whole), build_plan(robust)
    assert len(plain) == 57 and {c.hash for c in plain} < {c.hash for c in attacked}
    assert all(c.kind == "attack" for c in attacked if c.hash not in {p.hash for p in plain})


class _FakeCuda:
    """torch.cuda on a machine with two GPUs (test double): peaks of 3 and 5 MiB."""

    def __init__(self):
        self.resets = []

    def patch(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda i: self.resets.append(i))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: (3 if i == 0 else 5) * 2**20)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")


def _ga_cell(tmp_path):
    """A GA cell of a one-split plan: what the fake-CUDA tests run through the loop."""
    config = cfg.validate_config({"name": "g", "output_dir": str(tmp_path / "run"), "device": "cpu",
                                  "models": [{"name": "m", "path": "zoo:llama"}],
                                  "benchmarks": {"tofu": {"splits": ["forget01"]}}, "methods": ["GA"]})
    return build_plan(config)[-1]


def test_cuda_cells_record_gpu_name_and_peak_memory(tmp_path, monkeypatch):
    cell = _ga_cell(tmp_path)
    fake = _FakeCuda()
    fake.patch(monkeypatch)
    result, record = run_one(cell, tmp_path, lambda c, w: {"metrics": {}}, device="cuda:0")
    assert fake.resets == [0, 1]   # reset at the start: the peak is this cell's, not the process's
    assert result["resources"]["cell_peak_cuda_memory_bytes"] == 5 * 2**20
    assert result["resources"]["gpu_name"] == record["gpu_name"] == "NVIDIA H200"
    assert record["gpu_count"] == 2 and record["wall_time_s"] > 0 and "cell_peak_rss_bytes" in result["resources"]
    # a cell that broke CUDA is still recorded as failed, with its own error, and no GPU numbers
    def broken(i=None):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    result, record = run_one(cell, tmp_path, lambda c, w: broken(), device="cuda:0")
    assert result["status"] == "failed" and "device-side assert" in result["reason"]
    assert "cell_peak_cuda_memory_bytes" not in result["resources"]
    # a CPU cell records no GPU
    result, record = run_one(cell, tmp_path, lambda c, w: {"metrics": {}}, device="cpu")
    assert "gpu_name" not in result["resources"] and "gpu_name" not in record
    # the report's resources list the GPU and the cell's peak
    resources = tables.resources_table([{**tofu_result("m", "forget01", "GA", 0.5, 0.5),
                                          "resources": {"cell_peak_cuda_memory_bytes": 5 * 2**20,
                                                        "gpu_name": "NVIDIA H200"}}])
    assert "| tofu | m | GA | NVIDIA H200 | 5.0 | 1 |" in resources


class _LazyFakeCuda:
    """torch.cuda as a fresh process sees it (test double): resetting a counter before CUDA is initialised raises,
    as the real allocator does; peaks follow `allocate`."""

    def __init__(self):
        self.initialized, self.current, self.peak = False, 0, 0

    def _init(self):
        self.initialized = True

    def _reset(self, index):
        if not self.initialized:
            raise RuntimeError(f"Invalid device argument {index}: did you call init?")
        self.peak = self.current

    def allocate(self, transient: int, kept: int):
        self.peak, self.current = max(self.peak, transient), kept

    def patch(self, monkeypatch):
        for name, value in {"is_available": lambda: True, "device_count": lambda: 1, "init": self._init,
                            "is_initialized": lambda: self.initialized, "current_device": lambda: 0,
                            "reset_peak_memory_stats": self._reset, "synchronize": lambda i=None: self._init(),
                            "max_memory_allocated": lambda i=None: self.peak, "empty_cache": lambda: None,
                            "get_device_name": lambda i=None: "NVIDIA H200"}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_a_cells_gpu_peak_in_a_fresh_process_covers_loading_and_training(tmp_path, monkeypatch):
    from cru_harness.training.resources import ResourceMonitor

    cell = _ga_cell(tmp_path)
    fake = _LazyFakeCuda()
    fake.patch(monkeypatch)
    seen = {}

    def executor(c, w):
        fake.allocate(transient=150, kept=100)        # loading: a transient peak above the weights it keeps
        with ResourceMonitor("cuda:0") as monitor:    # training resets the same counter
            fake.allocate(transient=120, kept=100)
        seen["train_peak"] = monitor.record.peak_memory_bytes
        return {"metrics": {}}

    result, _ = run_one(cell, tmp_path, executor, device="cuda:0")
    # the first cell of a process that never touched CUDA: no "did you call init?" crash
    assert result["status"] == "ok" and fake.initialized
    assert seen["train_peak"] == 120                                  # training's own peak
    assert result["resources"]["cell_peak_cuda_memory_bytes"] == 150  # the cell's: loading included
    # the next cell starts its own measurement
    result, _ = run_one(cell, tmp_path, lambda c, w: fake.allocate(transient=110, kept=100) or {}, device="cuda:0")
    assert result["resources"]["cell_peak_cuda_memory_bytes"] == 110


def test_report_checks_the_regime_and_names_failed_cells(tmp_path):
    results = [tofu_result("M", "forget01", "Original", 0.5, 0.6, kind="original"),    # forget ROUGE-L 0.5
               tofu_result("M", "forget01", "Retain", 0.62, 0.6, kind="retain"),       # 0.38: gap 0.12, holds
               tofu_result("M", "forget10", "Original", 0.5, 0.6, kind="original"),    # 0.5
               tofu_result("M", "forget10", "Retain", 0.55, 0.6, kind="retain"),       # 0.45: gap 0.05, fails
               tofu_result("M", "forget01", "GA", 0.9, 0.5)]
    failed = {**tofu_result("M", "forget10", "NPO", 0.9, 0.5), "status": "failed", "metrics": {},
              "reason": "OutOfMemoryError: CUDA out of memory"}
    checks = {row["split"]: row for row in tofu_report.regime_check(results)}
    assert checks["forget01"]["gap"] == pytest.approx(0.12) and checks["forget01"]["holds"] is True
    assert checks["forget10"]["holds"] is False
    write_cells(tmp_path / "run", results + [failed])
    write_report([tmp_path / "run"], tmp_path / "out", plots=False, log=lambda *_: None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Regime check" in report
    assert "| M | forget01 | 0.50 | 0.38 | 0.12 |" in report and "| M | forget10 | 0.50 | 0.45 | 0.05 |" in report
    assert "**fails**" in report
    assert "- failed: M forget10 NPO: OutOfMemoryError: CUDA out of memory" in report


def test_report_regenerates_byte_for_byte(tmp_path):
    """`cru-harness report DIR` rewrites the report a run wrote (tables, stats, plots) with the same bytes."""
    from cru_harness.cli import main

    run = tmp_path / "run"
    write_cells(run, synthetic_blocks() + [tofu_result("M1", "forget01", "Retain", 0.2, 0.9, kind="retain")])
    write_report([CellStore(run).root], run / "report", log=lambda *_: None)   # as `cru-harness run` does
    first = {p.relative_to(run): p.read_bytes() for p in sorted((run / "report").rglob("*")) if p.is_file()}
    assert any(p.suffix == ".png" for p in first) and Path("report/report.md") in first
    assert main(["report", str(run)]) == 0
    second = {p.relative_to(run): p.read_bytes() for p in sorted((run / "report").rglob("*")) if p.is_file()}
    assert second.keys() == first.keys()
    assert [p for p in first if first[p] != second[p]] == []
    assert json.loads(first[Path("report/stats.json")])["tofu"]["friedman"]["status"] == "ok"


def _without_provenance(report_md: str) -> str:
    """report.md less its Provenance section, which names the checkout's code version (any later code change)."""
    head, _, rest = report_md.partition("## Provenance\n")
    return head + rest[rest.index("\n## "):] if rest else head


# The committed CPU runs whose report must regenerate (config, --scale, directory under results/); the git-ignore
# test reads the same list, so a landed run is named once.
COMMITTED_CPU_RUNS = [
    ("cpu_smollm2.yaml", None, "cpu_smollm2"), ("cpu_smollm2_forget01.yaml", None, "cpu_smollm2_forget01"),
    ("cpu_smollm2_lunar.yaml", None, "cpu_smollm2_lunar"),
    ("studies/options_report_forget01_cpu.yaml", None, "studies/options_report-cpu_smollm2_forget01"),
    ("studies/random_control.yaml", "cpu_smollm2_forget01.yaml", "studies/random_control-cpu_smollm2_forget01"),
    ("studies/lambda.yaml", "cpu_smollm2_forget01.yaml", "studies/lambda-cpu_smollm2_forget01"),
    ("studies/loss_shape.yaml", "cpu_smollm2_forget01.yaml", "studies/loss_shape-cpu_smollm2_forget01"),
    ("studies/percentile.yaml", "cpu_smollm2_forget01.yaml", "studies/percentile-cpu_smollm2_forget01"),
    ("studies/blocks.yaml", "cpu_smollm2_forget01.yaml", "studies/blocks-cpu_smollm2_forget01"),
    ("studies/gate_gap.yaml", "cpu_smollm2_forget01.yaml", "studies/gate_gap-cpu_smollm2_forget01")]


#: Runs computed by a campaign (benchmarks/cpu_campaign/): landed session by session from one pinned commit, a part
#: of the plan while it computes; the report says how many planned cells are still owed, and none once it is whole.
CAMPAIGN_CPU_RUNS = [("cpu_smollm2_forget01_robustness.yaml", None, "cpu_smollm2_forget01_robustness"),
                     ("cpu_smollm2_forget01_tuned.yaml", None, "cpu_smollm2_forget01_tuned"),
                     ("cpu_smollm2_forget01_tuned_robustness.yaml", None, "cpu_smollm2_forget01_tuned_robustness")]


@pytest.mark.parametrize("config_name, scale, name", COMMITTED_CPU_RUNS)
def test_committed_cpu_run_is_its_whole_plan_and_its_report_regenerates(config_name, scale, name, tmp_path,
                                                                         monkeypatch):
    """A committed CPU run (or study run at forget01's size) holds exactly its config's cells, finished, each
    computed from a committed (clean) tree; `cru-harness report` on those cells writes the committed tables,
    statistics and report again, byte for byte (plots aside: their bytes follow the matplotlib version; the
    Provenance section follows the code)."""
    committed, planned = _committed_run(config_name, scale, name)
    assert sorted(p.name for p in (committed / "cells").iterdir()) == sorted(planned)
    _check_committed_cells_and_report(committed, name, tmp_path, monkeypatch)


@pytest.mark.parametrize("config_name, scale, name", CAMPAIGN_CPU_RUNS)
def test_campaign_cpu_run_holds_planned_cells_of_one_commit_and_says_what_is_owed(config_name, scale, name,
                                                                                  tmp_path, monkeypatch):
    """A run landed part by part holds only its config's cells, finished clean by one code version (the campaign's
    pinned commit), and its report names the planned cells it still lacks, so that a part never reads as the whole
    (and the whole run names none). The one exception: the Original + attack controls, which the plans of the
    robustness campaign's pinned commit did not hold, may come from one later code version (docs/results.md says
    which, and that it computes the Original's numbers as the pinned commit does)."""
    committed, planned = _committed_run(config_name, scale, name)
    held = sorted(p.name for p in (committed / "cells").iterdir())
    assert held and set(held) <= set(planned)
    controls = _original_controls(config_name, scale)
    version = {p.parent.name: json.loads(p.read_text())["code_version"]
               for p in (committed / "cells").glob("*/run_record.json")}
    assert len({v for h, v in version.items() if h not in controls}) == 1, version
    assert len({v for h, v in version.items() if h in controls}) <= 1, version
    report = (committed / "report" / "report.md").read_text()
    owed = len(planned) - len(held)
    assert (f"**{owed} of {len(planned)} planned cell(s)" in report) == (owed > 0)
    _check_committed_cells_and_report(committed, name, tmp_path, monkeypatch)


def _table(text: str, header: str) -> list[str]:
    """The Markdown table that starts at line `header` in `text` (empty when no line is `header`)."""
    lines = text.splitlines()
    if header not in lines:
        return []
    start = lines.index(header)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("run, header, docs", [
    (CAMPAIGN_CPU_RUNS[0], "| Method | Gap |", ("docs/results.md",)),
    (CAMPAIGN_CPU_RUNS[2], "| Method | Gap |", ("docs/results.md",)),
    (CAMPAIGN_CPU_RUNS[2], "| Row | int4 |", ("README.md", "docs/results.md"))])
def test_the_docs_show_the_robustness_runs_matrix_as_its_report_writes_it(run, header, docs):
    """The docs copy a robustness run's method x attack matrices from its report: the recovery shares (`| Method |
    Gap |`) and the absolute levels beside the controls (`| Row |`), the tuned run's levels in the README's
    headline."""
    root = CONFIGS.parent
    committed, _ = _committed_run(*run)
    report = (committed / "report" / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith(header))
    matrix = _table(report, header)
    assert len(matrix) > 4
    for doc in docs:
        assert _table((root / doc).read_text(), header) == matrix, f"{doc}: not the report's matrix {header}"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_readme_headline_table_carries_the_tuned_runs_report_numbers():
    """Each row of the README's headline table that names a leaderboard row of the tuned run carries that report's
    numbers as it writes them: forget ROUGE-L (1 − the leaderboard's 1-ROUGE-L), MU and the correct-answer rate
    (means over seeds), Forget Quality and privleak with their item-bootstrap intervals (the privacy block); every
    leaderboard row has its row."""
    import csv

    committed, _ = _committed_run(*CAMPAIGN_CPU_RUNS[1])
    with open(committed / "report" / "leaderboard_tofu.csv", newline="") as handle:
        rows = {row["label"]: row for row in csv.DictReader(handle)}
    report = (committed / "report" / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| Model | Split | Row | privleak |"))
    privacy = {cells[2]: (cells[5], cells[3]) for cells in map(_cells, _table(report, header)[2:])}
    readme = (CONFIGS.parent / "README.md").read_text()
    table = _table(readme, "| method | setting | forget ROUGE-L ↓ | FQ ↑ | MU ↑ | privleak → 0 | forget answers |")
    seen = []
    for cells in map(_cells, table[2:]):
        row = rows.get(cells[0])
        if row is None:
            continue   # the oracle's row: no leaderboard row of its own
        assert cells[2] == f"{1 - float(row['forget_1_rouge_l']):.2f}", cells
        assert cells[4] == f"{float(row['model_utility']):.2f}", cells
        assert (cells[3], cells[5]) == privacy[cells[0]], cells
        assert cells[6].startswith(f"{round(100 * float(row['fc_forget_correct']))} % correct"), cells
        seen.append(cells[0])
    assert sorted(seen) == sorted(rows), "README.md: the headline table lacks a row of the tuned run's leaderboard"


@pytest.mark.parametrize("config_name, scale, name", CAMPAIGN_CPU_RUNS)
def test_the_docs_say_how_many_of_a_campaign_runs_cells_have_landed(config_name, scale, name):
    """docs/results.md's row of a run landed part by part names how many of its cells have landed ("N of M planned
    so far" while some are owed, "M (all planned)" once none is), and so does the README where it names an
    unfinished run: a landing that adds cells updates the docs with it."""
    root = CONFIGS.parent
    committed, planned = _committed_run(config_name, scale, name)
    held = len(list((committed / "cells").iterdir()))
    landed = f"{held} of {len(planned)} planned so far" if held < len(planned) else f"{held} (all planned)"
    rows = [line for line in (root / "docs" / "results.md").read_text().splitlines()
            if line.startswith(f"| `results/{name}/` |")]
    assert len(rows) == 1 and f"| {landed} |" in rows[0], f"docs/results.md: {name} has {landed}"
    readme = (root / "README.md").read_text()
    if held < len(planned) and f"`results/{name}/`" in readme:
        assert f"`results/{name}/`, {held} of its {len(planned)} cells so far" in readme


def _committed_run(config_name, scale, name):
    from cru_harness.studies.config import load_study

    committed = CONFIGS.parent / "results" / name
    if config_name.startswith("studies/"):
        return committed, [c.hash for c in build_plan(load_study(CONFIGS / config_name,
                                                                 scale=scale and CONFIGS / scale).config)]
    config = _load_campaign_config(CONFIGS / config_name)
    if config.tuning is None:
        return committed, [c.hash for c in build_plan(config)]
    # a tuned run: its validation cells, then the plan at the rule's choice once its landed cells let it choose
    store = CellStore(committed)
    validation, cells, _ = load_benchmark("cpu_campaign/worker").campaign_cells(
        config, lambda cell_hash: store.load_result(cell_hash, quiet=True))
    return committed, list(dict.fromkeys(c.hash for c in [*validation, *cells]))


def _load_campaign_config(path):
    """A shipped config, `tuning:` resolved, read where LUNAR's user-supplied refusal prompts exist (an entry naming
    `data/lunar/harmful.json` is refused without the file; the plan's hashes hold its path, not its bytes)."""
    import os
    import tempfile

    from cru_harness.runner.tuning import load_with_tuning

    here = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "data" / "lunar").mkdir(parents=True)
        (Path(scratch) / "data" / "lunar" / "harmful.json").write_text('["a harmful prompt"]')
        os.chdir(scratch)
        try:
            return load_with_tuning(path)
        finally:
            os.chdir(here)


def _original_controls(config_name, scale) -> set[str]:
    """The planned attack cells whose attacked cell is the Original (the controls issue 77 added to the plans)."""
    cells = build_plan(_load_campaign_config(CONFIGS / config_name))
    originals = {c.hash for c in cells if c.kind == "original"}
    return {c.hash for c in cells if c.kind == "attack" and c.extra["attacked"] in originals}


def _check_committed_cells_and_report(committed, name, tmp_path, monkeypatch):
    import shutil

    from cru_harness.cli import main

    for path in (committed / "cells").glob("*/run_record.json"):
        record = json.loads(path.read_text())
        assert record["status"] == "ok" and record["git"]["dirty"] is False, path
        assert json.loads((path.parent / "result.json").read_text())["status"] == "ok", path
    copy = tmp_path / "results" / name   # the same relative path: the report names its directory
    shutil.copytree(committed / "cells", copy / "cells")
    shutil.copy(committed / "plan.json", copy / "plan.json")
    if (committed / "tuning").is_dir():   # a tuned run's saved choice: its report's "Tuning" section reads it
        shutil.copytree(committed / "tuning", copy / "tuning")
    monkeypatch.chdir(tmp_path)
    assert main(["report", f"results/{name}"]) == 0
    written = {p.relative_to(copy / "report") for p in (copy / "report").rglob("*") if p.is_file()}
    assert written == {p.relative_to(committed / "report") for p in (committed / "report").rglob("*") if p.is_file()}
    for rel in sorted(written):
        if rel.suffix == ".png":
            continue
        new, old = (copy / "report" / rel).read_text(), (committed / "report" / rel).read_text()
        if rel.name == "report.md":
            new, old = _without_provenance(new), _without_provenance(old)
        assert new == old, rel


def _committed_studies():
    """Each committed study directory (results/studies/<name>-<scale>) with the config and --scale that wrote it:
    a `*_cpu` config that names the directory as its output, else configs/studies/<name>.yaml with --scale."""
    import yaml

    own = {}
    for path in sorted((CONFIGS / "studies").glob("*.yaml")):
        out = (yaml.safe_load(path.read_text()) or {}).get("output_dir")
        if out:
            own[Path(out).name] = (f"configs/studies/{path.name}", None)
    found = []
    for directory in sorted((CONFIGS.parent / "results" / "studies").iterdir()):
        name, _, scale = directory.name.partition("-")
        found.append((directory.name, *own.get(directory.name, (f"configs/studies/{name}.yaml",
                                                                 f"configs/{scale}.yaml"))))
    return found


@pytest.mark.parametrize("directory, config, scale", _committed_studies())
def test_committed_study_table_is_what_its_cells_say(directory, config, scale, tmp_path, monkeypatch):
    """`cru-harness study --table-only` on a copy of a committed study directory (its cells and saved analyses,
    no work/ files), with the seeds its table names, writes its committed tables again, byte for byte, but for
    the checkout's code version on the line naming the cells' other code: a table edited by hand, or a cell
    changed without its table, fails."""
    import re
    import shutil

    from cru_harness.cli import main

    repo = CONFIGS.parent
    committed = repo / "results" / "studies" / directory
    tables = {p.name: p.read_text() for p in (committed / "study").iterdir() if p.suffix in (".md", ".csv")}
    assert tables, directory
    copy = tmp_path / "results" / "studies" / directory   # the same relative paths: the tables name them
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("work", "*.png", "table.*", "gate_gap.*"))
    shutil.copytree(CONFIGS, tmp_path / "configs")
    for name in ("CRU_HARNESS_DATA_DIR", "CRU_HARNESS_TOFU_DIR", "CRU_HARNESS_RWKU_DIR"):
        # the tables say what the cells read (their run records), not what this environment names
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    seeds = re.search(r"^- seeds \[([0-9, ]+)\]:", tables["table.md"], re.M).group(1).replace(" ", "")
    assert main(["study", config, *(["--scale", scale] if scale else []), "--seeds", seeds, "--table-only"]) == 0
    written = {p.name: p.read_text() for p in (copy / "study").iterdir() if p.suffix in (".md", ".csv")}
    assert sorted(written) == sorted(tables)
    code = re.compile(r"than this table's \([0-9a-f]{16}\)")
    for name, text in tables.items():
        assert code.sub("", written[name]) == code.sub("", text), name


def test_report_of_one_run_uses_the_report_settings_its_config_named(tmp_path, capsys):
    """A run whose config asked for md and csv without plots: `cru-harness report DIR` writes those files again,
    not the CLI's every format; --formats still chooses; a bad recorded block is named in one line."""
    from cru_harness.cli import main

    run = tmp_path / "run"
    write_cells(run, synthetic_blocks())
    plan = {"config": {"report": {"formats": ["md", "csv"], "plots": False}}, "source": "configs/x.yaml",
            "shard": None, "cells": []}
    (run / "plan.json").write_text(json.dumps(plan))
    write_report([run], run / "report", formats=["md", "csv"], plots=False, log=lambda *_: None)  # as the run
    first = {p.relative_to(run): p.read_bytes() for p in sorted((run / "report").rglob("*")) if p.is_file()}
    assert main(["report", str(run)]) == 0
    assert "report settings: the run's config (configs/x.yaml)" in capsys.readouterr().out
    second = {p.relative_to(run): p.read_bytes() for p in sorted((run / "report").rglob("*")) if p.is_file()}
    assert second == first and not any(p.suffix in (".tex", ".png") for p in second)
    assert main(["report", str(run), "--formats", "tex"]) == 0
    assert (run / "report" / "leaderboard_tofu.tex").is_file()
    assert main(["report", str(run), "--formats", "md,pdf"]) == 2
    assert "--formats: report.formats[1]" in capsys.readouterr().err
    plan["config"]["report"] = {"formats": ["pdf"]}
    (run / "plan.json").write_text(json.dumps(plan))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.formats[0]" in err[0] and "'pdf'" in err[0]
    (run / "plan.json").write_text('{"config": {"report": ')   # a plan cut short (a full disk, a bad copy)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan.json: cannot read the run's plan" in err[0]


@pytest.mark.parametrize("name", ["gpu_smollm2.yaml", "gpu_smollm2_seed0.yaml", "gpu_smollm2_lr.yaml", "cpu_smollm2.yaml",
                                  "cpu_smollm2_forget01.yaml"])
def test_every_trained_cell_of_the_regime_configs_builds_its_training_config(name):
    """What a dry run cannot see: each cell's hyperparameters make a valid method config (e.g. SimNPO on
    forget01, which has no protocol preset, needs beta and forget_weight given)."""
    from cru_harness.cru.train import RouterTrainingConfig

    config = cfg.load_config(CONFIGS / name)
    cells = [c for c in build_plan(config, {"SmolLM2-135M": [1, 11]}) if c.kind == "method"]
    assert cells
    for cell in cells:
        if cell.method == "CRU":
            RouterTrainingConfig(**cell.hparams)
        elif hasattr(cell.method_plugin, "cell_config"):   # the baselines (GD-KL, TaskVector, ...: the plugin's name)
            cell.method_plugin.cell_config(cell)


def _swept(method, lr, mu, seed=0):
    return {**tofu_result("M", "forget05", f"{method} lr={lr:g}", 0.5, mu, seed=seed), "method": method,
            "hash": f"{method}-{lr}-{seed}", "hparams": {"learning_rate": lr}}


def test_lr_sweep_applies_the_stated_rule(tmp_path):
    from cru_harness.reporting.lr_sweep import sweep_choices

    original = tofu_result("M", "forget05", "Original", 0.0, 0.5, kind="original")   # threshold 0.9 x 0.5 = 0.45
    cells = [original,
             # 1e-5: MUs 0.50, 0.48, 0.46 -> median 0.48 >= 0.45: qualifies
             _swept("GA", 1e-5, 0.50), _swept("GD", 1e-5, 0.48), _swept("NPO", 1e-5, 0.46),
             # 3e-5: GA's two seeds average 0.45; median of 0.45, 0.47, 0.49 = 0.47: qualifies (the largest that does)
             _swept("GA", 3e-5, 0.40), _swept("GA", 3e-5, 0.50, seed=1), _swept("GD", 3e-5, 0.47),
             _swept("NPO", 3e-5, 0.49),
             # 1e-4: median of 0.0, 0.44, 0.9 = 0.44 < 0.45: fails although one method keeps MU high
             _swept("GA", 1e-4, 0.0), _swept("GD", 1e-4, 0.44), _swept("NPO", 1e-4, 0.9)]
    (entry,) = sweep_choices(cells)
    assert [row["qualifies"] for row in entry["rows"]] == [True, True, False]
    assert entry["rows"][1]["median_score"] == pytest.approx(0.47)
    assert entry["chosen"] == 3e-5
    # nothing qualifies -> the smallest learning rate; a forget metric never matters
    low = [original] + [{**c, "metrics": {**c["metrics"], "model_utility": 0.1, "forget_rouge_l": 0.0}}
                        for c in cells[1:]]
    (entry,) = sweep_choices(low)
    assert entry["chosen"] == 1e-5 and "smallest" in entry["reason"]
    # a run at one learning rate is not a sweep
    assert sweep_choices([original, _swept("GA", 1e-5, 0.5), _swept("GD", 1e-5, 0.5)]) == []
    # nor is a tuned run: methods at different learning rates, each at its own one
    assert sweep_choices([original, _swept("GA", 1e-4, 0.5), _swept("GA", 1e-4, 0.4, seed=1),
                          _swept("GD", 3e-5, 0.5), _swept("NPO", 3e-4, 0.5)]) == []
    write_cells(tmp_path / "run", cells)
    write_report([tmp_path / "run"], tmp_path / "out", plots=False, log=lambda *_: None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Learning-rate sweep: M forget05" in report and "Chosen: **3e-05**" in report


def _rwku_swept(method, lr, fb, qa, kind="method"):
    result = {"hash": f"rwku-{method}-{lr}", "kind": kind, "method": method, "label": f"{method} lr={lr}",
              "model": "M", "benchmark": "rwku", "split": None, "target": 23, "unit": "target23", "seed": 0,
              "status": "ok", "hparams": {"learning_rate": lr},
              "metrics": {"neighbor_fb": fb, "neighbor_qa": qa, "forget_fb": 0.0, "forget_qa": 0.0}}
    return result if kind == "method" else {**result, "label": "Original", "seed": None, "hparams": {}}


def test_lr_sweep_rule_reads_rwkus_neighbour_score_never_its_forget_probes(tmp_path):
    from cru_harness.reporting.lr_sweep import sweep_choices, sweep_markdown

    original = _rwku_swept("Original", None, 0.5, 0.3, kind="original")          # score 0.4: threshold 0.36
    cells = [original,
             # 1e-6: scores 0.40, 0.38, 0.39, 0.40 -> median 0.395: qualifies
             _rwku_swept("GA", 1e-6, 0.4, 0.4), _rwku_swept("GD", 1e-6, 0.36, 0.4),
             _rwku_swept("NPO", 1e-6, 0.38, 0.4), _rwku_swept("SimNPO", 1e-6, 0.4, 0.4),
             # 1e-5: 0.30, 0.37, 0.37, 0.40 -> median 0.37: qualifies, the largest that does
             _rwku_swept("GA", 1e-5, 0.3, 0.3), _rwku_swept("GD", 1e-5, 0.34, 0.4),
             _rwku_swept("NPO", 1e-5, 0.4, 0.34), _rwku_swept("SimNPO", 1e-5, 0.4, 0.4),
             # 1e-4: 0.0, 0.0, 0.35, 0.40 -> median 0.175: fails
             _rwku_swept("GA", 1e-4, 0.0, 0.0), _rwku_swept("GD", 1e-4, 0.0, 0.0),
             _rwku_swept("NPO", 1e-4, 0.3, 0.4), _rwku_swept("SimNPO", 1e-4, 0.4, 0.4)]
    (entry,) = sweep_choices(cells)
    assert (entry["benchmark"], entry["split"]) == ("rwku", "target23")
    assert entry["original_score"] == pytest.approx(0.4)
    assert [row["qualifies"] for row in entry["rows"]] == [True, True, False]
    assert entry["rows"][1]["median_score"] == pytest.approx(0.37) and entry["chosen"] == 1e-5
    # the forget probes never move the choice
    forgotten = [{**c, "metrics": {**c["metrics"], "forget_fb": 1.0, "forget_qa": 1.0}} for c in cells]
    assert sweep_choices(forgotten)[0]["chosen"] == 1e-5
    # a cell without both neighbour probes has no score: it is not counted
    partial = cells + [{**_rwku_swept("IdkDPO", 1e-4, 0.4, 0.4), "metrics": {"neighbor_fb": 0.4}}]
    assert sweep_choices(partial)[0]["rows"][2]["methods"] == ["GA", "GD", "NPO", "SimNPO"]
    text = "\n".join(sweep_markdown(cells))
    assert "Learning-rate sweep: M target23" in text and "neighbour ROUGE-L recall" in text
    assert "Chosen: **1e-05**" in text
    write_cells(tmp_path / "run", cells)           # and the run's report prints it under RWKU
    write_report([tmp_path / "run"], tmp_path / "out", plots=False, log=lambda *_: None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## RWKU" in report and "Chosen: **1e-05**" in report.split("## RWKU")[1]


def test_the_seed0_slice_is_gpu_smollm2s_own_cells():
    """configs/gpu_smollm2_seed0.yaml (what one GPU session can hold) must compute cells of gpu_smollm2.yaml
    itself, same hashes and directory, so the full run later finds them finished: its TOFU cells at seed 0."""
    full = cfg.load_config(CONFIGS / "gpu_smollm2.yaml")
    part = cfg.load_config(CONFIGS / "gpu_smollm2_seed0.yaml")
    assert part.output_dir == full.output_dir and list(part.seeds) == [0]
    full_cells = {c.hash: c for c in build_plan(full, {"SmolLM2-135M": [1, 11]})}
    part_cells = build_plan(part)
    expected = {h for h, c in full_cells.items() if c.benchmark == "tofu" and c.seed in (None, 0)}
    assert {c.hash for c in part_cells} == expected and len(expected) == 17


def test_the_gpu_session_scripts_parse():
    scripts = sorted((CONFIGS.parent / "benchmarks" / "gpu_session").glob("*.sh"))
    assert {s.name for s in scripts} >= {"prepare.sh", "call1.sh", "stash.sh", "run.sh", "env.sh", "rehearse.sh"}
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script


def test_rwku_lr_sweep_is_on_a_target_gpu_smollm2_never_scores():
    sweep = cfg.load_config(CONFIGS / "gpu_smollm2_rwku_lr.yaml")
    main = cfg.load_config(CONFIGS / "gpu_smollm2.yaml")
    assert sweep.device == "cuda" and sweep.models[0].identity() == main.models[1].identity()
    assert set(sweep.benchmarks["rwku"]["targets"]).isdisjoint({*main.benchmarks["rwku"]["targets"], 21})
    for key in ("limit", "forget_corpus", "retain_corpus"):
        assert sweep.benchmarks["rwku"][key] == main.benchmarks["rwku"][key], key
    assert {**sweep.benchmarks["rwku"]["select_known"], "top": 5} == main.benchmarks["rwku"]["select_known"]
    reported = {c.method: c for c in build_plan(main, {"SmolLM2-135M": [1]})
                if c.benchmark == "rwku" and c.kind == "method" and c.seed == 0}
    grid = {}
    for cell in (c for c in build_plan(sweep, {"SmolLM2-135M": [30]}) if c.kind == "method"):
        grid.setdefault(cell.method, set()).add(cell.hparams["learning_rate"])
        assert cell.hparams == {**reported[cell.method].hparams, "learning_rate": cell.hparams["learning_rate"]}
    assert set(grid) == {"GA", "GD", "NPO", "SimNPO"} and len({frozenset(v) for v in grid.values()}) == 1
    assert len(grid["GA"]) == 5
    assert "LARGEST" in (CONFIGS / "gpu_smollm2_rwku_lr.yaml").read_text().split("\nname:")[0]


GPU_STUDIES = sorted(p.name for p in (CONFIGS / "studies").glob("*.yaml") if "cpu" not in p.name)


@pytest.mark.parametrize("name", GPU_STUDIES)
def test_every_gpu_study_plans_the_real_regime_runs_own_model_oracles_and_baselines(name):
    """Issue 11 uses the real-regime run's fine-tuned model and oracles: a study's cells other than its CRU
    variants are gpu_smollm2's by hash (or its learning-rate sweep's, on forget05), so `cru-harness merge` hands
    them over instead of a second GPU fine-tune, whose weights need not be bitwise the same, and its baseline rows
    are the report's. An evaluation setting that differs (the batch size) would change every hash."""
    from cru_harness.studies.config import load_study

    runs = {c.hash for path in ("gpu_smollm2.yaml", "gpu_smollm2_lr.yaml")
            for c in build_plan(cfg.load_config(CONFIGS / path))}
    cells = build_plan(load_study(CONFIGS / "studies" / name).config)
    others = [c for c in cells if c.method != "CRU"]
    assert {c.kind for c in others} >= {"finetune", "retain", "original"}
    # options.yaml's baselines on forget05 run at the sweep's one chosen rate, which no plan fixes yet
    unshared = [c.describe() for c in others
                if c.hash not in runs and not (c.kind == "method" and c.split == "forget05")]
    assert unshared == []


def test_gpu_studies_paper_rows_are_the_real_regime_runs_cru_cells_under_their_own_labels():
    """Five studies hold a row at the paper's setting under a label of their own; a label enters no computation,
    so `--reuse results/gpu_smollm2` copies gpu_smollm2's CRU cells for those rows (`runner.plan.computation_key`)
    instead of training them again: 27 TOFU cells of GPU time (gate_gap's 6 only where their router bundles are
    still on the machine), and options_report's 15 RWKU ones (its five chosen targets, here stood in for by 1-5).
    loss_shape and random_control name their setting's defaults (suppress/pass loss, selection) in the method
    entry, which makes other cells, computed again."""
    from cru_harness.studies.config import load_study

    real = cfg.load_config(CONFIGS / "gpu_smollm2.yaml")
    chosen = {model.name: [1, 2, 3, 4, 5] for model in real.models}
    run = {c.computation: c for c in build_plan(real, chosen) if c.method == "CRU"}
    shared = {}
    for name in GPU_STUDIES:
        for cell in build_plan(load_study(CONFIGS / "studies" / name).config, chosen):
            if cell.method == "CRU" and cell.computation in run:
                origin = run[cell.computation]
                assert (cell.hash != origin.hash, origin.label, origin.seed) == (True, "CRU", cell.seed)
                shared.setdefault(name, Counter())[(cell.label, cell.benchmark)] += 1
    assert shared == {"blocks.yaml": {("CRU-last4", "tofu"): 6}, "gate_gap.yaml": {("CRU-paper", "tofu"): 6},
                      "lambda.yaml": {("CRU-lambda1", "tofu"): 3}, "percentile.yaml": {("CRU-p95", "tofu"): 6},
                      "options_report.yaml": {("CRU-paper", "tofu"): 6, ("CRU-paper", "rwku"): 15}}


def test_every_gpu_run_writes_where_git_ignores_it_until_it_is_committed():
    """On the GPU machine each call gets a fresh copy of the tree, and only git-ignored paths survive from one call
    to the next: a run's cells must be there to resume (benchmarks/gpu_session/run.sh). The CPU results stay
    tracked."""
    from cru_harness.studies.config import load_study

    repo = CONFIGS.parent
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout: .gitignore cannot be asked")
    outputs = [cfg.load_config(path).output_dir for path in sorted(CONFIGS.glob("gpu_*.yaml"))]
    outputs += [load_study(CONFIGS / "studies" / name).config.output_dir for name in GPU_STUDIES]
    assert len(outputs) >= 15
    ignored = subprocess.run(["git", "check-ignore", *map(str, outputs)], cwd=repo, capture_output=True, text=True)
    assert sorted(ignored.stdout.split()) == sorted(map(str, outputs))
    committed = [f"results/{name}" for *_, name in COMMITTED_CPU_RUNS + CAMPAIGN_CPU_RUNS] + [
        "results/studies/lambda-cpu_smollm2", "results/studies/overlap-cpu_smollm2_forget01", "results/demo"]
    assert subprocess.run(["git", "check-ignore", *committed], cwd=repo).returncode == 1   # none ignored


def test_sharded_runs_report_with_the_settings_their_config_named(tmp_path, capsys):
    """Shards write plan.shardIofN.json, not plan.json: `report` on a shard, and `merge` (which copies the plans),
    still write what the config's `report:` named (md and csv, no plots), not every format."""
    from cru_harness.cli import main

    blocks = synthetic_blocks()
    shards = []
    for i, part in enumerate((blocks[: len(blocks) // 2], blocks[len(blocks) // 2:]), start=1):
        shard = tmp_path / f"shard{i}"
        write_cells(shard, part)
        plan = {"config": {"report": {"formats": ["md", "csv"], "plots": False}}, "source": "configs/x.yaml",
                "shard": [i, 2], "cells": []}
        (shard / f"plan.shard{i}of2.json").write_text(json.dumps(plan))
        shards.append(str(shard))
    assert main(["report", shards[0]]) == 0
    assert "report settings: the run's config (configs/x.yaml)" in capsys.readouterr().out
    merged = tmp_path / "merged"
    assert main(["merge", *shards, "--out", str(merged)]) == 0
    for written in (Path(shards[0]) / "report", merged / "report"):
        suffixes = {p.suffix for p in written.rglob("*") if p.is_file()}
        assert ".md" in suffixes and ".csv" in suffixes and not suffixes & {".tex", ".png"}, (written, suffixes)
