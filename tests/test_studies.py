"""Studies (`cru-harness study`, configs/studies/): config validation, the table's statistics, the gate-gap and
collapsed-router arithmetic, and each study end to end on the tiny testbed models (slow).

The end-to-end tests run the committed study configs through `tiny_study`, which only swaps the model and data for
the tiny testbed (and shrinks epochs, limits, variants): the study code path is the one the real configs take.
`loss_shape` and `options*` exercise the CRU options (suppress_loss / pass_loss, gate_site, input_norm
rms_learned, exclude_top_magnitude, retain_batch_ratio) end to end.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cru_harness.cli import main
from cru_harness.reporting.plots import file_slug
from cru_harness.runner.config import ConfigError
from cru_harness.runner.plan import build_plan
from cru_harness.studies.analyses import gate_auc, subsample
from cru_harness.studies.config import load_study, validate_study
from cru_harness.studies.tables import study_rows

torch.set_num_threads(1)  # 2 shared cores: as tests/test_runner_e2e.py, one thread is faster under contention

REPO_ROOT = Path(__file__).resolve().parents[1]
STUDIES = REPO_ROOT / "configs" / "studies"
NAMES = ("percentile", "lambda", "random_control", "blocks", "overlap", "gate_gap", "loss_shape", "options", "router_lr",
         "options_report")


# ------------------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name", NAMES)
def test_committed_study_configs_validate_on_the_smollm2_tofu_setup(name):
    study = load_study(STUDIES / f"{name}.yaml")
    config = study.config
    assert config.output_dir == Path("results/studies") / name
    assert config.seeds == (0, 1, 2)
    tofu_models = [m for m in config.models if "tofu" in m.benchmarks]
    assert [m.path for m in tofu_models] == ["smollm2"] and tofu_models[0].finetune["data"] == "full"
    assert {spec.kind for spec in tofu_models[0].retain.values()} == {"finetune"}  # FQ's oracle per split
    rows = [(m.label, bench) for m in config.methods for bench in m.benchmarks]   # a table row per benchmark
    assert len(rows) == len(set(rows)) and any(m.method == "CRU" for m in config.methods)


def test_lambda_and_percentile_configs_sweep_the_issues_values():
    lam = load_study(STUDIES / "lambda.yaml")
    assert [m.hparams["lam"] for m in lam.config.methods] == [0.5, 1, 10, 50, 100]
    assert lam.spec.x == "lam" and lam.spec.collapse_line
    p = load_study(STUDIES / "percentile.yaml")
    assert [m.hparams["percentile"] for m in p.config.methods] == [85, 90, 95, 99]
    assert p.config.benchmarks["tofu"]["splits"] == ["forget01", "forget10"]
    overlap = load_study(STUDIES / "overlap.yaml")
    assert overlap.spec.kind == "overlap" and list(overlap.spec.examples) == [40, "all"]


def _raw(**study):
    return {"name": "s", "models": [{"name": "m", "path": "zoo:llama:finetuned"}],
            "benchmarks": {"tofu": {"data_dir": "testbed:world", "splits": ["forget10"]}},
            "methods": [{"method": "CRU", "lambda": 1}], "study": {"kind": "sweep", **study}}


@pytest.mark.parametrize("raw, key", [
    ({**_raw(), "study": None}, "study"),
    (_raw(kind="sweeps"), "study.kind"),
    (_raw(collapse_line=True), "study.collapse_line"),          # the line needs x: lam
    (_raw(x="lamda"), "study.x"),                                # not a CRU hyperparameter: no x column, no plot
    (_raw(x="lam", collapse_line="yes please"), "study.collapse_line"),
    (_raw(x="lam", examples=[1]), "study.examples"),
    (_raw(colour="red"), "study.colour"),
    (_raw(note=""), "study.note"),
    (_raw(note=["a"]), "study.note"),
    ({**_raw(), "methods": [{"method": "GA"}], "study": {"kind": "overlap"}}, "study.kind"),
])
def test_bad_study_blocks_name_the_key(raw, key):
    if raw.get("study") is None:
        raw = {k: v for k, v in raw.items() if k != "study"}
    with pytest.raises(ConfigError) as err:
        validate_study(raw, source="s.yaml")
    assert err.value.key == key


def test_a_sweeps_x_may_use_the_alias_the_methods_use_and_is_read_by_its_recorded_name():
    assert validate_study(_raw(x="lambda")).spec.x == "lam"   # results record `lam`: the table reads that column
    with pytest.raises(ConfigError, match="expected true or false, got 'yes please'"):
        validate_study(_raw(x="lam", collapse_line="yes please"))


def test_study_cli_reports_a_bad_config_in_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_raw(kind="nope")))
    assert main(["study", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study.kind" in err[0] and "Traceback" not in err[0]


@pytest.mark.slow
def test_study_shards_split_the_cells_and_the_table_waits_for_the_run_without_shard(tmp_path, capsys):
    out = tmp_path / "percentile"
    config = str(tiny_study("percentile", out))
    assert main(["study", config, "--shard", "1/2"]) == 0
    first = {r["hash"] for r in _results(out)}
    assert first and not (out / "study").exists()          # a shard's cells alone make no table
    assert "without --shard" in capsys.readouterr().out
    assert main(["study", config, "--shard", "2/2"]) == 0
    both = {r["hash"]: r for r in _results(out)}
    assert first < set(both)                                # the second shard ran the other cells
    stamps = {h: (out / "cells" / h / "result.json").stat().st_mtime_ns for h in both}
    assert main(["study", config]) == 0
    _check_sweep(out, [m["label"] for m in yaml.safe_load(Path(config).read_text())["methods"]])
    # the table came from the shards' cells: none was computed again
    assert {h: (out / "cells" / h / "result.json").stat().st_mtime_ns for h in both} == stamps


@pytest.mark.slow
def test_table_only_rewrites_the_table_from_finished_cells_and_names_other_code(tmp_path, capsys):
    out = tmp_path / "percentile"
    config = str(tiny_study("percentile", out))
    assert main(["study", config]) == 0
    table = (out / "study" / "table.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/result.json")}
    (out / "study" / "table.md").unlink()
    assert main(["study", config, "--table-only"]) == 0
    assert (out / "study" / "table.md").read_text() == table       # same code, same cells: the same table
    # a cell computed by another code version is read as it is, and the header says which code computed it
    record_path = sorted(out.glob("cells/*/run_record.json"))[0]
    record = json.loads(record_path.read_text())
    record["inputs"]["code_version"] = "0123456789abcdef"
    record_path.write_text(json.dumps(record))
    assert main(["study", config, "--table-only"]) == 0
    rewritten = (out / "study" / "table.md").read_text()
    assert "cells computed by other code than this table's" in rewritten and "0123456789abcdef" in rewritten
    assert rewritten.replace(next(l for l in rewritten.splitlines() if "other code" in l) + "\n", "") == table
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/result.json")} == stamps   # nothing ran
    capsys.readouterr()
    assert main(["study", config, "--table-only", "--shard", "1/2"]) == 2
    assert "--table-only" in capsys.readouterr().err


def test_a_study_table_names_the_rwku_targets_select_known_chose():
    from cru_harness.studies.run import header_lines

    study = load_study(STUDIES / "options_report_rwku_cpu.yaml")
    (line,) = [l for l in header_lines(study, {"SmolLM2-135M": [2]}) if l.startswith("- scale rwku")]
    assert "targets SmolLM2-135M: [2], the top 1 of candidates [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" in line
    (line,) = [l for l in header_lines(study) if l.startswith("- scale rwku")]
    assert "targets not chosen yet" in line
    noted = validate_study({**yaml.safe_load((STUDIES / "options_report_rwku_cpu.yaml").read_text()),
                            "study": {"kind": "sweep", "title": "t", "note": "GA at\n  its preset: seed 0 only."}})
    assert header_lines(noted)[-1] == "- note: GA at its preset: seed 0 only."


def test_study_shard_is_checked_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "overlap"
    assert main(["study", str(tiny_study("overlap", out)), "--shard", "1/2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shard" in err[0] and "Traceback" not in err[0]
    assert main(["study", str(tiny_study("percentile", tmp_path / "p")), "--shard", "3/2"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "p" / "cells").exists()


def test_scale_runs_a_study_on_another_configs_models_and_benchmarks(capsys):
    # demo.yaml: a tiny TOFU model and SmolLM2 on RWKU; the TOFU-only lambda study keeps only the TOFU part
    study = load_study(STUDIES / "lambda.yaml", {"seeds": [0]}, scale=REPO_ROOT / "configs" / "demo.yaml")
    config = study.config
    assert [m.name for m in config.models] == ["tiny-llama"] and list(config.benchmarks) == ["tofu"]
    assert config.benchmarks["tofu"]["data_dir"] == "testbed:world" and config.seeds == (0,)
    assert config.output_dir == Path("results/studies/lambda-demo")
    assert [m.label for m in config.methods] == [f"CRU-lambda{v}" for v in ("0_5", "1", "10", "50", "100")]
    assert study.spec.scale.endswith("demo.yaml") and study.spec.collapse_line
    # the study's own tasks: demo.yaml scores TOFU's default tasks (its privacy task too), the study lists four
    assert config.benchmarks["tofu"]["tasks"] == ["tofu_{split}", "tofu_retain", "tofu_real_authors",
                                                  "tofu_world_facts"]
    # and its own logit-lens setting: a scale that reads the lens (forget01's campaign) leaves a study's cells alone
    from cru_harness.studies.config import apply_scale

    raw, scale = {"study": {}, "benchmarks": {"tofu": {}}}, {"benchmarks": {"tofu": {}}, "evaluation": {
        "batch_size": 8, "logit_lens": True}}
    assert apply_scale(raw, scale, "s.yaml")["evaluation"] == {"batch_size": 8}
    asked = {**raw, "evaluation": {"logit_lens": True}}
    assert apply_scale(asked, scale, "s.yaml")["evaluation"] == {"batch_size": 8, "logit_lens": True}
    lensless = {**scale, "evaluation": {"batch_size": 8}}   # a scale without the key keeps the study's too
    assert apply_scale(asked, lensless, "s.yaml")["evaluation"] == {"batch_size": 8, "logit_lens": True}
    from cru_harness.studies.run import header_lines

    assert any("configs/demo.yaml" in line and "--scale" in line for line in header_lines(study))
    # the CLI: a dry run plans the tiny cells; a scale config sharing no benchmark is one clear line
    assert main(["study", str(STUDIES / "lambda.yaml"), "--scale", str(REPO_ROOT / "configs" / "ci_minimal.yaml"),
                 "--seeds", "0", "--dry-run"]) == 0
    assert "results/studies/lambda-ci_minimal" in capsys.readouterr().out
    # the reduced CPU SmolLM2 setup the issue allows without a GPU
    assert main(["study", str(STUDIES / "percentile.yaml"), "--scale", str(REPO_ROOT / "configs" / "cpu_smollm2.yaml"),
                 "--seeds", "0", "--dry-run"]) == 0
    assert "results/studies/percentile-cpu_smollm2" in capsys.readouterr().out
    assert main(["study", str(STUDIES / "lambda.yaml"), "--scale",
                 str(REPO_ROOT / "configs" / "paper_rwku.yaml"), "--dry-run"]) == 2
    assert "configures none of the study's benchmarks (tofu)" in capsys.readouterr().err
    assert main(["study", str(STUDIES / "lambda.yaml"), "--seeds", "zero", "--dry-run"]) == 2
    assert "--seeds" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- arithmetic
def test_gate_auc_is_the_probability_a_retain_token_passes_more():
    assert gate_auc(np.array([0.1, 0.2]), np.array([0.8, 0.9])) == 1.0
    assert gate_auc(np.array([0.8, 0.9]), np.array([0.1, 0.2])) == 0.0
    assert gate_auc(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == 0.5
    # 3 of 4 (retain, forget) pairs ordered: 0.75
    assert gate_auc(np.array([0.2, 0.6]), np.array([0.4, 0.8])) == pytest.approx(0.75)


def test_subsample_is_seeded_and_keeps_corpus_order():
    texts = [f"t{i}" for i in range(100)]
    a, b = subsample(texts, 40, 3), subsample(texts, 40, 3)
    assert a == b and len(set(a)) == 40 and a == sorted(a, key=texts.index)
    assert subsample(texts, 40, 4) != a
    assert subsample(texts, "all", 0) == texts and subsample(texts, 500, 0) == texts


def _cell(label, seed, benchmark="tofu", **metrics):
    return {"status": "ok", "kind": "method", "label": label, "seed": seed, "model": "m", "benchmark": benchmark,
            "split": "forget10" if benchmark == "tofu" else None, "hparams": {"lam": 2}, "metrics": metrics,
            "gate_means": {"forget": 0.1 * (seed + 1), "retain": 0.9}, "resources": {"train_wall_time_s": 1.0}}


def test_study_rows_are_mean_and_sample_sd_over_seeds():
    results = [_cell("CRU", 0, forget_rouge_l=0.2, model_utility=0.5),
               _cell("CRU", 1, forget_rouge_l=0.4, model_utility=0.7),
               # RWKU: two targets in seed 0 (mean 0.3), one in seed 1 (0.5) -> seeds' mean 0.4
               _cell("CRU", 0, "rwku", forget_fb=0.2), _cell("CRU", 0, "rwku", forget_fb=0.4),
               _cell("CRU", 1, "rwku", forget_fb=0.5),
               {**_cell("GA", 0), "status": "failed"}]
    rows = {r["benchmark"]: r for r in study_rows(results, ["CRU", "GA"], x="lam")}
    assert set(rows) == {"tofu", "rwku"}                          # the failed cell is no row
    tofu = rows["tofu"]
    assert tofu["seeds"] == [0, 1] and tofu["x"] == 2
    mean, sd, n = tofu["stats"]["forget_1_rouge_l"]
    assert (mean, n) == (pytest.approx(0.7), 2) and sd == pytest.approx(math.sqrt(0.02))
    assert tofu["stats"]["gate_forget"][:2] == (pytest.approx(0.15), pytest.approx(math.sqrt(0.005)))
    mean, sd, _ = rows["rwku"]["stats"]["forget_fb"]
    assert mean == pytest.approx(0.4) and sd == pytest.approx(math.sqrt(0.02))
    # the Pareto front over (forgetting, utility) = (1 - forget ROUGE-L, MU): B dominates A and C, not D
    front = study_rows([_cell("A", 0, forget_rouge_l=0.2, model_utility=0.5),
                        _cell("B", 0, forget_rouge_l=0.1, model_utility=0.6),
                        _cell("C", 0, forget_rouge_l=0.3, model_utility=0.4),
                        _cell("D", 0, forget_rouge_l=0.05, model_utility=0.3)], ["A", "B", "C", "D"])
    assert {r["label"]: r["pareto"] for r in front} == {"A": False, "B": True, "C": False, "D": True}
    single = study_rows([_cell("CRU", 0, forget_rouge_l=0.2)], ["CRU"])[0]
    assert single["stats"]["forget_1_rouge_l"][1] is None          # one seed: no spread claimed


def test_references_have_no_seed_and_a_small_forget_quality_shows():
    """Original / Retain have no seed (shown "–", an empty CSV field; they had read as seed 0), and an FQ below
    0.01 is written as the leaderboard writes it (three decimals would print 0.000)."""
    from cru_harness.studies.tables import to_csv, to_markdown

    reference = {**_cell("Original", 0, forget_rouge_l=0.8, model_utility=0.4, forget_quality=0.0004),
                 "kind": "original", "seed": None, "gate_means": None}
    rows = study_rows([reference, _cell("CRU", 0, forget_rouge_l=0.2, model_utility=0.5, forget_quality=0.3)],
                      ["CRU"])
    assert rows[0]["label"] == "Original" and rows[0]["seeds"] == [None]
    table = to_markdown(rows, ["# t"])
    line = next(x for x in table.splitlines() if x.startswith("| Original |"))
    assert line.split(" | ")[1] == "–" and "4.0e-04" in line and "0.000 " not in line
    csv_line = next(x for x in to_csv(rows).splitlines() if ",Original," in x)
    assert ",Original,," in csv_line


def test_a_mean_over_fewer_seeds_than_the_row_has_says_so():
    """A metric one seed's cell lacks is averaged over the seeds that have it, and the table cell says how many."""
    from cru_harness.studies.tables import to_markdown

    rows = study_rows([_cell("CRU", 0, forget_rouge_l=0.2, model_utility=0.5),
                       _cell("CRU", 1, forget_rouge_l=0.4, model_utility=None),
                       _cell("CRU", 2, forget_rouge_l=0.3, model_utility=0.7)], ["CRU"])
    assert rows[0]["stats"]["model_utility"] == (pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2)
    line = next(line for line in to_markdown(rows, []).splitlines() if line.startswith("| CRU |"))
    assert "0.600 ± 0.141 (2 of 3 seeds)" in line and "0.700 ± 0.100 |" in line   # 1-ROUGE-L: all three


def test_tradeoff_figure_keys_every_drawn_variant_in_a_legend_even_where_points_coincide():
    import matplotlib.pyplot as plt

    from cru_harness.studies.tables import tradeoff_figure

    # three CRU variants on one spot (as collapsed ones are): their labels cannot all sit beside it
    same = [_cell(f"CRU-{k}", 0, forget_rouge_l=0.05, model_utility=0.0) for k in ("a", "b", "c")]
    rows = study_rows([_cell("Original", 0, forget_rouge_l=0.8, model_utility=0.4), *same,
                       _cell("no-utility", 0, forget_rouge_l=0.3)], ["Original", "CRU-a", "CRU-b", "CRU-c",
                                                                   "no-utility"])
    fig = tradeoff_figure(rows, title="t", block="m · tofu forget10")
    try:
        legend = fig.axes[0].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["Original", "CRU-a", "CRU-b", "CRU-c"]
        handles, _ = fig.axes[0].get_legend_handles_labels()
        assert [h[0].get_marker() for h in handles] == ["s", "o", "o", "o"]   # a reference row is a square
    finally:
        plt.close(fig)


def test_table_header_names_the_cells_that_did_not_finish():
    from types import SimpleNamespace

    from cru_harness.studies.run import missing_lines

    def cell(h, kind="method"):
        return SimpleNamespace(hash=h, kind=kind, describe=lambda: f"cell {h}")

    cells = [cell("a"), cell("b"), cell("f", "finetune")]
    assert missing_lines(cells, [{"hash": "a", "status": "ok"}, {"hash": "b", "status": "ok"}]) == []
    (line,) = missing_lines(cells, [{"hash": "a", "status": "ok"}, {"hash": "b", "status": "failed"}])
    assert "not finished: 1 of 2 cells" in line and "cell b" in line


# ------------------------------------------------------------------------------------------------ end to end
def tiny_study(name: str, out: Path, *, seeds=(0,), keep=None) -> Path:
    """The committed study config on the tiny testbed: the tiny Llama on the fictitious world (retain oracle:
    the zoo's retain model), 4 rows per task, 1 router epoch, d_r 8, blocks mapped onto 8 layers; `keep`: the
    method labels kept (default: the first and last variant). Everything under `study:` is kept as committed."""
    raw = yaml.safe_load((STUDIES / f"{name}.yaml").read_text())
    raw.update(models=[{"name": "tiny-llama", "path": "zoo:llama:finetuned", "dtype": "float32",
                        "retain": {"checkpoint": "zoo:llama:retain"}}],
               benchmarks={"tofu": {"data_dir": "testbed:world", "splits": ["forget10"], "limit": 4}},
               seeds=list(seeds), device="cpu", output_dir=str(out), include_original=False,
               evaluation={"batch_size": 4})   # 4 rows per task; not the GPU's batch, so hashes stay the tiny run's
    methods = raw["methods"]
    keep = keep or [methods[0]["label"], methods[-1]["label"]]
    raw["methods"] = [m for m in methods if m.get("label", m["method"]) in keep]
    for method in raw["methods"]:
        method.pop("overrides", None)
        if method["method"] == "CRU":
            method.update(d_r=8, epochs=1)
            method.setdefault("lr", 1e-2)   # a study that sweeps the learning rate keeps its values
            if "blocks" in method:
                method["blocks"] = [b % 8 for b in method["blocks"]][:2]
            method["last_k"] = min(method.get("last_k", 4), 8)
        else:
            method.update(num_epochs=1, effective_batch_size=8, micro_batch_size=8)
    if raw["study"]["kind"] == "overlap":
        raw["study"]["examples"] = [10, "all"]
    path = out.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*/result.json"))]


def _table_rows(out: Path, stem: str = "table") -> list[dict]:
    with open(out / "study" / f"{stem}.csv") as handle:
        return list(csv.DictReader(handle))


def _check_sweep(out: Path, labels: list[str], seeds=(0,)) -> list[dict]:
    table = (out / "study" / "table.md").read_text()
    for line in ("model `tiny-llama`", "splits forget10", "evaluation rows per task: 4", f"seeds {list(seeds)}"):
        assert line in table
    assert "not finished" not in table
    rows = _table_rows(out)
    assert [r["variant"] for r in rows] == ["Retain", *labels]
    for row in rows[1:]:
        assert row["n_seeds"] == str(len(seeds))
        assert 0.0 <= float(row["forget_1_rouge_l_mean"]) <= 1.0 and 0.0 < float(row["model_utility_mean"]) <= 1
        assert float(row["train_wall_time_s_mean"]) > 0
        assert (row["forget_1_rouge_l_sd"] != "") == (len(seeds) > 1)
        assert row["pareto_front"] in ("true", "false")
    assert rows[0]["pareto_front"] == ""  # the retain oracle is a reference, not a candidate
    # one plot per block, named by the report's one file-name rule
    assert {p.name for p in (out / "study").glob("tradeoff_*.png")} == \
        {f"tradeoff_{file_slug(r['block'])}.png" for r in rows} == {"tradeoff_tiny-llama_tofu_forget10.png"}
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["percentile", "random_control", "loss_shape"])
def test_sweep_study_end_to_end(name, tmp_path):
    out = tmp_path / name
    config = tiny_study(name, out)
    assert main(["study", str(config)]) == 0
    labels = [m["label"] for m in yaml.safe_load(config.read_text())["methods"]]
    _check_sweep(out, labels)
    hparams = {r["label"]: r["hparams"] for r in _results(out) if r["kind"] == "method"}
    if name == "random_control":  # the control's cells really used random selection
        assert {h["selection"] for h in hparams.values()} == {"variance", "random"}
    if name == "loss_shape":
        assert {(h["suppress_loss"], h["pass_loss"]) for h in hparams.values()} == {("linear", "quadratic"),
                                                                                    ("quadratic", "linear")}


@pytest.mark.slow
def test_lambda_study_two_seeds_spread_and_collapsed_router_plot(tmp_path):
    out = tmp_path / "lambda"
    assert main(["study", str(tiny_study("lambda", out, seeds=(0, 1)))]) == 0
    rows = _check_sweep(out, ["CRU-lambda0_5", "CRU-lambda100"], seeds=(0, 1))
    assert [r["lam"] for r in rows[1:]] == ["0.5", "100"]
    # the collapsed router's gate of each row (paper loss: 1 - 1/(2 lambda), clipped); none for the oracle row
    assert [r["collapsed_gate"] for r in rows] == ["", "0.0", "0.995"]
    assert list((out / "study").glob("sweep_*.png"))
    assert "±" in (out / "study" / "table.md").read_text()


@pytest.mark.slow
def test_blocks_study_gates_the_blocks_it_names(tmp_path):
    from cru_harness.cru.bundle import RouterBundle

    out = tmp_path / "blocks"
    assert main(["study", str(tiny_study("blocks", out, keep=["CRU-first4", "CRU-last2"]))]) == 0
    _check_sweep(out, ["CRU-first4", "CRU-last2"])
    gated = {r["label"]: RouterBundle.from_pretrained(r["artifacts"]["routers"]).config.block_indices
             for r in _results(out) if r["kind"] == "method"}
    assert gated == {"CRU-first4": [0, 1], "CRU-last2": [6, 7]}


@pytest.mark.slow
def test_overlap_study_localizes_without_training(tmp_path, monkeypatch):
    out = tmp_path / "overlap"
    assert main(["study", str(tiny_study("overlap", out))]) == 0
    assert not list((out / "cells").glob("*/result.json"))      # no router trained, nothing evaluated
    rows = _table_rows(out)
    assert {r["examples"] for r in rows} == {"10", "all"}
    assert sorted(int(r["block"]) for r in rows if r["examples"] == "all") == list(range(8))  # last_k: all 8
    for row in rows:
        assert 0.0 <= float(row["overlap_mean"]) <= 1.0 and -1.0 <= float(row["rho_mean"]) <= 1.0
    assert {(r["n_forget"], r["n_retain"]) for r in rows} == {("10", "10"), ("40", "360")}  # world forget10/retain90
    assert (out / "study" / "overlap.png").is_file()
    # a second run reuses the saved per-cell analyses; --force recomputes them (same numbers: seeded)
    saved = {p: (p.stat().st_mtime_ns, p.read_text()) for p in (out / "study" / "analysis").glob("*.json")}
    assert len(saved) == 1
    assert main(["study", str(out.parent / "overlap.yaml")]) == 0
    assert {p: (p.stat().st_mtime_ns, p.read_text()) for p in saved} == saved
    assert main(["study", str(out.parent / "overlap.yaml"), "--force"]) == 0
    assert all(p.stat().st_mtime_ns != stamp and p.read_text() == text for p, (stamp, text) in saved.items())
    _check_table_only(out, "table", monkeypatch)


def _check_table_only(out, stem, monkeypatch):
    """`--table-only` rewrites an analysis study's table from its saved analyses alone (nothing loaded: the
    checkpoints and bundles a clone lacks are gone), names analyses computed by other code, and refuses, in one
    line, when a CRU cell has none."""
    import shutil

    import cru_harness.studies.analyses as analyses

    def no_model(*args, **kwargs):
        raise AssertionError("--table-only loaded a model")

    monkeypatch.setattr(analyses, "load_cell_model", no_model)
    config = str(out.parent / f"{out.name}.yaml")
    table = (out / "study" / f"{stem}.md").read_text()
    for work in out.glob("cells/*/work"):
        shutil.rmtree(work)
    (out / "study" / f"{stem}.md").unlink()
    assert main(["study", config, "--table-only"]) == 0
    assert (out / "study" / f"{stem}.md").read_text() == table
    path = next((out / "study" / "analysis").glob("*.json"))
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "code_version": "0123456789abcdef"}))
    assert main(["study", config, "--table-only"]) == 0
    assert "- analyses computed by other code than this table's" in (out / "study" / f"{stem}.md").read_text()
    assert "code version 0123456789abcdef (1 of" in (out / "study" / f"{stem}.md").read_text()
    # an analysis computed with other settings than the study's is refused, not described as the study's
    other = {"rows": 3} if "rows" in saved else {"by_examples": {"7": next(iter(saved["by_examples"].values()))}}
    path.write_text(json.dumps({**saved, **other}))
    written = {p: p.stat().st_mtime_ns for p in (out / "study").glob("*.md")}
    assert main(["study", config, "--table-only"]) == 2
    path.unlink()
    assert main(["study", config, "--table-only"]) == 2
    assert {p: p.stat().st_mtime_ns for p in (out / "study").glob("*.md")} == written   # nothing half-rewritten


@pytest.mark.slow
def test_gate_gap_study_token_gates_agree_with_the_bundles_own_measurement(tmp_path, monkeypatch):
    from cru_harness.cru.bundle import RouterBundle

    out = tmp_path / "gate_gap"
    config = tiny_study("gate_gap", out, keep=["CRU-paper"])
    raw = yaml.safe_load(config.read_text())
    raw["study"]["rows"] = None  # every row: what the bundle's final measurement reads
    config.write_text(yaml.safe_dump(raw))
    assert main(["study", str(config)]) == 0
    (cell,) = [r for r in _results(out) if r["kind"] == "method"]
    analysis = json.loads(next((out / "study" / "analysis").glob("gate_gap_*.json")).read_text())
    seen = analysis["retain_seen"]["all"]
    # token by token (this study's observer) vs the trainer's pooled measurement over the same rows: the forget
    # set, and the retain rows training drew (the world's 360 retain rows: 1 epoch of 5 steps x 8 draws 40)
    assert seen["forget_mean"] == pytest.approx(cell["gate_means"]["forget"], rel=1e-4)
    assert seen["retain_mean"] == pytest.approx(cell["gate_means"]["retain"], rel=1e-4)
    metrics = RouterBundle.from_pretrained(cell["artifacts"]["routers"]).config.metrics
    assert (analysis["n_forget_rows"], analysis["n_retain_seen_rows"]) == (40, metrics["retain_gate_rows"]) == (40, 40)
    assert analysis["n_retain_held_out_rows"] == 320
    for part in ("retain_seen", "retain_held_out"):
        assert 0.0 <= analysis[part]["all"]["auc"] <= 1.0
    rows = _table_rows(out, "gate_gap")
    assert [r["block"] for r in rows] == ["all", "4", "5", "6", "7"]
    assert (out / "study" / "gate_gap.png").is_file() and (out / "study" / "table.md").is_file()
    _check_table_only(out, "gate_gap", monkeypatch)


@pytest.mark.slow
def test_options_study_end_to_end(tmp_path):
    name = "options"
    out = tmp_path / name
    keep = ["GA", "CRU-paper", "CRU-mlp-site", "CRU-rms-learned-input", "CRU-exclude-top1pct", "CRU-retain-batch4"]
    assert main(["study", str(tiny_study(name, out, keep=keep))]) == 0
    _check_sweep(out, keep)
    ratios = {r["label"]: json.loads((Path(r["artifacts"]["routers"]) / "cru_bundle.json").read_text())
              ["training"]["retain_batch_ratio"] for r in _results(out) if r["kind"] == "method" and r["method"] == "CRU"}
    assert ratios["CRU-retain-batch4"] == 4 and ratios["CRU-paper"] == 1


@pytest.mark.slow
def test_a_studys_paper_row_is_the_runs_cru_cell_reused_under_its_label_and_computes_the_same(tmp_path, capsys):
    """lambda's `CRU-lambda1` row is a run's `CRU` cell under another label: `--reuse` copies it (the table says
    so) instead of training it, and a study computing that row itself gets the same numbers to the bit (CPU):
    the label enters no computation."""
    study = tiny_study("lambda", tmp_path / "study", keep=["CRU-lambda1"])
    raw = yaml.safe_load(study.read_text())
    del raw["study"], raw["methods"][0]["label"]
    raw["output_dir"] = str(tmp_path / "run")
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(raw))
    assert main(["run", str(run)]) == 0
    capsys.readouterr()
    assert main(["study", str(study), "--reuse", str(tmp_path / "run")]) == 0
    assert "copied 1 finished cell(s) of this plan, and 1 that differ only in label (CRU-lambda1 <- CRU)" in \
        capsys.readouterr().out
    assert main(["study", str(study), "--output-dir", str(tmp_path / "own")]) == 0
    reused, = [r for r in _results(tmp_path / "study") if r["kind"] == "method"]
    computed, = [r for r in _results(tmp_path / "own") if r["kind"] == "method"]
    original, = [r for r in _results(tmp_path / "run") if r["kind"] == "method"]
    assert reused["hash"] == computed["hash"] != original["hash"] and reused["label"] == "CRU-lambda1"
    assert reused["metrics"] == computed["metrics"] == original["metrics"]
    assert reused["per_item"] == computed["per_item"] and reused["gate_means"] == computed["gate_means"]
    record = json.loads((tmp_path / "study" / "cells" / reused["hash"] / "run_record.json").read_text())
    assert record["reused_from"] == {"hash": original["hash"], "label": "CRU", "run": str(tmp_path / "run")}
    table = (tmp_path / "study" / "study" / "table.md").read_text()
    assert f"CRU-lambda1: 1 cell(s) of {tmp_path / 'run'}'s CRU" in table
    assert "under another label" not in (tmp_path / "own" / "study" / "table.md").read_text()


@pytest.mark.slow
def test_router_lr_study_trains_at_each_learning_rate_and_the_report_applies_the_rule(tmp_path):
    """configs/studies/router_lr_cpu.yaml end to end on the tiny testbed: each cell's routers trained at its own
    learning rate, and the report chooses by cru_harness.reporting.router_lr (the objective, not the table)."""
    from cru_harness.reporting.router_lr import router_lr_choices

    out = tmp_path / "router_lr_cpu"
    assert main(["study", str(tiny_study("router_lr_cpu", out))]) == 0
    _check_sweep(out, ["CRU-lr1e-5", "CRU-lr1e-2"])
    results = [r for r in _results(out) if r["kind"] == "method"]
    trained = {json.loads((Path(r["artifacts"]["routers"]) / "cru_bundle.json").read_text())["training"]["lr"]
               for r in results}
    assert trained == {1e-5, 1e-2}
    (entry,) = router_lr_choices(results)
    assert entry["chosen"] in (1e-5, 1e-2) and [row["seeds"] for row in entry["rows"]] == [1, 1]
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    # two rates: the choice is always at an end of the grid, and says so
    assert f"Chosen: **{entry['chosen']:g}** (the lowest median objective; the " in report
    assert "rate of the grid: one beyond it was not tried)" in report
    assert list((out / "study").glob("sweep_*.png"))


def test_reduced_options_study_trains_the_retain_cover_option_on_its_own_corpus(tmp_path):
    """configs/studies/options_cpu.yaml end to end on the tiny testbed: CRU-retain-cover's method-level retain
    corpus (retain rows + real-author / world-fact rows the evaluation never scores) reaches its routers."""
    name = "options_cpu"
    out = tmp_path / name
    keep = ["CRU", "CRU-retain-cover"]
    assert main(["study", str(tiny_study(name, out, keep=keep))]) == 0
    _check_sweep(out, keep)
    trained = {r["label"]: r for r in _results(out) if r["kind"] == "method"}
    manifests = {label: json.loads((Path(r["artifacts"]["routers"]) / "cru_bundle.json").read_text())
                 for label, r in trained.items()}
    cover = json.dumps(manifests["CRU-retain-cover"])
    assert "real_authors[8:28]" in cover and "world_facts[8:28]" in cover
    assert "real_authors" not in json.dumps(manifests["CRU"])


def test_study_tables_name_the_data_source_without_a_machine_path(tmp_path, monkeypatch):
    from cru_harness.studies.run import data_source

    for name in ("CRU_HARNESS_DATA_DIR", "CRU_HARNESS_TOFU_DIR", "CRU_HARNESS_RWKU_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert data_source("tofu", "data/") == "`data/` (config)"
    assert data_source("tofu", None) == "the Hugging Face Hub"
    (tmp_path / "d" / "tofu").mkdir(parents=True)
    (tmp_path / "d" / "tofu" / "forget10_perturbed.json").write_text("[]")
    monkeypatch.setenv("CRU_HARNESS_DATA_DIR", str(tmp_path / "d"))
    described = data_source("tofu", None)
    assert described.startswith("local files named by the environment") and str(tmp_path) not in described
    # finished cells' records decide, not this environment (a table written again elsewhere says the same)
    from collections import Counter

    assert data_source("tofu", None, Counter(hub=3)) == "the Hugging Face Hub"
    monkeypatch.delenv("CRU_HARNESS_DATA_DIR")
    assert data_source("tofu", None, Counter(local=3)) == described
    assert data_source("tofu", None, Counter(local=2, hub=1)) == (
        "local files for 2 cells and the Hugging Face Hub for 1 (their run records)")


def test_recorded_data_sources_counts_what_each_cells_record_says(tmp_path):
    from cru_harness.store import RECORD_FILE, CellStore, atomic_write_text
    from cru_harness.studies.run import cell_records, recorded_data_sources

    cells = build_plan(load_study(STUDIES / "lambda.yaml", scale=REPO_ROOT / "configs" / "demo.yaml").config)
    tofu = [c for c in cells if c.benchmark == "tofu"][:3]
    store = CellStore(tmp_path)
    for cell, data in zip(tofu, ("sha:08aabfb168b6ae25", "hub")):   # the third has no record
        store.cell_dir(cell.hash).mkdir(parents=True)
        atomic_write_text(store.cell_dir(cell.hash) / RECORD_FILE, json.dumps({"inputs": {"data": data}}))
    records = cell_records(tmp_path, [c.hash for c in tofu])
    assert recorded_data_sources(tofu, records) == {"tofu": {"local": 1, "hub": 1}}


def test_a_study_table_names_the_rows_reuse_copied_from_another_label(tmp_path):
    """A row whose cells `--reuse` copied from a cell of another label (`reused_from` in their records) is named
    in the table's header with where the cells came from; a table without such rows has no such line."""
    from cru_harness.store import RECORD_FILE, CellStore, atomic_write_text
    from cru_harness.studies.run import cell_records, reused_lines

    store = CellStore(tmp_path)
    results = [{"hash": h, "label": label} for h, label in (("a1", "CRU-lambda1"), ("a2", "CRU-lambda1"),
                                                           ("b1", "CRU-lambda10"))]
    for result in results:
        store.cell_dir(result["hash"]).mkdir(parents=True)
        record = {"hash": result["hash"]}
        if result["label"] == "CRU-lambda1":
            record["reused_from"] = {"hash": "x", "label": "CRU", "run": "results/gpu_smollm2"}
        atomic_write_text(store.cell_dir(result["hash"]) / RECORD_FILE, json.dumps(record))
    records = cell_records(tmp_path, [result["hash"] for result in results])
    assert reused_lines(results[2:], records) == []
    line, = reused_lines(results, records)
    assert line.endswith("CRU-lambda1: 2 cell(s) of results/gpu_smollm2's CRU")


@pytest.mark.parametrize("scale", [None, REPO_ROOT / "configs" / "cpu_smollm2.yaml"])
def test_random_draws_repeats_random_controls_random_rows_with_more_seeds(scale):
    """random_draws.yaml's seeds 0-2 are random_control.yaml's random cells (the same hashes), at either scale."""
    draws = load_study(STUDIES / "random_draws.yaml", scale=scale).config
    control = load_study(STUDIES / "random_control.yaml", scale=scale, overrides={"seeds": [0, 1, 2]}).config
    assert draws.seeds == tuple(range(10))
    assert [m.label for m in draws.methods] == ["CRU-random-p95", "CRU-random-p85"]
    assert all(m.hparams["selection"] == "random" for m in draws.methods)
    control_cells = {c.hash: (c.label, c.seed) for c in build_plan(control)}
    early = [c for c in build_plan(draws) if c.seed in (0, 1, 2) and c.method == "CRU"]
    assert len(early) == 2 * len(draws.benchmarks["tofu"]["splits"]) * 3
    assert all(control_cells.get(c.hash) == (c.label, c.seed) for c in early)


def test_block_plots_name_what_has_no_values_and_show_coinciding_series():
    """gate_gap at a scale with no held-out retain rows: the panel says so in its title (not an empty frame), and
    overlap's 40-example and 'all' series, equal where a corpus has 40 rows, are both drawn, told apart by style."""
    from cru_harness.reporting.plots import plt
    from cru_harness.studies.run import line_figure

    groups = {("M", "CRU", n, block): [{"forget_mean": 0.3, "retain_mean": 0.6, "held_mean": None}]
              for n in ("40", "all") for block in (26, 27, 28)}
    fig = line_figure(groups, [("mean gate", [("forget_mean", "forget"), ("retain_mean", "retain"),
                                              ("held_mean", "retain, held out")], True, None),
                               ("overlap", [("retain_mean", "")], True, 0.5)], title="T")
    gates, overlap = fig.axes[:2]
    assert gates.get_title() == "mean gate\n(no values at this scale: retain, held out)"
    assert overlap.get_title() == "overlap" and fig.get_suptitle() == "T"
    drawn = [container.lines[0] for container in overlap.containers]     # each errorbar's data line
    assert len(drawn) == 2 and {line.get_linestyle() for line in drawn} == {"-", "--"}
    assert all(float(t) == int(t) for t in gates.get_xticks())       # blocks: whole numbers only
    plt.close(fig)


def test_the_collapsed_router_gate_reads_the_setting_the_routers_trained_with():
    """A cell whose config left lambda and the loss shapes at their defaults is read at what its routers recorded
    (`details.router_training`), not at today's defaults, as the router_lr rule reads it."""
    from cru_harness.cru.losses import collapsed_gate
    from cru_harness.studies.tables import router_null_gate

    recorded = {"method": "CRU", "hparams": {"percentile": 95},
                "details": {"router_training": {"lam": 10.0, "suppress_loss": "quadratic", "pass_loss": "linear"}}}
    assert router_null_gate(recorded) == collapsed_gate(10.0, suppress_loss="quadratic", pass_loss="linear")
    given = {**recorded, "hparams": {"lam": 2.0}}   # a config's value wins over the record
    assert router_null_gate(given) == collapsed_gate(2.0, suppress_loss="quadratic", pass_loss="linear")
    assert router_null_gate({"method": "CRU", "hparams": {}}) == 0.5   # before the record: the default, lambda 1
    assert router_null_gate({"method": "GA", "hparams": {}}) is None
