"""Reporting on a synthetic results set: Pareto flags, Friedman statistic, 'too few' messages, tables, plots."""
import io
import json
import math
import statistics

import pytest

from cru_harness.benchmarks.rwku import report as rwku_report
from cru_harness.reporting import stats, tables
from cru_harness.reporting.cli import compare_methods, stats_markdown, write_report
from cru_harness.store import CellStore

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tofu_result(model, split, label, forgetting, mu, kind="method", seed=0, **metrics):
    """A cell result (schema of docs/results_schema.md) with forget ROUGE-L = 1 - forgetting."""
    return {"hash": f"{model}-{split}-{label}-{seed}", "kind": kind, "method": label if kind == "method" else label,
            "label": label, "model": model, "benchmark": "tofu", "split": split, "target": None, "unit": split,
            "seed": None if kind != "method" else seed, "status": "ok",
            "metrics": {"forget_rouge_l": 1 - forgetting, "model_utility": mu, **metrics},
            "failure_classes": {"forget": {"correct": 0.1, "refusal": 0.2, "degenerate": 0.3, "wrong": 0.4}},
            "gate_means": {"forget": 0.2, "retain": 0.9} if label == "CRU" else None,
            "resources": {"train_wall_time_s": 10.0, "train_peak_memory_bytes": 2**30, "trainable_params": 5},
            "per_item": {}}


def test_pareto_flags_hand_computed():
    # A=(0.9,0.5) and D=(0.9,0.5) tie: equal points do not dominate each other. B=(0.5,0.9) and E=(0.4,0.95)
    # trade off. C=(0.5,0.5) is beaten by A (more forgetting, same utility) -> dominated. F=(0.4,0.9) is beaten
    # by B (0.5 >= 0.4, 0.9 >= 0.9, one strict) -> dominated.
    points = {"A": (0.9, 0.5), "B": (0.5, 0.9), "C": (0.5, 0.5), "D": (0.9, 0.5), "E": (0.4, 0.95), "F": (0.4, 0.9)}
    assert stats.pareto_dominated(points) == {"A": False, "B": False, "C": True, "D": False, "E": False, "F": True}


def synthetic_blocks():
    """4 blocks (2 models x 2 splits), 3 methods. Trade-off = hmean(forgetting, MU) = x when both equal x.
    X: 0.9 everywhere (rank 1 in every block); Y: 0.6, 0.6, 0.3, 0.3; Z: 0.3, 0.3, 0.6, 0.6."""
    results = []
    blocks = [("M1", "forget01"), ("M1", "forget10"), ("M2", "forget01"), ("M2", "forget10")]
    y = [0.6, 0.6, 0.3, 0.3]
    for i, (model, split) in enumerate(blocks):
        results.append(tofu_result(model, split, "Original", 0.05, 0.99, kind="original"))
        results.append(tofu_result(model, split, "CRU", 0.9, 0.9))
        results.append(tofu_result(model, split, "GA", y[i], y[i]))
        results.append(tofu_result(model, split, "NPO", 0.9 - y[i], 0.9 - y[i]))
    return results


def test_friedman_statistic_hand_computed():
    # Ranks (1 = best) per block: CRU 1,1,1,1 (R=4); GA 2,2,3,3 (R=10); NPO 3,3,2,2 (R=10).
    # n = 4 blocks, k = 3 methods, no ties:
    #   chi2 = 12 / (n k (k+1)) * sum R_j^2 - 3 n (k+1) = 12/48 * (16 + 100 + 100) - 48 = 54 - 48 = 6.0
    # chi-square approximation: P(chi2_2 > 6) = exp(-6/2) = 0.049787. The permutation p is exact here: of the
    # 3!**4 = 1296 arrangements of each block's scores, 90 give chi2 >= 6 (the rank sums' spread is as large),
    # so p = 90 / 1296 = 0.0694: the approximation claims 0.05 where the exact test does not reach it.
    comparison = compare_methods(synthetic_blocks(), "tofu")
    f = comparison["friedman"]
    assert f["status"] == "ok" and f["n_blocks"] == 4
    assert f["statistic"] == pytest.approx(6.0)
    assert f["pvalue_chi2"] == pytest.approx(math.exp(-3.0))
    assert f["pvalue"] == pytest.approx(90 / 1296) and f["pvalue_method"].startswith("exact over all 1,296")
    assert f["mean_ranks"] == {"CRU": 1.0, "GA": 2.5, "NPO": 2.5}
    # Wilcoxon: only 4 pairs per comparison -> too few (min exact two-sided p with 4 pairs is 0.125)
    w = comparison["wilcoxon"]
    assert w["best"] == "CRU"
    assert all(c["status"] == "too_few" and c["pvalue"] is None and "too few pairs" in c["message"]
               for c in w["comparisons"])


def test_too_few_blocks_says_so():
    two_blocks = [r for r in synthetic_blocks() if r["model"] == "M1"]
    f = compare_methods(two_blocks, "tofu")["friedman"]
    assert f["status"] == "too_few" and f["statistic"] is None and f["pvalue"] is None
    assert "too few blocks" in f["message"]
    two_methods = [r for r in synthetic_blocks() if r["label"] != "NPO"]
    f = compare_methods(two_methods, "tofu")["friedman"]
    assert f["status"] == "too_few" and "at least 3" in f["message"]


def test_friedman_p_by_random_arrangements_when_there_are_too_many():
    # 7 methods x 6 blocks: 5040**6 arrangements, so PERMUTATIONS random ones (seeded: the same p every time)
    scores = {b: {m: ((b * 7 + i * 3) % 11) / 10 for i, m in enumerate("ABCDEFG")} for b in range(6)}
    first, again = stats.friedman(scores), stats.friedman(scores)
    assert first["status"] == "ok" and first["pvalue"] == again["pvalue"]
    assert "9,999 random" in first["pvalue_method"] and 1 / 10000 <= first["pvalue"] <= 1


def test_a_method_scored_on_few_blocks_is_left_out_not_every_block():
    # one extra NPO setting on one of five splits: leaving the blocks that lack it would leave none
    scores = {b: {"GA": 0.1 * b, "GD": 0.5, "NPO": 0.9 - 0.1 * b} for b in range(5)}
    scores[0]["NPO (learning_rate=1e-05)"] = 0.4
    f = stats.friedman(scores)
    assert f["status"] == "ok" and f["n_blocks"] == 5 and f["methods"] == ["GA", "GD", "NPO"]
    assert f["dropped_methods"] == ["NPO (learning_rate=1e-05)"] and f["dropped_blocks"] == []
    assert "left out, scored in fewer than half of the blocks: NPO (learning_rate=1e-05)" in \
        stats_markdown({"benchmark": "tofu", "friedman": f, "wilcoxon": stats.wilcoxon_posthoc(scores)})
    # scored in half of the blocks or more: kept, and the blocks without it are left out instead
    for b in (1, 2):
        scores[b]["NPO (learning_rate=1e-05)"] = 0.4
    f = stats.friedman(scores)
    assert f["dropped_methods"] == [] and f["n_blocks"] == 3 and f["dropped_blocks"] == [3, 4]
    # no cell with a trade-off score (e.g. RWKU without utility sets): that is the reason given
    assert "no method has a trade-off score" in stats.friedman({})["message"]


def test_holm_adjustment_hand_computed():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04, kept monotone -> 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_wilcoxon_p_values_are_holm_adjusted_and_a_tie_for_best_is_said():
    scores = {b: {"A": 0.9 + 0.001 * b, "B": 0.5 + 0.002 * b, "C": 0.4, "D": 0.3} for b in range(8)}
    w = stats.wilcoxon_posthoc(scores)
    assert [c["pvalue"] for c in w["comparisons"]] == pytest.approx([2 / 2**8] * 3)
    assert [c["pvalue_holm"] for c in w["comparisons"]] == pytest.approx([3 * 2 / 2**8] * 3)
    assert "Holm-adjusted over 3 test(s)" in w["comparisons"][0]["message"] and "tie" not in w["message"]
    tied = {b: {"A": 0.9, "B": 0.9, "C": 0.1 * (b % 3)} for b in range(8)}
    w = stats.wilcoxon_posthoc(tied)
    assert w["best"] == "A" and w["tied_best"] == ["A", "B"] and "A, B tie on mean rank" in w["message"]
    # no test run (too few pairs): no header claiming p-values, each comparison says why
    w = stats.wilcoxon_posthoc({b: {"A": 0.9, "B": 0.5} for b in range(3)})
    assert "message" not in w and "too few pairs" in w["comparisons"][0]["message"]


def test_wilcoxon_runs_with_enough_pairs():
    scores = {b: {"A": 0.9 + 0.001 * b, "B": 0.5 + 0.002 * b, "C": 0.4} for b in range(8)}
    w = stats.wilcoxon_posthoc(scores)
    assert w["best"] == "A"
    # A beats B in all 8 blocks: exact two-sided p = 2 / 2**8
    b = next(c for c in w["comparisons"] if c["method"] == "B")
    assert b["status"] == "ok" and b["pvalue"] == pytest.approx(2 / 2**8)


def test_tables_bold_best_and_reference_row():
    results = synthetic_blocks()
    rows = tables.aggregate(results, "tofu")
    md = tables.to_markdown(rows, "tofu")
    m1 = [line for line in md.splitlines() if line.startswith("| M1 | forget01")]
    original = next(line for line in m1 if "Original (reference)" in line)
    cru = next(line for line in m1 if "| CRU |" in line)
    ga = next(line for line in m1 if "| GA |" in line)
    # Original has the highest MU (0.99) but is a reference: never bold; CRU's 0.90 MU is the block's best
    assert "**" not in original and "0.99" in original
    assert "**0.90**" in cru and "front" in cru and "dominated" in ga
    # direction: forget_truth_ratio is mean(min(R, 1/R)), 1 = forgotten -> the largest is bold
    results[1]["metrics"]["forget_truth_ratio"] = 0.2
    results[2]["metrics"]["forget_truth_ratio"] = 0.9
    results[3]["metrics"]["forget_truth_ratio"] = 0.3
    rows = tables.aggregate(results, "tofu")
    ga_row = next(r for r in rows if r["model"] == "M1" and r["unit"] == "forget01" and r["label"] == "GA")
    assert "forget_truth_ratio" in ga_row["best"]
    assert not any("forget_truth_ratio" in r["best"] for r in rows if r is not ga_row and r["model"] == "M1"
                   and r["unit"] == "forget01")
    tex = tables.to_latex(rows, "tofu")
    assert "\\textbf{0.90}" in tex and "Original" in tex and "\\toprule" in tex and "Real Authors" in tex
    csv_text = tables.to_csv(rows, "tofu")
    assert csv_text.splitlines()[0].startswith("model,unit,method,label,reference")
    assert "fc_forget_refusal" in md or "forget ref." in md


def test_a_column_some_cells_lack_is_a_mean_over_the_others_and_the_row_says_so():
    results = [tofu_result("M", "forget01", "GA", 0.5, 0.4, seed=seed) for seed in range(3)]
    results[1]["metrics"]["model_utility"] = None
    row = tables.aggregate(results, "tofu")[0]
    assert row["metrics"]["model_utility"] == pytest.approx(0.4)
    assert row["partial"] == ["MU ↑: mean over 2 of 3 cells"]
    line = next(line for line in tables.to_markdown([row], "tofu").splitlines() if "| GA |" in line)
    assert line.rstrip(" |").endswith("MU ↑: mean over 2 of 3 cells")
    results[1]["metrics"]["model_utility"] = 0.4
    assert tables.aggregate(results, "tofu")[0]["partial"] == []


def test_rwku_forget_all_weights_fb_qa_aa_by_their_item_counts():
    """RWKU's paper: All is the count-weighted mean of FB / QA / AA (e.g. 8, 3 and 8 items), not their plain
    mean; it is also the RWKU Forgetting axis. A score whose count was not recorded gives no All."""
    def rwku(counts, prefix="rwku_"):
        per_target = {f"{prefix}{p}": {"2": {"n": n}} for p, n in zip(("fb", "qa", "aa"), counts)}
        return {"benchmark": "rwku", "metrics": {"forget_fb": 0.5, "forget_qa": 0.2, "forget_aa": 0.1,
                                                 "utility_mmlu": 0.4},
                "details": {"scoring": {"per_target": per_target}}}

    weighted = (8 * 0.5 + 3 * 0.2 + 8 * 0.1) / 19
    metrics = tables.derived_metrics(rwku((8, 3, 8)))
    assert metrics["forget_all"] == pytest.approx(weighted) and metrics["forget_all"] != pytest.approx(0.8 / 3)
    assert metrics["forgetting"] == pytest.approx(1 - weighted) and metrics["utility"] == pytest.approx(0.4)
    assert tables.derived_metrics(rwku((8, 3, 8), "rwku_icu_"))["forget_all"] == pytest.approx(weighted)
    assert tables.derived_metrics(rwku((8, 8, 8)))["forget_all"] == pytest.approx(0.8 / 3)
    assert tables.derived_metrics(rwku((8, 0, 8)))["forget_all"] is None
    # a cell without one of the three has no All (FB and AA alone would be another number)
    without_qa = rwku((8, 3, 8))
    del without_qa["metrics"]["forget_qa"]
    assert tables.derived_metrics(without_qa)["forget_all"] is None
    # the counts are the cell's target's, not every target's the scorer recorded
    two_targets = rwku((8, 3, 8))
    two_targets["target"] = 2
    two_targets["details"]["scoring"]["per_target"]["rwku_qa"]["7"] = {"n": 100}
    assert tables.derived_metrics(two_targets)["forget_all"] == pytest.approx(weighted)


def test_forget_quality_from_retain_cell():
    """The report computes FQ against the run's retain cell by the scorer's rule: items matched by question
    (another order, extra items), a NaN (stored as null) refused, no shared item refused. It fills a cell scored
    before its retain cell existed and replaces one scored against another oracle (a reused cell: the oracle is
    not in its hash); without per-item values the recorded number stays."""
    from scipy.stats import ks_2samp

    def cell(label, questions, ratios, kind="method", reason="no retain model given (use --retain-run DIR ...)"):
        result = tofu_result("M1", "forget01", label, 0.0, 0.5, kind=kind)
        result["per_item"] = {"forget_truth_ratio": ratios, "forget_question": questions}
        result["metrics"]["forget_quality"] = None
        result["details"] = {"scoring": {"forget_quality": {"value": None, "reason": reason}}}
        return result

    retain = cell("Retain", ["q5", "q4", "q3", "q2", "q1", "q0"], [0.5, 0.4, 0.3, 0.2, 0.1, 9.0], kind="retain")
    same = cell("GA", ["q1", "q2", "q3", "q4", "q5"], [0.1, 0.2, 0.3, 0.4, 0.5])
    shifted = cell("NPO", ["q1", "q2", "q3", "q4", "q5"], [0.6, 0.7, 0.8, 0.9, 1.0])
    nan = cell("GD", ["q1", "q2", "q3", "q4", "q5"], [0.1, None, 0.3, 0.4, 0.5])
    refused = cell("SimNPO", ["x1", "x2"], [0.1, 0.2],
                   reason="tofu_forget01: the retain model's results share no forget item with this run")
    stale = cell("IdkDPO", ["q1", "q2", "q3", "q4", "q5"], [0.1, 0.2, 0.3, 0.4, 0.5], reason=None)
    stale["metrics"]["forget_quality"] = 0.0123   # scored against an oracle this run no longer has
    bare = cell("CRU", ["q1"], [0.1], reason=None)
    bare["per_item"] = {}
    bare["metrics"]["forget_quality"] = 0.5       # no per-item values to recompute from: kept
    tables.fill_from_oracle([same, shifted, nan, refused, stale, bare, retain])   # TOFU.compare_to_oracle
    assert same["metrics"]["forget_quality"] == pytest.approx(1.0)   # q0 is not an item of the run: left out
    assert shifted["metrics"]["forget_quality"] == pytest.approx(
        ks_2samp([0.6, 0.7, 0.8, 0.9, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5]).pvalue)
    assert nan["metrics"]["forget_quality"] is None and refused["metrics"]["forget_quality"] is None
    assert stale["metrics"]["forget_quality"] == pytest.approx(1.0) and bare["metrics"]["forget_quality"] == 0.5


def test_privleak_from_retain_cell():
    """The report computes privleak against the run's retain cell from both cells' Min-K% AUCs (open-unlearning's
    formula): it fills a cell scored against the 0.5 fallback (scored before its oracle existed) and one scored
    against another oracle; the oracle's own is 0; a cell without an AUC keeps its number, and no oracle AUC
    leaves every recorded number."""
    from cru_harness.metrics import privleak

    retain = tofu_result("M1", "forget01", "Retain", 0.0, 0.5, kind="retain", mia_auc_min_k=0.68, privleak=-36.0)
    early = tofu_result("M1", "forget01", "GA", 0.0, 0.5, mia_auc_min_k=0.86, privleak=privleak(0.86))
    other = tofu_result("M1", "forget01", "NPO", 0.0, 0.5, mia_auc_min_k=0.9, privleak=privleak(0.9, 0.6))
    bare = tofu_result("M1", "forget01", "CRU", 0.0, 0.5, privleak=12.0)
    elsewhere = tofu_result("M2", "forget01", "GA", 0.0, 0.5, mia_auc_min_k=0.86, privleak=privleak(0.86))
    tables.fill_from_oracle([early, other, bare, elsewhere, retain])
    assert early["metrics"]["privleak"] == pytest.approx(((1 - 0.86) - (1 - 0.68)) / (1 - 0.68) * 100)
    assert early["metrics"]["privleak"] == pytest.approx(-56.25)
    assert other["metrics"]["privleak"] == pytest.approx(((1 - 0.9) - (1 - 0.68)) / (1 - 0.68) * 100)
    assert retain["metrics"]["privleak"] == 0.0
    assert bare["metrics"]["privleak"] == 12.0 and elsewhere["metrics"]["privleak"] == pytest.approx(-72.0)


def write_cells(root, results):
    store = CellStore(root)
    for r in results:
        store.write(r["hash"], r, {"hash": r["hash"]})


def test_report_writes_tables_stats_and_pngs(tmp_path):
    results = synthetic_blocks()
    rwku = []
    for target in (1, 2):
        for label, fb in (("Original", 0.5), ("CRU", 0.05), ("GA", 0.2)):
            rwku.append({"hash": f"r{target}{label}", "kind": "original" if label == "Original" else "method",
                         "method": label, "label": label, "model": "Smol", "benchmark": "rwku", "split": None,
                         "target": target, "unit": f"target{target}", "seed": 0, "status": "ok",
                         "metrics": {"forget_fb": fb, "forget_qa": fb, "forget_aa": fb, "neighbor_fb": 0.4,
                                     "neighbor_qa": 0.4, "mia_auc": 0.5 + fb, "utility_mmlu": 0.3},
                         "failure_classes": {}, "gate_means": None, "resources": {"cell_wall_time_s": 3.0}})
    rwku.append({**rwku[-1], "hash": "purge1", "method": "PURGE", "label": "PURGE", "status": "unavailable",
                 "reason": "Hugging Face Hub unreachable", "metrics": {}})
    write_cells(tmp_path / "run", results + rwku)
    written = write_report([tmp_path / "run"], tmp_path / "out", log=lambda *_: None)
    for name in ("leaderboard_tofu.md", "leaderboard_tofu.csv", "leaderboard_tofu.tex", "leaderboard_rwku.md",
                 "stats.json", "report.md", "resources.png", "gates_tofu.png", "rwku_levels.png"):
        assert name in written, name
    pngs = list((tmp_path / "out" / "plots").glob("*.png"))
    assert len(pngs) >= 6
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Friedman chi2 = 6.000" in report
    assert "unavailable: Smol target2 PURGE: Hugging Face Hub unreachable" in report
    assert "Friedman test not computed" in report        # RWKU: 2 blocks, 2 methods
    rwku_md = (tmp_path / "out" / "leaderboard_rwku.md").read_text()
    assert "2 targets" in rwku_md and "1 unavailable" in rwku_md
    stats_json = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats_json["tofu"]["friedman"]["statistic"] == pytest.approx(6.0)


def test_report_cli(tmp_path, capsys):
    from cru_harness.cli import main

    write_cells(tmp_path / "run", synthetic_blocks())
    assert main(["report", str(tmp_path / "run"), "--no-plots", "--formats", "md"]) == 0
    assert (tmp_path / "run" / "report" / "leaderboard_tofu.md").is_file()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "results directory not found" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()   # a mistyped directory is not created (with a report/ inside)


def test_a_cell_file_that_is_not_valid_is_named_once_and_in_the_report_and_no_cells_is_an_error(tmp_path, capsys):
    """A truncated result.json drops its cell from every table: the console names it once, and report.md's
    provenance says so (the tables change, so the report must). A directory without one valid cell is refused."""
    from cru_harness.cli import main

    results = synthetic_blocks()
    write_cells(tmp_path / "run", results)
    damaged = tmp_path / "run" / "cells" / results[0]["hash"] / "result.json"
    damaged.write_text(damaged.read_text()[:40])
    assert main(["report", str(tmp_path / "run"), "--no-plots", "--formats", "md"]) == 0
    assert capsys.readouterr().err.count(f"{damaged} is not a valid cell file") == 1
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "**1 cell file(s) are not valid**" in report and f"{damaged} (unreadable" in report
    (tmp_path / "empty" / "cells").mkdir(parents=True)
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no valid cell results under" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report").exists()


def test_a_label_run_under_two_settings_is_two_rows_never_one_average(tmp_path):
    """A config edited between runs into one directory (here GA's learning rate) leaves cells of one label with
    different settings: the report names each variant's setting and never averages them."""
    cells = []
    for seed in (0, 1):
        for lr, forgetting in ((1e-4, 0.9), (1e-5, 0.1)):
            cell = tofu_result("M", "forget01", "GA", forgetting, 0.5, seed=seed)
            cells.append({**cell, "hash": f"ga-{lr}-{seed}", "hparams": {"learning_rate": lr, "max_length": 128}})
    cells.append(tofu_result("M", "forget01", "Original", 0.0, 0.6, kind="original"))
    write_cells(tmp_path / "run", cells)
    write_report([tmp_path / "run"], tmp_path / "out", formats=("csv",), plots=False, log=lambda *_: None)
    import csv

    with open(tmp_path / "out" / "leaderboard_tofu.csv", newline="") as handle:
        rows = {row["label"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"Original", "GA (learning_rate=0.0001)", "GA (learning_rate=1e-05)"}
    assert float(rows["GA (learning_rate=0.0001)"]["forget_1_rouge_l"]) == pytest.approx(0.9)   # 2 seeds each
    assert float(rows["GA (learning_rate=1e-05)"]["forget_1_rouge_l"]) == pytest.approx(0.1)
    # one setting per label and split (the usual case, per-split `overrides` included): labels stay as they are
    forget10 = [{**tofu_result("M", "forget10", "GA", 0.5, 0.5, seed=seed), "hash": f"ga10-{seed}",
                 "hparams": {"learning_rate": 1e-4, "max_length": 128, "beta": 4.5}} for seed in (0, 1)]
    usual = cells[::2] + cells[-1:] + forget10
    assert tables.split_label_variants(usual) == usual


def test_cells_evaluated_or_finetuned_differently_are_two_rows(tmp_path):
    """result.json does not hold the evaluation settings or the model's recipe; the cell's record does (its hash
    covers them). A limit edited between runs into one directory had been pooled into one row (n=2, seeds [0])."""
    store = CellStore(tmp_path / "run")
    for limit, forgetting in ((8, 0.9), (4, 0.1)):
        cell = {**tofu_result("M", "forget01", "GA", forgetting, 0.5), "hash": f"ga-{limit}"}
        resolved = {"model": {"name": "M", "finetune": {"data": "full"}}, "limit": limit,
                    "evaluation": {"batch_size": 8}, "corpora": {"forget_corpus": "forget01"}}
        store.write(cell["hash"], cell, {"hash": cell["hash"], "resolved_config": resolved})
    cell = {**tofu_result("M", "forget01", "NPO", 0.5, 0.5), "hash": "npo-recipe"}
    for recipe, forgetting in (("full", 0.5), ("forget01", 0.2)):
        resolved = {"model": {"name": "M", "finetune": {"data": recipe}}, "limit": 8}
        store.write(f"npo-{recipe}", {**cell, "hash": f"npo-{recipe}", "metrics": {
            **cell["metrics"], "forget_rouge_l": 1 - forgetting}}, {"hash": f"npo-{recipe}", "resolved_config": resolved})
    write_report([tmp_path / "run"], tmp_path / "out", formats=("csv",), plots=False, log=lambda *_: None)
    import csv

    with open(tmp_path / "out" / "leaderboard_tofu.csv", newline="") as handle:
        rows = {row["label"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"GA (limit=4)", "GA (limit=8)", "NPO (model.finetune.data=forget01)",
                         "NPO (model.finetune.data=full)"}
    assert float(rows["GA (limit=8)"]["forget_1_rouge_l"]) == pytest.approx(0.9)
    assert float(rows["NPO (model.finetune.data=forget01)"]["forget_1_rouge_l"]) == pytest.approx(0.2)
    # absent (a record older than the key) and unset are one setting; locations are no setting
    def cell(name, resolved):
        return {**tofu_result("M", "forget10", "GD", 0.5, 0.5, seed=int(name[-1])), "hash": name,
                "resolved_config": resolved}

    same = [cell("gd-0", {"model": {"name": "M", "eval_dtype": None}, "extra": {}}),
            cell("gd-1", {"model": {"name": "M"}}),
            cell("gd-2", {"model": {"name": "M", "path": "/elsewhere"}, "extra": {"purge_local_checkpoint": "/p"}})]
    assert {r["label"] for r in tables.split_label_variants(same)} == {"GD"}


def test_bold_marks_what_prints_best_and_nothing_where_all_print_the_same():
    results = [tofu_result("M", "forget01", "Original", 0.1, 0.9, kind="original"),
               tofu_result("M", "forget01", "A", 0.6251, 0.40, forget_truth_ratio=0.5),
               tofu_result("M", "forget01", "B", 0.6249, 0.30, forget_truth_ratio=0.5)]
    rows = {r["label"]: r for r in tables.aggregate(results, "tofu")}
    # 1 - forget ROUGE-L prints 0.63 and 0.62: A alone; truth ratio prints 0.50 for both: neither
    assert "forget_1_rouge_l" in rows["A"]["best"] and "forget_1_rouge_l" not in rows["B"]["best"]
    assert "forget_truth_ratio" not in rows["A"]["best"] | rows["B"]["best"]
    # 0.6251 and 0.6252 both print 0.63, above C's 0.30: both bold
    results[2:] = [tofu_result("M", "forget01", "B", 0.6252, 0.30), tofu_result("M", "forget01", "C", 0.3, 0.2)]
    rows = {r["label"]: r for r in tables.aggregate(results, "tofu")}
    assert "forget_1_rouge_l" in rows["A"]["best"] and "forget_1_rouge_l" in rows["B"]["best"]
    assert "forget_1_rouge_l" not in rows["C"]["best"]


def test_a_report_of_an_unfinished_run_names_the_planned_cells_without_a_result(tmp_path):
    results = synthetic_blocks()[:4]
    write_cells(tmp_path / "run", results)
    cells = [{"hash": r["hash"], "cell": f"{r['model']} | tofu {r['split']} | {r['label']}"} for r in results]
    cells += [{"hash": "not-run-yet", "cell": "M1 | tofu forget01 | NPO seed=1"}]
    (tmp_path / "run" / "plan.json").write_text(json.dumps({"config": {}, "source": "c.yaml", "cells": cells}))
    write_report([tmp_path / "run"], tmp_path / "out", formats=("md",), plots=False, log=lambda *_: None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "**1 of 5 planned cell(s) of" in report and "M1 | tofu forget01 | NPO seed=1" in report
    (tmp_path / "run" / "plan.json").write_text(json.dumps({"config": {}, "source": "c.yaml", "cells": cells[:4]}))
    write_report([tmp_path / "run"], tmp_path / "out", formats=("md",), plots=False, log=lambda *_: None)
    assert "planned cell(s)" not in (tmp_path / "out" / "report.md").read_text()


def test_peak_memory_on_cpu_is_the_cells_own_not_the_process_peak_to_date():
    # Training's CPU figure is ru_maxrss (earlier, larger cells of the run included); the cell's sampled peak is
    # its own. On a GPU, training's CUDA peak is the cell's.
    cpu = {"train_peak_memory_bytes": 9 * 2**20, "peak_memory_source": "process_peak_rss",
           "cell_peak_rss_bytes": 4 * 2**20}
    gpu = {**cpu, "peak_memory_source": "cuda_max_allocated"}
    assert tables.peak_memory_bytes(cpu) == 4 * 2**20
    assert tables.peak_memory_bytes(gpu) == 9 * 2**20
    assert tables.peak_memory_bytes({"cell_peak_rss_bytes": 3}) == 3
    row = tables.resources_table([{"kind": "method", "status": "ok", "benchmark": "tofu", "model": "m",
                                   "label": "GA", "resources": cpu}])
    assert "| tofu | m | GA | -- | -- | 4.0 |" in row


def test_point_labels_do_not_overlap_even_where_points_coincide():
    """Five methods at one spot (collapsed variants at MU 0) and two near it: every label is readable, none
    covers another, each stays inside the axes, and labels moved away from their point get a leader line."""
    from cru_harness.reporting import plots

    fig, ax = plots.plt.subplots(figsize=(5, 4))
    points = [(0.9 + 0.005 * i, 0.0, f"CRU-variant-{i}") for i in range(5)]
    points += [(0.99, 0.0, "IdkDPO"), (0.2, 0.38, "SimNPO"), (0.6, 0.26, "GA")]
    ax.scatter([x for x, _, _ in points], [y for _, y, _ in points])
    plots.pad_limits(ax)
    fig.tight_layout()
    texts = plots.label_points(ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert sorted(t.get_text() for t in texts) == sorted(label for _, _, label in points)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    leaders = [t for t in ax.texts if t.get_text() == ""]
    assert len(leaders) >= 2                  # at most four labels fit right next to one spot
    plots.plt.close(fig)


def test_figures_are_written_whole_under_their_name(tmp_path):
    from cru_harness.reporting import plots

    fig, ax = plots.plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = plots.save_figure(fig, tmp_path / "a.png", dpi=50)
    plots.plt.close(fig)
    assert path.read_bytes().startswith(b"\x89PNG") and [p.name for p in tmp_path.iterdir()] == ["a.png"]


def test_colours_do_not_repeat_for_any_number_of_methods():
    from cru_harness.reporting import plots

    assert len(set(plots.distinct_colors(10))) == 10
    assert len(set(plots.distinct_colors(20))) == 20
    assert len(set(plots.distinct_colors(31))) == 31   # past tab20: no colour comes round again
    assert plots.distinct_colors(13)[:10] == plots.distinct_colors(20)[:10]   # strong shades first


def test_rows_follow_the_configured_method_order_even_across_shards(tmp_path):
    """The cells are read in hash order, which says nothing; the tables and plots list methods as the config
    does. A shard's plan holds only its own cells, so the order comes from the config's `methods`."""
    cells = [tofu_result("M", "forget01", label, 0.5, 0.5, kind="original" if label == "Original" else "method")
             for label in ("Original", "NPO", "CRU", "GA")]
    cells = [{**cell, "hash": f"h{index}"} for index, cell in zip((3, 0, 2, 1), cells)]   # GA's hash first
    write_cells(tmp_path / "run", cells)
    config = {"methods": [{"method": "CRU"}, {"method": "NPO", "label": "NPO"}, {"method": "GA"}]}
    for shard, hashes in ((1, ["h3", "h1"]), (2, ["h0", "h2"])):    # each shard: some cells, in its own order
        plan = {"config": config, "source": "c.yaml", "cells": [{"hash": h, "cell": h} for h in hashes]}
        (tmp_path / "run" / f"plan.shard{shard}of2.json").write_text(json.dumps(plan))
    write_report([tmp_path / "run"], tmp_path / "out", formats=("md",), plots=False, log=lambda *_: None)
    table = (tmp_path / "out" / "leaderboard_tofu.md").read_text()
    assert [line.split(" | ")[2] for line in table.splitlines()[2:]] == ["Original (reference)", "CRU", "NPO", "GA"]


def test_resources_plot_draws_a_method_that_does_not_train_by_its_whole_cell():
    """ICU trains nothing (train time 0): its wall-time bar is the cell's, not an empty bar; a training method
    shows both, its training part over its cell."""
    from cru_harness.reporting import plots

    def cell(label, train, whole):
        return {"kind": "method", "status": "ok", "benchmark": "rwku", "label": label,
                "resources": {"train_wall_time_s": train, "cell_wall_time_s": whole, "cell_peak_rss_bytes": 2**30}}

    fig = plots.resources_figure([cell("ICU", 0.0, 165.0), cell("GA", 120.0, 250.0), cell("GA", 130.0, 260.0)])
    times = fig.axes[0]
    whole, training = (sorted((round(bar.get_y(), 1), bar.get_width()) for bar in container)
                       for container in times.containers)
    names = [tick.get_text() for tick in times.get_yticklabels()]
    assert names == ["rwku ICU", "rwku GA"]                 # bottom to top: A..Z reads from the top
    assert whole == [(-0.4, 165.0), (0.6, 255.0)]           # bars start at y - 0.4
    assert training[1] == (0.8, 125.0) and math.isnan(training[0][1])
    plots.plt.close(fig)


def test_legends_sit_beside_the_axes_however_many_methods():
    """With twenty-odd methods, a legend inside the axes covered every line of the probe-level plot."""
    from cru_harness.reporting import plots

    rows = [{"model": "Smol", "label": f"Method-{i}", "reference": i == 0,
             "metrics": {"forget_fb": i / 30, "forget_qa": 0.0, "forget_aa": 0.3},
             "unit": "all targets", "gate_means": {"forget": 0.9, "retain": 0.99}} for i in range(22)]
    for fig in (rwku_report.rwku_level_figure(rows), plots.gate_figure(rows)):
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
        plots.plt.close(fig)
    fig = rwku_report.rwku_level_figure(rows)
    assert fig.axes[0].get_yticklabels()[0].get_text() == "Smol Method-0 (reference)"   # the reference on top
    plots.plt.close(fig)


def test_a_mean_over_cells_does_not_depend_on_the_order_they_were_read_in():
    values = [1e16, 1.0, -1e16, 0.1, 0.2, 0.3]
    means = {stats.finite_mean(order) for order in (values, values[::-1], sorted(values))}
    assert means == {1.6 / 6}        # a plain running sum gives 0.1 or 0.0 depending on the order
    assert stats.finite_mean([None, float("nan"), 2.0]) == 2.0 and stats.finite_mean([None]) is None


def test_rows_of_several_seeds_print_their_spread_over_seeds():
    """Seeds 0-2 of a method print mean ± sample sd; RWKU's spread is over each seed's mean over targets (the
    targets' own differences are not seed noise); a row of one seed prints its mean alone."""
    results = [tofu_result("M", "forget01", "Original", 0.1, 0.6, kind="original")]
    results += [{**tofu_result("M", "forget01", "GA", f, 0.5, seed=seed)} for seed, f in enumerate((0.2, 0.4, 0.6))]
    results += [tofu_result("M", "forget01", "NPO", 0.3, 0.5)]
    rows = {r["label"]: r for r in tables.aggregate(results, "tofu")}
    assert rows["GA"]["metrics_sd"]["forget_1_rouge_l"] == pytest.approx(0.2)
    assert rows["NPO"]["metrics_sd"] == {} and rows["Original"]["metrics_sd"] == {}
    table = tables.to_markdown(list(rows.values()), "tofu")
    assert "| **0.40** ± 0.20 |" in table and "| 0.30 |" in table and "Mean ± sample sd (ddof 1) over seeds" in table
    assert "\\textbf{0.40}$\\pm$0.20" in tables.to_latex(list(rows.values()), "tofu")
    csv_rows = {r["label"]: r for r in __import__("csv").DictReader(io.StringIO(tables.to_csv(list(rows.values()),
                                                                                                "tofu")))}
    assert float(csv_rows["GA"]["forget_1_rouge_l_sd"]) == pytest.approx(0.2) and csv_rows["GA"]["seeds"] == "0;1;2"
    assert csv_rows["NPO"]["forget_1_rouge_l_sd"] == ""
    # RWKU: two targets per seed; the per-seed means are 0.3 and 0.5, whatever the targets' spread
    rwku = [{"hash": f"{t}{s}", "kind": "method", "method": "GA", "label": "GA", "model": "M", "benchmark": "rwku",
             "split": None, "target": t, "unit": f"target{t}", "seed": s, "status": "ok",
             "metrics": {"forget_fb": value, "forget_qa": value, "forget_aa": value}, "failure_classes": {},
             "gate_means": None, "resources": {}}
            for s, values in ((0, (0.1, 0.5)), (1, (0.3, 0.7))) for t, value in zip((1, 2), values)]
    (row,) = tables.aggregate(rwku, "rwku")
    assert row["metrics_sd"]["forget_fb"] == pytest.approx(statistics.stdev([0.3, 0.5]))


def test_a_configured_method_without_a_row_is_named_with_its_reason(tmp_path):
    cells = [tofu_result("M", "forget01", label, 0.5, 0.5, kind="original" if label == "Original" else "method")
             for label in ("Original", "GA")]
    write_cells(tmp_path / "run", cells)
    config = {"benchmarks": {"tofu": {}, "rwku": {}},
              "methods": [{"method": "GA"}, {"method": "icu"}, {"method": "IdkDPO", "benchmarks": ["rwku"]},
                          {"method": "NPO", "label": "NPO-scaled"}]}
    (tmp_path / "run" / "plan.json").write_text(json.dumps({"config": config, "source": "c.yaml", "cells": []}))
    write_report([tmp_path / "run"], tmp_path / "out", formats=("md",), plots=False, log=lambda *_: None)
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("Configured methods without a row here: ICU (ICU does not run on TOFU); IdkDPO (its entry runs it on "
            "rwku only); NPO-scaled (configured for this benchmark, but no cell of it has a result here).") in report


def test_a_cell_scored_before_its_retain_cell_reproduces_one_scored_after(tmp_path):
    """A shard may score a cell before the retain cell exists: its file has no Forget Quality, which its report
    computes from the truth ratios. The reproduction check compares what the reports show, so such a cell
    reproduces one whose file holds the same value; without the retain cell it still differs."""
    from cru_harness.benchmarks.tofu.score import NO_RETAIN
    from cru_harness.runner.reproduce import compare_runs

    def cells(late: bool, with_retain: bool = True):
        retain = tofu_result("M", "forget01", "Retain", 0.0, 0.5, kind="retain")
        retain["per_item"] = {"forget_truth_ratio": [0.5, 0.4, 0.3], "forget_question": ["q1", "q2", "q3"]}
        ga = tofu_result("M", "forget01", "GA", 0.0, 0.5, forget_quality=None if late else 1.0)
        ga["per_item"] = {"forget_truth_ratio": [0.5, 0.4, 0.3], "forget_question": ["q1", "q2", "q3"]}
        ga["details"] = {"scoring": {"forget_quality": {"value": None, "reason": f"{NO_RETAIN} ..."}}} if late else {}
        return [ga, retain] if with_retain else [ga]

    write_cells(tmp_path / "reference", cells(late=False))
    write_cells(tmp_path / "run", cells(late=True))
    assert compare_runs(tmp_path / "run", tmp_path / "reference").reproduced
    write_cells(tmp_path / "alone", cells(late=True, with_retain=False))
    comparison = compare_runs(tmp_path / "alone", tmp_path / "reference")
    assert not comparison.reproduced and [d.name for c in comparison.cells for d in c.diffs] == [
        "metrics.forget_quality"]


def test_string_and_lowercase_method_entries_order_the_rows_and_name_absent_methods(tmp_path):
    """`methods: [ga, CRU]` and `benchmarks: rwku` (a single name) are valid configs: the report reads them as the
    runner does (`runner.config.configured_methods`)."""
    cells = [tofu_result("M", "forget01", label, 0.5, 0.5, kind="original" if label == "Original" else "method")
             for label in ("Original", "GA", "CRU")]
    write_cells(tmp_path / "run", cells)
    config = {"benchmarks": {"tofu": {}, "rwku": {}},
              "methods": ["CRU", {"method": "ga"}, {"method": "npo", "benchmarks": "rwku"}]}
    (tmp_path / "run" / "plan.json").write_text(json.dumps({"config": config, "source": "c.yaml", "cells": []}))
    write_report([tmp_path / "run"], tmp_path / "out", formats=("md",), plots=False, log=lambda *_: None)
    table = (tmp_path / "out" / "leaderboard_tofu.md").read_text()
    assert [line.split(" | ")[2] for line in table.splitlines()[2:5]] == ["Original (reference)", "CRU", "GA"]
    assert "Configured methods without a row here: NPO (its entry runs it on rwku only)." in table


def test_the_table_names_the_scoring_preset_behind_its_numbers(tmp_path):
    """Each preset reproduces another reference (open-unlearning's epsilons, legacy TOFU's 200-token cut): the
    report names the one its cells were scored with, and which rows used which when a run mixes them."""
    def scored(label, preset, seed=0):
        evaluation = {"tofu_preset": preset} if preset else {"batch_size": 8}
        return {**tofu_result("M", "forget01", label, 0.5, 0.5, seed=seed), "hash": f"{label}-{preset}-{seed}",
                "resolved_config": {"evaluation": evaluation}}

    rows = tables.aggregate([scored("GA", "open-unlearning"), scored("GA", "open-unlearning", 1),
                             scored("NPO", "open-unlearning")], "tofu")
    assert tables.preset_note(rows, "tofu") == ("Scored with the TOFU preset `open-unlearning` "
                                                "(`evaluation.tofu_preset`; what it reproduces: docs/protocol.md).")
    assert tables.preset_note(rows, "tofu") in tables.to_markdown(rows, "tofu")
    mixed = tables.aggregate(tables.split_label_variants([scored("GA", "open-unlearning"), scored("GA", "tofu"),
                                                          scored("NPO", None)]), "tofu")
    note = tables.preset_note(mixed, "tofu")
    assert note.startswith("Scored with several TOFU presets (`evaluation.tofu_preset`; docs/protocol.md): ")
    assert "`open-unlearning`: GA (evaluation.tofu_preset=open-unlearning) (forget01)" in note
    assert "`tofu`: GA (evaluation.tofu_preset=tofu) (forget01)" in note
    assert "`not recorded`: NPO (forget01)" in note


def test_tradeoff_plot_shows_each_methods_seed_spread(tmp_path, monkeypatch):
    """Each method's point carries ± 1 sd over seeds on both axes (the table's ± values), and the title says so; a
    run of one seed (no sd) draws no bars and says nothing of them."""
    from cru_harness.reporting import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    monkeypatch.setattr(plots.plt, "close", lambda fig: None)

    def row(label, sd):
        return {"model": "m", "unit": "forget01", "label": label, "reference": label == "Original",
                "metrics": {"forgetting": 0.5, "utility": 0.3}, "metrics_sd": sd}

    plots.tradeoff_plots([row("Original", {}), row("GA", {"forgetting": 0.05, "utility": 0.02})], "tofu", tmp_path)
    plots.tradeoff_plots([row("Original", {}), row("GA", {})], "tofu", tmp_path)
    spread, single = (fig.axes[0] for fig in figures)
    bars = [segment for container in spread.containers for lines in container.lines[2]
            for segment in lines.get_segments()]
    assert sorted(tuple(map(tuple, s.round(3))) for s in bars) == [((0.45, 0.3), (0.55, 0.3)),
                                                                   ((0.5, 0.28), (0.5, 0.32))]
    assert "bars: ± 1 sd" in spread.get_title() and "sd" not in single.get_title() and not single.containers
