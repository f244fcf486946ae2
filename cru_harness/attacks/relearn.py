"""The relearn attack: fine-tune the deployed model on a slice of the forget set, then ask the rest.

Sources: Hu et al. 2024, "Jogging the Memory of Unlearned LLMs Through Targeted Relearning Attacks" (arXiv:
2406.13356; TOFU, WMDP, WHP): a few steps of ordinary fine-tuning on a small part of the forget data bring back
forget items the attack never saw. Łucki et al. 2024, "An Adversarial Perspective on Machine Unlearning for AI
Safety" (arXiv:2409.18025): fine-tuning on a handful of samples recovers most of what RMU/NPO removed.

Defaults (docs/protocol.md, "Relearn, in detail", quotes each source's code): full weights at lr 1e-5 (Hu et al.'s
`relearn_full.py`; also TOFU's fine-tuning rate, the recipe that taught TOFU's models these items), 3 epochs and
weight decay 0.01 (Łucki et al.'s `finetune.py`), batches of 4 (Hu et al.'s per-device batch), AdamW at a constant
rate without warm-up. The slice, a quarter of the forget items (`slice_fraction`), is this project's choice: Hu
et al.'s public code has no TOFU experiment. A model fine-tuned at another rate is relearned at that rate: set
`learning_rate`. Each setting is recorded in every attack cell.

The slice is a deterministic function of the forget corpus and the attack cell's seed (`relearn_slice`); the
items left out ("held out") are the ones a recovery must be measured on, since those in the slice are simply
taught. They are recorded in the cell's details (`relearn.held_out_indices`, `relearn.slice_questions`): the
evaluation of all forget items is still the runner's; the report's robustness table drops the slice's questions
(and those of the oracle's own slice) from the Original, the unlearned cell, the attacked one and the oracle
alike, so the recovery score compares the same held-out items (`reporting.tables.robustness_rows`; per-item
TOFU metrics: `metrics.recovery.held_out_forget_metrics`; docs/protocol.md, "Attacks"). A `corpus` setting
relearns on other text instead (benign relearning): no forget item is trained on.

For an adapter method (CRU) the base is fine-tuned with the routers attached (they gate every forward, and are
not trained), and the same routers are served with the relearned base.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..api import Attack, CellContext, Trained
from ..data.slices import DEFAULT_SLICE_FRACTION, check_slice_settings, forget_slice
from ..errors import InputError
from ..metrics.recovery import held_out_forget_metrics  # noqa: F401 - the held-out scoring's home; named here too

SCHEDULERS = ("constant", "linear", "cosine")


@dataclass
class RelearnConfig:
    """`slice_fraction`: the share of forget items trained on (or `slice_size` items, when set); the rest are
    held out. `corpus`: benign relearning instead, on every row of this corpus source (e.g. `retain90[:40]`,
    TOFU's other authors; `rwku:{target}:passage`, public text on the cell's target); every forget item is then
    held out and the slice settings are unused. The benchmark's placeholders (`{target}`, `{split}`,
    `{retain_split}`) are filled with the attacked cell's. The training fields are
    `cru_harness.finetune.FinetuneConfig`'s."""
    slice_fraction: float = DEFAULT_SLICE_FRACTION
    slice_size: int | None = None
    corpus: str | None = None
    learning_rate: float = 1e-5
    num_epochs: int = 3
    effective_batch_size: int = 4
    micro_batch_size: int = 4
    weight_decay: float = 0.01
    lr_scheduler: str = "constant"
    max_length: int = 512

    def __post_init__(self):
        check_slice_settings(self.slice_fraction, self.slice_size)
        if self.corpus is not None and (not isinstance(self.corpus, str) or not self.corpus.strip()):
            raise InputError(f"corpus must be a corpus source (a JSON/JSONL file or a benchmark's corpus name), "
                             f"got {self.corpus!r}")
        if self.lr_scheduler not in SCHEDULERS:
            raise InputError(f"lr_scheduler {self.lr_scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
        self.training()   # the fine-tuning config refuses its own bad values (learning rate, batch sizes, ...)

    def training(self):
        from ..finetune.train import FinetuneConfig

        return FinetuneConfig(learning_rate=self.learning_rate, num_epochs=self.num_epochs,
                              effective_batch_size=self.effective_batch_size, micro_batch_size=self.micro_batch_size,
                              weight_decay=self.weight_decay, lr_scheduler=self.lr_scheduler, warmup_steps=0,
                              max_length=self.max_length)


def relearn_slice(n_items: int, config: RelearnConfig, seed: int) -> tuple[list[int], list[int]]:
    """(slice, held out): sorted item indices of a forget set of `n_items`, drawn with `random.Random(seed)`
    (`data.slices.forget_slice`, which `in_context` draws its slice with too). At least one item is held out and at
    least one trained on."""
    return forget_slice(n_items, fraction=config.slice_fraction, size=config.slice_size, seed=seed, what="relearn")


class RelearnAttack(Attack):
    name = "relearn"
    summary = "fine-tune on a slice of the forget set; recovery is measured on the held-out forget items"
    seeded = True   # the slice is drawn with the attacked cell's seed
    config = RelearnConfig
    order = 130
    needs_one_checkpoint = True   # no cell for a WHP model (two checkpoints)

    def check_inputs(self, cell, local: bool) -> tuple[str, str] | None:
        """The benign `corpus` (filled, each part a JSON/JSONL file that parses or, with the data here, a corpus of
        the cell's benchmark or of one reading the same data), else the slice against the forget corpus's rows."""
        from ..data.corpora import load_corpus_rows
        from ..errors import UserError

        config = RelearnConfig(**cell.extra["attack"]["settings"])
        if config.corpus is not None:
            try:
                source = benign_corpus(config.corpus, cell)
                if local:
                    foreign = foreign_corpus(source, cell)
                    if foreign:
                        return "corpus", foreign
                    load_corpus_rows(source, cell.data_dir)
                else:
                    for part in corpus_files(source):
                        load_corpus_rows(part, cell.data_dir)
            except UserError as err:
                return "corpus", str(err)
            return None
        if not local:
            return None
        try:
            rows, _ = load_corpus_rows(cell.corpora["forget_corpus"], cell.data_dir)
            relearn_slice(len(rows), config, cell.seed or 0)
        except UserError as err:
            return "slice_size" if config.slice_size is not None else "slice_fraction", str(err)
        return None

    def run(self, ctx: CellContext) -> Trained:
        from ..data.corpora import load_corpus_rows
        from ..devices import load_causal_lm, saved_dtype, training_precision
        from ..finetune.train import finetune

        cell = ctx.cell
        config = RelearnConfig(**cell.extra["attack"]["settings"])
        seed = cell.seed or 0
        rows, source = load_corpus_rows(cell.corpora["forget_corpus"], ctx.data_dir)
        if config.corpus is None:
            chosen, held_out = relearn_slice(len(rows), config, seed)
            training_rows = [rows[i] for i in chosen]
        else:   # benign relearning: no forget item is trained on
            chosen, held_out = [], list(range(len(rows)))
            training_rows, benign_source = load_corpus_rows(benign_corpus(config.corpus, cell), ctx.data_dir)
        # fp32 master weights under the cell's autocast, as every trainer here (`devices.training_precision`):
        # AdamW on bf16 weights would lose most updates at lr 1e-5
        model, tokenizer = load_causal_lm(ctx.model_path, device=ctx.device, device_map=cell.model.device_map,
                                          dtype=training_precision(ctx.dtype)[0],
                                          trust_remote_code=cell.model.trust_remote_code)
        handle = _attach(model, ctx.routers)
        try:
            fmt = ctx.prompt_format
            trained = finetune(model, training_rows, tokenizer=tokenizer, config=config.training(),
                               seed=seed, dtype=ctx.dtype, device=ctx.device, device_map=cell.model.device_map,
                               chat_template=fmt.get("chat"), progress=False,
                               **{k: fmt[k] for k in ("preset", "family", "benchmark") if fmt.get(k) is not None})
        finally:
            if handle is not None:
                handle.remove()   # the saved base carries no hooks; the bundle is served beside it
        model.to(saved_dtype(ctx.dtype))
        out = ctx.workdir / "relearned"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        ctx.outcome["details"]["relearn"] = {
            "forget_corpus": source, "n_items": len(rows), "seed": seed,
            "slice_indices": chosen, "held_out_indices": held_out,
            # whole questions: the held-out scoring drops the slice's items by question (text rows have none)
            "slice_questions": [rows[i]["question"] for i in chosen if rows[i].get("question")],
            "benign_corpus": None if config.corpus is None else benign_source, "n_training_rows": len(training_rows),
            "routers_attached": ctx.routers, "optimizer_steps": trained.optimizer_steps,
            "training": trained.config, "final_logs": trained.final_logs,
        }
        ctx.outcome["resources"]["relearn_wall_time_s"] = trained.resources.get("wall_time_s")
        return Trained(str(out), routers=ctx.routers)


def benign_corpus(template: str, cell) -> str:
    """A benign `corpus` with the attacked cell's placeholders filled (`rwku:{target}:passage` -> `rwku:3:passage`),
    as the runner fills a benchmark's corpus templates."""
    import string

    from .. import plugins

    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    if not names:
        return template
    values = plugins.benchmarks.get(cell.benchmark).placeholder_values(cell.split, cell.target)
    for name in names:
        if values.get(name) in (None, ""):
            raise InputError(f"relearn corpus {template!r}: {{{name}}} has no value for a {cell.benchmark} cell "
                             f"(its placeholders: {', '.join('{' + k + '}' for k, v in values.items() if v != '')})")
    return template.format(**values)


def load_bundles(routers: str | None) -> list:
    """The router bundles of a `routers` value (`dir` or `dir+dir`, as the `cru` model takes it), frozen."""
    if not routers:
        return []
    from ..cru.bundle import RouterBundle
    from ..protocol import ROUTER_SEPARATOR

    bundles = [RouterBundle.from_pretrained(part.strip()) for part in str(routers).split(ROUTER_SEPARATOR)]
    for bundle in bundles:
        bundle.requires_grad_(False)
    return bundles


def _attach(model, routers: str | None):
    """Attach the attacked cell's bundles so fine-tuning sees the model as served (None: no bundle)."""
    bundles = load_bundles(routers)
    if not bundles:
        return None
    from ..cru.attach import attach_bundles

    return attach_bundles(model, bundles)


ATTACK = RelearnAttack()


def _corpus_parts(source: str) -> list[str]:
    """The sources joined by ` + `, each without its `[A:B]` cap (`data.corpora.load_corpus_rows`'s syntax)."""
    import re

    parts = [part.strip() for part in source.split(" + ")]
    return [(m.group(1) if (m := re.fullmatch(r"(.+)\[(\d*):(\d+)\]", part)) else part) for part in parts]


def _is_file_source(part: str) -> bool:
    path = Path(part).expanduser()
    return path.suffix in (".json", ".jsonl") or path.exists()


def corpus_files(source: str) -> list[str]:
    """The parts of a corpus source that are files (read without the benchmark's data)."""
    return [part for part in _corpus_parts(source) if part and _is_file_source(part)]


def foreign_corpus(source: str, cell) -> str | None:
    """Why a corpus name in `source` is not the cell's benchmark's (nor of a benchmark reading the same data, as
    tofu_author reads TOFU's), or None. Asks those benchmarks' `corpus_rows` only: another benchmark's data is
    never read (it may not be on this machine)."""
    from .. import plugins

    own = plugins.benchmarks.get(cell.benchmark)
    family = [p for p in plugins.benchmarks if p.name == own.name or (own.data is not None and p.data is own.data)]
    for part in _corpus_parts(source):
        if not part or _is_file_source(part):
            continue
        if not any(p.corpus_rows(part, cell.data_dir) is not None for p in family):
            return (f"corpus {part!r} is not a {own.name} corpus nor a JSON/JSONL file: a relearn attack on a "
                    f"{own.name} cell trains on text of its own benchmark or on a file")
    return None
