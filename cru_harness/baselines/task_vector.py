"""Task Vector negation (Ilharco et al. 2023), as MUSE runs it as an unlearning baseline.

First the starting model theta_0 is fine-tuned on the forget rows (NLL, the "reinforced" model theta_ft); then
the task vector is subtracted, scaled: theta = theta_0 - scaling_coef * (theta_ft - theta_0).
Source: swj0419/muse_bench baselines/unlearn.py (`--algo tv`: `finetune` then `tv_unlearn`),
baselines/baselines/task_vector.py (`TaskVector`, `-task_vector`, `apply_to(..., scaling_coef=alpha)`) and
baselines/baselines/finetune.py; defaults from baselines/scripts/unlearn_news.sh and unlearn_books.sh (--alpha 5.0,
FT_EPOCHS 10, FT_LR 1e-5, 4 per device x 8 GPUs = 32) with finetune.py's TrainingArguments (cosine schedule,
adamw_torch; the Trainer's defaults: no warm-up, weight decay 0, clipping at 1.0), on every benchmark. The
subtraction covers the trained parameters (MUSE's covers every floating-point entry of the state dict, whose
buffers training leaves unchanged). The starting weights come from the frozen reference copy.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..hparams import bound_problem
from .base import BaselineConfig, UnlearningMethod
from .losses import nll_loss
from .plugin import BaselineMethod
from .registry import register_method


@dataclass
class MuseFinetuneConfig(BaselineConfig):
    """MUSE's fine-tuning recipe (baselines/finetune.py, the scripts' FT_* settings), on every benchmark: the
    reinforced model of Task Vector and WHP."""
    num_epochs: int = 10
    lr_scheduler: str = "cosine"
    warmup_epochs: float = 0.0
    weight_decay: float = 0.0


@dataclass
class TaskVectorConfig(MuseFinetuneConfig):
    scaling_coef: float = 5.0    # MUSE --alpha

    def __post_init__(self):
        super().__post_init__()
        if problem := bound_problem(self.scaling_coef, above=0):
            raise InputError(f"scaling_coef: {problem}")


def negate_task_vector(model, start, scaling_coef: float) -> None:
    """In place: every trained parameter p of `model` becomes p0 - scaling_coef * (p - p0), p0 from `start`."""
    start_params = dict(start.named_parameters())
    for name, param in model.named_parameters():
        if param.requires_grad:
            p0 = start_params[name].detach().to(param.device, param.dtype)
            param.copy_(p0 - scaling_coef * (param - p0))


class Reinforce(UnlearningMethod):
    """MUSE's `finetune`: NLL on the forget rows, which makes the reinforced model (Task Vector, WHP)."""

    def compute_loss(self, model, batch, ref_model=None):
        term, value = nll_loss(model, batch["forget"])
        return term, {"loss": float(term.detach()), "forget_nll": value}


@register_method
class TaskVector(Reinforce):
    name = "task_vector"
    Config = TaskVectorConfig
    needs_ref = True   # the starting weights theta_0, for the subtraction

    def post_train(self, model, ref_model=None):
        if ref_model is None:
            raise ValueError("task_vector needs the starting model (the frozen reference) to subtract from")
        negate_task_vector(model, ref_model, self.config.scaling_coef)


#: The runner's view of it (entry point `cru_harness.methods`: TaskVector).
METHOD = BaselineMethod(TaskVector, "TaskVector",
                        "MUSE's task vector: fine-tune on the forget set, subtract the difference",
                        order=59)
