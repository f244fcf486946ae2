"""The baselines as runner methods (`cru_harness.api.Method`): each baseline module registers one
`BaselineMethod` under the `cru_harness.methods` entry-point group, wrapping its `UnlearningMethod` class."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

from ..api import CellContext, Method, Trained
from ..training.launch import LaunchSettings, launch
from ..training.resources import record_resources

#: Spellings the configs accept for the trainers' fields (results record the canonical names).
TRAINER_ALIASES = {"lr": "learning_rate", "epochs": "num_epochs"}


def training_cost(config, corpus: str, benchmark: str, data_dir, rows_name: str = "rows") -> str:
    """`N optimizer steps (E epochs, effective batch B, R rows)` of a run of the baselines' trainer with `config`
    on `corpus` (`--dry-run`). Rows are counted only from local data: a dry run never reaches the Hub."""
    from ..data.corpora import training_steps_note
    from ..training.engine import step_counts

    shape = f"{config.num_epochs:g} epochs, effective batch {config.effective_batch_size}"

    def steps(rows: int) -> str:
        count, _ = step_counts(config, -(-rows // config.micro_batch_size), config.micro_batches_per_step())
        return f"{count} optimizer steps ({shape}, {rows} {rows_name})"

    return training_steps_note(corpus, benchmark, data_dir, shape, steps, check=config.micro_batches_per_step)


class BaselineMethod(Method):
    """A full-weight trainer from `cru_harness.baselines`, trained by `baselines.unlearn` with the cell's
    benchmark's defaults for it on the cell's unit (`api.Benchmark.method_defaults`), then saved for the
    evaluation."""

    def __init__(self, trainer: type, name: str, summary: str, *, refusals: dict[str, str] | None = None,
                 order: int = 100, alternate: str = "refusals", needs: tuple[str, ...] = (),
                 benchmark_defaults: dict[str, dict[str, Any]] | None = None, sources: dict[str, str] | None = None,
                 known_as: tuple[str, ...] = (), needs_qa_rows: bool = False,
                 former_defaults: dict[str, Any] | None = None):
        self.trainer = trainer
        self.known_as = known_as
        self.needs_qa_rows = needs_qa_rows
        self.order = order
        self.name = name
        self.summary = summary
        self.config = trainer.Config
        self.aliases = TRAINER_ALIASES
        # what the trainer's flags say (`alternate`: what its alternate answers are), then what only the method
        # knows (`needs`: an input file)
        self.needs = tuple(need for flag, need in (("needs_retain", "retain corpus"),
                                                   ("needs_ref", "reference model"),
                                                   ("needs_alternate", alternate))
                           if getattr(trainer, flag, False)) + needs
        self._refusals = refusals or {}
        doc = (trainer.Config.__doc__ or "").strip()
        self.sources = {**({"presets": doc.splitlines()[0]} if doc else {}), **(sources or {})}
        # a benchmark's own setting of the method (`api.Method.benchmark_defaults`): in each cell's hyperparameters
        self.benchmark_defaults = dict(benchmark_defaults or {})
        self.former_defaults = dict(former_defaults or {})   # `api.Method.former_defaults`

    @property
    def tuning_grid(self):
        """Its default `tuning:` grid (`baselines.tuning_grids`), None where it has none."""
        from .tuning_grids import GRIDS

        return GRIDS.get(self.name)

    def refuse_hparam(self, key: str) -> str | None:
        return self._refusals.get(key)

    def unsupported(self, benchmark: str) -> str | None:
        """Also: a method that needs question / answer rows on a benchmark whose corpora are passages."""
        from .. import plugins

        if reason := super().unsupported(benchmark):
            return reason
        plugin = plugins.benchmarks.get(benchmark) if benchmark in plugins.benchmarks.names() else None
        if self.needs_qa_rows and plugin is not None and plugin.passage_corpora:
            return (f"{self.name} cannot run on {benchmark}: it trains on question / answer rows and {benchmark}'s "
                    f"corpora are passages (docs/methods.md)")
        return None

    def check_hparams(self, values: dict[str, Any]) -> None:
        """The preset-free dataclass check (a preset may still fill what a split needs), and `lora`'s own."""
        from dataclasses import fields

        from ..training.lora import LoraSettings

        values = dict(values)
        if "lora" in values:
            LoraSettings.from_dict(values.pop("lora"))
        names = {f.name for f in fields(self.config)}
        self.config(**{k: v for k, v in values.items() if k in names})

    def describe(self, cell) -> tuple[str | None, list[str]]:
        """What the cell trains, with its cost in optimizer steps where the data is on this machine (`--dry-run`
        then states what a run of absurd size would cost, beyond the bounds the config check applies)."""
        from ..fingerprints import setting_paths

        what, downloads = super().describe(cell)
        # an input file a method reads (LUNAR's refusal prompts) that is not there fails its cells: say so now
        missing = [f"; {key} {cell.hparams[key]} does not exist: these cells will fail"
                   for key, path in setting_paths(cell.hparams).items() if not path.exists()]
        return f"{what}; {self.cost(cell)}{''.join(missing)}", downloads

    def cell_config(self, cell):
        """The trainer's config of a cell: its benchmark's defaults for the cell's unit, the cell's settings on top
        (`lora`, an option of the engine, apart: `cell_lora`)."""
        from .registry import benchmark_defaults

        # a committed run's restated former defaults (`as_computed`) under the cell's own settings
        settings = {**getattr(cell, "as_computed", {}), **cell.hparams}
        given = {k: v for k, v in settings.items() if k != "lora"}
        return self.trainer.Config.with_defaults(benchmark_defaults(self.name, cell.benchmark, cell.split, given),
                                                 **given)

    def cell_lora(self, cell) -> dict | None:
        """A cell's `lora:` settings (`training.lora.LoraSettings` fields), or None: full-weight training."""
        return cell.hparams.get("lora")

    def hparams(self) -> tuple[str, ...]:
        return super().hparams() + ("lora",)

    def trained_weights(self, cell) -> str:
        what = self.trainer(self.cell_config(cell)).trained_weights()
        if lora := self.cell_lora(cell):
            from ..training.lora import LoraSettings

            settings = LoraSettings.from_dict(lora)
            targets = ",".join(settings.target_modules) if settings.target_modules else "PEFT's default modules"
            what = f"a LoRA adapter (r {settings.r}, alpha {settings.alpha:g}, {targets}) on a frozen base"
        return what

    def cost(self, cell) -> str:
        from .data import builds_own_examples

        config = self.cell_config(cell)
        if builds_own_examples(cell.benchmark):   # rows are not examples there (MUSE's blocks): not counted
            return (f"steps counted when the data is tokenized ({cell.benchmark} builds its own training examples; "
                    f"{config.num_epochs:g} epochs, effective batch {config.effective_batch_size})")
        return training_cost(config, cell.corpora["forget_corpus"], cell.benchmark, cell.data_dir, "forget rows")

    def train(self, base_path: str, forget: list[dict], retain: list[dict], config, out, **kwargs):
        """Train from `base_path` and save to `out` what the evaluation loads (`lm_eval --model cru --model_args
        base=<out>`); keyword arguments as `baselines.unlearn`'s. The runner and `cru-harness unlearn` call it."""
        from .api import unlearn

        return unlearn(base_path, None, forget, retain, self.trainer, config, out_dir=out, **kwargs)

    def run(self, ctx: CellContext) -> Trained:
        from ..data.corpora import load_corpus_rows

        cell = ctx.cell
        out = ctx.workdir / "model"
        config = self.cell_config(cell)
        forget = load_corpus_rows(cell.corpora["forget_corpus"], ctx.data_dir)[0]
        retain = load_corpus_rows(cell.corpora["retain_corpus"], ctx.data_dir)[0]
        kwargs = dict(seed=cell.seed or 0, data_dir=ctx.data_dir, dtype=ctx.dtype, progress=False,
                      prompt_format=ctx.prompt_format, trust_remote_code=cell.model.trust_remote_code, overwrite=True)
        if lora := self.cell_lora(cell):
            kwargs["lora"] = lora
        settings = LaunchSettings.from_dict(getattr(cell, "training", None))
        if settings.launches:   # the config's `training:` engine, in processes of their own
            from .api import RECORD_FILE

            launch(settings, "cru_harness.baselines.api:unlearn",
                   dict(model_path_or_model=ctx.model_path, tokenizer=None, forget_rows=forget, retain_rows=retain,
                        method=self.trainer.name, config=config.to_dict(), out_dir=str(out), **kwargs))
            trained = SimpleNamespace(**json.loads((out / RECORD_FILE).read_text()))
            ctx.outcome["details"]["training_engine"] = dataclasses.asdict(settings)
        else:
            trained = self.train(ctx.model_path, forget, retain, config, out, device=cell.device,
                                 device_map=cell.model.device_map, **kwargs)
        ctx.outcome["details"]["training_prompts"] = ctx.prompt_format
        resources = getattr(trained, "resources", None)
        if resources is not None:
            record_resources(ctx.outcome, resources.to_dict() if hasattr(resources, "to_dict") else dict(resources))
        ctx.outcome["details"]["baseline_config"] = trained.config  # as trained (bf16/fp16 set mixed_precision)
        return Trained(str(out))
