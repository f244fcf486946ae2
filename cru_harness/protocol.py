"""The data contract between the `cru` lm-eval model and the project's task YAMLs.

Importable without torch or lm-eval (task `process_results` functions import it), so it holds only plain Python:

- `EOS_MARKER`: a `loglikelihood` continuation that ends with it is scored with the tokenizer's EOS token appended
  (the marker text itself is never tokenized). TOFU's answer probability counts EOS as part of the answer.
- `LoglikelihoodResult` / `RollingResult`: what `cru` returns for `loglikelihood` / `loglikelihood_rolling`.
  They *are* the plain values `--model hf` returns (a `(logprob_sum, is_greedy)` tuple and a float), so every
  built-in metric keeps working, and they carry the per-token arrays Min-K%, Min-K%++ and per-token
  normalisation need. `has_token_stats(x)` tells a task which kind it got.
- `JOINT_MARKER`: a `loglikelihood` continuation that starts with it is encoded the way the references do it
  (open-unlearning `src/data/utils.py:61-124`, TOFU `data_module.py:13-30`, RWKU `eval_mia.py:21-42`): the whole
  text `context + continuation` is tokenized once and the scored tokens are the ones after the first
  `len(tokenize(context))` positions; no whitespace is moved across the boundary (lm-eval's `_encode_pair` moves
  the context's trailing whitespace into the continuation). With an empty context the first token of the text is
  the context and every later token is scored (RWKU's MIA alignment).
- `max_length_marker(n)`: right after `JOINT_MARKER`, "cut the whole text at its first n tokens, as TOFU's dataset
  does" (locuslab/tofu `data_module.py:15-27`: `truncation=True, max_length=n`; a text that reaches n tokens gets no
  EOS, a shorter one always gets one). The legacy TOFU preset sends it with n = 200.
- `MIA_MARKER`: before everything else in a continuation, "also return the membership scores that need the model
  itself": GradNorm (open-unlearning `mia/gradnorm.py`: one backward pass of the mean scored-token loss without
  the EOS prediction, the mean over parameters of the gradient's p-norm) in `LoglikelihoodResult.gradnorm`, and,
  when the `cru` model was given `reference=<model>`, that model's mean loss on the same scored tokens
  (`mia/reference.py`) in `LoglikelihoodResult.reference_loss`; `split_mia_marker(...)` reads the marker.
- `UNK_STOP`: a stop string standing for the tokenizer's unknown token (RWKU's `convert_tokens_to_ids("\n")`
  resolves to it on byte-level and SentencePiece vocabularies, so RWKU stops there).
- Chat-template date pinning: `PINNED_DATE`, `template_date(...)` (a task's protocol may pin another date while
  it renders its prompts), `pinned_template_kwargs()` and `pinned_clock()` (the clock templates read).
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import math
import re
from collections.abc import Sequence

__all__ = [
    "EOS_MARKER",
    "MIA_MARKER",
    "split_mia_marker",
    "JOINT_MARKER",
    "UNK_STOP",
    "TOKENIZER_EOS",
    "ROUTER_SEPARATOR",
    "SYSTEM_PROMPT",
    "PINNED_DATE",
    "pinned_template_kwargs",
    "current_pinned_date",
    "template_date",
    "split_joint_marker",
    "pinned_clock",
    "LoglikelihoodResult",
    "RollingResult",
    "has_token_stats",
    "split_eos_marker",
    "max_length_marker",
    "split_max_length_marker",
]

#: Appended to a loglikelihood continuation: "score these tokens followed by the tokenizer's EOS token" (unless the
#: scored tokens already end with it: open-unlearning `src/data/utils.py:113-114` appends EOS only when missing).
EOS_MARKER = "<|cru_eos|>"

#: Prepended to a loglikelihood continuation: "encode context + continuation as one text, score what follows the
#: context's own token count" (the references' span rule; see the module docstring).
JOINT_MARKER = "<|cru_joint|>"

#: Prepended (before JOINT_MARKER) to a loglikelihood continuation: "return this text's model-side membership
#: scores too" (GradNorm; the reference model's loss when one is given).
MIA_MARKER = "<|cru_mia|>"

_MAX_LENGTH_MARKER = re.compile(r"<\|cru_max_length=(\d+)\|>")

#: A generation stop string the `cru` model replaces with its tokenizer's unknown token (dropped if it has none).
UNK_STOP = "<|cru_unk|>"

#: A generation stop string telling the `cru` model to end generation at the tokenizer's EOS id only, not at the
#: other EOS ids a model's generation_config may list (RWKU passes `eos_token_id=tokenizer.eos_token_id` to
#: `generate`, inference.py:44-49; Phi-3's config also lists <|end|>). Removed before generation.
TOKENIZER_EOS = "<|cru_tokenizer_eos|>"

#: Separates several router bundle directories in `--model_args routers=dirA+dirB`.
ROUTER_SEPARATOR = "+"

#: The protocol's system prompt for chat-template models (pass it with lm-eval's `--system_instruction`).
SYSTEM_PROMPT = "You are a helpful assistant."

#: Any date a chat template injects (Llama-3.x `date_string`, `strftime_now(...)`) is this one, so prompts and
#: scores do not change with the calendar. (26 Jul 2024 is Llama 3.1's own fallback date.)
PINNED_DATE = _dt.datetime(2024, 7, 26)


_TEMPLATE_DATE: contextvars.ContextVar[_dt.datetime | None] = contextvars.ContextVar("cru_template_date",
                                                                                     default=None)


def current_pinned_date() -> _dt.datetime:
    """The date chat templates see now: the one a task set with `template_date`, else `PINNED_DATE`."""
    return _TEMPLATE_DATE.get() or PINNED_DATE


@contextlib.contextmanager
def template_date(date: _dt.datetime | None):
    """While active, the `cru` model renders chat templates with `date` (None: keep the current one).

    Tasks use it around their prompt rendering because the date is part of a benchmark's protocol
    (open-unlearning pins 10 Apr 2025 for Llama 3.x, RWKU's code passes none, i.e. 26 Jul 2024 for Llama 3.1).
    """
    token = _TEMPLATE_DATE.set(date) if date is not None else None
    try:
        yield
    finally:
        if token is not None:
            _TEMPLATE_DATE.reset(token)


def pinned_template_kwargs() -> dict:
    """Template variables that pin the date: `date_string` (read by Llama 3.x templates instead of the clock).

    Templates that call transformers' `strftime_now(...)` global directly are pinned by the `cru` model
    patching the clock that global reads while it renders (`pinned_clock`): transformers >= 5 turns
    callables passed as template variables into inert placeholders, so `strftime_now` cannot be passed here.
    """
    return {"date_string": current_pinned_date().strftime("%d %b %Y")}


@contextlib.contextmanager
def pinned_clock():
    """While rendering, transformers' `strftime_now` template global reads the pinned date instead of the clock.

    transformers (4.4x and 5.x) defines `strftime_now(fmt)` as `datetime.now().strftime(fmt)` with `datetime`
    imported into `transformers.utils.chat_template_utils`; that name is swapped for a subclass whose `now()`
    is pinned, and restored afterwards. If a transformers release renders dates differently, the date-pinning
    test fails (rather than this silently doing nothing): see tests/test_lmeval_model.py.
    """
    import transformers.utils.chat_template_utils as ctu  # lazy: this module stays importable without it

    original = getattr(ctu, "datetime", None)
    if not (isinstance(original, type) and issubclass(original, _dt.datetime)):
        raise RuntimeError(
            "cannot pin the chat-template date: transformers.utils.chat_template_utils.datetime is "
            f"{original!r}, not the datetime class this transformers version was expected to use"
        )

    pinned = current_pinned_date()

    class _PinnedDatetime(original):
        @classmethod
        def now(cls, tz=None):
            return pinned if tz is None else pinned.replace(tzinfo=tz)

    ctu.datetime = _PinnedDatetime
    try:
        yield
    finally:
        ctu.datetime = original


def split_eos_marker(continuation: str) -> tuple[str, bool]:
    """`(text without the marker, whether the marker was there)`. The marker counts only at the very end."""
    if continuation.endswith(EOS_MARKER):
        return continuation[: -len(EOS_MARKER)], True
    return continuation, False


def split_joint_marker(continuation: str) -> tuple[str, bool]:
    """`(text without the marker, whether the marker was there)`. The marker counts only at the very start."""
    if continuation.startswith(JOINT_MARKER):
        return continuation[len(JOINT_MARKER):], True
    return continuation, False


def split_mia_marker(continuation: str) -> tuple[str, bool]:
    """`(text without the marker, whether the marker was there)`. The marker counts only at the very start."""
    if continuation.startswith(MIA_MARKER):
        return continuation[len(MIA_MARKER):], True
    return continuation, False


def max_length_marker(max_length: int) -> str:
    """The marker that cuts a joint text at `max_length` tokens, TOFU's way (see the module docstring)."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    return f"<|cru_max_length={max_length}|>"


def split_max_length_marker(text: str) -> tuple[str, int | None]:
    """`(text without the marker, its max_length or None)`. The marker counts only at the very start."""
    match = _MAX_LENGTH_MARKER.match(text)
    if match is None:
        return text, None
    return text[match.end():], int(match.group(1))


def _floats(values) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


class _TokenStats:
    """Per-token arrays shared by both result types (mixin; values are tuples of floats, one per scored token).

    - `token_logprobs[i]`: log p(token_i | prefix) under the model.
    - `token_mu[i]` = Σ_v p(v) log p(v), `token_sigma[i]` = sqrt(Σ_v p(v) (log p(v))² − mu²): mean and standard
      deviation of log p(v) under the model's next-token distribution at that position (Min-K%++).
    """

    token_logprobs: tuple[float, ...]
    token_mu: tuple[float, ...]
    token_sigma: tuple[float, ...]

    def _set_stats(self, token_logprobs, token_mu, token_sigma) -> None:
        lp, mu, sd = _floats(token_logprobs), _floats(token_mu), _floats(token_sigma)
        if not (len(lp) == len(mu) == len(sd)):
            raise ValueError(
                f"token arrays differ in length: logprobs {len(lp)}, mu {len(mu)}, sigma {len(sd)}"
            )
        self.__dict__.update(token_logprobs=lp, token_mu=mu, token_sigma=sd)

    @property
    def n_tokens(self) -> int:
        """Number of scored tokens (including an appended EOS)."""
        return len(self.token_logprobs)

    @property
    def mean_logprob(self) -> float:
        """Mean token log-prob (the negative of TOFU's / RWKU's avg NLL); NaN for zero tokens."""
        return math.fsum(self.token_logprobs) / self.n_tokens if self.n_tokens else float("nan")

    def min_k_plus_plus_scores(self) -> tuple[float, ...]:
        """Per-token `(log p − mu) / sigma` (Min-K%++ before taking the lowest k%)."""
        return tuple((lp - m) / s if s > 0 else 0.0
                     for lp, m, s in zip(self.token_logprobs, self.token_mu, self.token_sigma))


class LoglikelihoodResult(_TokenStats, tuple):
    """`(logprob_sum, is_greedy)`, exactly what HFLM returns, plus the per-token arrays of `_TokenStats`, and:

    - `token_greedy[i]`: whether token i is the model's argmax given the true prefix (teacher forcing; exact
      memorization and extraction strength); `is_greedy` is their conjunction. Empty when not recorded.
    - `text`: the scored tokens decoded without special tokens (open-unlearning's ZLib text); None when not
      recorded.
    - `gradnorm`: the text's GradNorm score when the request carried `MIA_MARKER`, else None.
    - `reference_loss`: a reference model's mean loss on the same scored tokens (EOS included) when the request
      carried `MIA_MARKER` and the `cru` model has a reference model, else None.
    """

    def __new__(cls, logprob_sum: float, is_greedy: bool, token_logprobs: Sequence[float] = (),
                token_mu: Sequence[float] = (), token_sigma: Sequence[float] = (),
                token_greedy: Sequence[bool] = (), text: str | None = None, gradnorm: float | None = None,
                reference_loss: float | None = None):
        self = tuple.__new__(cls, (float(logprob_sum), bool(is_greedy)))
        self._set_stats(token_logprobs, token_mu, token_sigma)
        greedy = tuple(bool(g) for g in token_greedy)
        if greedy and len(greedy) != len(self.token_logprobs):
            raise ValueError(f"token_greedy has {len(greedy)} flags for {len(self.token_logprobs)} tokens")
        self.__dict__.update(token_greedy=greedy, text=text, gradnorm=None if gradnorm is None else float(gradnorm),
                             reference_loss=None if reference_loss is None else float(reference_loss))
        return self

    @property
    def logprob(self) -> float:
        return self[0]

    @property
    def is_greedy(self) -> bool:
        return self[1]

    def __reduce__(self):  # pickling (CachingLM's sqlite cache, accelerate's gather_object)
        return (type(self), (self[0], self[1], self.token_logprobs, self.token_mu, self.token_sigma,
                             self.token_greedy, self.text, self.gradnorm, self.reference_loss))

    def __repr__(self) -> str:
        return f"LoglikelihoodResult({self[0]!r}, {self[1]!r}, n_tokens={self.n_tokens})"


class RollingResult(_TokenStats, float):
    """The summed log-prob of a whole text (what HFLM's `loglikelihood_rolling` returns) plus the token arrays."""

    def __new__(cls, logprob_sum: float, token_logprobs: Sequence[float] = (), token_mu: Sequence[float] = (),
                token_sigma: Sequence[float] = ()):
        self = float.__new__(cls, logprob_sum)
        self._set_stats(token_logprobs, token_mu, token_sigma)
        return self

    def __reduce__(self):
        return (type(self), (float(self), self.token_logprobs, self.token_mu, self.token_sigma))

    def __repr__(self) -> str:
        return f"RollingResult({float(self)!r}, n_tokens={self.n_tokens})"


def has_token_stats(result) -> bool:
    """True for the `cru` model's extended results, False for the plain tuple / float of `--model hf`."""
    return isinstance(result, _TokenStats)
