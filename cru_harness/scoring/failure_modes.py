"""How a model fails on forget inputs (protocol.md, "How a model fails on forget inputs"); TOFU and RWKU.

For every generated answer to a forget (or neighbour) probe: its fluency (RWKU's weighted 2/3-gram entropy),
its mean token NLL under the *original* model (one extra pass over the logged answers after the run; for CRU
the same base model with its routers detached), and a class `correct` / `refusal` / `degenerate` / `wrong`
(`cru_harness.metrics.classify_answer`). `summarise` gives the class fractions of a task.

Records are plain dicts with `generation` (the answer), `answer` (the reference), `prompt` (the exact context
the model saw, from lm-eval's logged `arguments`) and optionally `rouge_l_recall` (the benchmark's own score;
computed with the TOFU scorer when absent - pass `scorer=metrics.rouge_l_recall_rwku` for RWKU).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cru_harness import metrics as M

from ..errors import InputError
from ..prompts import encode_text


class AnswerNLLScorer:
    """Mean token NLL of answers given their prompts under one causal LM (the original model)."""

    def __init__(self, model, tokenizer=None, *, device: str = "cpu", batch_size: int = 8, device_map=None,
                 dtype: str = "float32", trust_remote_code: bool = False):
        from ..devices import input_device, is_sharded, load_causal_lm, resolve_device

        if isinstance(model, (str, Path)):
            model, loaded = load_causal_lm(str(model), device=device, device_map=device_map, dtype=dtype,
                                           load_tokenizer=tokenizer is None, trust_remote_code=trust_remote_code)
            tokenizer = tokenizer or loaded
        elif not is_sharded(model):  # a sharded model stays where its device_map put it
            model = model.to(resolve_device(device))
        if tokenizer is None:
            raise ValueError("AnswerNLLScorer: pass the tokenizer with a model object")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = input_device(self.model)  # under a device_map: the first shard's device
        self.batch_size = max(1, int(batch_size))

    def _encode(self, prompt: str, answer: str) -> tuple[list[int], int]:
        # As lm-eval does: context and continuation are encoded separately and concatenated, so the answer's
        # tokens are exactly those of the answer text.
        context = encode_text(self.tokenizer, prompt)   # a logged chat prompt carries its own BOS
        continuation = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        return context + continuation, len(continuation)

    def __call__(self, prompts: Sequence[str], answers: Sequence[str]) -> list[float]:
        """One NLL per (prompt, answer); NaN for an empty answer (no tokens to score)."""
        import torch

        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts for {len(answers)} answers")
        results = [math.nan] * len(answers)
        todo = []
        for i, (prompt, answer) in enumerate(zip(prompts, answers)):
            if prompt is None:
                raise InputError(f"record {i} has no prompt: the NLL under the original model needs it")
            if answer and answer.strip():
                ids, n_answer = self._encode(prompt, answer)
                if n_answer:
                    todo.append((i, ids, n_answer))
        max_len = getattr(self.model.config, "max_position_embeddings", None)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start:start + self.batch_size]
            if max_len:  # keep the answer; cut the prompt from the left
                batch = [(i, ids[-max_len:], min(n, max_len - 1)) for i, ids, n in batch]
            width = max(len(ids) for _, ids, _ in batch)
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (_, ids, _) in enumerate(batch):  # right padding: real tokens are never masked
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=input_ids.to(self.device),
                                    attention_mask=attention.to(self.device)).logits.float()
            logprobs = torch.log_softmax(logits, dim=-1)
            for row, (i, ids, n_answer) in enumerate(batch):
                positions = torch.arange(len(ids) - n_answer, len(ids), device=logprobs.device)
                targets = torch.tensor(ids[len(ids) - n_answer:], device=logprobs.device)
                token_lp = logprobs[row, positions - 1, targets]
                results[i] = float(-token_lp.mean())
        return results


def annotate(
    records: list[dict],
    *,
    nll_scorer: Callable[[Sequence[str], Sequence[str]], list[float]] | None = None,
    refusal_phrases: Iterable[str] = M.DEFAULT_REFUSAL_PHRASES,
    scorer: Callable[[str, str], float] = M.rouge_l_recall_tofu,
) -> list[dict]:
    """Add `fluency`, `nll_original` (None without a scorer) and `answer_class` to each record, in place."""
    refusal_phrases = tuple(refusal_phrases)
    nlls: list[float | None] = [None] * len(records)
    if nll_scorer is not None and records:
        nlls = list(nll_scorer([r.get("prompt") for r in records], [r["generation"] for r in records]))
    for record, nll in zip(records, nlls):
        answer = record["generation"]
        rouge = record.get("rouge_l_recall")
        if rouge is None or (isinstance(rouge, float) and math.isnan(rouge)):
            rouge = scorer(answer, record["answer"])
        record["fluency"] = float(M.fluency_entropy(answer)) if answer.strip() else 0.0
        record["nll_original"] = None if nll is None or math.isnan(nll) else float(nll)
        record["answer_class"] = M.classify_answer(
            answer, record.get("answer"), rouge_recall=float(rouge), nll_under_original=record["nll_original"],
            refusal_phrases=refusal_phrases,
        )
    return records


def summarise(records: Sequence[dict]) -> dict:
    """Class fractions, mean fluency and mean NLL under the original model of annotated records."""
    if not records:
        return {"n_items": 0, "fractions": None, "mean_fluency": None, "mean_nll_original": None}
    nlls = [r["nll_original"] for r in records if r.get("nll_original") is not None]
    return {
        "n_items": len(records),
        "fractions": M.class_fractions([r["answer_class"] for r in records]),
        "mean_fluency": float(sum(r["fluency"] for r in records) / len(records)),
        "mean_nll_original": float(sum(nlls) / len(nlls)) if nlls else None,
    }
