"""CRU as a runner method (`cru_harness.api.Method`, entry point `cru_harness.methods`: CRU): routers trained on
a frozen base, saved as a bundle the evaluation attaches."""
from __future__ import annotations

from ..api import ROUTERS_DIR, CellContext, Method, Trained  # noqa: F401  (ROUTERS_DIR: its bundle, in work/)


class CRUMethod(Method):
    name = "CRU"
    summary = "causal routing: sigmoid routers gate variance-selected coordinates of a frozen base"
    runner_fields = ("seed", "forget_description", "retain_description", "progress")
    aliases = {"lambda": "lam"}
    needs = ("retain corpus",)
    #: Its default `tuning:` grid: the routers' learning rate (the paper's 1e-3 and a decade below, the router_lr
    #: study's grid, docs/configs.md) x its epochs, 1 and 3 (the steps: the paper's 5 epochs would give CRU more
    #: steps than a baseline's setting; 1 + 3 spend, over the grid, the same as four baseline settings at 2 epochs)
    tuning_grid = {"grid": {"lr": [1.0e-4, 1.0e-3], "epochs": [1, 3]},
                   "source": "the paper's router lr 1e-3 and 1e-4 (router_lr study's grid) x epochs 1 and 3"}
    adapter = True
    order = 60

    @property
    def config(self):
        from .train import RouterTrainingConfig

        return RouterTrainingConfig

    def describe(self, cell) -> tuple[str | None, list[str]]:
        """What the cell trains and its router steps (epochs x forget batches), counted from local data only."""
        from ..data.corpora import training_steps_note
        from .train import RouterTrainingConfig

        what, downloads = super().describe(cell)
        config = RouterTrainingConfig(**cell.hparams, seed=cell.seed or 0, progress=False)
        shape = f"{config.epochs} epochs, batch {config.batch_size}"

        def steps(rows: int) -> str:   # router_schedule's count
            return f"{config.epochs * -(-rows // config.batch_size)} router steps ({shape}, {rows} forget rows)"

        note = training_steps_note(cell.corpora["forget_corpus"], cell.benchmark, cell.data_dir, shape, steps)
        return f"{what}; {note}", downloads

    def run(self, ctx: CellContext) -> Trained:
        from ..training.resources import record_resources
        from ..training.resources import ResourceMonitor
        from ..data.corpora import load_corpus
        from .train import RouterTrainingConfig, train_routers

        cell, fmt = ctx.cell, ctx.prompt_format
        model, tokenizer = ctx.load_model(ctx.model_path)
        forget = load_corpus(cell.corpora["forget_corpus"], ctx.data_dir, tokenizer=tokenizer, **fmt)
        retain = load_corpus(cell.corpora["retain_corpus"], ctx.data_dir, tokenizer=tokenizer, **fmt)
        outcome = ctx.outcome
        outcome["details"]["training_prompts"] = fmt
        config = RouterTrainingConfig(**cell.hparams, seed=cell.seed or 0, progress=False,
                                      forget_description=cell.corpora["forget_corpus"],
                                      retain_description=cell.corpora["retain_corpus"])
        template = None
        if (config.token_scope, config.localization_tokens) != ("all", "all"):   # readings.py: the answer's marker
            from .readings import prompt_template

            template = prompt_template(tokenizer, **fmt)
        with ResourceMonitor(ctx.device) as monitor:
            bundle = train_routers(model, tokenizer, forget, retain, config,
                                   **({} if template is None else {"template": template}))
        from ..prompts import prompt_format_label

        bundle.config.training["prompt_format"] = prompt_format_label(fmt)   # the cru model warns on another one
        out = ctx.workdir / ROUTERS_DIR
        bundle.save_pretrained(out)
        record_resources(outcome, monitor.record.to_dict())
        outcome["resources"]["trainable_params"] = sum(p.numel() for p in bundle.parameters())
        outcome["resources"]["total_params"] = sum(p.numel() for p in model.parameters()) + \
            outcome["resources"]["trainable_params"]
        # what the routers trained with, defaults included: read by reporting.router_lr, whatever the defaults become
        outcome["details"]["router_training"] = dict(bundle.config.training)
        metrics = dict(getattr(bundle.config, "metrics", {}) or {})
        outcome["gate_means"] = {"forget": metrics.get("forget_gate_mean"),
                                 "retain": metrics.get("retain_gate_mean"), "raw": metrics}
        outcome["artifacts"]["routers"] = str(out)
        return Trained(ctx.model_path, routers=str(out))


METHOD = CRUMethod()
