"""The training phase of the runner's own cells: a retain oracle fine-tuned from the cell's base, or a model
fine-tuned with TOFU's recipe (`finetune:`). A method cell trains through its method plugin (`Method.run`,
`runner.execute`). Each trainer returns the path the evaluation loads and records its resources in `outcome`."""
from __future__ import annotations

import time
from pathlib import Path

from ..api import ROUTERS_DIR  # noqa: F401  (where an adapter cell keeps its bundle; importable here)
from ..training.launch import LaunchSettings, launch
from ..training.resources import record_resources
from .models import resolve_model_path
from .plan import Cell
from .provenance import directory_fingerprint

FINETUNED_DIR = "finetuned_model"   # a finetune cell's checkpoint, inside its work directory


def train_retain_model(cell: Cell, spec: dict, workdir: Path, data_dir, outcome: dict) -> str:
    from ..data.corpora import load_corpus
    from ..testbed.finetune import finetune_causal_lm

    decisions = cell.decisions
    source = resolve_model_path(spec.get("from", cell.model.path))
    model, tokenizer = decisions.load_model(source)
    # the rows as the evaluation writes them (a testbed model: the plain template, which `format_qa` also writes)
    texts = load_corpus(cell.corpora["retain_corpus"], data_dir, tokenizer=tokenizer,
                        **decisions.rows(decisions.chat(source)))
    t0 = time.perf_counter()
    kwargs = {k: v for k, v in spec.items() if k != "from"}   # every other key validation let through
    finetune_causal_lm(model, tokenizer, texts, seed=cell.seed or 0, **kwargs)
    outcome["resources"]["train_wall_time_s"] = time.perf_counter() - t0
    out = workdir / "retain_model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def train_finetuned_model(cell: Cell, spec: dict, source_path: str, corpus: str, workdir: Path, data_dir,
                          outcome: dict, name: str = FINETUNED_DIR) -> str:
    """`source_path` fine-tuned on `corpus` with TOFU's recipe (`cru_harness.finetune`), overridden by `spec`;
    saved under workdir/`name`. The prompt is the one the cell's evaluation uses (chat template or plain)."""
    from ..finetune import FinetuneConfig, finetune

    decisions = cell.decisions
    overrides = {k: v for k, v in spec.items() if k not in ("data", "dtype")}
    dtype = spec.get("dtype") or decisions.dtype()
    out = workdir / name
    fmt = decisions.rows(decisions.chat(source_path))
    config = FinetuneConfig.from_dict(overrides)
    kwargs = dict(seed=cell.seed or 0, data_dir=data_dir, dtype=dtype, chat_template=fmt["chat"],
                  overwrite=True, progress=False,
                  trust_remote_code=cell.model.trust_remote_code,
                  **{k: fmt[k] for k in ("preset", "family", "benchmark") if k in fmt})
    settings = LaunchSettings.from_dict(getattr(cell, "training", None))
    if settings.launches:   # the config's `training:` engine, in processes of their own
        import json
        from types import SimpleNamespace

        from ..finetune.train import RECORD_FILE

        launch(settings, "cru_harness.finetune:finetune",
               dict(model=source_path, data=corpus, out_dir=str(out), config=config.to_dict(), **kwargs))
        record = json.loads((out / RECORD_FILE).read_text())
        result = SimpleNamespace(**record, to_dict=lambda: record)
        outcome["details"]["training_engine"] = dict(cell.training)
    else:
        result = finetune(source_path, corpus, out, config=config, device=cell.device,
                          device_map=cell.model.device_map, **kwargs)
    outcome["details"]["training_prompts"] = fmt
    record_resources(outcome, result.resources)
    # The weights' fingerprint: a run that must fine-tune again elsewhere compares its checkpoint with this one.
    outcome["details"]["finetune"] = {**{k: v for k, v in result.to_dict().items() if k != "history"},
                                      "checkpoint_fingerprint": directory_fingerprint(out)}
    outcome["artifacts"]["checkpoint"] = str(out)
    return str(out)
