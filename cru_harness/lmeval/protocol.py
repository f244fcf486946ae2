"""The data contract between the `cru` lm-eval model and the project's task YAMLs.

Importable without torch or lm-eval (task `process_results` functions import it), so it holds only plain Python:

- `EOS_MARKER`: a `loglikelihood` continuation that ends with it is scored with the tokenizer's EOS token appended
  (the marker text itself is never tokenized). TOFU's answer probability counts EOS as part of the answer.
- `LoglikelihoodResult` / `RollingResult`: what `cru` returns for `loglikelihood` / `loglikelihood_rolling`.
  They *are* the plain values `--model hf` returns (a `(logprob_sum, is_greedy)` tuple and a float), so every
  built-in metric keeps working, and they carry the per-token arrays Min-K%, Min-K%++ and per-token
  normalisation need. `has_token_stats(x)` tells a task which kind it got.
- Chat-template date pinning: `PINNED_DATE`, `pinned_template_kwargs()` (the clock part lives in `model.pinned_clock`).
"""
from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Sequence

__all__ = [
    "EOS_MARKER",
    "ROUTER_SEPARATOR",
    "SYSTEM_PROMPT",
    "PINNED_DATE",
    "pinned_template_kwargs",
    "LoglikelihoodResult",
    "RollingResult",
    "has_token_stats",
    "split_eos_marker",
]

#: Appended to a loglikelihood continuation: "score these tokens followed by the tokenizer's EOS token".
EOS_MARKER = "<|cru_eos|>"

#: Separates several router bundle directories in `--model_args routers=dirA+dirB`.
ROUTER_SEPARATOR = "+"

#: The protocol's system prompt for chat-template models (pass it with lm-eval's `--system_instruction`).
SYSTEM_PROMPT = "You are a helpful assistant."

#: Any date a chat template injects (Llama-3.x `date_string`, `strftime_now(...)`) is this one, so prompts and
#: scores do not change with the calendar. (26 Jul 2024 is Llama 3.1's own fallback date.)
PINNED_DATE = _dt.datetime(2024, 7, 26)


def pinned_template_kwargs() -> dict:
    """Template variables that pin the date: `date_string` (read by Llama 3.x templates instead of the clock).

    Templates that call transformers' `strftime_now(...)` global directly are pinned by the `cru` model
    patching the clock that global reads while it renders (`model.pinned_clock`): transformers >= 5 turns
    callables passed as template variables into inert placeholders, so `strftime_now` cannot be passed here.
    """
    return {"date_string": PINNED_DATE.strftime("%d %b %Y")}


def split_eos_marker(continuation: str) -> tuple[str, bool]:
    """`(text without the marker, whether the marker was there)`. The marker counts only at the very end."""
    if continuation.endswith(EOS_MARKER):
        return continuation[: -len(EOS_MARKER)], True
    return continuation, False


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
    """`(logprob_sum, is_greedy)`, exactly what HFLM returns, plus the per-token arrays of `_TokenStats`."""

    def __new__(cls, logprob_sum: float, is_greedy: bool, token_logprobs: Sequence[float] = (),
                token_mu: Sequence[float] = (), token_sigma: Sequence[float] = ()):
        self = tuple.__new__(cls, (float(logprob_sum), bool(is_greedy)))
        self._set_stats(token_logprobs, token_mu, token_sigma)
        return self

    @property
    def logprob(self) -> float:
        return self[0]

    @property
    def is_greedy(self) -> bool:
        return self[1]

    def __reduce__(self):  # pickling (CachingLM's sqlite cache, accelerate's gather_object)
        return (type(self), (self[0], self[1], self.token_logprobs, self.token_mu, self.token_sigma))

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
