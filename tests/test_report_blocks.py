"""The report's blocks beyond the leaderboard's core: TOFU's privacy block (cells that ran `tofu_privacy_<split>`:
privleak against the retain oracle's Min-K% AUC, open-unlearning's default, and the attack that best tells forget
from holdout) and the robustness table of attack cells (recovery beside the oracle's change; relearn on the forget
items it did not train on)."""
import json

import pytest

from cru_harness.benchmarks.rwku import report as rwku_report
from cru_harness.benchmarks.tofu import BENCHMARK as TOFU
from cru_harness.metrics.privacy import privleak
from cru_harness.reporting import tables
from cru_harness.benchmarks.tofu import scoring as tofu_scoring
from score_support import UTILITY, local_tofu_refusals, write_run  # noqa: F401 (an autouse fixture: no Hub wait)


def _results_file(directory, date, split, aucs):
    directory.mkdir(parents=True, exist_ok=True)
    results = {f"tofu_privacy_{split}": {f"{name},none": value for name, value in aucs.items()},
               "tofu_retain": {"rouge_l_recall,none": 0.5}}
    (directory / f"results_{date}.json").write_text(json.dumps({"results": results}))


def test_privacy_metrics_read_the_newest_results_of_the_split(tmp_path):
    _results_file(tmp_path / "a", "2026-01-01T00-00-00", "forget01", {"mia_min_k": 0.9, "mia_loss": 0.8})
    _results_file(tmp_path / "b", "2026-02-01T00-00-00", "forget01", {"mia_min_k": 0.7, "mia_loss": 0.6,
                                                                        "exact_memorization": 0.4})
    got = tofu_scoring.privacy_metrics(tmp_path, "forget01")
    assert got["mia_auc_min_k"] == 0.7 and got["mia_auc_loss"] == 0.6 and got["exact_memorization"] == 0.4
    assert got["mia_auc_zlib"] is None
    assert tofu_scoring.privacy_metrics(tmp_path, "forget10") == {}   # the task was not run: nothing recorded


def test_privleak_uses_the_retain_cells_auc_and_says_when_it_falls_back():
    value, details = tofu_scoring.privleak_of(0.8, 0.55)
    assert value == pytest.approx(((1 - 0.8) - (1 - 0.55)) / (1 - 0.55) * 100)
    assert value == pytest.approx(privleak(0.8, 0.55)) and details["retain_source"] == "retain cell"
    fallback, details = tofu_scoring.privleak_of(0.8, None)
    assert fallback == pytest.approx(privleak(0.8, 0.5)) and details["retain_auc"] == 0.5
    assert "no retain cell" in details["retain_source"]
    assert tofu_scoring.privleak_of(None, 0.5)[0] is None


def _result(label, privacy=None, kind="method"):
    metrics = {"forget_rouge_l": 0.5, "forget_prob": 0.5, "model_utility": 0.4, **(privacy or {})}
    return {"hash": label, "status": "ok", "kind": kind, "label": label, "method": label, "model": "m",
            "benchmark": "tofu", "split": "forget01", "target": None, "seed": 0, "metrics": metrics}


def test_the_leaderboard_shows_the_privacy_block_only_where_cells_have_it():
    metrics = {"mia_auc_loss": 0.45, "mia_auc_min_k": 0.8, "mia_auc_zlib": 0.3}
    TOFU.derive(metrics, {})
    assert metrics["mia_auc_best"] == 0.8          # the attack farthest from 0.5
    plain = [_result("Original", kind="original"), _result("GA"), _result("NPO")]
    rows = tables.aggregate(plain, "tofu")
    assert "privleak" not in tables.to_markdown(rows, "tofu") and "privleak" not in tables.to_csv(rows, "tofu")
    private = [_result("Original", {"privleak": -40.0, "mia_auc_min_k": 0.8}, kind="original"),
               _result("GA", {"privleak": 12.0, "mia_auc_min_k": 0.45}),
               _result("NPO", {"privleak": -5.0, "mia_auc_min_k": 0.52})]
    rows = tables.aggregate(private, "tofu")
    markdown = tables.to_markdown(rows, "tofu")
    assert "privleak →0" in markdown and "| best MIA AUC |" in markdown
    npo = next(r for r in rows if r["label"] == "NPO")
    # privleak: closest to 0; the best AUC is not ranked (the right value is the oracle's, not 0.5)
    assert "privleak" in npo["best"] and not any("mia_auc_best" in r["best"] for r in rows)
    assert "privleak" in tables.to_csv(rows, "tofu").splitlines()[0]


def test_a_rows_best_mia_auc_is_the_strongest_attack_of_the_seed_means():
    """Seed 0's strongest attack is LOSS (0.25), seed 1's Min-K% (0.80): a mean of the picks would be 0.525, as if
    nothing told forget from holdout text. The row picks among the mean AUCs: Min-K%, 0.70."""
    cells = [_result("GA", {"mia_auc_loss": 0.25, "mia_auc_min_k": 0.6}),
             _result("GA", {"mia_auc_loss": 0.55, "mia_auc_min_k": 0.8})]
    cells[1]["seed"] = 1
    (row,) = tables.aggregate(cells, "tofu")
    assert row["metrics"]["mia_auc_loss"] == pytest.approx(0.40)
    assert row["metrics"]["mia_auc_best"] == pytest.approx(0.70)
    assert row["metrics_sd"]["mia_auc_best"] == pytest.approx(row["metrics_sd"]["mia_auc_min_k"])


def _attack(label, attack, value, attacked_kind="method", seed=0, attacked=None):
    result = _result(f"{label} + {attack}", kind="attack")
    result.update(hash=f"{label} + {attack}-{seed}", seed=seed,
                  details={"attack": {"name": attack, "attacked": attacked or label, "attacked_label": label,
                                      "attack_label": attack, "attacked_kind": attacked_kind}})
    result["metrics"]["forget_rouge_l"] = value
    return result


def test_the_robustness_table_reads_recovery_beside_the_oracles_change():
    """Original 0.9, GA 0.3 (gap 0.6); relearn brings GA to 0.6 (recovery 0.5) and the oracle from 0.2 to 0.35
    (0.15 of the gap): 0.25 of GA's recovery is beyond what the attack teaches a model that never saw the set."""
    results = [_result("Original", kind="original"), _result("Retain", kind="retain"), _result("GA"),
               _attack("GA", "relearn", 0.6), _attack("Retain", "relearn", 0.35, attacked_kind="retain")]
    for r, value in zip(results[:3], (0.9, 0.2, 0.3)):
        r["metrics"]["forget_rouge_l"] = value
    rows = tables.robustness_rows(results, "tofu")
    assert [(r["label"], r["attack"]) for r in rows] == [("GA", "relearn")]   # the oracle is the control, not a row
    recovery = rows[0]["recovery"]
    assert recovery.score == pytest.approx(0.5) and recovery.oracle_score == pytest.approx(0.25)
    assert recovery.excess == pytest.approx(0.25)
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "| m | forget01 | GA | relearn | all | 0.90 | 0.30 | 0.60 | 0.50 | 0.25 | 0.25 | 1 |" in text
    assert "- GA + relearn" not in text   # a row with every number needs no note
    # attack cells are not leaderboard rows
    assert [r["label"] for r in tables.aggregate(results, "tofu")] == ["Original", "GA"]
    # without the oracle's attack cell the row keeps its recovery and says why the Oracle column is empty
    text = "\n".join(tables.robustness_markdown(results[:4], "tofu"))
    assert "| GA | relearn | all | 0.90 | 0.30 | 0.60 | 0.50 | -- | -- | 1 |" in text
    assert "- GA + relearn (forget01): no oracle beside it" in text
    # a method that left the Original's score has no gap: no recovery share, and the note says why
    results[2]["metrics"]["forget_rouge_l"] = 0.9
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "| GA | relearn | all | 0.90 | 0.90 | 0.60 | -- | -- | -- | 1 |" in text
    assert "- GA + relearn (forget01): no recovery: the unlearned model's forget score is not below" in text


def test_the_robustness_matrix_puts_methods_by_attacks_and_names_short_entries():
    """GA has both seeds attacked by relearn, NPO one of two and no int4 cell: the matrix reads recovery (oracle)
    per method and attack, says n where an entry averages fewer cells than the rest, and leaves a dash for none."""
    results = [_result("Original", kind="original"), _result("Retain", kind="retain")]
    for label, seed, value in (("GA", 0, 0.3), ("GA", 1, 0.3), ("NPO", 0, 0.6), ("NPO", 1, 0.6)):
        cell = _result(label)
        cell.update(hash=f"{label}{seed}", seed=seed)
        cell["metrics"]["forget_rouge_l"] = value
        results.append(cell)
    results += [_attack("GA", "relearn", 0.6, attacked="GA0"), _attack("GA", "relearn", 0.6, seed=1, attacked="GA1"),
                _attack("NPO", "relearn", 0.75, attacked="NPO0"), _attack("GA", "int4", 0.3, attacked="GA0"),
                _attack("GA", "int4", 0.3, seed=1, attacked="GA1"),
                _attack("Retain", "relearn", 0.35, attacked_kind="retain", attacked="Retain")]
    results[-1]["details"]["attack"]["attacked"] = results[1]["hash"]
    for r, value in zip(results[:2], (0.9, 0.2)):
        r["metrics"]["forget_rouge_l"] = value
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "Recovery by method and attack, m, split forget01" in text and "averages 2 attack cell(s)" in text
    assert "| Method | Gap | int4 | relearn |" in text
    assert "| GA | 0.60 | 0.00 (--) | 0.50 (0.25) |" in text
    assert "| NPO | 0.30 | – | 0.50 (0.50) n=1 |" in text


def test_a_robustness_row_reads_each_attack_cell_against_the_seed_it_attacked():
    """GA's seeds 0 and 1 forget to 0.3 and 0.7; only seed 0's quantized cell finished (0.6). Against its own seed
    the attack closes half of the gap (0.9 - 0.3); against the mean over both seeds (0.5) it would read 0.25."""
    ga0, ga1 = _result("GA"), _result("GA")
    ga0.update(hash="ga0", seed=0)
    ga1.update(hash="ga1", seed=1)
    results = [_result("Original", kind="original"), ga0, ga1, _attack("GA", "int4", 0.6, attacked="ga0")]
    for r, value in zip(results[:3], (0.9, 0.3, 0.7)):
        r["metrics"]["forget_rouge_l"] = value
    (row,) = tables.robustness_rows(results, "tofu")
    assert (row["before"], row["n"]) == (pytest.approx(0.3), 1)
    assert row["recovery"].score == pytest.approx(0.5)
    # an attack cell whose attacked cell is not among the results gives the row no number, and says why
    results[-1]["details"]["attack"]["attacked"] = "gone"
    (row,) = tables.robustness_rows(results, "tofu")
    assert row["recovery"] is None and row["before"] is None and "no Original or attacked cell" in row["reason"]
    assert "not scored against its references (no Original or attacked cell beside it)" in \
        "\n".join(tables.robustness_markdown(results, "tofu"))


# ------------------------------------------------------------------------------------------- relearn: held-out items

QUESTIONS = ["q0", "q1", "q2", "q3"]


def _cell(label, kind, values, *, seed=0, hash_=None, attacked=None, attacked_kind="method", slice_questions=None):
    """A TOFU cell with per-item forget ROUGE-L (`values`, one per question); its cell-level number is the mean
    over all items, as the scorer gives it, so a table that reads it instead of the held-out items is caught."""
    result = _result(label, kind=kind)
    result.update(hash=hash_ or f"{label}-{seed}", seed=seed,
                  per_item={"forget_question": list(QUESTIONS), "forget_rouge_l": list(values),
                            "forget_truth_ratio": [0.5] * len(values)})
    result["metrics"]["forget_rouge_l"] = sum(values) / len(values)
    if kind == "attack":
        name = label.split(" + ")[0]
        result["details"] = {"attack": {"name": "relearn", "attacked": attacked, "attacked_label": name,
                                        "attack_label": "relearn", "attacked_kind": attacked_kind},
                             "relearn": {"slice_questions": list(slice_questions or [])}}
    return result


def _relearn_run():
    """Seed 0 trains on q0, seed 1 on q1, the oracle (seed 0) on q3. Held out: seed 0 {q1, q2}, seed 1 {q0, q2}."""
    return [
        _cell("Original", "original", [1.0, 0.8, 0.6, 0.2], seed=None, hash_="orig"),
        _cell("Retain", "retain", [0.1, 0.1, 0.1, 0.9], hash_="ret"),
        _cell("Retain + relearn", "attack", [0.1, 0.2, 0.2, 1.0], attacked="ret", attacked_kind="retain",
              slice_questions=["q3"]),
        _cell("GA", "method", [0.0, 0.2, 0.0, 0.6], seed=0, hash_="ga0"),
        _cell("GA", "method", [0.0, 0.0, 0.2, 0.6], seed=1, hash_="ga1"),
        _cell("GA + relearn", "attack", [1.0, 0.5, 0.3, 0.0], seed=0, attacked="ga0", slice_questions=["q0"]),
        _cell("GA + relearn", "attack", [0.4, 1.0, 0.2, 0.0], seed=1, attacked="ga1", slice_questions=["q1"]),
    ]


def test_relearn_recovery_counts_only_the_items_outside_both_slices_for_every_reference_point():
    """Per seed, the slice's and the oracle's slice's questions leave all five numbers; then seeds are averaged.
    seed 0 on {q1, q2}: Original 0.7, GA 0.1, attacked 0.4, oracle 0.1 -> 0.2; seed 1 on {q0, q2}: 0.8, 0.1, 0.3,
    0.1 -> 0.15. Means: 0.75, 0.1, 0.35, oracle 0.1 -> 0.175: recovery 0.25 / 0.65, the oracle's 0.075 / 0.65."""
    rows = tables.robustness_rows(_relearn_run(), "tofu")
    assert [(r["label"], r["attack"], r["items"]) for r in rows] == [("GA", "relearn", "held-out")]
    row = rows[0]
    assert (row["original"], row["before"], row["after"]) == pytest.approx((0.75, 0.1, 0.35))
    assert row["n_items"] == [2, 2]
    assert row["recovery"].score == pytest.approx(0.25 / 0.65)
    assert row["recovery"].oracle_score == pytest.approx(0.075 / 0.65)
    text = "\n".join(tables.robustness_markdown(_relearn_run(), "tofu"))
    # the item-bootstrap interval beside each figure (every cell stores per-item values)
    assert "| m | forget01 | GA | relearn | held-out (2) | 0.75 [0.60, 0.90] | 0.10 [0.03, 0.17] | 0.35 [0.25, 0.45] | " \
        "0.38 [0.30, 0.44] | 0.12 [0.06, 0.20] | 0.27 [0.10, 0.37] | 2 |" in text
    assert "Rows of relearn count the held-out forget items only" in text


def test_relearn_without_per_item_values_gives_no_numbers_and_says_why():
    results = _relearn_run()
    del results[0]["per_item"]["forget_rouge_l"]    # an Original scored before per-item ROUGE-L was kept
    row = tables.robustness_rows(results, "tofu")[0]
    assert row["recovery"] is None and row["after"] is None and "no per-item forget_rouge_l" in row["reason"]
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "- GA + relearn (forget01): not scored on held-out items (no per-item forget_rouge_l" in text


def test_benign_relearn_trains_on_no_forget_item_so_every_item_counts():
    results = _relearn_run()
    for cell in results:
        if cell["kind"] == "attack":
            cell["details"]["relearn"]["slice_questions"] = []
    row = tables.robustness_rows(results, "tofu")[0]
    # the cells' own numbers (means over all four items): Original 0.65, GA 0.2, attacked (0.45 + 0.4) / 2
    assert (row["original"], row["before"], row["after"]) == pytest.approx((0.65, 0.2, 0.425))
    assert "| all (none trained on) |" in "\n".join(tables.robustness_markdown(results, "tofu"))


def test_the_retain_oracle_records_its_own_privleak_as_0(tmp_path):
    """The oracle is its own reference: its cell records privleak 0 (as the report computes it), not a number
    against open-unlearning's 0.5 fallback, which a method cell without an oracle still gets and says so."""
    items = [{"question": "Q0?", "answer": "A0", "generation": "x", "truth_ratio": 0.5}]
    tasks = {"tofu_forget10": {"agg": {"rouge_l_recall": 0.5, "probability": 0.5, "truth_ratio": 0.5},
                               "items": items},
             **{name: {"agg": a, "items": items} for name, a in UTILITY.items()},
             "tofu_privacy_forget10": {"agg": {"mia_min_k": 0.8, "mia_loss": 0.7}}}
    run = write_run(tmp_path / "oracle", tasks)
    oracle = tofu_scoring.score_tofu_cell(run, split="forget10", is_oracle=True)
    assert oracle["metrics"]["privleak"] == 0.0 and oracle["metrics"]["mia_auc_min_k"] == 0.8
    assert oracle["details"]["privleak"]["retain_source"] == "this cell (the retain oracle)"
    alone = tofu_scoring.score_tofu_cell(run, split="forget10")
    assert alone["metrics"]["privleak"] == pytest.approx(privleak(0.8, 0.5))
    assert "no retain cell" in alone["details"]["privleak"]["retain_source"]


def test_scored_tofu_cells_carry_the_per_item_values_the_held_out_rows_read(tmp_path):
    """From lm-eval's saved outputs through the scorer to the table: each cell's per-item forget ROUGE-L (and
    probability) is recorded by question, and the relearn row reads the items outside the slice (Q0)."""
    values = {"Original": [1.0, 0.8, 0.6], "GA": [0.0, 0.2, 0.0], "GA + relearn": [1.0, 0.5, 0.3]}
    results = []
    for label, rouge in values.items():
        items = [{"question": f"Q{i}?", "answer": f"A{i}", "generation": "x", "truth_ratio": 0.5,
                  "rouge_l_recall": r, "probability": r / 2} for i, r in enumerate(rouge)]
        agg = {"rouge_l_recall": sum(rouge) / 3, "probability": sum(rouge) / 6, "truth_ratio": 0.5}
        tasks = {"tofu_forget10": {"agg": agg, "items": items},
                 **{name: {"agg": a, "items": items[:1]} for name, a in UTILITY.items()}}
        scored = tofu_scoring.score_tofu_cell(write_run(tmp_path / label, tasks), split="forget10")
        assert scored["per_item"]["forget_question"] == ["Q0?", "Q1?", "Q2?"]
        assert scored["per_item"]["forget_rouge_l"] == pytest.approx(rouge)
        assert scored["per_item"]["forget_prob"] == pytest.approx([r / 2 for r in rouge])
        kind = {"Original": "original", "GA": "method"}.get(label, "attack")
        results.append({**_result(label, kind=kind), "split": "forget10", "metrics": scored["metrics"],
                        "per_item": scored["per_item"]})
    results[2]["details"] = {"attack": {"name": "relearn", "attacked": "GA", "attacked_label": "GA",
                                        "attack_label": "relearn", "attacked_kind": "method"},
                             "relearn": {"slice_questions": ["Q0?"]}}
    row = tables.robustness_rows(results, "tofu")[0]
    assert (row["original"], row["before"], row["after"]) == pytest.approx((0.7, 0.1, 0.4))
    assert row["recovery"].score == pytest.approx(0.5) and row["n_items"] == [2]


def test_the_robustness_block_shows_the_best_layer_beside_the_outputs_forget_probability():
    """Cells that recorded the logit lens (evaluation.logit_lens): means over seeds, the best layers 1-based."""
    def lensed(label, seed, output, per_layer, kind="method"):
        result = _result(label, kind=kind)
        best = max(range(len(per_layer)), key=per_layer.__getitem__)
        result.update(hash=f"{label}-{seed}", seed=seed, details={"logit_lens": {
            "per_layer": per_layer, "best_layer": best, "best": per_layer[best], "final": per_layer[-1],
            "n_items": 4, "n_layers": len(per_layer)}})
        result["metrics"].update(forget_prob=output, forget_best_layer_prob=per_layer[best])
        return result

    # the output column is the lens's own last layer (its items), not the cell's forget probability (all items)
    results = [lensed("Original", None, 0.8, [0.1, 0.5, 0.9], kind="original"),
               lensed("Retain", 0, 0.3, [0.2, 0.5, 0.3], kind="retain"),
               lensed("GA", 0, 0.2, [0.1, 0.6, 0.2]), lensed("GA", 1, 0.4, [0.5, 0.3, 0.4])]
    copied = lensed("GA + paraphrase", 0, 0.7, [0.1, 0.6, 0.2])   # a prompt attack: its attacked cell's lens
    copied["details"]["logit_lens"]["from_attacked_cell"] = "GA-0"
    assert [row["label"] for row in tables.lens_rows(results + [copied], "tofu")] == ["Original", "Retain", "GA"]
    text = "\n".join(tables.robustness_markdown(results, "tofu"))   # no attack cell: the lens alone
    assert text.startswith("### Robustness: is the knowledge gone, or only hidden?")
    assert ("| Model | Split | Row | Output forget probability | Best-layer forget probability (layer l of L) | "
            "Recovery | Oracle | Excess |") in text
    assert "| m | forget01 | Original | 0.90 | 0.90 (layer 3 of 3) | -- | -- | -- |" in text
    # GA: output 0.30, best 0.55, the Original's best 0.90: (0.55 - 0.30) / 0.60; the oracle: (0.50 - 0.30) / 0.60
    assert "| m | forget01 | GA | 0.30 | 0.55 (layers 1, 2 of 3) | 0.42 | 0.33 | 0.08 |" in text
    without_oracle = "\n".join(tables.lens_markdown([results[0]] + results[2:], "tofu"))
    assert "| m | forget01 | GA | 0.30 | 0.55 (layers 1, 2 of 3) | 0.42 | -- | -- |" in without_oracle
    assert tables.robustness_markdown([_result("GA")], "tofu") == []   # neither attacks nor a lens: no block


def test_attack_cells_of_several_seeds_stay_one_row():
    """Each seed's attack cell records the hash of the cell it attacked (one per seed): a link, not a setting, so
    the report does not split `GA + relearn` into one row per attacked hash."""
    cells = [{**_cell("GA + relearn", "attack", [0.5] * 4, seed=seed, attacked=f"ga{seed}", slice_questions=["q0"]),
              "resolved_config": {"extra": {"attack": {"name": "relearn", "settings": {}}, "attacked": f"ga{seed}"}}}
             for seed in (0, 1)]
    assert [r["label"] for r in tables.split_label_variants(cells)] == ["GA + relearn"] * 2
    cells[1]["resolved_config"]["extra"]["attack"]["settings"] = {"slice_size": 3}   # a setting still splits
    assert {r["label"] for r in tables.split_label_variants(cells)} == {
        "GA + relearn (extra.attack.settings.slice_size=unset)", "GA + relearn (extra.attack.settings.slice_size=3)"}


def test_rwku_relearn_on_passages_counts_every_probe_and_pairs_each_target_with_its_own_original():
    """RWKU's relearn trains on passages (no probe question in its slice): each target's cells give the numbers
    (forget All), target by target; no oracle. Targets 1 and 2: Original 0.8 / 0.6, GA 0.2 / 0.2, attacked 0.5 /
    0.3: means 0.7, 0.2, 0.4, recovery 0.2 / 0.5."""
    def rwku(label, kind, target, value, **details):
        counts = {f"rwku_{p}": {str(target): {"n": 2}} for p in ("fb", "qa", "aa")}
        return {"hash": f"{label}-{target}", "status": "ok", "kind": kind, "label": label, "method": label,
                "model": "m", "benchmark": "rwku", "split": None, "target": target, "seed": None if kind ==
                "original" else 0, "metrics": {f"forget_{p}": value for p in ("fb", "qa", "aa")},
                "details": {"scoring": {"per_target": counts}, **details}}

    results = []
    for target, (orig, ga, after) in {1: (0.8, 0.2, 0.5), 2: (0.6, 0.2, 0.3)}.items():
        results += [rwku("Original", "original", target, orig), rwku("GA", "method", target, ga),
                    rwku("GA + relearn", "attack", target, after, relearn={"slice_questions": []}, attack={
                        "name": "relearn", "attacked": f"GA-{target}", "attacked_label": "GA",
                        "attack_label": "relearn", "attacked_kind": "method"})]
    row = tables.robustness_rows(results, "rwku")[0]
    assert (row["original"], row["before"], row["after"]) == pytest.approx((0.7, 0.2, 0.4))
    assert row["recovery"].score == pytest.approx(0.4) and row["recovery"].oracle_score is None
    assert "| m | all targets | GA | relearn | all (none trained on) |" in "\n".join(
        tables.robustness_markdown(results, "rwku"))


def test_rwku_adversarial_probes_are_reported_per_attack_type():
    """The paraphrase attack on RWKU is its AA probe read per attack type: each row pools its cells' per-type
    recalls weighted by their item counts (target 1 has 3 role-play items, target 2 one)."""
    from cru_harness.reporting import tables

    def cell(label, target, types, kind="method"):
        return {"model": "M", "label": label, "kind": kind, "status": "ok", "benchmark": "rwku", "target": target,
                "details": {"scoring": {"forget_aa_types": {k: {"n": n, "rouge_l_recall": v}
                                                            for k, (n, v) in types.items()}}}}

    results = [cell("GA", 1, {"role play": (3, 0.2), "reverse query": (2, 0.5)}),
               cell("GA", 2, {"role play": (1, 0.6)}),
               cell("Retain", 1, {"role play": (3, 0.9)}, kind="retain")]
    (row,) = rwku_report.aa_type_rows(results)
    assert row["types"]["role play"] == (pytest.approx((3 * 0.2 + 0.6) / 4), 4)
    assert row["types"]["reverse query"] == (pytest.approx(0.5), 2)
    lines = rwku_report.aa_type_markdown(results)
    assert "| Model | Method | reverse query | role play |" in lines
    assert "| M | GA | 0.50 (2) | 0.30 (4) |" in lines
    assert rwku_report.aa_type_markdown([cell("GA", 1, {})]) == []


def test_the_paraphrase_attacks_multiple_choice_form_has_its_own_table():
    """`forget_mc_prob` of paraphrase cells (TOFU's multiple-choice form) reaches the report: a row per attacked row,
    the mean over seeds; cells without it add none."""
    def mc(label, seed, value, kind="attack"):
        result = _result(f"{label} + paraphrase", kind=kind)
        result.update(hash=f"{label}-p-{seed}", seed=seed, details={"attack": {
            "attacked_label": label, "attack_label": "paraphrase"}})
        result["metrics"]["forget_mc_prob"] = value
        return result

    results = [mc("GA", 0, 0.2), mc("GA", 1, 0.4), mc("Retain", 0, 0.3), _result("GA")]
    assert [(r["label"], r["attack"], r["n"]) for r in tables.mc_rows(results, "tofu")] == [
        ("GA", "paraphrase", 2), ("Retain", "paraphrase", 1)]
    text = "\n".join(tables.mc_markdown(results, "tofu"))
    assert "| m | forget01 | GA | paraphrase | 0.30 | 2 |" in text and "| m | forget01 | Retain | paraphrase | 0.30 | 1 |" in text
    assert tables.mc_markdown([_result("GA")], "tofu") == []


# ------------------------------------------------------------------------------------------- issue 77: controls
def test_the_original_under_an_attack_is_a_control_beside_the_oracles_in_the_absolute_levels():
    """int4 lowers every model: the Original 0.9 -> 0.7, the oracle 0.2 -> 0.15; GA 0.3 -> 0.25. The Original's
    attack cell is no robustness row of its own; the levels table reads GA's 0.25 beside the oracle's 0.15 and the
    Original's 0.7 under int4, with the difference 0.10; the noise floor sets the rounding's change beside the
    unlearning's."""
    results = [_result("Original", kind="original"), _result("Retain", kind="retain"), _result("GA"),
               _attack("GA", "int4", 0.25), _attack("Retain", "int4", 0.15, attacked_kind="retain"),
               _attack("Original", "int4", 0.7, attacked_kind="original")]
    for r, value in zip(results[:3], (0.9, 0.2, 0.3)):
        r["metrics"]["forget_rouge_l"] = value
    results[3]["details"]["quantize"] = {"relative_weight_change": 0.05, "unlearning_weight_change": 0.001}
    assert [(r["label"], r["attack"]) for r in tables.robustness_rows(results, "tofu")] == [("GA", "int4")]
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert "| m | forget01 | GA | int4 | all | 0.25 | 0.15 | 0.70 | 0.10 | 1 |" in text
    assert "No Original + attack cell" not in text
    assert "| m | forget01 | GA | int4 | 0.05 | 0.001 | 50.0 | 1 |" in text
    # without the Original's attack cell the level table says the control is missing
    text = "\n".join(tables.robustness_markdown(results[:5], "tofu"))
    assert "| m | forget01 | GA | int4 | all | 0.25 | 0.15 | -- | 0.10 | 1 |" in text
    assert "- No Original + attack cell for int4" in text


def test_the_levels_matrix_reads_each_method_beside_the_controls_under_each_attack():
    """int4: GA at 0.25 and 0.35 (seeds 0, 1), NPO at 0.20 (one cell), the oracle at 0.15 and the Original at 0.70
    under it: the matrix shows the controls once and each method's mean level with its difference from the oracle's,
    saying n where a row averages fewer cells. Under relearn each method's items are those its attack did not
    show, so the oracle's level differs by row and the control row says so instead of one number."""
    results = [_attack("GA", "int4", 0.25), _attack("GA", "int4", 0.35, seed=1), _attack("NPO", "int4", 0.2),
               _attack("Retain", "int4", 0.15, attacked_kind="retain"),
               _attack("Original", "int4", 0.7, attacked_kind="original")]
    lines = tables.levels_markdown(results, "tofu")
    assert lines[lines.index("| Row | int4 |") + 2:lines.index("| Row | int4 |") + 6] == [
        "| Retain (oracle) + attack | 0.15 |", "| Original + attack | 0.70 |", "| GA | 0.30 (0.15) |",
        "| NPO | 0.20 (0.05) n=1 |"]

    def relearn(label, kind, values, shown):
        cell = _attack(label, "relearn", sum(values) / 3, attacked_kind=kind)
        cell["details"]["relearn"] = {"slice_questions": shown}
        cell["per_item"] = {"forget_question": ["q0", "q1", "q2"], "forget_rouge_l": values}
        return cell

    results = [relearn("GA", "method", [0.9, 0.5, 0.5], ["q0"]), relearn("NPO", "method", [0.5, 0.9, 0.5], ["q1"]),
               relearn("Retain", "retain", [0.2, 0.4, 0.3], []), relearn("Original", "original", [0.6] * 3, [])]
    lines = tables.levels_markdown(results, "tofu")
    assert lines[lines.index("| Row | relearn |") + 2] == "| Retain (oracle) + attack | per row |"
    assert lines[lines.index("| Row | relearn |") + 3].startswith("| Original + attack | 0.60 [0.60, 0.60] |")
    assert lines[lines.index("| Row | relearn |") + 4].startswith("| GA | 0.50 (0.15 [")   # q1, q2: 0.5 - 0.35


def test_a_recovery_share_of_a_gap_under_the_minimum_says_why_instead_of_a_number():
    """A gap of 0.05 (< MIN_REPORTED_GAP): a 0.04 drop would read as a share of -0.8; the table prints why."""
    from cru_harness.metrics.recovery import MIN_REPORTED_GAP

    results = [_result("Original", kind="original"), _result("GA"), _attack("GA", "int4", 0.81)]
    for r, value in zip(results[:2], (0.9, 0.85)):
        r["metrics"]["forget_rouge_l"] = value
    assert MIN_REPORTED_GAP > 0.05
    text = "\n".join(tables.robustness_markdown(results, "tofu"))
    assert f"| m | forget01 | GA | int4 | all | 0.90 | 0.85 | 0.81 | gap < {MIN_REPORTED_GAP:g} | gap < " in text
    assert f"no recovery share: the gap (0.05) is below {MIN_REPORTED_GAP:g}" in text
    results[1]["metrics"]["forget_rouge_l"] = 0.5   # a gap of 0.4: the share is shown
    assert "| m | forget01 | GA | int4 | all | 0.90 | 0.50 | 0.81 | 0.78 |" in "\n".join(
        tables.robustness_markdown(results, "tofu"))


def _private(label, kind, forget, holdout, ratios, seed=0):
    """A cell with per-item privacy scores (Min-K%, loss-like) and forget truth ratios; its leaderboard numbers are
    those the scorer gives (the AUC of these scores, privleak against 0.5 until the oracle fills it)."""
    from cru_harness.metrics.privacy import forget_holdout_auc

    result = _result(label, kind=kind)
    questions = [f"f{i}" for i in range(len(forget))] + [f"h{i}" for i in range(len(holdout))]
    result.update(hash=f"{label}-{seed}", seed=seed, per_item={
        "privacy_question": questions, "privacy_set": [0] * len(forget) + [1] * len(holdout),
        "privacy_min_k": list(forget) + list(holdout),
        "forget_question": [f"f{i}" for i in range(len(ratios))], "forget_truth_ratio": list(ratios)})
    auc = forget_holdout_auc(forget, holdout)
    result["metrics"].update(mia_auc_min_k=auc, privleak=privleak(auc, 0.5), forget_quality=0.5)
    return result


def test_privleak_and_forget_quality_carry_item_bootstrap_intervals_where_cells_store_per_item_scores():
    """GA's forget items mostly score below its holdout items (AUC about 0.87), the oracle's interleave (near 0.5):
    each AUC varies with the items drawn, so privleak's interval, recomputed against the oracle's resampled AUC on
    the same draw, spreads around the leaderboard's number, wide at 20 + 20 items. Cells without the scores add no
    block."""
    import random

    rng = random.Random(0)
    oracle = _private("Retain", "retain", [rng.random() for _ in range(20)], [rng.random() for _ in range(20)],
                      [rng.random() for _ in range(20)])
    ga = _private("GA", "method", [i / 20 for i in range(20)], [0.5 + i / 20 for i in range(20)],
                  [rng.random() + 0.5 for _ in range(20)])
    results = tables.fill_from_oracle([oracle, ga])
    (row,) = [r for r in tables.privacy_interval_rows(results, "tofu") if r["label"] == "GA"]
    auc_low, auc_high = row["intervals"]["mia_auc_min_k"]
    assert auc_low < row["mia_auc_min_k"] < auc_high <= 1.0
    assert row["privleak"] == pytest.approx(privleak(row["mia_auc_min_k"], oracle["metrics"]["mia_auc_min_k"]))
    low, high = row["intervals"]["privleak"]
    assert low < row["privleak"] < high and high - low > 10   # 20 + 20 items: privleak is loose
    fq_low, fq_high = row["intervals"]["forget_quality"]
    assert 0 <= fq_low < fq_high <= 1
    text = "\n".join(tables.privacy_intervals_markdown(results, "tofu"))
    assert "### Privacy with item-bootstrap intervals" in text and "| m | forget01 | GA | -" in text
    for cell in results:
        cell["per_item"] = {}
    assert tables.privacy_intervals_markdown(results, "tofu") == []


def test_the_scorer_keeps_privleaks_per_item_scores_from_the_privacy_samples(tmp_path):
    rows = [{"doc": {"question": "q0", "set": "forget"}, "mia_min_k": [0, 1.5]},
            {"doc": {"question": "q1", "set": "holdout"}, "mia_min_k": [1, 2.5]}]
    (tmp_path / "samples_tofu_privacy_forget01_2026-01-01T00-00-00.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    assert tofu_scoring.privacy_items(tmp_path, "forget01") == {
        "privacy_question": ["q0", "q1"], "privacy_set": [0, 1], "privacy_min_k": [1.5, 2.5]}
    assert tofu_scoring.privacy_items(tmp_path / "none", "forget01") == {}
