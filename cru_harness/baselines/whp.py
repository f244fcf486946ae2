"""WHP, "Who's Harry Potter" (Eldan & Russinovich 2023), as MUSE runs it as an unlearning baseline.

A reinforced model is fine-tuned on the forget rows; the deployed model is the pair, whose next-token logits are
`v_b - alpha * ReLU(v_r - v_b)`, v_b the baseline's (the cell's starting model) and v_r the reinforced model's. No
weight of the baseline changes.
Sources: swj0419/muse_bench baselines/baselines/whos_harry_potter.py (`WHPModelForCausalLM`: the logits; alpha 1.0
by default), baselines/baselines/utils.py `load_model` (a `whp` model loads that pair, alpha 1.0 unless its name
says `alpha=`; the reinforced model is `reinforced_model_dir`, the fine-tuned model Task Vector subtracts too),
baselines/baselines/finetune.py with baselines/scripts/unlearn_news.sh (FT_EPOCHS 10, FT_LR 1e-5, batch 4 x 8 GPUs:
`task_vector.MuseFinetuneConfig`). MUSE generates greedily (metrics/knowmem.py, `do_sample=False`); its wrapper
returns no cache, so every step runs both models on the whole sequence. Here each model keeps its own KV cache: the
same logits, fewer passes. Departure: the logits are combined in float32 (MUSE: in the models' dtype, bf16).

On disk (`save_whp`): `whp.json` (the baseline, alpha, the reinforced folder), the reinforced checkpoint in
`reinforced/`, and the tokenizer. The directory holds no `config.json` at its top, so no loader takes half of the
pair for the whole: lm-eval's `cru` model loads the pair (`base=<dir>`), and `devices.load_causal_lm` refuses it
in one line (so do the quantize and relearn attacks, which change one checkpoint's weights).
"""
from __future__ import annotations

import inspect
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..api import ModelLoader
from ..errors import InputError
from ..hparams import bound_problem
from ..locations import WHP_MANIFEST, check_output_dir, write_directory
from .plugin import BaselineMethod
from .registry import register_method
from .task_vector import MuseFinetuneConfig, Reinforce

REINFORCED_DIR = "reinforced"
FORMAT_VERSION = 1


class WHPError(InputError):
    """A WHP directory or generation request that cannot be used."""


@dataclass
class WHPConfig(MuseFinetuneConfig):
    """MUSE's WHP: its fine-tuning recipe for the reinforced model, and the logit offset's weight."""
    whp_alpha: float = 1.0   # MUSE's alpha: WHPModelForCausalLM's default and load_model's without `alpha=`


@register_method
class WHP(Reinforce):
    """The reinforced model's training: NLL on the forget rows (MUSE's `finetune`)."""
    name = "whp"
    Config = WHPConfig


def whp_logits(baseline: torch.Tensor, reinforced: torch.Tensor, alpha: float) -> torch.Tensor:
    """`v_b - alpha * ReLU(v_r - v_b)` in float32 (whos_harry_potter.py's forward)."""
    v_b = baseline.float()
    return v_b - alpha * torch.relu(reinforced.to(v_b.device).float() - v_b)


# ------------------------------------------------------------------ on disk

@dataclass(frozen=True)
class WHPManifest:
    baseline: str       # the starting model: a local directory (absolute) or a Hub id
    alpha: float
    reinforced: str = REINFORCED_DIR   # a folder of the WHP directory
    format_version: int = FORMAT_VERSION


def read_whp(directory: str | os.PathLike) -> WHPManifest | None:
    """The manifest of a WHP directory, checked (None when `directory` holds no `whp.json`)."""
    root = Path(directory).expanduser()
    path = root / WHP_MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise WHPError(f"{path}: not a readable WHP manifest ({err})") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise WHPError(f"{path}: format_version {data.get('format_version') if isinstance(data, dict) else None!r}; "
                       f"this cru-harness reads version {FORMAT_VERSION}")
    baseline, alpha, reinforced = data.get("baseline"), data.get("alpha"), data.get("reinforced")
    if not isinstance(baseline, str) or not baseline.strip():
        raise WHPError(f"{path}: `baseline` must name the starting model, got {baseline!r}")
    if problem := bound_problem(alpha, above=0):
        raise WHPError(f"{path}: alpha {problem}")
    if not isinstance(reinforced, str) or Path(reinforced).name != reinforced or reinforced in ("", ".", ".."):
        raise WHPError(f"{path}: `reinforced` must be a folder name inside {root}, got {reinforced!r}")
    for inside in (path, root / reinforced, root / reinforced / "config.json"):
        if inside.is_symlink():   # a WHP directory is read as one whole: never followed out of it
            raise WHPError(f"{inside} is a symbolic link: a WHP directory holds its own files (copy them in)")
    if not (root / reinforced / "config.json").is_file():
        raise WHPError(f"{path}: its reinforced model {root / reinforced} holds no config.json")
    check_baseline_reachable(baseline, path)
    return WHPManifest(baseline=baseline, alpha=float(alpha), reinforced=reinforced)


def check_baseline_reachable(baseline: str, manifest: Path) -> None:
    """The starting model a WHP directory names must be loadable here: a local directory that exists, or a Hub id
    in the local cache when the Hub is off (HF_HUB_OFFLINE): one line now instead of two tracebacks later."""
    from ..locations import looks_local

    local = Path(baseline).expanduser()
    if local.exists() or looks_local(baseline):
        if not (local / "config.json").is_file():
            raise WHPError(f"{manifest}: its starting model {baseline} " + (
                "holds no config.json" if local.is_dir() else "does not exist"))
        return
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(baseline, "config.json"), str):
            raise WHPError(f"{manifest}: its starting model {baseline!r} is a Hub id that is not in the local cache, "
                           "and the Hub is off (HF_HUB_OFFLINE): download it first, or point `baseline` to a local "
                           "copy")


def _model_reference(path: str) -> str:
    """A local model directory as an absolute path (the manifest is read from anywhere); a Hub id as it is."""
    local = Path(path).expanduser()
    return str(local.resolve()) if local.is_dir() else str(path)


def save_whp(out: str | os.PathLike, reinforced, tokenizer, *, baseline: str, alpha: float,
             record: dict | None = None) -> Path:
    """Write a WHP directory whole (`locations.write_directory`): manifest, reinforced checkpoint, tokenizer."""
    from .api import RECORD_FILE

    manifest = WHPManifest(baseline=_model_reference(baseline), alpha=float(alpha))

    def write(tmp: Path) -> None:
        reinforced.save_pretrained(tmp / REINFORCED_DIR)
        tokenizer.save_pretrained(tmp / REINFORCED_DIR)
        tokenizer.save_pretrained(tmp)     # the runner reads the evaluated model's chat template from here
        if record is not None:
            (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2, default=str))
        (tmp / WHP_MANIFEST).write_text(json.dumps(asdict(manifest), indent=2))

    return write_directory(out, write)


# ------------------------------------------------------------------ evaluation

# Generation-config entries that add a logits processor to greedy decoding in `generate`; MUSE's wrapper decodes
# without them, and so does `WHPModel.generate`: a checkpoint that sets one is refused rather than decoded otherwise.
_GREEDY_PROCESSORS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens",
                      "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
                      "sequence_bias", "encoder_repetition_penalty", "exponential_decay_length_penalty")


class WHPModel(torch.nn.Module):
    """The pair as one causal LM for lm-eval's HFLM: `forward(...).logits` are `whp_logits`, and `generate` decodes
    greedily on them, one token at a time."""

    def __init__(self, baseline, reinforced, alpha: float):
        super().__init__()
        if baseline.config.vocab_size != reinforced.config.vocab_size:
            raise WHPError(f"WHP: the baseline's vocabulary ({baseline.config.vocab_size}) and the reinforced "
                           f"model's ({reinforced.config.vocab_size}) differ: their logits cannot be combined")
        self.baseline, self.reinforced, self.alpha = baseline, reinforced, float(alpha)

    # what HFLM reads of its model
    @property
    def config(self):
        return self.baseline.config

    @property
    def generation_config(self):
        return self.baseline.generation_config

    @property
    def device(self) -> torch.device:
        return self.baseline.device

    @property
    def dtype(self) -> torch.dtype:
        return self.baseline.dtype

    @property
    def name_or_path(self) -> str:
        return self.baseline.name_or_path

    def tie_weights(self) -> None:
        self.baseline.tie_weights()
        self.reinforced.tie_weights()

    def num_parameters(self) -> int:
        return self.baseline.num_parameters() + self.reinforced.num_parameters()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutput

        v_b = self.baseline(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits
        v_r = self.reinforced(input_ids=input_ids.to(self.reinforced.device), attention_mask=None if attention_mask
                              is None else attention_mask.to(self.reinforced.device), **kwargs).logits
        return CausalLMOutput(logits=whp_logits(v_b, v_r, self.alpha))

    def _check_generation(self, do_sample, unsupported: dict[str, Any]) -> None:
        from transformers import GenerationConfig

        if do_sample or unsupported.pop("temperature", 0.0) not in (0.0, None):
            raise WHPError("WHP generates greedily, as MUSE does: do_sample / temperature are not supported")
        unsupported.pop("top_p", None), unsupported.pop("top_k", None)   # unused by greedy decoding, as in HF
        if unsupported:
            raise WHPError(f"WHP generates greedily, as MUSE does: generation argument(s) {', '.join(sorted(unsupported))} "
                           "are not supported")
        default, mine = GenerationConfig(), self.generation_config
        set_here = [name for name in _GREEDY_PROCESSORS if getattr(mine, name, None) != getattr(default, name, None)]
        if set_here:
            raise WHPError(f"WHP generates greedily without logits processors, as MUSE does; the baseline's "
                           f"generation config sets {', '.join(set_here)}")

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_length: int | None = None, stopping_criteria=None,
                 pad_token_id: int | None = None, eos_token_id=None, do_sample: bool = False, use_cache: bool = True,
                 **unsupported):
        """Greedy decoding on `whp_logits` up to `max_length` tokens in all, as HF's `generate` runs it: left-padded
        prompts with their attention mask (positions from the mask), EOS (the baseline's generation config unless
        given) ends a sequence, which then grows by `pad_token_id`, and `stopping_criteria` as HF calls them."""
        self._check_generation(do_sample, unsupported)
        if max_length is None:
            raise WHPError("WHP generate needs max_length (prompt + new tokens)")
        eos = self.generation_config.eos_token_id if eos_token_id is None else eos_token_id
        eos_ids = torch.tensor([] if eos is None else [eos] if isinstance(eos, int) else list(eos),
                               dtype=torch.long, device=input_ids.device)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        ids, step_ids, step_positions = input_ids, input_ids, positions
        caches: list = [None, None]
        unfinished = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        models = (self.baseline, self.reinforced)
        # transformers 5 names the KV cache `cache`, earlier versions `past_key_values`; only the last position's
        # logits are needed (HF's `logits_to_keep`, where the model takes it: a prompt's [T, V] logits are large)
        extra = []
        for model in models:
            parameters = inspect.signature(model.forward).parameters
            extra.append(("cache" if "cache" in parameters else "past_key_values",
                          {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}))
        while ids.shape[1] < max_length:
            last = []
            for i, model in enumerate(models):
                out = model(input_ids=step_ids.to(model.device), attention_mask=mask.to(model.device),
                            position_ids=step_positions.to(model.device), use_cache=use_cache,
                            **{extra[i][0]: caches[i]}, **extra[i][1])
                caches[i] = getattr(out, extra[i][0]) if use_cache else None
                last.append(out.logits[:, -1])
            next_tokens = whp_logits(last[0], last[1], self.alpha).argmax(-1).to(ids.device)
            if len(eos_ids) and pad_token_id is not None:   # a finished sequence grows by padding
                next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad_token_id))
            ids = torch.cat([ids, next_tokens[:, None]], dim=-1)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            if use_cache:
                step_ids, step_positions = next_tokens[:, None], step_positions[:, -1:] + 1
            else:
                step_ids, step_positions = ids, (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
            done = torch.isin(next_tokens, eos_ids)
            if stopping_criteria is not None:
                done = done | torch.as_tensor(stopping_criteria(ids, None), device=ids.device)
            unfinished &= ~done
            if not unfinished.any():
                break
        return ids


# ------------------------------------------------------------------ the evaluation's loader

class WHPLoader(ModelLoader):
    """A WHP directory as lm-eval's `cru` model serves it (`base=<dir>`): the reinforced checkpoint loaded as the
    base (its config and tokenizer), the baseline loaded the same way, the pair served as `WHPModel`."""

    name = "WHP"

    def __init__(self, directory, manifest: WHPManifest):
        from ..locations import check_model_path
        from ..testbed.names import resolve_model_path

        self.directory, self.manifest = str(directory), manifest
        self.checkpoint = str(Path(directory).expanduser() / manifest.reinforced)
        self.baseline = check_model_path(resolve_model_path(manifest.baseline), what="WHP baseline model")

    def build(self, model, load):
        return WHPModel(load(self.baseline), model, self.manifest.alpha)

    def identity(self) -> dict:
        """The baseline (and alpha) decide the logits too."""
        from ..fingerprints import directory_stamp

        baseline = Path(self.manifest.baseline).expanduser()
        return {"whp": {"alpha": self.manifest.alpha, "baseline": {
            "path": str(baseline.resolve()), "files": directory_stamp(baseline)} if baseline.is_dir()
            else {"hub": self.manifest.baseline}}}

    def info(self) -> dict:
        return {"cru_whp": {"directory": self.directory, "baseline": self.manifest.baseline,
                            "alpha": self.manifest.alpha}}


# ------------------------------------------------------------------ the method

class WHPMethod(BaselineMethod):
    """The runner's and `unlearn`'s WHP: trains the reinforced model, writes the WHP directory."""

    one_checkpoint = False   # two models served: no quantize or relearn cell, no logit lens

    def train(self, base_path: str, forget: list[dict], retain: list[dict], config: WHPConfig, out, *,
              overwrite: bool = False, trust_remote_code: bool = False, **kwargs):
        from transformers import AutoTokenizer

        from .api import unlearn   # here: listing the methods must not import the training loop

        check_output_dir(out, what="out_dir", overwrite=overwrite, overwrite_hint="overwrite=True", staged=True)
        result = unlearn(base_path, None, forget, retain, self.trainer, config, out_dir=None,
                         trust_remote_code=trust_remote_code, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(base_path, trust_remote_code=trust_remote_code)
        result.out_dir = str(out)
        save_whp(out, result.model, tokenizer, baseline=base_path, alpha=config.whp_alpha, record=result.to_dict())
        return result

    def model_loader(self, path) -> WHPLoader | None:
        """A WHP directory (its `whp.json`) is two models: the evaluation serves the pair."""
        manifest = read_whp(path)
        return None if manifest is None else WHPLoader(path, manifest)

    def describe(self, cell):
        hp = ", ".join(f"{k}={v}" for k, v in sorted(cell.hparams.items())) or "defaults"
        return (f"WHP: a reinforced model fine-tuned on forget={cell.corpora.get('forget_corpus')}, evaluated with "
                f"the starting model as v_b - alpha * ReLU(v_r - v_b) [{hp}]"), []


#: The runner's view of it (entry point `cru_harness.methods`: WHP).
METHOD = WHPMethod(WHP, "WHP", "Who's Harry Potter (MUSE): logits v_b - alpha * ReLU(v_r - v_b) of the starting "
                               "model and a model reinforced on the forget set", order=59)
METHOD.needs = ("the starting model at evaluation (two models served)",)
