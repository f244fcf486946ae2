"""A method entry's `as_computed:` (issue 77): the committed shared-budget runs restate RMU's and LUNAR's defaults
from before they changed; the restated values train the cells and stay out of their hashes, so every committed
cell keeps its hash and trains as it did. It restates former defaults only."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cru_harness import plugins
from cru_harness.runner.config import load_config, validate_config
from cru_harness.runner.plan import build_plan
from cru_harness.validation import ConfigError

REPO = Path(__file__).resolve().parents[1]
PINNED = ("cpu_smollm2_forget01", "cpu_smollm2_forget01_robustness", "cpu_smollm2_lunar")


def _cells(raw_or_path, method):
    config = load_config(raw_or_path) if isinstance(raw_or_path, Path) else validate_config(raw_or_path)
    return [c for c in build_plan(config) if c.method == method and c.kind == "method"]


@pytest.mark.parametrize("name", PINNED)
def test_pinned_cells_keep_their_committed_hashes_and_train_as_computed(name):
    path = REPO / "configs" / f"{name}.yaml"
    committed = {p.name for p in (REPO / load_config(path).output_dir / "cells").iterdir()}
    raw = yaml.safe_load(path.read_text())
    for method, former in (("RMU", {"steering_coeff": 6.5, "alpha": 1200.0, "adam_eps": 1e-8}),
                           ("LUNAR", {"prompt_style": "evaluation"})):
        cells = _cells(path, method)
        if not cells:
            continue
        assert all(c.hash in committed for c in cells)
        config = plugins.methods.get(method).cell_config(cells[0])
        assert {k: getattr(config, k) for k in former} == former
        unpinned = [dict(m) for m in raw["methods"]]
        for entry in unpinned:
            entry.pop("as_computed", None)
        fresh = _cells({**raw, "methods": unpinned}, method)   # today's defaults: other cells, other settings
        assert not {c.hash for c in fresh} & committed
        assert {k: getattr(plugins.methods.get(method).cell_config(fresh[0]), k) for k in former} != former


@pytest.mark.parametrize("pin, message", [
    ({"steering_coeff": 7.0}, "is not RMU's former default 6.5"),
    ({"beta": 0.1}, "not a hyperparameter of RMU"),
    ({"forget_weight": 1.0}, "has no former default for forget_weight"),
    ({"alpha": 1200.0, "learning_rate": 5e-5}, "also set as a hyperparameter"),
    ([1], "expected a mapping"),
])
def test_as_computed_restates_former_defaults_only(tmp_path, pin, message):
    raw = {"name": "t", "output_dir": str(tmp_path), "models": [{"name": "m", "path": "zoo:llama"}],
           "benchmarks": {"tofu": {"splits": ["forget01"]}},
           "methods": [{"method": "RMU", "learning_rate": 1e-4, "as_computed": pin}]}
    with pytest.raises(ConfigError, match=message):
        validate_config(raw)
