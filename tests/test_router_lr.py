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


def test_the_lowest_median_over_seeds_is_chosen_and_a_failed_seed_is_missing_not_low():
    cells = [
        # 1e-4: medians of [0.6, 0.7, 0.65] -> 0.65
        *(_cell(1e-4, s, [f], [1.0]) for s, f in enumerate([0.6, 0.7, 0.65])),
        # 1e-3: one seed very low, the median 0.5 still the lowest
        *(_cell(1e-3, s, [f], [1.0]) for s, f in enumerate([0.05, 0.5, 0.55])),
        # 1e-2: two seeds at 0.52, and a diverged seed that must not count as a low objective
        _cell(1e-2, 0, [0.52], [1.0]), _cell(1e-2, 1, [0.52], [1.0]), _cell(1e-2, 2, [float("nan")], [1.0]),
        _cell(1e-2, 3, [0.0], [1.0], status="failed"),
    ]
    (entry,) = router_lr_choices(cells)
    assert entry["chosen"] == 1e-3
    rows = {row["lr"]: row for row in entry["rows"]}
    assert rows[1e-4]["median_objective"] == pytest.approx(0.65)
    assert rows[1e-2]["median_objective"] == pytest.approx(0.52) and rows[1e-2]["missing"] == [2, 3]
    text = "\n".join(router_lr_markdown(cells))
    assert "Chosen: **0.001** (the lowest median objective)" in text and "| 0.01 | 0.5200 | 2 | 2, 3 |" in text


def test_an_exact_tie_goes_to_the_smaller_learning_rate_and_a_missing_lr_is_the_default():
    cells = [_cell(1e-2, 0, [0.3], [1.0]), _cell(None, 0, [0.3], [1.0], label="CRU")]
    (entry,) = router_lr_choices(cells)
    assert [row["lr"] for row in entry["rows"]] == [1e-3, 1e-2]   # RouterTrainingConfig's default lr
    assert entry["chosen"] == 1e-3


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
