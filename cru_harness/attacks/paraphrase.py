"""The paraphrase attack: each forget question asked in other words.

TOFU: the forget task's `tofu_forgetXX_paraphrase` variant asks each row's `paraphrased_question` (in every
`*_perturbed` file) in place of `question`; the scored answers are unchanged (ROUGE-L against `answer`, the
answer's probability, the truth ratio). It adds `mc_probability`: the answer against the row's perturbed answers,
as TOFU scores Real Authors' multiple-choice probability. RWKU has no variant: its adversarial probe (`rwku_aa`,
in every RWKU cell) is this attack on RWKU, reported per attack type in every cell
(`details.scoring.forget_aa_types`).

Source: Doshi & Cooper Stickland 2024, "Does Unlearning Truly Unlearn? A Black Box Evaluation of LLM Unlearning
Methods" (arXiv:2411.12103): rephrased questions recover much of what RMU / LLMU removed; TOFU's paraphrased
questions are its authors' (Maini et al. 2024).
"""
from __future__ import annotations

from dataclasses import dataclass

from .prompt_variants import PromptAttack


@dataclass
class ParaphraseConfig:
    """No settings: the paraphrases are TOFU's own."""


class ParaphraseAttack(PromptAttack):
    name = "paraphrase"
    summary = "ask TOFU's paraphrased forget questions (same answers scored), plus the multiple-choice form"
    config = ParaphraseConfig
    variant = "paraphrase"
    order = 140


ATTACK = ParaphraseAttack()
