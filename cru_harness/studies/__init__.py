"""Studies: a runner config plus what it reports (`cru-harness study CONFIG`).

A study YAML is an experiment config (`cru_harness.runner.config`) with one more key, `study:`, saying which
kind of study it is and what its table and plot show. `sweep` studies run the runner's cells (each variant a
method entry with its own `label`) and tabulate them; `overlap` is a localization analysis (no router
training); `gate_gap` runs the cells and then measures the trained routers' gates token by token.
"""
