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
the rows here are QA pairs; WMDP's corpora are plain text, whose every token is scored here too.

Defaults (`OPEN_UNLEARNING_TOFU` below and WMDP's and RWKU's `Benchmark.method_settings`, each entering a cell's
hyperparameters): on TOFU and any
benchmark without its own, open-unlearning's TOFU RMU (configs/trainer/RMU.yaml: steering 2, alpha 1, layer 7;
configs/experiment/unlearn/tofu/default.yaml: lr 1e-5 and the HF Trainer's schedule, AdamW eps 1e-8) with WMDP's
trained weights; on WMDP (and RWKU, which ships no RMU script) WMDP's README run for Zephyr-7B (`--steering_coeffs
6.5 --alpha 1200 --lr 5e-5 --batch_size 4 --max_num_batches 150`, layer_id 7, layer_ids 5,6,7, param_ids 6), one
pass, constant learning rate with no warm-up, WMDP's `transformers.AdamW` at its defaults (eps 1e-6, weight decay 0),
without clipping. Before issue 77 WMDP's constants and schedule, with eps 1e-8, served every benchmark
(`FORMER_DEFAULTS`, which the committed shared-budget runs restate under `as_computed:`).

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

#: The default on every benchmark without its own setting of RMU (`Benchmark.method_settings`: WMDP's and RWKU's
#: are WMDP's Zephyr-7B run, with `transformers.AdamW`'s eps 1e-6): open-unlearning's TOFU RMU.
#: configs/trainer/RMU.yaml (steering_coeff 2, alpha 1, module_regex model.layers.7) and
#: configs/experiment/unlearn/tofu/default.yaml (lr 1e-5, weight decay 0.01, a warm-up epoch; HF Trainer's linear
#: decay, clipping at 1.0 and AdamW eps 1e-8), at the protocol's TOFU batch (32) and epochs (5: TOFU's forget.yaml;
#: open-unlearning runs 10). The keys are those of WMDP's setting, so neither leaves a value of the other in a cell.
#: Trained weights stay WMDP's (the down projections of blocks 5-7): open-unlearning's TOFU config trains every
#: weight. Both references keep layer 7 and their c on every model (open-unlearning: Llama-3.2 1B to 3.1 8B, 16 to
#: 32 blocks, widths 2048 to 4096), so no width rule is taken.
OPEN_UNLEARNING_TOFU = dict(layer=7, steering_coeff=2.0, alpha=1.0, learning_rate=1e-5, lr_scheduler="linear",
                            warmup_epochs=1.0, weight_decay=0.01, effective_batch_size=32, micro_batch_size=4,
                            num_epochs=5, max_grad_norm=1.0, max_length=512, adam_eps=1e-8)

#: The defaults before issue 77 (WMDP's Zephyr constants and schedule with torch AdamW's eps 1e-8, on every
#: benchmark), which the committed shared-budget runs restate under `as_computed:`.
FORMER_DEFAULTS = dict(layer=7, steering_coeff=6.5, alpha=1200.0, learning_rate=5e-5, lr_scheduler="constant",
                       warmup_epochs=0.0, weight_decay=0.0, effective_batch_size=4, micro_batch_size=4, num_epochs=1,
                       max_grad_norm=None, max_length=512, adam_eps=1e-8)


@dataclass
class RMUConfig(RetainConfig):
    layer: int = 7                          # block whose output is steered (WMDP layer_id; open-unlearning layers.7)
    steering_coeff: float = 2.0             # c (open-unlearning RMU.yaml; WMDP --steering_coeffs 6.5 on WMDP)
    alpha: float = 1.0                      # retain weight (open-unlearning RMU.yaml; WMDP --alpha 1200 on WMDP)
    trainable_layers: tuple[int, ...] | None = None   # None: layer-2, layer-1, layer (WMDP layer_ids)
    trainable_params: tuple[str, ...] = (r"mlp\.down_proj\.weight",)   # in-block names (WMDP param_ids 6)
    # the schedule and optimizer: TrainingConfig's, the protocol's TOFU ones (OPEN_UNLEARNING_TOFU)

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
                        order=53, benchmark_defaults={"*": OPEN_UNLEARNING_TOFU},
                        former_defaults=FORMER_DEFAULTS,
                        sources={"*": "open-unlearning configs/trainer/RMU.yaml and its TOFU experiment "
                                      "default.yaml"})
