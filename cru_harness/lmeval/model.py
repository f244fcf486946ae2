"""The `cru` lm-eval model: a Hugging Face causal LM with CRU router bundles attached, and extended results.

Use::

    lm_eval --model cru --model_args base=<HF id or dir>,routers=<bundle dir>[+<bundle dir>...] --tasks ...

- `base=` is an alias of HFLM's `pretrained=` (lm-eval names the output folder after it, as after `pretrained=`:
  `registration.patch_output_name`); every other HFLM argument passes through unchanged (`dtype`,
  `batch_size` incl. `auto`, `max_batch_size`, `parallelize`/device maps, `trust_remote_code`, `revision`,
  `peft`, `chat_template_args`, ...; use `--device`, not `device=` inside `--model_args`). The class *is*
  lm-eval's `HFLM`, so batching, dtypes, chat templates and `accelerate launch` data parallelism behave as for
  `--model hf`. A model a method saved as more than one checkpoint (WHP's pair, `base=<WHP dir>`) is loaded by
  that method's loader (`cru_harness.api.Method.model_loader`, found by `loaders.model_loader`).
- `routers=` names one or more router bundle directories (`RouterBundle.save_pretrained` output) joined by
  `+`, e.g. `routers=runs/a/routers+runs/b/routers` (gates of several bundles on one coordinate multiply). The
  routers are attached after the model is loaded, each on the device of the block it reads. A directory
  whose own name contains `+` cannot be given this way: pass a list (`routers=[dirA, dirB]`) through the
  Python API. Without `routers` the model is exactly the base model.
- A bundle that does not fit the base (other architecture, hidden size, block count) fails with the bundle's
  own `BundleError`, naming the mismatch. Bundles are read and validated before the base is loaded (`routers`), a
  local base path is checked first (`locations.check_model_path`); in `arguments`: a model argument that is a near
  miss of a known one (`router=`) is refused (`ModelArgumentError`), dtype names, `max_length` and the device go
  through the project's rules (`check_argument_values`, `devices.py`), a boolean (`trust_remote_code`, `parallelize`, ...)
  takes exactly lm-eval's `true`/`false` (`check_boolean_arguments`: `no` would be a true string), an argument
  given empty (`routers=`) is refused (`check_empty_arguments`), and a base that cannot be read (a Hub id while
  offline) is named. These are the project's `UserError`s: the `lm_eval` and `cru-eval` command lines print them
  as one line (`cru_harness.lmeval.errors`).
- `--use_cache DB` holds the identity of the model that wrote it (`cache_identity`: base, bundle digests, dtypes);
  a cache another model wrote is refused (`identity.check_cache`), since lm-eval keys it by the requests alone.

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

from cru_harness.errors import InputError
from cru_harness.protocol import (
    EOS_MARKER,
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

from .arguments import (
    ModelArgumentError,
    check_argument_values,
    check_arguments,
    check_boolean_arguments,
    check_empty_arguments,
)
from .gradnorm import with_model_scores
from .identity import base_identity, check_cache
from .loaders import model_loader
from .reference import ReferenceModel, check_reference_model
from .routers import Routers, parse_router_spec

__all__ = ["CRULM", "EOS_MARKER", "LoglikelihoodResult", "RollingResult"]

eval_logger = logging.getLogger(__name__)


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


class CRULM(HFLM):
    """HFLM + CRU router bundles + extended loglikelihood results. Registered in lm-eval as `cru`.

    Its parts, one job each: `arguments` (the `--model_args` checks), `loaders` (a method's own loader for a
    model that is not one checkpoint), `routers` (the bundles), `reference` (the privacy reference model),
    `gradnorm` (GradNorm scores), `identity` (`--use_cache`). This class wires them into HFLM."""

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
        # A model a method saved as more than one checkpoint (WHP's pair): HFLM loads the loader's checkpoint,
        # `_create_model` lets the loader build the model served
        self.loader = model_loader(pretrained)
        if self.loader is not None:
            if routers is not None:
                raise ModelArgumentError(f"cru model: {pretrained} is a {self.loader.name} model; router bundles "
                                         "attach to one base, so leave routers out")
            pretrained = self.loader.checkpoint
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
        self.routers = Routers(routers)   # read and validated before the base loads: a bad bundle fails at once
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
        self._dropped_stop_ids: dict[tuple, list[int]] = {}   # stop list -> ids (`dropped_stop_ids`)
        self._chat_rendered = False      # whether a prompt went through the chat template (`apply_chat_template`)
        self.reference = None if reference is None else ReferenceModel(reference)   # the reference attack's model
        self.routers.attach(self.model)

    def _create_model(self, pretrained, **kwargs) -> None:
        """HFLM's loading; a method's loader (`self.loader`) then builds the model served from it, loading any other
        checkpoint it needs the same way (dtype, device map, ...)."""
        super()._create_model(pretrained, **kwargs)
        if self.loader is None:
            return

        def load(path):
            super(CRULM, self)._create_model(path, **kwargs)
            return self._model

        first = self._model
        self._model = self.loader.build(first, load)

    def _get_config(self, pretrained, **kwargs) -> None:   # HFLM's own (lm-eval 0.4.13, pinned), narrowed
        try:
            super()._get_config(pretrained, **kwargs)
        except OSError as err:
            # a Hub id that cannot be fetched (offline, no such repo, gated) or an unreadable directory: reported
            # in one line, as `cru-harness unlearn` reports its --base
            raise ModelArgumentError(f"cannot load base model {pretrained!r}: {err}") from None

    # ------------------------------------------------------------------ routers
    @property
    def bundles(self) -> list:
        return self.routers.bundles

    @property
    def router_sources(self) -> list[str]:
        return self.routers.sources

    @property
    def has_routers(self) -> bool:
        return self.routers.attached

    @contextlib.contextmanager
    def without_routers(self):
        """Temporarily score with the base model (e.g. the NLL of answers under the original model)."""
        with self.routers.without():
            yield self

    # ---------------------------------------------------------- loglikelihood
    def check_prompt_format(self) -> None:
        """Warn once when a bundle trained on another prompt format (`Routers.check_prompt_format`). Called when the
        requests come, which lm-eval builds (through `apply_chat_template`) before running any."""
        self.routers.check_prompt_format(self._chat_rendered)

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
            reference = None if self.reference is None else self.reference.load(self.model, self.tokenizer,
                                                                                 self.device)
            results = with_model_scores(self.model, new_reqs, results, gradnorm, max_length=self.max_length,
                                        reference=reference, progress=not disable_tqdm and self.rank == 0)
        return results

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
        """What decides this model's results beyond the requests: the base (`identity.base_identity`, with what its
        loader adds), the bundles (`digest`), the dtypes, the BOS rule and the context length."""
        base = base_identity(self.pretrained, self.revision)
        if self.loader is not None:
            base = {**base, **self.loader.identity()}
        return {"base": base, "routers": [bundle.digest() for bundle in self.bundles],
                "dtype": str(self.model.dtype), "softmax_dtype": str(self.softmax_dtype),
                "add_bos_token": self.add_bos_token, "max_length": self.max_length}

    def set_cache_hook(self, cache_hook) -> None:
        """`--use_cache DB`: the cache holds the identity of the model that wrote it; another model is refused
        (`identity.check_cache`)."""
        db = getattr(cache_hook, "dbdict", None)
        if db is not None:
            check_cache(db, self.cache_identity())
        super().set_cache_hook(cache_hook)

    # --------------------------------------------------------------- provenance
    def get_model_info(self) -> dict[str, Any]:
        info = super().get_model_info()
        info["cru_routers"] = list(self.router_sources)
        if self.loader is not None:
            info.update(self.loader.info())
        # the default; a task's preset may render with its own date (protocol.template_date), recorded in its metadata
        info["cru_pinned_date"] = pinned_template_kwargs()["date_string"]
        return info


def _register() -> None:
    from cru_harness.lmeval.registration import patch_output_name, register

    register()
    patch_output_name()   # the Python API without the start-up hook: `base=` names the output folder too


_register()
