"""Three readings of the CRU paper that it leaves open, as options (`docs/cru_method.md`, "Readings the paper
leaves open"); each default is the reading the project ran first, so default bundles are unchanged.

- `token_scope`: which positions the routers' loss reads and their gates act on. "all" (default): every real
  token. "answer": the *answer scope*, the positions from the last token of the prompt's end marker (the
  template's text between the question and the answer, e.g. `<|im_end|>\\n<|im_start|>assistant\\n`) on: the
  position whose output predicts the answer's first token, the answer's tokens, and what follows them. Found in
  the token ids by the marker's last occurrence, the same way in training and at inference; in a cached
  generation step every new position follows the prompt, so it is in scope. A sequence without the marker has
  no answer scope: it is not gated (and a training row without it is an error).
- `localization_tokens`: which positions the variance of phase 1 pools over. "all" (default): every real token.
  "content": without the template: the tokens every prompt of the format shares before the question (BOS, the
  system turn, the user header), the end marker, the template's tail after the answer, and any special token.
- `block_output`: what "the output of block l" is. "block" (default): decoder block l's output. "hf_hidden_states":
  HF's `output_hidden_states` entry l (1..L): the output of block l-1, and for the last one the *final norm's*
  output. The last k of them are blocks L-k..L-1, as under "block", with the last one read after the final norm;
  `blocks=[...]` then names entries 1..L (stored as blocks 0..L-1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import InputError
from ..training.blocks import FINAL_NORMS, find_decoder_blocks, find_final_norm, run_until_module

TOKEN_SCOPES = ("all", "answer")
LOCALIZATION_TOKENS = ("all", "content")
BLOCK_OUTPUTS = ("block", "hf_hidden_states")


def validate_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


# -- the prompt template: what the format adds around a question and its answer -------------------------------
@dataclass(frozen=True)
class PromptTemplate:
    """Token ids the prompt format puts around every question-answer pair: `prefix` before the question (BOS,
    system turn, user header), `marker` between question and answer (the end of every prompt), `suffix` after
    the answer (the template's end of turn), and the tokenizer's `special` ids."""
    prefix: tuple[int, ...]
    marker: tuple[int, ...]
    suffix: tuple[int, ...]
    special: frozenset[int] = frozenset()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    out = []
    for x, y in zip(a, b):
        if x != y:
            break
        out.append(x)
    return out


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return _common_prefix(a[::-1], b[::-1])[::-1]


def prompt_template(tokenizer, **fmt) -> PromptTemplate:
    """The template of the prompt format `fmt` (`prompts.qa_texts`'s chat / preset / family / benchmark), read
    off two made-up question-answer pairs that share no character at their ends: what their token ids share."""
    from ..prompts import encode_text, qa_texts

    pairs = [("Xq", "Ka"), ("Yz?", "Wb!")]
    written = [qa_texts(tokenizer, question, answer, **fmt) for question, answer in pairs]
    prompts = [encode_text(tokenizer, w.prompt) for w in written]
    texts = [encode_text(tokenizer, w.text) for w in written]
    marker = _common_suffix(*prompts)
    if not marker:
        raise InputError("the prompt format has no text between question and answer: an answer scope cannot be "
                         "found (token_scope=answer needs a chat template or a question format)")
    prefix = _common_prefix(*prompts)
    suffix = _common_suffix(*texts)
    return PromptTemplate(tuple(prefix), tuple(marker), tuple(suffix),
                          frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []) or []))


def _last_occurrence(ids: Sequence[int], marker: Sequence[int]) -> int:
    """Start of the last occurrence of `marker` in `ids`, or -1."""
    n = len(marker)
    for start in range(len(ids) - n, -1, -1):
        if list(ids[start:start + n]) == list(marker):
            return start
    return -1


def scope_start(ids: Sequence[int], marker: Sequence[int]) -> int | None:
    """The first position of the answer scope (the marker's last token), or None without the marker."""
    start = _last_occurrence(ids, marker)
    return None if start < 0 else start + len(marker) - 1


def scope_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, marker: Sequence[int], *,
               require: bool = False) -> torch.Tensor:
    """(B, T) float mask of the answer scope of each row (real positions only). `require`: a row without the
    marker is an error (training rows), else it gets no position."""
    mask = torch.zeros(input_ids.shape, dtype=torch.float32)
    rows = input_ids.tolist()
    real = attention_mask.tolist() if attention_mask is not None else [[1] * len(r) for r in rows]
    for row, (ids, keep) in enumerate(zip(rows, real)):
        start = scope_start(ids, marker)
        if start is None:
            if require:
                raise InputError(f"row {row} of a batch has no answer: the prompt's end marker {list(marker)} is not "
                                 "in its tokens (token_scope=answer needs question-answer rows in the training format)")
            continue
        mask[row, start:] = torch.tensor(keep[start:], dtype=torch.float32)
    return mask.to(input_ids.device)


def content_mask(token_lists: Sequence[Sequence[int]], template: PromptTemplate, width: int) -> torch.Tensor:
    """(B, width) float mask of the content positions of each row: without the template's prefix, its last
    marker, its suffix and special tokens; padding is 0. The prefix (suffix) removed is the part of the template's
    that the row's first (last) tokens match: a question's first characters may merge with the template's last
    ones into one token, which is then content."""
    mask = torch.zeros(len(token_lists), width, dtype=torch.float32)
    for row, ids in enumerate(token_lists):
        ids = list(ids)
        keep = [1.0 if token not in template.special else 0.0 for token in ids]
        n = len(_common_prefix(ids, template.prefix))
        keep[:n] = [0.0] * n
        start = _last_occurrence(ids, template.marker)
        if start >= 0:
            keep[start:start + len(template.marker)] = [0.0] * len(template.marker)
        n = len(_common_suffix(ids, template.suffix))
        keep[len(ids) - n:] = [0.0] * n
        if not any(keep):
            raise InputError(f"row {row} has no content token (all {len(ids)} are template or special tokens): "
                             "localization_tokens=content has nothing to pool")
        mask[row, :len(ids)] = torch.tensor(keep)
    return mask


# -- block_output: where the output of block l is read --------------------------------------------------------
def final_norm(model: nn.Module) -> nn.Module:
    """The norm applied before the output head."""
    if (norm := find_final_norm(model)) is not None:
        return norm
    raise InputError(f"block_output=hf_hidden_states: no final norm found in {type(model).__name__} "
                     f"(looked for {', '.join(FINAL_NORMS)})")


def site_module(model: nn.Module, index: int, block_output: str = "block") -> nn.Module:
    """The module whose output is "the output of block `index`": the decoder block, or under "hf_hidden_states"
    for the last block the final norm (HF's last `hidden_states` entry)."""
    _, blocks = find_decoder_blocks(model)
    if block_output == "hf_hidden_states" and index == len(blocks) - 1:
        return final_norm(model)
    return blocks[index]


def hf_entries_to_blocks(entries: Sequence[int] | None, n_layers: int) -> list[int] | None:
    """`blocks=[...]` under "hf_hidden_states" names `hidden_states` entries 1..L: entry l is block l-1's site."""
    if entries is None:
        return None
    out = []
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, int) or not 1 <= entry <= n_layers:
            raise InputError(f"block_output=hf_hidden_states: blocks names hidden_states entries 1..{n_layers} "
                             f"(entry 0 is the embeddings, which no router gates), got {entry!r}")
        out.append(entry - 1)
    return out


def run_until_site(model: nn.Module, last_index: int, block_output: str = "block", **model_inputs) -> None:
    """`run_until_module` up to the site of block `last_index`."""
    run_until_module(model, site_module(model, last_index, block_output), **model_inputs)
