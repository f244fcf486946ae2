"""RMU, Representation Misdirection for Unlearning (WMDP, Li et al. 2024).

forget term = mean_i mean_{t in answer_i} (1/d) ||h_L(x_i)_t - c u||^2
retain term = mean_i mean_{t in answer_i} (1/d) ||h_L(x_i)_t - h_L^ref(x_i)_t||^2
loss = forget_weight * forget term + alpha * retain term
h_L is the output of decoder block `layer` (the residual stream), h_L^ref the frozen starting model's; u is a
unit vector drawn once per run from the seed as WMDP draws it (torch.rand, uniform in [0, 1)^d, normalised) and
c = `steering_coeff`. Only the parameters matching `trainable_params` (names inside a block, regular expressions)
in blocks `trainable_layers` (default L-2, L-1, L) are trained.

Sources. The equation, u, and the trained parameters: centerforaisafety/wmdp rmu/unlearn.py (`run_rmu`:
control_vec = rand / norm * steering_coeff; mse_loss to it on forget, alpha * mse_loss to the frozen model on
retain; `get_params(layer_ids=5,6,7, param_ids=6)`, the 7th parameter of a Llama/Mistral block,
mlp.down_proj.weight). The reduction over tokens: open-unlearning src/trainer/unlearn/rmu.py
(`compute_activation_loss`: the answer tokens of each row, labels != -100, row means then the batch mean), since
the rows here are QA pairs; WMDP's corpora are plain text, whose every token is scored here too. The defaults:
WMDP's README run for Zephyr-7B (`--steering_coeffs 6.5 --alpha 1200 --lr 5e-5 --batch_size 4
--max_num_batches 150`, layer_id 7, layer_ids 5,6,7, param_ids 6), one pass, constant learning rate with no
warm-up (WMDP steps transformers' AdamW, weight decay 0, without clipping). The same on RWKU, which ships no RMU
script. open-unlearning's own TOFU setting (steering 2, alpha 1, every parameter trained) is a different
choice, not taken.

A joint WMDP unit (`bio+cyber`, forget rows tagged with their domain) trains as rmu/unlearn.py trains its list of
forget corpora: one u per domain (drawn in the corpora's order from the one seeded generator), batches alternating
over the domains in that order, each domain's b-th batch with the b-th batch of its retain corpus, read unshuffled
(`data.DomainAlternatingDataset`). One steering coefficient serves every domain (WMDP's README gives 6.5 for both).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..training.blocks import find_decoder_blocks, hidden_size
from ..errors import InputError
from ..hparams import bound_problem
from ._activations import block_output, masked_mse_per_sequence
from .base import RetainConfig, UnlearningMethod
from .data import IGNORE_INDEX, DomainAlternatingDataset
from .losses import sequence_mean
from .plugin import BaselineMethod
from .registry import register_method

@dataclass
class RMUConfig(RetainConfig):
    layer: int = 7                          # block whose output is steered (WMDP layer_id)
    steering_coeff: float = 6.5             # c, the norm of the target activation (WMDP --steering_coeffs)
    alpha: float = 1200.0                   # retain weight (WMDP --alpha)
    trainable_layers: tuple[int, ...] | None = None   # None: layer-2, layer-1, layer (WMDP layer_ids)
    trainable_params: tuple[str, ...] = (r"mlp\.down_proj\.weight",)   # in-block names (WMDP param_ids 6)
    learning_rate: float = 5e-5
    lr_scheduler: str = "constant"
    warmup_epochs: float = 0.0
    weight_decay: float = 0.0
    effective_batch_size: int = 4
    micro_batch_size: int = 4
    num_epochs: int = 1
    max_grad_norm: float | None = None

    def __post_init__(self):
        super().__post_init__()
        for name, rule in (("layer", dict(low=0, integer=True)), ("steering_coeff", dict(above=0))):
            if problem := bound_problem(getattr(self, name), **rule):
                raise InputError(f"{name}: {problem}")
        from ..hparams import as_list

        if self.trainable_layers is not None:
            self.trainable_layers = as_list("trainable_layers", self.trainable_layers, "block indices")
            if not self.trainable_layers or any(bound_problem(i, low=0, integer=True) for i in self.trainable_layers):
                raise InputError(f"trainable_layers: expected block indices >= 0, got {self.trainable_layers!r}")
        self.trainable_params = as_list("trainable_params", self.trainable_params, "parameter name patterns")
        if not self.trainable_params:
            raise InputError("trainable_params: expected at least one parameter name pattern")
        for pattern in self.trainable_params:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as err:
                raise InputError(f"trainable_params: {pattern!r} is not a regular expression ({err})") from None

    @property
    def layers_trained(self) -> tuple[int, ...]:
        if self.trainable_layers is not None:
            return self.trainable_layers
        return tuple(i for i in (self.layer - 2, self.layer - 1, self.layer) if i >= 0)

    def to_dict(self):
        d = super().to_dict()
        d["trainable_params"] = list(self.trainable_params)
        if self.trainable_layers is not None:
            d["trainable_layers"] = list(self.trainable_layers)
        return d


def block_parameter_names(model, layers, patterns, what: str) -> list[str]:
    """Full names of the parameters of decoder blocks `layers` whose in-block name matches one of `patterns`."""
    path, blocks = find_decoder_blocks(model)
    names = []
    for layer in layers:
        if not 0 <= layer < len(blocks):
            raise InputError(f"{what}: block {layer} does not exist (the model has blocks 0..{len(blocks) - 1})")
        names += [f"{path}.{layer}.{name}" for name, _ in blocks[layer].named_parameters()
                  if any(re.fullmatch(p, name) for p in patterns)]
    if not names:
        raise InputError(f"{what}: no parameter of blocks {list(layers)} matches {list(patterns)}")
    return names


def answer_mask(inputs: dict) -> torch.Tensor:
    mask = inputs["labels"] != IGNORE_INDEX
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("a sequence has no answer tokens to score (check prompt masking / max_length)")
    return mask


@register_method
class RMU(UnlearningMethod):
    name = "rmu"
    Config = RMUConfig
    needs_ref = True
    needs_retain = True
    control_vector: torch.Tensor | None = None
    control_vectors: torch.Tensor | None = None   # [domains, d]: a joint unit's, one per domain

    def trained_weights(self) -> str:
        params = ", ".join(self.config.trainable_params)
        return f"blocks {', '.join(map(str, self.config.layers_trained))}: weights matching {params}"

    def trainable_parameters(self, model):
        return block_parameter_names(model, self.config.layers_trained, self.config.trainable_params, "rmu")

    def make_dataset(self, tokenizer, forget_rows, retain_rows, **kwargs):
        """Domain-tagged forget rows (a joint WMDP unit, `wmdp:bio+cyber-forget`) train as WMDP's script trains its
        forget corpora: alternating batches of the effective batch size, retain paired by domain and batch index
        (`data.DomainAlternatingDataset`); any other rows as every baseline's."""
        if any(isinstance(row, dict) and "domain" in row for row in forget_rows):
            return DomainAlternatingDataset(tokenizer, forget_rows, retain_rows,
                                            batch_size=self.config.effective_batch_size, **kwargs)
        return super().make_dataset(tokenizer, forget_rows, retain_rows, **kwargs)

    def prepare(self, model, seed: int, dataset=None) -> None:
        """Draw u from the seed (WMDP: torch.rand of the hidden size, normalised) and scale it by c; one u per
        domain of a joint unit (WMDP: one per forget corpus, drawn in order), the first being a lone domain's."""
        generator = torch.Generator().manual_seed(seed)
        vectors = []
        for _ in getattr(dataset, "domains", None) or [None]:
            u = torch.rand(hidden_size(model), generator=generator, dtype=torch.float64)
            vectors.append((u / u.norm() * self.config.steering_coeff).float())
        self.control_vector = vectors[0]
        self.control_vectors = torch.stack(vectors)

    def compute_loss(self, model, batch, ref_model=None):
        if self.control_vector is None:
            raise RuntimeError("rmu: call prepare(model, seed) first (the trainer does) to draw the random direction")
        logs: dict[str, float] = {}
        forget = batch["forget"]
        acts = block_output(model, forget, self.config.layer)
        target = self.control_vector.to(acts.device)
        if "domain" in forget:   # a joint unit: each row steered to its own domain's direction
            target = self.control_vectors.to(acts.device)[forget["domain"].to(acts.device)][:, None, :]
        per_row = masked_mse_per_sequence(acts, target, answer_mask(forget))
        loss = self.config.forget_weight * sequence_mean(per_row, forget)
        logs["rmu_forget"] = float(per_row.detach().mean())
        if self.uses_retain:
            retain = self._retain_batch(batch)
            if ref_model is None:
                raise ValueError("rmu needs a reference model (a frozen copy of the starting model)")
            acts = block_output(model, retain, self.config.layer)
            with torch.no_grad():
                frozen = block_output(ref_model, retain, self.config.layer).to(acts.device)
            per_row = masked_mse_per_sequence(acts, frozen, answer_mask(retain))
            loss = loss + self.config.alpha * sequence_mean(per_row, retain)
            logs["rmu_retain"] = float(per_row.detach().mean())
        logs["loss"] = float(loss.detach())
        return loss, logs


#: The runner's view of it (entry point `cru_harness.methods`: RMU).
METHOD = BaselineMethod(RMU, "RMU",
                        "forget activations at one layer steered to a scaled random direction, retain held (WMDP)",
                        order=53)
