"""Scoring: lm-eval outputs -> a cell's numbers (`cell_scores`), the cross-task TOFU numbers (`score`, also the
`cru-harness score` command), the failure classes of answers (`failure_modes`) and the privacy scores that read the
model (`model_scores`). Below reporting: the runner scores a cell without the report layer."""
