"""Each baseline's default grid for `tuning:` (`api.Method.tuning_grid`, read by `runner.tuning`): the values a
tuned run tries on its validation unit when the config names no grid of its own, and where they come from. Every
default grid holds 4 settings at the entry's own step count, so methods trained for the same steps get the same
budget (grid size x steps). A method absent here has no default grid (LUNAR fits at its own code's schedule; ICU and
PURGE train nothing)."""
from __future__ import annotations

#: Half-decade steps from TOFU's protocol rate (1e-5: TOFU's and open-unlearning's TOFU unlearning configs) to
#: above the fine-tuning rate (1e-4 here), configs/gpu_smollm2_lr.yaml's grid without its lowest value (3e-6, which
#: moved no number there). No reference of these methods publishes a TOFU sweep this project could cite; the
#: references' beta / gamma grids (NPO, SimNPO) are not searched: each runs at its TOFU default.
LR_GRID = {"grid": {"learning_rate": [1.0e-5, 3.0e-5, 1.0e-4, 3.0e-4]},
           "source": "stated grid: half-decade steps from TOFU's lr 1e-5 to 3e-4 (configs/gpu_smollm2_lr.yaml's grid "
                     "without 3e-6); no published sweep of the method's"}

#: RMU: its two published settings' steering coefficient c and retain weight alpha crossed: WMDP's Zephyr-7B run (c
#: 6.5, alpha 1200: WMDP's README, the per-model search of the WMDP paper) and open-unlearning's TOFU RMU (c 2,
#: alpha 1), at the entry's learning rate.
RMU_GRID = {"grid": {"steering_coeff": [2.0, 6.5], "alpha": [1.0, 1200.0]},
            "source": "WMDP's per-model c / alpha search (Zephyr-7B: c 6.5, alpha 1200, WMDP README) crossed with "
                      "open-unlearning's TOFU RMU (c 2, alpha 1)"}

GRIDS = {name: LR_GRID for name in ("GA", "GD", "GD-KL", "NPO", "NPO-KL", "SimNPO", "IdkDPO", "DPO", "RT", "UNDIAL",
                                    "SatImp", "WGA", "CE-U", "TaskVector", "WHP")}
GRIDS["RMU"] = RMU_GRID
