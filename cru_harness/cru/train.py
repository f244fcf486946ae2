"""Phase 2 of CRU: train one router per selected block on gate values only (`cru_method.md`, "Phase 2").

    L = mean_l(mean forget gate) + lam * mean_l((mean retain gate - 1)^2)

(the paper's loss shapes; `losses.py` has the others) with the means taken jointly over the selected coordinates
and the non-padding positions. The base is frozen (no parameter of it requires grad, the optimizer only holds
router parameters) and the forward stops after the last gated block, so the LM head never runs while routers
train. The blocks below the first gated one do not depend on the routers: their output is computed once per
example and reused at every step (`prefix.py`).

Public pieces: `RouterTrainer` (the step, the schedule, the final measurement), `GateRecorder` (the gate
observer), `cru_loss`, `router_schedule`, `new_bundle`, and `train_routers` (all of it, from texts).
"""
from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..devices import explain_out_of_memory
from ..errors import InputError
from ..hparams import check_seed, fields_problem
from ..context import fit_to_context
from ..reductions import thread_invariant_sum
from .attach import attach_bundles
from ..training.blocks import find_decoder_blocks, run_until
from ..training.engine import Engine
from .bundle import BundleConfig, RouterBundle, base_fingerprint, sample_base_weights
from .localize import (SELECTIONS, Batch, Localization, collate, input_device, localize, pad_token_id,
                       tokenize_texts, validate_exclusion, validate_percentile)
from .losses import cru_loss, validate_loss_shape
from .prefix import CACHE_PLACEMENTS, FrozenPrefix, PrefixCache
from .readings import (BLOCK_OUTPUTS, LOCALIZATION_TOKENS, TOKEN_SCOPES, PromptTemplate, run_until_site, scope_mask,
                       scope_start, site_module, validate_choice)
from .router import INPUT_NORMS, Router
from ..training.sites import validate_gate_site


ROUTER_INITS = ("default", "open")
#: The gate every router of `router_init="open"` starts at (b2 = logit of it, W2 = 0): 1 % off the base's values.
OPEN_GATE = 0.99


@dataclass
class RouterTrainingConfig:
    """Hyper-parameters of `train_routers` (defaults follow the TOFU setting of `cru_method.md`; the RWKU setting
    differs in RWKU's `method_settings`, `benchmarks/rwku/methods.py`)."""
    last_k: int = 4
    blocks: list[int] | None = None
    percentile: float = 95.0
    selection: str = "variance"     # "variance" (CRU) or "random" (control: same blocks, same |C_l|)
    d_r: int = 32
    lam: float = 1.0
    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 8
    max_length: int = 256
    seed: int = 0
    input_norm: str = "none"        # "rms": router reads h / rms(h); "rms_learned": times a learned scale
    # Options beyond the paper (docs/cru_method.md, "Options beyond the paper"); the defaults are the paper's.
    suppress_loss: str = "linear"      # forget term f(w): "linear" w (paper) or "quadratic" w^2  (losses.py)
    pass_loss: str = "quadratic"       # retain term r(w): "quadratic" (w-1)^2 (paper) or "linear" 1-w
    exclude_top_magnitude: float = 0.0  # % of coordinates per block (largest mean |h| on forget) never selected
    gate_site: str = "residual"        # "residual" (paper) or "mlp": the blocks' MLP neurons (sites.py)
    # Batch composition: each step draws batch_size forget rows and retain_batch_ratio x batch_size retain rows
    # (paper: 1). The loss reads each side's batch mean, so the ratio changes how much of the retain set the
    # routers see and how noisy its mean is, not the weight of the two terms.
    retain_batch_ratio: int = 1
    # How new routers start (the paper does not say): "default" is PyTorch's nn.Linear init, under which routers
    # reading SmolLM2's raw residual stream start with 20-36 % of their gates below 0.05 (blocks 26-28, fine-tuned
    # on TOFU; benchmarks/results/doc_measurements.md); "open" zeroes W2 and sets b2 so that every gate starts at
    # OPEN_GATE, the base nearly untouched.
    router_init: str = "default"
    # Readings the paper leaves open (readings.py; the defaults are the reading run first): the positions the loss
    # reads and the gates act on ("answer": from the prompt's end marker on), the positions localization pools
    # ("content": no template or special token), and where "the output of block l" is read ("hf_hidden_states":
    # HF's hidden_states entry l, the final norm's output for the last).
    token_scope: str = "all"
    localization_tokens: str = "all"
    block_output: str = "block"
    forget_description: str = ""    # recorded in the manifest (e.g. "tofu:forget10")
    retain_description: str = ""
    progress: bool = True
    # Rows of the retain set the final gate measurement reads: the first ones training drew (a seeded sample),
    # None = every row training drew. Bounded because a full retain split (TOFU retain90: 3,600 rows) would cost
    # more prefix passes than the training itself.
    final_retain_rows: int | None = 1000
    # Execution only (results are identical either way, so not recorded in the bundle): compute the input of the
    # first gated block once per example and reuse it; where to keep it ("auto": the gated block's device while
    # small, else host memory; "cpu"; "device"); a bound on host memory for it in GiB (None: what is available).
    prefix_cache: bool = True
    prefix_cache_placement: str = "auto"
    prefix_cache_max_gib: float | None = None

    def __post_init__(self):
        validate_percentile(self.percentile)
        if self.selection not in SELECTIONS:
            raise InputError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.input_norm not in INPUT_NORMS:
            raise InputError(f"input_norm must be one of {', '.join(INPUT_NORMS)}, got {self.input_norm!r}")
        validate_loss_shape("suppress_loss", self.suppress_loss)
        validate_loss_shape("pass_loss", self.pass_loss)
        validate_exclusion(self.exclude_top_magnitude)
        validate_gate_site(self.gate_site)
        if self.router_init not in ROUTER_INITS:
            raise InputError(f"router_init must be one of {', '.join(ROUTER_INITS)}, got {self.router_init!r}")
        validate_choice("token_scope", self.token_scope, TOKEN_SCOPES)
        validate_choice("localization_tokens", self.localization_tokens, LOCALIZATION_TOKENS)
        validate_choice("block_output", self.block_output, BLOCK_OUTPUTS)
        if self.block_output != "block" and self.gate_site != "residual":
            raise InputError(f"block_output={self.block_output} reads the residual stream; it does not combine "
                             f"with gate_site={self.gate_site}")
        if self.prefix_cache_placement not in CACHE_PLACEMENTS:
            raise InputError(f"prefix_cache_placement must be one of {', '.join(CACHE_PLACEMENTS)}, "
                             f"got {self.prefix_cache_placement!r}")
        # Every numeric field by the runner config's table, so a config, `cru-harness unlearn` and this API refuse
        # the same values (d_r, epochs, lr, lam, max_length, last_k, ...), and the one seed rule.
        if problem := fields_problem(self):
            raise InputError(problem)
        check_seed(self.seed, what="seed")


class GateRecorder:
    """A gate observer (`attach_bundles(..., observer=recorder)`): collects, per forward pass, each gated block's
    gate sum over the non-padding positions and selected coordinates, and their count (float32)."""

    def __init__(self):
        self.mask: torch.Tensor | None = None
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, float] = {}

    def reset(self, mask: torch.Tensor) -> None:
        """Start a forward pass over a batch whose attention mask is `mask` (B, T)."""
        self.mask, self.sums, self.counts = mask, {}, {}

    def __call__(self, block: int, _bundle, gates: torch.Tensor) -> None:
        mask = self.mask.to(gates.device, torch.float32).unsqueeze(-1)
        self.sums[block] = thread_invariant_sum(gates * mask)
        self.counts[block] = float(mask.sum()) * gates.shape[-1]

    def block_means(self) -> dict[int, torch.Tensor]:
        return {block: self.sums[block] / self.counts[block] for block in self.sums}


def observed_mask(bundle: RouterBundle, batch: Batch, *, require: bool = False) -> torch.Tensor:
    """The positions whose gates a bundle's statistics read: the real ones, or for `token_scope="answer"` those in
    the answer scope (`readings.scope_mask`; `require`: a row without an answer is an error)."""
    if bundle.config.token_scope != "answer":
        return batch.attention_mask
    return scope_mask(batch.input_ids.cpu(), batch.attention_mask.cpu(), bundle.config.answer_marker,
                      require=require).to(batch.attention_mask.device)


def run_gated(model: nn.Module, bundle: RouterBundle, batch: Batch) -> None:
    """A forward of `batch` up to the bundle's last gated site (its last block, or the final norm for
    `block_output="hf_hidden_states"`)."""
    run_until_site(model, max(bundle.block_indices), bundle.config.block_output,
                   input_ids=batch.input_ids, attention_mask=batch.attention_mask)


def gate_means(model: nn.Module, bundle: RouterBundle, batch: Batch, recorder: GateRecorder | None = None
               ) -> dict[int, torch.Tensor]:
    """Mean gate per gated block over the batch's non-padding positions (the answer scope for
    `token_scope="answer"`) and the selected coordinates, from a full forward of the batch (up to the last
    gated block).

    `bundle` must already be attached with `recorder` as its observer when `recorder` is given; otherwise it is
    attached for this call.
    """
    _, blocks = find_decoder_blocks(model)
    handle = None
    if recorder is None:
        recorder = GateRecorder()
        handle = attach_bundles(model, [bundle], observer=recorder)
    try:
        batch = batch.to(input_device(model))
        recorder.reset(observed_mask(bundle, batch))
        if bundle.config.block_output == "block":
            run_until(model, blocks, max(bundle.block_indices),
                      input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        else:
            run_gated(model, bundle, batch)
        return recorder.block_means()
    finally:
        if handle is not None:
            handle.remove()


# Config fields that describe how training ran, not what it computed: left out of the bundle manifest.
_NOT_RECORDED = ("progress", "forget_description", "retain_description", "prefix_cache", "prefix_cache_placement",
                 "prefix_cache_max_gib")
# Options recorded in the manifest's `training` only when not at their default: a default run's manifest is the one
# written before they existed (their values are also top-level manifest fields).
_RECORDED_IF_SET = {"token_scope": "all", "localization_tokens": "all", "block_output": "block"}


def training_record(config: RouterTrainingConfig) -> dict:
    """The manifest's `training`: the config less execution-only fields and the readings at their default."""
    return {k: v for k, v in asdict(config).items()
            if k not in _NOT_RECORDED and not (k in _RECORDED_IF_SET and v == _RECORDED_IF_SET[k])}


def _fingerprint_texts(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _base_name(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or getattr(model, "name_or_path", "") or type(model).__name__)


def new_bundle(model: nn.Module, localization: Localization, config: RouterTrainingConfig,
               template: PromptTemplate | None = None) -> RouterBundle:
    """Freshly initialised routers (seeded) for the blocks and coordinates of `localization`; `template` (the
    prompt format's, `readings.prompt_template`) gives a `token_scope="answer"` bundle its end marker."""
    if config.token_scope == "answer" and template is None:
        raise InputError("token_scope=answer needs the prompt format's template (readings.prompt_template): the "
                         "gates find the answer by the prompt's end marker")
    fingerprint = base_fingerprint(model)
    bundle_config = BundleConfig(
        base_model=_base_name(model), fingerprint=fingerprint, block_indices=list(localization.block_indices),
        neurons={b: localization.neurons[b].tolist() for b in localization.block_indices},
        d_r=config.d_r, percentile=float(config.percentile), lam=float(config.lam), seed=config.seed,
        selection=config.selection, input_norm=config.input_norm,
        suppress_loss=config.suppress_loss, pass_loss=config.pass_loss,
        exclude_top_magnitude=float(localization.exclude_top_magnitude), gate_site=localization.site,
        site_width=localization.width(),
        excluded={b: localization.excluded[b].tolist() for b in sorted(localization.excluded)},
        base_weights=sample_base_weights(model, localization.block_indices[-1]),
        base_parameters=sum(p.numel() for p in model.parameters()),
        token_scope=config.token_scope,
        answer_marker=list(template.marker) if config.token_scope == "answer" else [],
        localization_tokens=localization.tokens, block_output=localization.block_output)
    torch.manual_seed(config.seed)
    routers = {b: Router(fingerprint["hidden_size"], len(bundle_config.neurons[b]), config.d_r,
                         input_norm=config.input_norm) for b in localization.block_indices}
    if config.router_init == "open":   # after the seeded init, so W1 (and the default's routers) are unchanged
        with torch.no_grad():
            for router in routers.values():
                router.w2.weight.zero_()
                router.w2.bias.fill_(math.log(OPEN_GATE / (1.0 - OPEN_GATE)))
    bundle = RouterBundle(bundle_config, routers)
    bundle_config.router_parameters = bundle.num_router_parameters()
    return bundle


@torch.no_grad()
def measure_gate_means(model: nn.Module, tokenizer, bundle: RouterBundle, texts: Sequence[str], *,
                       batch_size: int = 8, max_length: int = 256, recorder: GateRecorder | None = None) -> dict:
    """Mean gate over all `texts` (eval mode): overall and per block, weighted by non-padding tokens. `recorder`:
    a `GateRecorder` (subclass) that may collect more of each pass's gates."""
    ids = tokenize_texts(tokenizer, texts, max_length)
    pad = pad_token_id(tokenizer)
    recorder = recorder if recorder is not None else GateRecorder()
    sums = {b: 0.0 for b in bundle.block_indices}
    counts = {b: 0.0 for b in bundle.block_indices}
    was_training = bundle.training
    bundle.eval()
    handle = attach_bundles(model, [bundle], observer=recorder)
    try:
        for start in range(0, len(ids), batch_size):
            gate_means(model, bundle, collate(ids[start:start + batch_size], pad), recorder)
            for b in bundle.block_indices:
                sums[b] += float(recorder.sums[b])
                counts[b] += recorder.counts[b]
    finally:
        handle.remove()
        bundle.train(was_training)
    per_block = {str(b): sums[b] / counts[b] for b in bundle.block_indices}
    return {"mean": sum(per_block.values()) / len(per_block), "per_block": per_block}


def router_schedule(n_forget: int, n_retain: int, batch_size: int, epochs: int, seed: int,
                    retain_batch_size: int | None = None) -> list[tuple[list[int], list[int]]]:
    """The rows of every training step, `[(forget_rows, retain_rows), ...]`.

    Each epoch shuffles the forget set; retain batches (`retain_batch_size` rows, default `batch_size`, at most
    the whole retain set) cycle through their own shuffled order, independent of the forget set's size. One
    seeded generator draws both, in this order, so a seed fixes every batch.
    """
    retain_batch_size = batch_size if retain_batch_size is None else retain_batch_size
    generator = torch.Generator().manual_seed(seed)
    steps: list[tuple[list[int], list[int]]] = []
    retain_order: list[int] = []
    for _epoch in range(epochs):
        forget_order = torch.randperm(n_forget, generator=generator).tolist()
        for start in range(0, n_forget, batch_size):
            take = []
            while len(take) < min(retain_batch_size, n_retain):
                if not retain_order:
                    retain_order = torch.randperm(n_retain, generator=generator).tolist()
                take.append(retain_order.pop(0))
            steps.append((forget_order[start:start + batch_size], take))
    return steps


def schedule_for(n_forget: int, n_retain: int, config: RouterTrainingConfig) -> list[tuple[list[int], list[int]]]:
    """`router_schedule` as `config` sets it: the batches training draws (gate analyses read them too)."""
    return router_schedule(n_forget, n_retain, config.batch_size, config.epochs, config.seed,
                           retain_batch_size=config.batch_size * config.retain_batch_ratio)


@dataclass
class StepResult:
    """What one router step measured (gate means are over the selected coordinates and real tokens)."""
    loss: float
    forget_gate_mean: float
    retain_gate_mean: float


class RouterTrainer:
    """Phase 2 on tokenized corpora: the training step, the schedule, and the final gate measurement.

    Used as a context manager: entering freezes the base (no grad, eval mode), attaches `bundle` with a
    `GateRecorder` and creates the Adam optimizer over the router parameters only; leaving detaches the routers
    and restores the base's `requires_grad` flags and mode. Typical use (what `train_routers` does)::

        with RouterTrainer(model, bundle, forget_ids, retain_ids, config, pad_id=pad) as trainer:
            trainer.prepare()                     # prefix passes (once per example the schedule uses)
            trainer.train()                       # every step of `trainer.steps`
            forget = trainer.measure("forget")    # final gate means, eval mode
            retain = trainer.measure("retain")

    `trainer.step(forget_rows, retain_rows)` runs one step on rows of the two corpora; `trainer.timings` holds
    the seconds spent in prefix passes (wherever they ran: all up front with the cache, inside steps and the
    measurement without it), in router steps and in the final gate measurement (both less their prefix passes).
    """

    def __init__(self, model: nn.Module, bundle: RouterBundle, forget_ids: Sequence[Sequence[int]],
                 retain_ids: Sequence[Sequence[int]], config: RouterTrainingConfig | None = None, *,
                 pad_id: int = 0):
        self.config = config = config or RouterTrainingConfig()
        if not forget_ids or not retain_ids:
            raise InputError("RouterTrainer needs a non-empty forget and retain set")
        self.model, self.bundle, self.pad_id = model, bundle, int(pad_id)
        self.ids = {"forget": [list(x) for x in forget_ids], "retain": [list(x) for x in retain_ids]}
        self.steps = schedule_for(len(forget_ids), len(retain_ids), config)
        # The final retain measurement reads the retain rows training drew (their prefixes are cached), at most
        # `final_retain_rows` of them in the order first drawn: a seeded sample, and all rows of a small set.
        drawn = list(dict.fromkeys(i for _, retain_rows in self.steps for i in retain_rows))
        limit = config.final_retain_rows
        self.measured_rows = {"forget": list(range(len(forget_ids))),
                              "retain": sorted(drawn if limit is None else drawn[:limit])}
        # Every row whose prefix is needed: all forget rows, the retain rows in order of first use.
        needed = {("forget", i): None for i in range(len(forget_ids))}
        for _, retain_rows in self.steps:
            needed.update({("retain", i): None for i in retain_rows})
        needed.update({("retain", i): None for i in self.measured_rows["retain"]})
        last = max(bundle.block_indices)
        stop = site_module(model, last, bundle.config.block_output) if bundle.config.block_output != "block" else None
        self.prefix = FrozenPrefix(model, min(bundle.block_indices), last, stop=stop)
        base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        sequences = {(corpus, i): ids for corpus, rows in self.ids.items() for i, ids in enumerate(rows)}
        self.cache = PrefixCache(self.prefix, sequences, list(needed), enabled=config.prefix_cache,
                                 placement=config.prefix_cache_placement,
                                 max_gib=config.prefix_cache_max_gib, base_bytes=base_bytes)
        self.optimizer = torch.optim.Adam(bundle.routers.parameters(), lr=config.lr)
        # The training engine with the routers as its trainable weights: in place, in this process, beside the
        # frozen base (which may be device-mapped): no accumulation (one group per step), no clipping, no schedule.
        self.engine = Engine(bundle.routers, self.optimizer, keep_gradients=True)   # grads readable after a step
        self.recorder = GateRecorder()
        self.timings = {"prefix_s": 0.0, "steps_s": 0.0, "final_gates_s": 0.0}
        self._handle = None
        self._saved: dict = {}

    # -- session -------------------------------------------------------------------------------------------
    def __enter__(self) -> "RouterTrainer":
        model = self.model
        self._saved = {"requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
                       "training": model.training}
        for param in model.parameters():  # no gradient, no optimizer state for any base parameter
            param.requires_grad_(False)
        model.eval()  # dropout off: the base is evaluated, not trained
        self.bundle.train()
        self._handle = attach_bundles(model, [self.bundle], observer=self.recorder)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        flags = self._saved.get("requires_grad", {})
        for name, param in self.model.named_parameters():
            param.requires_grad_(flags.get(name, param.requires_grad))
        self.model.train(self._saved.get("training", self.model.training))
        self.bundle.eval()

    def _check_active(self) -> None:
        if self._handle is None:
            raise RuntimeError("use RouterTrainer as a context manager: `with RouterTrainer(...) as trainer:`")

    def _sync(self) -> None:
        if self.prefix.device.type == "cuda":
            torch.cuda.synchronize(self.prefix.device)

    # -- phases --------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Compute the prefix of every example the schedule and the final measurement need (with the cache
        on; a no-op with it off)."""
        self._check_active()
        if not self.cache.enabled or self.cache.built:
            return
        started = time.perf_counter()
        with tqdm(total=len(self.cache.keep), desc="CRU prefix", disable=not self.config.progress,
                  leave=False) as progress:
            self.cache.build(progress)
        self._sync()
        self.timings["prefix_s"] += time.perf_counter() - started

    def _gate_means(self, corpus: str, rows: Sequence[int]) -> dict[int, torch.Tensor]:
        batch = collate([self.ids[corpus][i] for i in rows], self.pad_id)
        keys = [(corpus, i) for i in rows]
        started = None if all(map(self.cache.cached, keys)) else time.perf_counter()
        hidden = self.cache.batch(keys, batch.input_ids.shape[1])
        if started is not None:  # cache off (or a row outside the schedule): the prefix is computed here
            self._sync()
            self.timings["prefix_s"] += time.perf_counter() - started
        self.recorder.reset(observed_mask(self.bundle, batch, require=True))
        self.prefix.gated_forward(hidden, batch)
        return self.recorder.block_means()

    def step(self, forget_rows: Sequence[int], retain_rows: Sequence[int]) -> StepResult:
        """One optimizer step on a forget batch and a retain batch (row indices of the two corpora)."""
        self._check_active()

        def loss_fn(rows):
            forget_means = self._gate_means("forget", rows[0])
            retain_means = self._gate_means("retain", rows[1])
            loss = cru_loss(forget_means, retain_means, self.config.lam, suppress_loss=self.config.suppress_loss,
                            pass_loss=self.config.pass_loss)
            return loss, {"loss": loss.item(), "forget_gate_mean": _mean_of(forget_means),
                          "retain_gate_mean": _mean_of(retain_means)}

        logs = self.engine.step([(forget_rows, retain_rows)], loss_fn)
        return StepResult(logs["loss"], logs["forget_gate_mean"], logs["retain_gate_mean"])

    def train(self) -> StepResult | None:
        """Run every step of the schedule; returns the last step's result."""
        self._check_active()
        self.prepare()
        result = None
        prefix_before = self.timings["prefix_s"]
        started = time.perf_counter()
        with tqdm(total=len(self.steps), desc="CRU routers", disable=not self.config.progress,
                  leave=False) as progress:
            for forget_rows, retain_rows in self.steps:
                result = self.step(forget_rows, retain_rows)
                progress.set_postfix(forget=f"{result.forget_gate_mean:.3f}",
                                     retain=f"{result.retain_gate_mean:.3f}", loss=f"{result.loss:.3f}")
                progress.update(1)
        self._sync()
        self.timings["steps_s"] += time.perf_counter() - started - (self.timings["prefix_s"] - prefix_before)
        return result

    @torch.no_grad()
    def measure(self, corpus: str, rows: Sequence[int] | None = None) -> dict:
        """Mean gate (eval mode) over `rows` of `corpus` ("forget" or "retain"; default: the rows
        `measured_rows` names): overall and per block, weighted by non-padding tokens."""
        self._check_active()
        rows = list(self.measured_rows[corpus] if rows is None else rows)
        prefix_before = self.timings["prefix_s"]
        started = time.perf_counter()
        was_training = self.bundle.training
        self.bundle.eval()
        sums = {b: 0.0 for b in self.bundle.block_indices}
        counts = {b: 0.0 for b in self.bundle.block_indices}
        try:
            for start in range(0, len(rows), self.config.batch_size):
                self._gate_means(corpus, rows[start:start + self.config.batch_size])
                for b in self.bundle.block_indices:
                    sums[b] += float(self.recorder.sums[b])
                    counts[b] += self.recorder.counts[b]
        finally:
            self.bundle.train(was_training)
        self._sync()
        self.timings["final_gates_s"] += time.perf_counter() - started - (self.timings["prefix_s"] - prefix_before)
        per_block = {str(b): sums[b] / counts[b] for b in self.bundle.block_indices}
        return {"mean": sum(per_block.values()) / len(per_block), "per_block": per_block, "rows": len(rows)}


def _mean_of(means: dict[int, torch.Tensor]) -> float:
    device = next(iter(means.values())).device
    return torch.stack([m.detach().to(device) for m in means.values()]).mean().item()


@explain_out_of_memory("CRU router training", "lower batch_size (--batch-size; a smaller batch trains other "
                       "routers) or max_length (--max-length), or load the frozen base in bfloat16 (--dtype bfloat16)")
def train_routers(model: nn.Module, tokenizer, forget_texts: Sequence[str], retain_texts: Sequence[str],
                  config: RouterTrainingConfig | None = None, *, localization: Localization | None = None,
                  timings: dict | None = None, template: PromptTemplate | None = None) -> RouterBundle:
    """Localize on `forget_texts` (unless `localization` is given), then train one router per selected block so
    gates close on forget inputs and stay open on retain inputs. Returns the trained `RouterBundle`, whose
    `config.metrics` holds the final forget/retain gate means (eval mode) over the whole forget set and the
    retain rows `config.final_retain_rows` allows.

    The base model's parameters are never updated; their `requires_grad` flags are restored afterwards. A dict
    passed as `timings` receives the seconds spent in localization, prefix passes, router steps and the final
    gate measurement. `template`: the prompt format's (`readings.prompt_template`), needed by
    `token_scope="answer"` and `localization_tokens="content"`.
    """
    config = config or RouterTrainingConfig()
    if template is None and (config.token_scope, config.localization_tokens) != ("all", "all"):
        raise InputError(f"token_scope={config.token_scope} / localization_tokens={config.localization_tokens} "
                         "need the prompt format's template (readings.prompt_template)")
    forget_texts, retain_texts = list(forget_texts), list(retain_texts)
    if not forget_texts:
        raise InputError("the forget set is empty; CRU needs examples of what to forget")
    if not retain_texts:
        raise InputError("the retain set is empty; CRU needs examples of what to keep")
    max_length = fit_to_context(model, config.max_length, lambda: {
        side: [len(ids) for ids in tokenize_texts(tokenizer, texts, config.max_length)]
        for side, texts in (("forget", forget_texts), ("retain", retain_texts))})
    if config.token_scope == "answer":   # every training row needs an answer: checked before any forward pass
        for side, texts in (("forget", forget_texts), ("retain", retain_texts)):
            for row, ids in enumerate(tokenize_texts(tokenizer, texts, max_length)):
                if scope_start(ids, template.marker) is None:
                    raise InputError(f"token_scope=answer: {side} row {row} has no answer (the prompt's end marker "
                                     f"is not in its first {max_length} tokens): {texts[row][:60]!r}; the answer "
                                     "scope needs question-answer rows written in the prompt format")
    started = time.perf_counter()
    if localization is None:
        localization = localize(model, tokenizer, forget_texts, blocks=config.blocks, last_k=config.last_k,
                                percentile=config.percentile, selection=config.selection, seed=config.seed,
                                batch_size=config.batch_size, max_length=max_length, site=config.gate_site,
                                exclude_top_magnitude=config.exclude_top_magnitude,
                                block_output=config.block_output, tokens=config.localization_tokens,
                                template=template)
    elif (localization.site, localization.exclude_top_magnitude, localization.block_output,
          localization.tokens) != (config.gate_site, float(config.exclude_top_magnitude), config.block_output,
                                   config.localization_tokens):
        raise InputError(f"the given localization is at gate_site={localization.site!r} with "
                         f"exclude_top_magnitude={localization.exclude_top_magnitude}, block_output="
                         f"{localization.block_output}, localization_tokens={localization.tokens}; the config asks "
                         f"for {config.gate_site!r}, {config.exclude_top_magnitude}, {config.block_output}, "
                         f"{config.localization_tokens}")
    localization_s = time.perf_counter() - started
    bundle = new_bundle(model, localization, config, template)

    forget_ids = tokenize_texts(tokenizer, forget_texts, max_length)
    retain_ids = tokenize_texts(tokenizer, retain_texts, max_length)
    with RouterTrainer(model, bundle, forget_ids, retain_ids, config, pad_id=pad_token_id(tokenizer)) as trainer:
        trainer.prepare()
        last = trainer.train()
        forget_final = trainer.measure("forget")
        retain_final = trainer.measure("retain")

    bundle.config.metrics = {
        "forget_gate_mean": forget_final["mean"], "retain_gate_mean": retain_final["mean"],
        "forget_gate_mean_per_block": forget_final["per_block"],
        "retain_gate_mean_per_block": retain_final["per_block"],
        "forget_gate_rows": forget_final["rows"], "retain_gate_rows": retain_final["rows"],
        "final_loss": last.loss, "last_batch_forget_gate_mean": last.forget_gate_mean,
        "last_batch_retain_gate_mean": last.retain_gate_mean, "steps": len(trainer.steps),
    }
    bundle.config.training = training_record(config)
    bundle.config.training_data = {
        "forget": {"description": config.forget_description, "n_examples": len(forget_texts),
                   "sha256_16": _fingerprint_texts(forget_texts)},
        "retain": {"description": config.retain_description, "n_examples": len(retain_texts),
                   "sha256_16": _fingerprint_texts(retain_texts)},
        "localization_examples": localization.n_examples,
    }
    if timings is not None:
        timings.update({"localization_s": localization_s, **trainer.timings,
                        "prefix_cache": trainer.cache.enabled, "prefix_rows": len(trainer.cache.keep),
                        "prefix_cache_gib": trainer.cache.nbytes / 2 ** 30 if trainer.cache.enabled else 0.0,
                        "prefix_cache_device": str(trainer.cache.device) if trainer.cache.enabled else None})
    return bundle
