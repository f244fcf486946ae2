"""Attacks on finished cells (`cru_harness.api.Attack`, entry-point group `cru_harness.attacks`): each takes a
cell's deployed model and returns the attacked one, which the runner evaluates as a cell of kind `attack`."""
