"""The `cru` lm-eval model: a Hugging Face causal LM with CRU router bundles attached, and extended results.

Use::

    lm_eval --model cru --model_args base=<HF id or dir>,routers=<bundle dir>[+<bundle dir>...] --tasks ...

- `base=` is an alias of HFLM's `pretrained=`; every other HFLM argument passes through unchanged (`dtype`,
  `batch_size` incl. `auto`, `max_batch_size`, `parallelize`/device maps, `trust_remote_code`, `revision`,
  `peft`, `chat_template_args`, ...; use `--device`, not `device=` inside `--model_args`). The class *is*
  lm-eval's `HFLM`, so batching, dtypes, chat templates and `accelerate launch` data parallelism behave as for
  `--model hf`.
- `routers=` names one or more router bundle directories (`RouterBundle.save_pretrained` output) joined by
  `+`, e.g. `routers=runs/a/routers+runs/b/routers` (gates of several bundles on one coordinate multiply). The
  routers are attached after the model is loaded, each on the device of the block it reads. A directory
  whose own name contains `+` cannot be given this way: pass a list (`routers=[dirA, dirB]`) through the
  Python API. Without `routers` the model is exactly the base model.
- A bundle that does not fit the base (other architecture, hidden size, block count) fails with the bundle's
  own `BundleError`, naming the mismatch. Bundles are read and validated before the base is loaded, a local
  base path is checked first (`locations.check_model_path`), a model argument that is a near miss of a
  known one (`router=`) is refused (`ModelArgumentError`), dtype names, `max_length` and the device go through the
  project's rules (`check_argument_values`, `devices.py`), a boolean (`trust_remote_code`, `parallelize`, ...)
  takes exactly lm-eval's `true`/`false` (`check_boolean_arguments`: `no` would be a true string), an argument
  given empty (`routers=`) is refused (`check_empty_arguments`), and a base that cannot be read (a Hub id while
  offline) is named. These are the project's `UserError`s: the `lm_eval` and `cru-eval` command lines print them
  as one line (`cru_harness.lmeval.errors`).
- `--use_cache DB` holds the identity of the model that wrote it (`cache_identity`: base, bundle digests, dtypes);
  a cache another model wrote is refused (`set_cache_hook`), since lm-eval keys it by the requests alone.

What `cru` reports beyond `--model hf` (see `protocol.py` and docs/lm_eval.md):

- `loglikelihood` -> `LoglikelihoodResult`: the same `(logprob_sum, is_greedy)` as HFLM, plus
  `n_tokens`, `token_logprobs`, `token_mu`, `token_sigma` (Min-K%++'s mean and std of log p(v) under the
  model's next-token distribution at each continuation position), `token_greedy` (per-token argmax flags) and
  `text` (the scored tokens decoded without special tokens).
- A continuation ending in `EOS_MARKER` is scored with the tokenizer's EOS token appended (the marker text is
  never tokenized); `--model hf` would score the marker as literal text, so tasks that use it report NaN
  for the EOS-dependent numbers under `hf`.
- `loglikelihood_rolling` -> `RollingResult` (a float, plus the same per-token arrays).
- Chat templates see a pinned date (`protocol.PINNED_DATE`): `date_string` is passed as a template variable
  (Llama 3.x reads it) and transformers' `strftime_now` global reads a pinned clock while rendering
  (`pinned_clock`; transformers 5 blanks callables passed as template variables, so shadowing it with a
  variable is not possible).

`_loglikelihood_tokens` re-implements HFLM's causal scoring loop (same `Collator` ordering, batch sizes,
truncation and padding, so sums and greedy flags equal HFLM's) because HFLM's loop discards the full
distribution before returning. One deliberate difference: for a one-token-continuation cache group whose
continuations differ in length, HFLM gathers the leading positions of the shared logits; this class takes the
trailing ones (the positions the continuation actually occupies). Task sets in this project never form such
groups; with equal-length continuations both agree.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

import jinja2
import torch
import torch.nn.functional as F
from tqdm import tqdm

from lm_eval import utils as lm_utils
# The helpers HFLM's own loop uses, taken from its module so they stay the ones HFLM uses.
from lm_eval.models.huggingface import HFLM, Collator, pad_and_concat

from ..errors import InputError
from cru_harness.errors import UserError, excerpt
from cru_harness.protocol import (
    EOS_MARKER,
    ROUTER_SEPARATOR,
    TOKENIZER_EOS,
    UNK_STOP,
    LoglikelihoodResult,
    RollingResult,
    pinned_clock,
    pinned_template_kwargs,
    split_eos_marker,
    split_mia_marker,
    split_joint_marker,
    split_max_length_marker,
)

__all__ = ["CRULM", "ModelArgumentError", "parse_router_spec", "EOS_MARKER", "LoglikelihoodResult",
           "RollingResult"]

eval_logger = logging.getLogger(__name__)
#: The `--use_cache` database entry naming the model that wrote it (lm-eval's own keys are SHA-256 hex digests).
CACHE_IDENTITY_KEY = "cru_harness:model_identity"


class ModelArgumentError(UserError, ValueError):
    """A `--model_args` entry the `cru` model does not take."""


def _named_parameters(function) -> frozenset[str]:
    import inspect

    return frozenset(name for name, p in inspect.signature(function).parameters.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self")


_HFLM_ARGUMENTS = _named_parameters(HFLM.__init__)


def known_arguments() -> set[str]:
    """What `cru` takes by name: its own (`base`, `routers`) and HFLM's. Other names go on to
    `from_pretrained` (HFLM forwards them), so only a near miss of a known name is refused."""
    return set(_HFLM_ARGUMENTS) | {"base", "routers", "reference"}


# Arguments transformers' `from_pretrained` takes from **kwargs (so not in its signature); some are near misses
# of HFLM's names (`device_map` ~ `device`, `max_memory` ~ `max_cpu_memory`) and must pass through.
FROM_PRETRAINED_KWARGS = frozenset({
    "adapter_kwargs", "adapter_name", "attn_implementation", "code_revision", "device_map", "device_mesh",
    "distributed_config", "dtype_plan", "experts_implementation", "from_flax", "from_tf", "generation_config",
    "gguf_file", "key_mapping", "load_in_4bit", "load_in_8bit", "low_cpu_mem_usage", "max_memory", "mirror",
    "offload_buffers", "offload_state_dict", "output_loading_info", "proxies", "quantization_config", "subfolder",
    "torch_dtype", "tp_size", "trust_remote_code", "use_cache", "use_flash_attention_2", "use_kernels", "variant",
})


def _similarity(a: str, b: str) -> float:
    import difflib

    # SequenceMatcher is not symmetric: a transposition ("dtpye") scores differently each way round.
    return max(difflib.SequenceMatcher(None, a, b).ratio(), difflib.SequenceMatcher(None, b, a).ratio())


def check_arguments(kwargs: dict) -> None:
    """Refuse `router=`, `bsae=`, ...: a misspelt argument would otherwise reach the model's constructor.
    Names `from_pretrained` takes pass through, as HFLM forwards them."""
    from transformers import PreTrainedModel

    known = known_arguments()
    forwarded = _named_parameters(PreTrainedModel.from_pretrained) | FROM_PRETRAINED_KWARGS
    for name in kwargs:
        if name in known or name in forwarded:
            continue
        score, best = max((_similarity(name, candidate), candidate) for candidate in sorted(known))
        if score >= 0.75:
            raise ModelArgumentError(f"cru model: unknown argument {name!r} in --model_args (did you mean "
                                     f"{best!r}?)")


def _boolean_parameters(function) -> frozenset[str]:
    """Parameters of `function` annotated `bool` or `bool | None` (annotations may be strings: PEP 563)."""
    import inspect
    import typing

    names = set()
    for name, p in inspect.signature(function).parameters.items():
        annotation = p.annotation
        if isinstance(annotation, str):
            kinds = {part.strip() for part in annotation.replace("Optional[", "").rstrip("]").split("|")}
        else:
            kinds = {getattr(a, "__name__", str(a)) for a in (typing.get_args(annotation) or (annotation,))}
        if "bool" in kinds and kinds <= {"bool", "None", "NoneType"}:
            names.add(name)
    return frozenset(names)


def boolean_arguments() -> frozenset[str]:
    """The `--model_args` entries that are booleans: HFLM's and `from_pretrained`'s (by annotation) and the
    booleans `from_pretrained` takes from **kwargs."""
    from transformers import PreTrainedModel

    return (_boolean_parameters(HFLM.__init__) | _boolean_parameters(PreTrainedModel.from_pretrained)
            | FROM_PRETRAINED_BOOLEANS)


# Booleans among FROM_PRETRAINED_KWARGS (not in any signature, so named here).
FROM_PRETRAINED_BOOLEANS = frozenset({
    "from_flax", "from_tf", "load_in_4bit", "load_in_8bit", "low_cpu_mem_usage", "offload_buffers",
    "offload_state_dict", "output_loading_info", "trust_remote_code", "use_cache", "use_flash_attention_2",
    "use_kernels",
})
#: lm-eval 0.4.13's spellings of a boolean (`lm_eval.utils.handle_arg_string`: case-insensitive).
BOOLEAN_SPELLINGS = {"true": True, "false": False}


def check_boolean_arguments(kwargs: dict) -> None:
    """Normalise (in place) every boolean `--model_args` entry to a bool, or refuse it.

    lm-eval turns `true`/`false` (any case) into bools and hands any other value over as it is: `no` stays a
    non-empty string, which the model's code reads as true (`trust_remote_code=no` would run the checkpoint's
    Python). So exactly lm-eval's spellings are taken (as bools, or as those strings from the Python API), and
    anything else (`yes`, `no`, `0`, `1`) is refused, naming the argument. None is "not given"."""
    for name in sorted(boolean_arguments() & kwargs.keys()):
        value = kwargs[name]
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str) and value.strip().lower() in BOOLEAN_SPELLINGS:
            kwargs[name] = BOOLEAN_SPELLINGS[value.strip().lower()]
            continue
        raise ModelArgumentError(f"cru model: {name}={value!r} in --model_args is not a boolean: write "
                                 f"{name}=true or {name}=false")


def check_empty_arguments(base, routers, kwargs: dict) -> None:
    """An entry given with no value (`routers=`, `base=`, `dtype=`) is a slip, never a choice: `routers=` empty
    would score the base alone as if it were CRU. Refused, naming it. (Leaving `routers` out is the way to get
    the base alone.)"""
    given = {"base": base, "routers": routers, **kwargs}
    for name, value in given.items():
        if isinstance(value, (str, Path)) and not str(value).strip():
            raise ModelArgumentError(f"cru model: {name}= is empty in --model_args: give a value, or leave "
                                     f"{name} out")
    if isinstance(routers, (list, tuple)) and not routers:
        raise ModelArgumentError("cru model: routers=[] names no bundle: give one or more bundle directories, or "
                                 "leave routers out")
    if isinstance(routers, bool):
        raise ModelArgumentError(f"cru model: routers={routers!r} in --model_args is not a bundle directory: give "
                                 "routers=<dir>[+<dir>...], or leave routers out")


# lm-eval takes these as dtype names and looks them up on `torch` only when it loads the model or scores.
DTYPE_ARGUMENTS = ("dtype", "softmax_dtype", "mixed_precision_dtype")
# What lm-eval's command line passes when `--device` is not given; HFLM then falls back to the CPU without CUDA.
LMEVAL_DEFAULT_DEVICE = "cuda:0"


def check_argument_values(kwargs: dict, *, check_device: bool = True) -> None:
    """Validate (and normalise, in place) the `--model_args` values lm-eval would only trip over later.

    - `dtype`, `softmax_dtype`, `mixed_precision_dtype`: the project's dtype rule (`devices.parse_dtype`), passed
      on by canonical name (`bf16` -> `bfloat16`), or any other torch floating dtype lm-eval takes (`float64`);
      `auto` (the checkpoint's own) is a weight dtype only. lm-eval
      would fail on `float17` with an AttributeError, the softmax one only when it scores.
    - `max_length`: a positive integer (lm-eval fails with a TypeError midway through generation).
    - `device`: the project's device rule (`devices.resolve_device`), so a device that is not there is refused
      before loading; `auto`, and no device at all (HFLM's own default would be `cuda`), become the device `auto`
      resolves to. lm-eval's command-line default `LMEVAL_DEFAULT_DEVICE` without CUDA stays HFLM's fallback to
      the CPU: a run without `--device` must work. (The command line passes that same string for an explicit
      `--device cuda:0`, which therefore falls back too; `cuda`, `cuda:1`, ... are refused.)
      A dtype the device cannot compute in (bf16 on a pre-Ampere GPU) is refused too.
    """
    import torch

    from cru_harness.devices import (DTYPE_NAMES, DeviceError, check_dtype_on_device, dtype_name, parse_dtype,
                                     resolve_device)

    for name in DTYPE_ARGUMENTS:
        value = kwargs.get(name)
        if value is None:
            continue
        try:
            canonical = dtype_name(parse_dtype(value))
        except DeviceError:   # beyond the project's names, any torch floating dtype lm-eval takes (float64, ...)
            text = str(value).strip().lower().removeprefix("torch.")
            found = getattr(torch, text, None)
            canonical = text if isinstance(found, torch.dtype) and found.is_floating_point else None
        if canonical is None or (canonical == "auto" and name != "dtype"):
            choices = DTYPE_NAMES if name == "dtype" else DTYPE_NAMES[1:]
            raise DeviceError(f"cru model: {name}={value!r} in --model_args is not a torch floating dtype (e.g. "
                              f"{', '.join(choices)})")
        kwargs[name] = canonical
    length = kwargs.get("max_length")
    if length is not None:
        if isinstance(length, bool) or not (isinstance(length, int) or str(length).strip().isdigit()) \
                or int(length) <= 0:
            raise ModelArgumentError(f"cru model: max_length={length!r} in --model_args is not a positive integer")
        kwargs["max_length"] = int(length)
    if not check_device:
        return
    device = kwargs.get("device")
    if device is None:   # none given (simple_evaluate without device=): a GPU if there is one
        device = "auto"
    if device == LMEVAL_DEFAULT_DEVICE and not torch.cuda.is_available():
        kwargs["device"] = "cpu"
        eval_logger.warning(f"device {device!r} (lm-eval's default) is not available: running on the CPU")
        return
    resolved = resolve_device(device)
    kwargs["device"] = str(resolved)  # HFLM falls back to any device for `auto`, and takes strings only
    if kwargs.get("dtype") in DTYPE_NAMES[1:]:
        check_dtype_on_device(parse_dtype(kwargs["dtype"]), resolved)


def parse_router_spec(routers) -> list:
    """`routers=` as given (None, `"a+b"`, a path, a RouterBundle, or a list of those) -> a list of entries."""
    if routers is None or routers == "" or routers is False:   # CRULM refuses "" and False (check_empty_arguments)
        return []
    if isinstance(routers, (str, Path)):
        entries = [part.strip() for part in str(routers).split(ROUTER_SEPARATOR)]
        if any(not part for part in entries):
            raise ModelArgumentError(
                f"routers={routers!r}: empty bundle directory between '{ROUTER_SEPARATOR}' separators; "
                f"write routers=<dir>[{ROUTER_SEPARATOR}<dir>...]"
            )
        return entries
    if isinstance(routers, (list, tuple)):
        out = []
        for item in routers:
            out.extend([item] if not isinstance(item, (str, Path)) else [str(item)])
        return out
    return [routers]  # a single RouterBundle object


def _load_bundle(entry):
    from cru_harness.cru.bundle import RouterBundle

    if isinstance(entry, RouterBundle):
        return entry
    # A missing or malformed directory raises the bundle's own BundleFileError naming the path.
    return RouterBundle.from_pretrained(Path(entry).expanduser())


def read_whp_dir(pretrained):
    """The manifest of a WHP directory given as the base (`baselines.whp.read_whp`), else None."""
    from cru_harness.locations import WHP_MANIFEST

    if not isinstance(pretrained, (str, Path)) or not (Path(pretrained).expanduser() / WHP_MANIFEST).is_file():
        return None
    from cru_harness.baselines.whp import read_whp

    return read_whp(pretrained)


def token_stats(logp: torch.Tensor, tokens: torch.Tensor):
    """Per position of `logp` [n, V] (log-probs) and `tokens` [n]: (log p(token), mu, sigma) as float32 lists.

    mu and sigma are the mean and standard deviation of log p under p (Min-K%++). The variance is taken around
    mu (two passes), not as E[x^2] - mu^2, which cancels badly in float32. Reductions are einsums, so the
    [n, V] tensor (49k columns for SmolLM2) is copied as few times as possible: they are a visible share of
    CPU scoring."""
    logp32 = logp.float()
    token_lp = torch.gather(logp32, -1, tokens.unsqueeze(-1)).squeeze(-1)
    probs = logp32.exp()  # exp(-inf) = 0 ...
    if torch.isinf(logp32).any():  # ... but 0 * -inf is nan: such entries contribute nothing
        logp32 = logp32.masked_fill(torch.isinf(logp32), 0.0)
    mu = torch.einsum("nv,nv->n", probs, logp32)
    centered = (logp32 - mu.unsqueeze(-1)).square_()
    sigma = torch.einsum("nv,nv->n", probs, centered).clamp_min(0.0).sqrt()
    return token_lp.tolist(), mu.tolist(), sigma.tolist()


#: Files whose content fixes a tokenizer's vocabulary and ids: equal files, equal tokenizers.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model")


def check_reference_model(reference, tokenizer_source, *, trust_remote_code=False) -> str:
    """The `reference=` model of the privacy metrics' reference attack, checked before any model loads: a local
    model directory (or a Hub id), whose tokenizer gives the evaluated model's ids (the attack compares losses on
    the same token ids). Tokenizer files compared by content; when they differ, both tokenizers (not the weights)
    are loaded and their vocabularies and a few encodings compared. Returns the resolved path."""
    from cru_harness.locations import check_model_path
    from cru_harness.testbed.names import resolve_model_path

    if isinstance(reference, (str, Path)):
        path = check_model_path(resolve_model_path(str(reference)), what="reference model (reference=)")
    else:
        raise ModelArgumentError(f"cru model: reference= must name a model directory or Hub id, not "
                                 f"{type(reference).__name__}")
    ref, base = Path(path).expanduser(), Path(str(tokenizer_source)).expanduser()
    if not (ref.is_dir() and base.is_dir()):
        return path   # a Hub id: its files are not here to compare; the run-time vocabulary check still holds

    def files(directory):
        return {name: (directory / name).read_bytes() for name in _TOKENIZER_FILES if (directory / name).is_file()}

    ref_files, base_files = files(ref), files(base)
    if ref_files and ref_files == base_files:
        return path
    if not ref_files:   # a checkpoint saved without its tokenizer: its embedding size must match at least
        sizes = []
        for directory in (ref, base):
            try:
                sizes.append(json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size"))
            except (OSError, ValueError, AttributeError):
                sizes.append(None)
        if None not in sizes and sizes[0] != sizes[1]:
            raise ModelArgumentError(f"cru model: reference={excerpt(reference, 200)} has vocab_size {sizes[0]}, the "
                                     f"evaluated model {sizes[1]}: the reference attack compares losses on the same "
                                     "token ids, so the reference model needs the evaluated model's tokenizer")
        return path
    from transformers import AutoTokenizer

    toks = []
    for directory, what in ((ref, f"reference={excerpt(reference, 200)}"), (base, f"tokenizer {base}")):
        try:
            toks.append(AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code))
        except (OSError, ValueError, TypeError) as err:
            raise ModelArgumentError(f"cru model: cannot read the tokenizer of {what}: "
                                     f"{excerpt(str(err).splitlines()[0] if str(err) else type(err).__name__, 200)}"
                                     ) from err
    samples = ("The quick brown fox jumps over the lazy dog.", "Who wrote 'Le Petit Prince' in 1943? 42 \u00e9t\u00e9")
    if toks[0].get_vocab() != toks[1].get_vocab() or any(
            toks[0].encode(text) != toks[1].encode(text) for text in samples):
        raise ModelArgumentError(f"cru model: reference={excerpt(reference, 200)} has another tokenizer than the "
                                 f"evaluated model ({len(toks[0])} vs {len(toks[1])} tokens, or other ids): the "
                                 "reference attack compares losses on the same token ids")
    return path


class CRULM(HFLM):
    """HFLM + CRU router bundles + extended loglikelihood results. Registered in lm-eval as `cru`."""

    def __init__(self, pretrained=None, *, base=None, routers=None, reference=None, **kwargs) -> None:
        if base is not None and pretrained is not None and base != pretrained:
            raise ModelArgumentError(f"give the base model once: base={base!r} and pretrained={pretrained!r} differ")
        check_empty_arguments(base if base is not None else pretrained, routers,
                              kwargs if reference is None else {**kwargs, "reference": reference})
        pretrained = base if base is not None else pretrained
        if pretrained is None:
            raise ModelArgumentError("the cru model needs base=<HF model id or local directory> (alias: pretrained=)")
        from cru_harness.testbed.names import resolve_model_path

        pretrained = resolve_model_path(pretrained)   # a testbed name (zoo:llama:finetuned, smollm2): its directory
        # A WHP directory (`baselines.whp`): HFLM loads its reinforced model, `_create_model` adds the baseline
        self._whp = read_whp_dir(pretrained)
        if self._whp is not None:
            if routers is not None:
                raise ModelArgumentError(f"cru model: {pretrained} is a WHP model; router bundles attach to one "
                                         "base, so leave routers out")
            from cru_harness.locations import check_model_path

            self._whp_dir = str(pretrained)
            self._whp_baseline = check_model_path(resolve_model_path(self._whp.baseline), what="WHP baseline model")
            pretrained = str(Path(pretrained).expanduser() / self._whp.reinforced)
        check_arguments(kwargs)
        check_boolean_arguments(kwargs)
        # HFLM takes the device of a model object it is given as is
        check_argument_values(kwargs, check_device=isinstance(pretrained, (str, Path)))
        if isinstance(pretrained, (str, Path)) and not kwargs.get("gguf_file"):
            from cru_harness.locations import check_model_path

            path = str(pretrained)
            if kwargs.get("subfolder") and Path(path).expanduser().is_dir():
                path = str(Path(path).expanduser() / kwargs["subfolder"])
            check_model_path(path, what="base model")
        if reference is not None:   # the privacy reference attack's model: checked before anything loads
            reference = check_reference_model(reference, kwargs.get("tokenizer") or pretrained,
                                              trust_remote_code=kwargs.get("trust_remote_code", False))
        # Bundles are read and validated before the base is loaded: a bad one fails in a second, not minutes.
        entries = parse_router_spec(routers)
        bundles = [_load_bundle(e) for e in entries]
        try:
            super().__init__(pretrained=pretrained, **kwargs)
        except TypeError as err:
            # HFLM forwards unknown names to the model class, which rejects them as a keyword: say which one.
            match = re.search(r"unexpected keyword argument '(\w+)'", str(err))
            if match and match.group(1) in kwargs:
                raise ModelArgumentError(f"cru model: unknown argument {match.group(1)!r} in --model_args (not an "
                                         f"argument of cru, HFLM or the model: {err})") from err
            raise
        if self.backend != "causal":
            raise ModelArgumentError(
                f"the cru model supports decoder-only (causal) models; {pretrained!r} loaded as {self.backend}. "
                f"Use --model hf for encoder-decoder models."
            )
        self.router_sources: list[str] = []
        self.bundles: list = []
        self._router_handle = None
        self._dropped_stop_ids: dict[tuple, list[int]] = {}   # stop list -> ids (`dropped_stop_ids`)
        self._chat_rendered = False      # whether a prompt went through the chat template (`apply_chat_template`)
        self._format_checked = False     # `check_prompt_format` has run (it warns once)
        self.reference = None if reference is None else str(reference)   # the reference attack's model
        if entries:
            self.bundles = bundles
            self.router_sources = [str(e) if isinstance(e, (str, Path)) else repr(e) for e in entries]
            self._attach()

    def _create_model(self, pretrained, **kwargs) -> None:
        """HFLM's loading; for a WHP directory it loads the baseline the same way (dtype, device map, ...) and
        serves the pair (`baselines.whp.WHPModel`): loglikelihood and generation see the combined logits."""
        super()._create_model(pretrained, **kwargs)
        if self._whp is None:
            return
        from cru_harness.baselines.whp import WHPModel

        reinforced = self._model
        super()._create_model(self._whp_baseline, **kwargs)
        self._model = WHPModel(self._model, reinforced, self._whp.alpha)

    def _get_config(self, pretrained, **kwargs) -> None:   # HFLM's own (lm-eval 0.4.13, pinned), narrowed
        try:
            super()._get_config(pretrained, **kwargs)
        except OSError as err:
            # a Hub id that cannot be fetched (offline, no such repo, gated) or an unreadable directory: reported
            # in one line, as `cru-harness unlearn` reports its --base
            raise ModelArgumentError(f"cannot load base model {pretrained!r}: {err}") from None

    # ------------------------------------------------------------------ routers
    def _attach(self) -> None:
        from cru_harness.cru.attach import attach_bundles

        # attach_bundles runs bundle.check_compatible(model) first: a mismatch raises the bundle's own
        # IncompatibleBaseError (hidden size / layer count / fingerprint) before any hook is installed.
        self._router_handle = attach_bundles(self.model, self.bundles)

    @property
    def has_routers(self) -> bool:
        return self._router_handle is not None

    @contextlib.contextmanager
    def without_routers(self):
        """Temporarily score with the base model (e.g. the NLL of answers under the original model)."""
        if self._router_handle is None:
            yield self
            return
        self._router_handle.remove()
        self._router_handle = None
        try:
            yield self
        finally:
            self._attach()

    # ---------------------------------------------------------- loglikelihood
    def check_prompt_format(self) -> None:
        """Warn once, in one line, when a bundle's routers trained on another prompt format than this evaluation's
        (the chat template or not): routers gate text they never saw, so "forgetting" can be a format effect. Called
        when the requests come, which lm-eval builds (through `apply_chat_template`) before running any.
        A bundle that does not record its format (made before bundles recorded it) is not checked."""
        if self._format_checked or not self.bundles:
            return
        self._format_checked = True
        evaluated = "the chat template" if self._chat_rendered else "no chat template"
        for source, bundle in zip(self.router_sources, self.bundles):
            trained = (bundle.config.training or {}).get("prompt_format")
            if trained is not None and (trained == "chat") != self._chat_rendered:
                eval_logger.warning(
                    f"router bundle {source} trained on {'chat-template' if trained == 'chat' else trained} prompts, "
                    f"but this evaluation prompts with {evaluated}: its scores measure a format change too "
                    f"(train and evaluate alike: unlearn --prompt-format, lm_eval --apply_chat_template)")
                return

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[LoglikelihoodResult]:
        self.check_prompt_format()
        if self.enable_thinking:
            task_names = sorted({req.task_name for req in requests if req.task_name})
            raise ModelArgumentError(
                "enable_thinking=True is not compatible with loglikelihood tasks. "
                f"Triggered by task(s): {', '.join(task_names)}"
            )
        new_reqs, gradnorm = [], []
        for context, continuation in tqdm([req.args for req in requests], desc="Tokenizing inputs",
                                          disable=disable_tqdm):
            ctx_enc, cont_enc = self.encode_request(context, continuation)
            wants_scores = split_mia_marker(continuation)[1]
            # the key keeps the marker: a cached result without the score never answers a request for it
            new_reqs.append(((context, continuation), ctx_enc, cont_enc))
            gradnorm.append(wants_scores)
        results = self._loglikelihood_tokens(new_reqs, disable_tqdm=disable_tqdm)
        if any(gradnorm):
            results = self._with_model_scores(new_reqs, results, gradnorm, disable_tqdm)
        return results

    def _with_model_scores(self, requests, results, wanted, disable_tqdm):
        """The results of the requests that carried `MIA_MARKER` with their GradNorm score (one backward pass
        each, batch size 1 as open-unlearning, through the model as served: routers attached) and, with a
        `reference=` model, its mean loss on the same scored tokens."""
        import torch

        from .gradnorm import scored_logprobs, text_gradnorm

        reference = self._reference_model()
        out = list(results)
        for i in tqdm([i for i, want in enumerate(wanted) if want], desc="GradNorm (one backward pass each)",
                      disable=disable_tqdm or self.rank != 0):
            _, ctx_enc, cont_enc = requests[i]
            ids = (ctx_enc + cont_enc)[-(self.max_length + 1):]   # the window the log-likelihood scored
            score = text_gradnorm(self.model, ids, len(ids) - len(cont_enc))
            ref_loss = None
            if reference is not None:
                with torch.no_grad():
                    ref_loss = -float(scored_logprobs(reference, ids, len(ids) - len(cont_enc)).mean())
            r = out[i]
            out[i] = LoglikelihoodResult(r[0], r[1], r.token_logprobs, r.token_mu, r.token_sigma, r.token_greedy,
                                         r.text, gradnorm=score, reference_loss=ref_loss)
        return out

    def _reference_model(self):
        """The `reference=` model (the reference attack's; open-unlearning's TOFU config names the retain model),
        loaded once on first use, in the scored model's dtype and device; None without one."""
        if self.reference is None:
            return None
        if getattr(self, "_reference", None) is None:
            from transformers import AutoModelForCausalLM

            from cru_harness.testbed.names import resolve_model_path

            model = AutoModelForCausalLM.from_pretrained(resolve_model_path(self.reference),
                                                         dtype=self.model.dtype).to(self.device).eval()
            if model.get_input_embeddings().num_embeddings < len(self.tokenizer):
                raise ModelArgumentError(f"cru model: reference={self.reference} has another vocabulary than the "
                                         "scored model's tokenizer: the reference attack compares losses on the "
                                         "same tokens")
            self._reference = model
        return self._reference

    def encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The (context ids, scored ids) of one `loglikelihood` request, markers of `protocol` applied.

        - plain: lm-eval's own pairing (`_encode_pair`; an empty context gets the prefix token);
        - `JOINT_MARKER` first: `context + text` encoded once, the scored ids are those after
          `len(tok_encode(context))` (an empty context: the first token is the context), as the references do;
        - `max_length_marker(n)` right after `JOINT_MARKER`: the whole text is cut at n tokens, and `EOS_MARKER`
          then appends EOS only to a text shorter than n, always (TOFU `data_module.py:15-27`);
        - `EOS_MARKER` last: the tokenizer's EOS is appended unless the scored ids already end with it.
        """
        text = split_mia_marker(continuation)[0]   # a request for a score, not for other tokens
        text, joint = split_joint_marker(text)
        text, max_length = split_max_length_marker(text) if joint else (text, None)
        text, add_eos = split_eos_marker(text)
        cut = False
        if joint:
            whole = self.tok_encode(context + text)
            n_context = len(self.tok_encode(context)) if context else 1
            if max_length is not None:
                # TOFU's dataset (data_module.py:15-27): `truncation=True, max_length=n`; a text that reaches n
                # tokens is scored as cut, without EOS
                cut = len(whole) >= max_length
                whole = whole[:max_length]
            elif not context and len(whole) > self.max_length + 1:
                # RWKU feeds the whole text (its models' windows hold it); a shorter window keeps the beginning
                eval_logger.warning(f"a scored text of {len(whole)} tokens exceeds the model's max_length "
                                    f"{self.max_length}: its first {self.max_length + 1} tokens are scored")
                whole = whole[:self.max_length + 1]
            ctx_enc, cont_enc = whole[:n_context], whole[n_context:]
        elif context == "":
            cont_enc = self.tok_encode(text, add_special_tokens=False) if text else []
            if cont_enc and cont_enc[0] == self.prefix_token_id:
                ctx_enc, cont_enc = cont_enc[:1], cont_enc[1:]
            else:
                ctx_enc = [self.prefix_token_id]
        else:
            ctx_enc, cont_enc = self._encode_pair(context, text)
        ctx_enc, cont_enc = list(ctx_enc), list(cont_enc)
        if add_eos and not cut:
            eos = self.tokenizer.eos_token_id
            if eos is None:
                raise InputError(
                    f"continuation ends with {EOS_MARKER!r} but the tokenizer of {self.pretrained!r} has no EOS token"
                )
            # TOFU (with a max_length marker) appends EOS to every uncut text; open-unlearning only when missing
            if max_length is not None or not cont_enc or cont_enc[-1] != eos:
                cont_enc.append(eos)
        if not cont_enc:
            raise ValueError(f"empty continuation for context {context[-80:]!r}: nothing to score")
        return ctx_enc, cont_enc

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """HFLM's causal loop (same ordering/batching), returning `LoglikelihoodResult`s."""
        res: list[LoglikelihoodResult] = []

        def _collate(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        def _lookup_one_token_cont(req):
            return req[-2] + req[-1][:-1]

        re_ord = Collator(
            requests,
            sort_fn=_collate,
            group_by="contexts" if self.logits_cache else None,
            group_fn=_lookup_one_token_cont,
        )
        n_reordered = len(re_ord)
        batch_size = (self.batch_size if self.batch_size != "auto"
                      else override_bs if override_bs is not None else 0)
        batch_fn = (self._batch_scheduler
                    if self.batch_size == "auto" and n_reordered > 0 and not override_bs else None)
        if batch_fn is not None:
            self.batch_sizes = {}
        chunks = re_ord.get_batched(n=batch_size, batch_fn=batch_fn)
        pbar = tqdm(total=len(requests), disable=(disable_tqdm or (self.rank != 0)),
                    desc="Running loglikelihood requests")
        for chunk in chunks:
            inps, inplens, cont_toks_list = [], [], []
            padding_len_inp = None
            for request_str, context_enc, continuation_enc in chunk:
                assert len(context_enc) > 0
                assert len(continuation_enc) > 0
                if len(continuation_enc) > self.max_length:   # HFLM asserts this: bad input, said in one line
                    text = request_str[1] if isinstance(request_str, tuple) and len(request_str) > 1 else ""
                    raise InputError(f"a scored continuation is {len(continuation_enc)} tokens, more than the "
                                     f"model's max_length {self.max_length} ({str(text)[:60]!r}...): give a larger "
                                     f"max_length in --model_args, up to the model's context")
                total_length = len(context_enc) + len(continuation_enc)
                if total_length > self.max_length + 1:
                    eval_logger.warning(
                        f"Combined length of context ({len(context_enc)}) and continuation "
                        f"({len(continuation_enc)}) exceeds model's maximum length ({self.max_length}). "
                        f"Truncating {total_length - self.max_length + 1} tokens from the left."
                    )
                inp = torch.tensor((context_enc + continuation_enc)[-(self.max_length + 1):][:-1],
                                   dtype=torch.long, device=self.device)
                (inplen,) = inp.shape
                padding_len_inp = max(padding_len_inp or 0, inplen)
                inps.append(inp)
                cont_toks_list.append(continuation_enc)
                inplens.append(inplen)

            batched_inps = pad_and_concat(padding_len_inp, inps, padding_side="right")
            multi_logits = F.log_softmax(self._model_call(batched_inps), dim=-1, dtype=self.softmax_dtype)

            for (request_str, ctx_tokens, _), logits, inplen, cont_toks in zip(
                chunk, multi_logits, inplens, cont_toks_list, strict=True
            ):
                contlen = len(cont_toks)
                ctx_len = inplen + (logits.shape[0] - padding_len_inp)
                logits = self._select_cont_toks(logits, contlen=contlen, inplen=ctx_len)  # [contlen, V]
                greedy_tokens = logits.argmax(dim=-1)
                for request_str, cont_toks, cached in re_ord.get_cache(
                    req_str=request_str, cxt_toks=ctx_tokens, cont_toks=cont_toks, logits=logits.unsqueeze(0)
                ):
                    n = len(cont_toks)
                    cont = torch.tensor(cont_toks, dtype=torch.long, device=self.device)
                    rows = cached[0, -n:]  # [n, V]
                    token_greedy = (greedy_tokens[-n:] == cont).tolist()
                    is_greedy = all(token_greedy)
                    picked = torch.gather(rows, 1, cont.unsqueeze(-1)).squeeze(-1)
                    token_lp, mu, sigma = token_stats(rows, cont)
                    text = self.tokenizer.decode(cont_toks, skip_special_tokens=True)
                    answer = LoglikelihoodResult(float(picked.sum()), is_greedy, token_lp, mu, sigma, token_greedy,
                                                 text)
                    res.append(answer)
                    if request_str is not None:
                        self.cache_hook.add_partial("loglikelihood", request_str, answer)
                    pbar.update(1)
        pbar.close()
        return re_ord.get_original(res)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[RollingResult]:
        """HFLM's rolling windows, summed the same way, keeping the per-token arrays of every window."""
        adaptive_batch_size = None
        if self.batch_size == "auto":
            adaptive_batch_size = self._detect_batch_size()

        all_windows: list[tuple] = []
        window_counts: list[int] = []
        for (string,) in tqdm([req.args for req in requests], disable=(disable_tqdm or (self.rank != 0))):
            windows = list(map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(token_list=self.tok_encode(string),
                                                   prefix_token=self.prefix_token_id,
                                                   max_seq_len=self.max_length, context_len=1),
            ))
            all_windows.extend((None,) + w for w in windows)
            window_counts.append(len(windows))

        pad_amnt = 0
        if self.world_size > 1:
            mytensor = torch.tensor(len(all_windows), device=self.device)
            gathered = self.all_gather(mytensor).cpu().detach().numpy().tolist()
            pad_amnt = max(gathered) - gathered[self.rank]
            if pad_amnt > 0:
                all_windows += pad_amnt * [all_windows[0]]

        window_results: list[LoglikelihoodResult] = []
        batch_size = adaptive_batch_size or self.batch_size
        for i in range(0, len(all_windows), batch_size):
            batch = all_windows[i:i + batch_size]
            window_results.extend(self._loglikelihood_tokens(batch, disable_tqdm=True, override_bs=len(batch)))
        if pad_amnt > 0:
            window_results = window_results[:-pad_amnt]

        out: list[RollingResult] = []
        pos = 0
        for req, count in zip(requests, window_counts, strict=True):
            parts = window_results[pos:pos + count]
            pos += count
            total = sum(part[0] for part in parts)  # same summation as HFLM
            result = RollingResult(
                total,
                [x for part in parts for x in part.token_logprobs],
                [x for part in parts for x in part.token_mu],
                [x for part in parts for x in part.token_sigma],
            )
            out.append(result)
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, result)
        return out

    # ------------------------------------------------------------ generation
    def resolve_stops(self, until: list[str]) -> list[str]:
        """Stop strings with `UNK_STOP` replaced by the tokenizer's unknown token (dropped when it has none)."""
        unk = self.tokenizer.unk_token
        return [unk if s == UNK_STOP else s for s in until if s != UNK_STOP or unk]

    def resolve_generation_kwargs(self, gen_kwargs: dict) -> dict:
        """`gen_kwargs` with the protocol's stop markers applied: `UNK_STOP` through `resolve_stops`;
        `TOKENIZER_EOS` removed and `eos_token_id` set to the tokenizer's EOS (RWKU's generate call)."""
        until = gen_kwargs.get("until")
        if not isinstance(until, list) or not ({UNK_STOP, TOKENIZER_EOS} & set(until)):
            return gen_kwargs
        out = dict(gen_kwargs)
        if TOKENIZER_EOS in until:
            until = [s for s in until if s != TOKENIZER_EOS]
            out["eos_token_id"] = self.tokenizer.eos_token_id
        out["until"] = self.resolve_stops(until)
        return out

    def dropped_stop_ids(self, stop: list[str]) -> list[int]:
        """The ids of stop strings that are one token the decoding drops (`skip_special_tokens`): lm-eval's cut on
        the decoded text cannot see them. E.g. `<|eot_id|>` where EOS is `<|end_of_text|>`, SmolLM2's unknown token
        (RWKU's newline stop), and the tokenizer's EOS itself (lm-eval adds it to every `until`; `generate` already
        ends there unless the model's generation config names other EOS ids)."""
        key = tuple(stop or ())
        if key not in self._dropped_stop_ids:   # get_vocab() builds the whole vocabulary: once per stop list
            vocab = self.tokenizer.get_vocab()
            ids = [vocab[s] for s in key if s in vocab]
            self._dropped_stop_ids[key] = [i for i in ids if self.tokenizer.decode([i], skip_special_tokens=True) == ""]
        return self._dropped_stop_ids[key]

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        """HFLM's generation, each sequence cut at its first dropped stop id (`dropped_stop_ids`): the rest is
        overwritten with that id, which the decoding then drops. HFLM stops a batch only when every sequence has
        stopped, and a stop the decoding removed would leave the text generated after it; RWKU stops at the id."""
        out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        ids = self.dropped_stop_ids(stop)
        if not ids:
            return out
        generated = out[:, context.shape[1]:]
        after = torch.isin(generated, torch.tensor(ids, device=out.device)).cumsum(dim=1) > 0
        out = out.clone()
        out[:, context.shape[1]:] = generated.masked_fill(after, ids[0])
        return out

    def generate_until(self, requests, disable_tqdm: bool = False):
        """HFLM's generation, generation kwargs through `resolve_generation_kwargs`. The resolved kwargs go to
        copies of the requests: the caller's keep their own arguments, under which lm-eval's `--use_cache` looks
        them up and `--log_samples` records them (as for `--model hf`)."""
        self.check_prompt_format()
        resolved_requests = []
        for req in requests:
            context, gen_kwargs = req.args
            resolved = self.resolve_generation_kwargs(gen_kwargs) if isinstance(gen_kwargs, dict) else gen_kwargs
            resolved_requests.append(req if resolved is gen_kwargs else
                                     dataclasses.replace(req, arguments=(context, resolved)))
        return super().generate_until(resolved_requests, disable_tqdm=disable_tqdm)

    # ------------------------------------------------------------ chat template
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True,
                            close_final_turn: bool = False) -> str:
        """HFLM's template application with the date pinned (explicit `chat_template_args` still win).

        `close_final_turn=True` renders a finished conversation (the last assistant turn with the template's own
        end-of-turn text, neither a generation prompt nor `continue_final_message`): what open-unlearning tokenizes
        as the scored conversation (`src/data/utils.py:61-63`).
        """
        self._chat_rendered = True
        saved = self.chat_template_args
        self.chat_template_args = {**pinned_template_kwargs(), **(saved or {})}
        try:
            with pinned_clock():
                if close_final_turn:
                    def render(history):
                        return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=False,
                                                                  **self.chat_template_args)
                    try:
                        return render(chat_history)
                    except jinja2.exceptions.TemplateError:
                        # as HFLM renders the prompt: a template without a system role (Gemma) drops that turn,
                        # so the scored conversation keeps the prompt's prefix
                        return render([turn for turn in chat_history if turn.get("role") != "system"])
                return super().apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)
        finally:
            self.chat_template_args = saved

    # ------------------------------------------------------------------ cache
    def cache_identity(self) -> dict[str, Any]:
        """What decides this model's results beyond the requests: the base (a local directory by its resolved
        path and its files' names, sizes and mtimes; a Hub id by id and revision), the bundles (`digest`), the
        dtypes, the BOS rule and the context length."""
        if not isinstance(self.pretrained, (str, Path)):
            raise ModelArgumentError("--use_cache needs a base given by path or Hub id (a model object passed in "
                                     "cannot be told from another)")
        path = Path(self.pretrained).expanduser()
        if path.is_dir():
            from cru_harness.fingerprints import directory_stamp

            base = {"path": str(path.resolve()), "files": directory_stamp(path)}
        else:
            base = {"hub": str(self.pretrained), "revision": self.revision}
        if self._whp is not None:   # the pair: the baseline (and alpha) decide the logits too
            from cru_harness.fingerprints import directory_stamp

            baseline = Path(self._whp.baseline).expanduser()
            base = {**base, "whp": {"alpha": self._whp.alpha, "baseline": {"path": str(baseline.resolve()), "files":
                    directory_stamp(baseline)} if baseline.is_dir() else {"hub": self._whp.baseline}}}
        return {"base": base, "routers": [bundle.digest() for bundle in self.bundles],
                "dtype": str(self.model.dtype), "softmax_dtype": str(self.softmax_dtype),
                "add_bos_token": self.add_bos_token, "max_length": self.max_length}

    def set_cache_hook(self, cache_hook) -> None:
        """`--use_cache DB`: lm-eval keys its cache by the requests alone, so a cache another base, bundle set or
        dtype wrote would hand back that model's numbers as this one's. The cache holds the identity of the model
        that wrote it (`cache_identity`), and any other model is refused."""
        db = getattr(cache_hook, "dbdict", None)
        if db is not None:
            mine, theirs = self.cache_identity(), db.get(CACHE_IDENTITY_KEY)
            where = f"--use_cache {getattr(db, 'filename', '')}".rstrip()
            if theirs is None and len(db):
                raise ModelArgumentError(f"{where}: holds results of a model it does not name (written by another "
                                         f"lm-eval model or an older cru-harness); give this model its own cache path")
            if theirs is not None and theirs != mine:
                differ = ", ".join(key for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key))
                raise ModelArgumentError(f"{where}: written by another model (its {differ} differ); lm-eval keys "
                                         f"the cache by the requests alone, so give each base and router set its "
                                         f"own cache path")
            if theirs is None:
                db[CACHE_IDENTITY_KEY] = mine
                db.commit()
        super().set_cache_hook(cache_hook)

    # --------------------------------------------------------------- provenance
    def get_model_info(self) -> dict[str, Any]:
        info = super().get_model_info()
        info["cru_routers"] = list(self.router_sources)
        if self._whp is not None:
            info["cru_whp"] = {"directory": self._whp_dir, "baseline": self._whp.baseline, "alpha": self._whp.alpha}
        # the default; a task's preset may render with its own date (protocol.template_date), recorded in its metadata
        info["cru_pinned_date"] = pinned_template_kwargs()["date_string"]
        return info


def _register() -> None:
    from cru_harness.lmeval.registration import register

    register()


_register()
