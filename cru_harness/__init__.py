"""cru-harness: Causal Routing for Unlearning and an honest TOFU/RWKU harness on lm-evaluation-harness."""

__version__ = "0.1.0"
