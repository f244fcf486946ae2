"""The routers' learning-rate rule (cru_harness.reporting.router_lr): the paper's loss on the final per-block gate
means, the lowest median over seeds, and the blocks it refuses to choose in."""
from __future__ import annotations


import pytest

from cru_harness.reporting.router_lr import objective, router_lr_choices, router_lr_markdown


def _cell(lr, seed, forget, retain, *, label=None, status="ok", **hparams):
    hparams = {"lam": 1, "percentile": 95, "d_r": 32, "last_k": 4, **hparams}
    if lr is not None:
        hparams["lr"] = lr
    return {"kind": "method", "method": "CRU", "label": label or f"CRU-lr{lr}", "model": "m", "benchmark": "tofu",
            "split": "forget05", "seed": seed, "status": status, "hparams": hparams,
            "gate_means": {"raw": {"forget_gate_mean_per_block": {str(b): v for b, v in enumerate(forget)},
                                   "retain_gate_mean_per_block": {str(b): v for b, v in enumerate(retain)}}}}


def test_objective_is_the_papers_loss_on_the_block_means():
    # mean_l f = (0.2 + 0.4) / 2; mean_l (r - 1)^2 = (0.01 + 0.09) / 2
    assert objective(_cell(1e-3, 0, [0.2, 0.4], [0.9, 0.7])) == pytest.approx(0.3 + 0.05)
    assert objective(_cell(1e-3, 0, [0.2, 0.4], [0.9, 0.7], lam=10)) == pytest.approx(0.3 + 10 * 0.05)
    # the cell's own loss shapes: w^2 forget term, 1 - w retain term
    assert objective(_cell(1e-3, 0, [0.2, 0.4], [0.9, 0.7], suppress_loss="quadratic", pass_loss="linear")) \
        == pytest.approx((0.04 + 0.16) / 2 + (0.1 + 0.3) / 2)
    assert objective(_cell(1e-3, 0, [0.2, float("nan")], [0.9, 0.7])) is None
    assert objective({"hparams": {}, "gate_means": {"raw": {}}}) is None
    # damaged or foreign results are missing, not a traceback: unknown settings, blocks that do not match
    assert objective(_cell(1e-3, 0, [0.2], [0.9], pass_loss="cubic")) is None
    mismatched = _cell(1e-3, 0, [0.2, 0.4], [0.9, 0.7])
    del mismatched["gate_means"]["raw"]["retain_gate_mean_per_block"]["1"]
    assert objective(mismatched) is None
    assert objective(dict(_cell(1e-3, 0, [0.2], [0.9]), hparams={"lam": 1, "some_future_option": 3})) \
        == pytest.approx(0.2 + 0.01)


def test_the_lowest_median_over_seeds_is_chosen_and_a_failed_seed_counts_against_its_rate():
    cells = [
        # 1e-5: medians of [0.6, 0.7, 0.65] -> 0.65
        *(_cell(1e-5, s, [f], [1.0]) for s, f in enumerate([0.6, 0.7, 0.65])),
        # 1e-4: one seed very low, the median 0.5 still the lowest
        *(_cell(1e-4, s, [f], [1.0]) for s, f in enumerate([0.05, 0.5, 0.55])),
        # 1e-3: two seeds far lower, but a diverged and a failed seed count as infinite: median of
        # [0.1, 0.1, inf, inf] = inf, so the rate that survived on two seeds of four is never chosen
        _cell(1e-3, 0, [0.1], [1.0]), _cell(1e-3, 1, [0.1], [1.0]), _cell(1e-3, 2, [float("nan")], [1.0]),
        _cell(1e-3, 3, [0.0], [1.0], status="failed"),
        # 1e-2: one failed seed of three: median of [0.6, 0.6, inf] = 0.6
        _cell(1e-2, 0, [0.6], [1.0]), _cell(1e-2, 1, [0.6], [1.0]), _cell(1e-2, 2, [0.0], [1.0], status="failed"),
    ]
    (entry,) = router_lr_choices(cells)
    assert entry["chosen"] == 1e-4 and entry["reason"] == "the lowest median objective"   # not at an end
    rows = {row["lr"]: row for row in entry["rows"]}
    assert rows[1e-5]["median_objective"] == pytest.approx(0.65)
    assert rows[1e-3]["median_objective"] is None and rows[1e-3]["missing"] == [2, 3]
    assert rows[1e-2]["median_objective"] == pytest.approx(0.6)
    text = "\n".join(router_lr_markdown(cells))
    assert "Chosen: **0.0001** (the lowest median objective)." in text and "| 0.001 | -- | 2 | 2, 3 |" in text
    # a choice at an end of the grid says so
    (edge,) = router_lr_choices(cells[:6])
    assert edge["chosen"] == 1e-4 and "the largest rate of the grid: one beyond it was not tried" in edge["reason"]


def test_an_exact_tie_goes_to_the_smaller_learning_rate_and_a_cell_is_read_at_its_recorded_rate():
    recorded = _cell(None, 0, [0.3], [1.0], label="CRU")
    recorded["details"] = {"router_training": {"lr": 1e-3, "lam": 1.0}}   # what the routers trained with
    cells = [_cell(1e-2, 0, [0.3], [1.0]), recorded, _cell(1e-2, 1, [0.3], [1.0])]
    (entry,) = router_lr_choices(cells)
    assert [row["lr"] for row in entry["rows"]] == [1e-3, 1e-2]
    assert entry["chosen"] == 1e-3 and entry["unrecorded"] == 0
    # a cell that records no rate (from before the record) is left out and counted, never read at today's default
    unknown = _cell(None, 1, [0.0], [1.0], label="CRU")
    (entry,) = router_lr_choices(cells + [unknown])
    assert entry["unrecorded"] == 1 and [row["seeds"] for row in entry["rows"]] == [1, 2]
    assert "1 CRU cell(s) of this block record no learning rate" in "\n".join(router_lr_markdown(cells + [unknown]))


def test_no_choice_without_a_sweep_of_the_learning_rate_alone():
    # one learning rate: a run, not a sweep
    assert router_lr_choices([_cell(1e-3, s, [0.3], [1.0]) for s in range(3)]) == []
    # other hyperparameters differ: two blocks of one learning rate each
    assert router_lr_choices([_cell(1e-3, 0, [0.3], [1.0]), _cell(1e-2, 0, [0.2], [1.0], lam=10)]) == []
    # two labels at one learning rate (another corpus, which results do not record): listed, nothing chosen
    cells = [_cell(1e-3, 0, [0.3], [1.0], label="CRU"), _cell(1e-3, 0, [0.1], [1.0], label="CRU-retain-cover"),
             _cell(1e-2, 0, [0.2], [1.0])]
    (entry,) = router_lr_choices(cells)
    assert entry["chosen"] is None and "CRU, CRU-retain-cover" in entry["reason"]
    assert "Chosen: none (learning rate 0.001 holds several labels" in "\n".join(router_lr_markdown(cells))
    # baselines and finished non-CRU cells are never read
    assert router_lr_choices([dict(_cell(1e-3, 0, [0.3], [1.0]), method="GA"),
                              dict(_cell(1e-2, 0, [0.3], [1.0]), method="GA")]) == []
    assert objective(_cell(1e-3, 0, [0.0], [0.0])) == pytest.approx(1.0)   # every gate shut: lambda x 1
