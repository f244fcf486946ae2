"""QA batching for the baselines: prompt tokens masked, answer tokens + EOS as labels, padding masked.

A row is either TOFU-style `{"question": q, "answer": a}` or RWKU-style `{"text": t}`; a text row is a QA
row with an empty question, i.e. the whole text is the "answer" and every token is trained on.

Prompts and the trained span come from the one prompt builder, `cru_harness.prompts.qa_texts` (the same text the
TOFU tasks score): under the default `open-unlearning` preset a tokenizer with a chat template gets it (system
prompt "You are a helpful assistant.", date pinned) and the labels are the conversation's tokens after the prompt
(the answer, the template's end of turn, EOS); otherwise `Question: {q}\\nAnswer:` and the answer after one space.
With `benchmark="rwku"`, a question row is written as the RWKU probe of its file asks it (`data.corpora.row_prompt`).
Masks are built from sequence lengths, never from token ids, so a pad token equal to EOS can never mask the EOS
label (or any real token).
"""
from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from cru_harness.data.corpora import row_prompt, row_qa
from cru_harness.prompts import DEFAULT_TOFU_PRESET, encode_qa_ids, qa_texts

from ..errors import InputError
from ..training.objective import IGNORE_INDEX


@dataclass(frozen=True)
class EncodedExample:
    """One tokenised example: `labels` is -100 on prompt tokens and a copy of `input_ids` elsewhere."""

    input_ids: list[int]
    labels: list[int]

    @property
    def n_answer_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE_INDEX)


def row_to_qa(row: dict, index: int | None = None, origin: str = "training data") -> tuple[str, str]:
    """(question, answer) of a row; a `text` row becomes ("", text). Checked by `data.corpora.row_qa` (null or
    empty fields are errors naming the row)."""
    return row_qa(row, 0 if index is None else index, origin)


def _benchmark(name: str | None) -> dict:
    """`qa_texts`'s `benchmark` keyword when one is named (None: the prompt builder's default, TOFU's format)."""
    return {} if name is None else {"benchmark": name}


def build_prompt(tokenizer, question: str, *, preset: str = DEFAULT_TOFU_PRESET, family: str | None = None,
                 chat: bool | None = None, benchmark: str | None = None, probe: str | None = None,
                 aa_type: str = "") -> str:
    """The prompt text in front of the answer ("" for a text row, which is trained on raw). `chat`: use the chat
    template (None: when the tokenizer has one); pass what the evaluation uses. The rest: as `prompts.qa_texts`."""
    if question == "":
        return ""
    return qa_texts(tokenizer, question, "", preset=preset, family=family, chat=chat, probe=probe, aa_type=aa_type,
                    **_benchmark(benchmark)).prompt


def encode_qa(tokenizer, question: str, answer: str, max_length: int = 512, *, preset: str = DEFAULT_TOFU_PRESET,
              family: str | None = None, chat: bool | None = None, benchmark: str | None = None, probe: str | None = None,
              aa_type: str = "") -> EncodedExample:
    """Input ids and labels of one row: the whole text tokenized once, prompt positions masked, EOS appended.

    A QA row follows `cru_harness.prompts.encode_qa_ids` (the references' span rule: labels are the text's tokens
    after the prompt's token count). A text row (empty question) is the tokenizer's special prefix (masked)
    and the raw text + EOS, every text token a label. Longer than `max_length`: the answer is truncated (and
    then has no EOS, since the text did not end there); a prompt that leaves no room for an answer token is an
    error.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InputError("the tokenizer has no EOS token; the baselines train on answer + EOS")
    if question == "":
        prefix = list(tokenizer("")["input_ids"])  # the tokenizer's own special prefix (e.g. BOS), not a label
        while prefix and prefix[-1] == eos:  # some tokenizers append EOS themselves
            prefix.pop()
        ids = prefix + list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [eos]
        n_prompt = len(prefix)
    else:
        texts = qa_texts(tokenizer, question, answer, preset=preset, family=family, chat=chat, probe=probe,
                         aa_type=aa_type, **_benchmark(benchmark))
        ids, n_prompt = encode_qa_ids(tokenizer, texts)
    if n_prompt >= max_length:
        raise InputError(f"prompt of {n_prompt} tokens leaves no room for the answer (max_length={max_length})")
    ids = ids[:max_length]
    # With no prompt at all the first token has no context and cannot be predicted; it is still a label
    # (shifted away by the loss), which is the usual language-modelling convention.
    return EncodedExample(input_ids=ids, labels=[IGNORE_INDEX] * n_prompt + ids[n_prompt:])


def encode_row(tokenizer, row: dict, index: int, origin: str, max_length: int = 512, **fmt) -> EncodedExample:
    """One training row as `encode_qa` writes it, with the prompt arguments the row carries
    (`data.corpora.row_prompt`: an RWKU probe file's rows are asked as their probe asks them)."""
    return encode_qa(tokenizer, *row_to_qa(row, index, origin), max_length, **fmt, **row_prompt(row))


def training_benchmark(name: str | None):
    """The registered benchmark named `name` (the prompt format's `benchmark`), or None for a name none has."""
    from .. import plugins

    return plugins.benchmarks.get(name) if name in plugins.benchmarks.names() else None


def builds_own_examples(name: str | None) -> bool:
    """Whether the benchmark named `name` overrides `api.Benchmark.training_examples` (MUSE: its blocks), so that its
    training examples are known only once its corpora are tokenized."""
    from ..api import Benchmark

    plugin = training_benchmark(name)
    return plugin is not None and type(plugin).training_examples is not Benchmark.training_examples


def _own_example(example, index: int, side: str, max_length: int) -> EncodedExample:
    """One of a benchmark's own examples (`api.Benchmark.training_examples`): token ids, or input_ids + labels."""
    if isinstance(example, dict):
        ids, labels = list(example["input_ids"]), list(example["labels"])
    else:
        ids = list(example)
        labels = list(ids)
    if not ids or len(labels) != len(ids) or len(ids) > max_length:   # the benchmark's bug, not the user's
        raise ValueError(f"{side} example {index}: {len(ids)} input ids and {len(labels)} labels (max_length "
                         f"{max_length})")
    return EncodedExample(input_ids=ids, labels=labels)


def own_examples(plugin, tokenizer, rows: Sequence[dict], side: str, max_length: int) -> list[EncodedExample] | None:
    """The examples the benchmark `plugin` builds itself for a corpus (`api.Benchmark.training_examples`: MUSE's
    blocks of its joined text), or None: one per row."""
    own = plugin.training_examples(tokenizer, list(rows), side, max_length) if plugin is not None else None
    if own is None:
        return None
    if not own:
        raise InputError(f"{plugin.name} built no {side} examples from {len(rows)} rows")
    return [_own_example(e, i, side, max_length) for i, e in enumerate(own)]


def encode_rows(tokenizer, rows: Sequence[dict], side: str, max_length: int = 512, *, benchmark: str | None = None,
                **fmt) -> list[EncodedExample]:
    """A corpus's training examples: the benchmark's own when it builds them (`own_examples`), else one per row
    (`encode_row`; no `benchmark`: the prompt builder's default)."""
    own = own_examples(training_benchmark(benchmark), tokenizer, rows, side, max_length)
    if own is not None:
        return own
    named = {"benchmark": benchmark} if benchmark is not None else {}
    return [encode_row(tokenizer, r, i, side, max_length, **named, **fmt) for i, r in enumerate(rows)]


def collate(examples: Sequence[EncodedExample], pad_token_id: int | None) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example. Padding: attention 0, label -100, decided by length only."""
    if not examples:
        raise ValueError("cannot collate an empty batch")
    pad = 0 if pad_token_id is None else pad_token_id
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        attention[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def row_alternate(row: dict, index: int) -> str | None:
    """A forget row's own preferred answer to its question (`alternate`), or None."""
    value = row.get("alternate") if isinstance(row, dict) else None
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InputError(f"forget row {index}: `alternate` must be a non-empty string, got {value!r}")
    return value


def pick_refusals(n: int, refusals: Sequence[str], seed: int, epoch: int = 0) -> list[str]:
    """One refusal per forget item for an epoch, drawn from `refusals` deterministically from (seed, epoch).
    Redrawn every epoch, as TOFU's and open-unlearning's datasets draw one at random on every fetch."""
    if not refusals:
        raise InputError("IdkDPO needs a non-empty list of refusals (TOFU's idontknow list)")
    rng = random.Random(f"idk-{seed}-{epoch}")
    return [refusals[rng.randrange(len(refusals))] for _ in range(n)]


class ForgetRetainDataset(Dataset):
    """Forget items are the anchor (one epoch = one pass over them); each is paired with a retain item.

    Examples are one per row, or the benchmark's own (`api.Benchmark.training_examples`: MUSE's blocks). The
    pairing is redrawn per epoch from (seed, epoch), so it is deterministic, or, for a benchmark whose
    `retain_pairing` is "cycled" (MUSE), forget item i takes retain item i mod n every epoch. `refusals` (IdkDPO's
    `idontknow` list), when given, give each forget item an alternate answer to the same prompt, redrawn per
    epoch the same way (`pick_refusals`); a forget row's own `alternate` answer (DPO's preferred response, RT's
    refusal, from RWKU's pair / reject corpora) is used instead, every epoch.
    """

    def __init__(self, tokenizer, forget_rows: Sequence[dict], retain_rows: Sequence[dict] | None = None, *,
                 refusals: Sequence[str] | None = None, max_length: int = 512, seed: int = 0,
                 preset: str = DEFAULT_TOFU_PRESET, family: str | None = None, chat: bool | None = None,
                 benchmark: str | None = None):
        if not forget_rows:
            raise InputError("forget_rows is empty: nothing to unlearn")
        self.seed = seed
        fmt = {"preset": preset, "family": family, "chat": chat, **_benchmark(benchmark)}
        # kept for methods that read more than the batches before training (LUNAR's direction: `prepare`)
        self.tokenizer, self.format, self.forget_rows = tokenizer, fmt, list(forget_rows)
        self.retain_rows = list(retain_rows or [])
        # the benchmark's own examples where it builds them (MUSE's blocks), else one per row
        plugin = training_benchmark(benchmark)
        own = own_examples(plugin, tokenizer, forget_rows, "forget", max_length)
        self.own_examples = own is not None
        self.forget = own if own is not None else [encode_row(tokenizer, r, i, "forget", max_length, **fmt)
                                                   for i, r in enumerate(forget_rows)]
        self.retain = ((own_examples(plugin, tokenizer, retain_rows, "retain", max_length)
                        or [encode_row(tokenizer, r, i, "retain", max_length, **fmt) for i, r in enumerate(retain_rows)])
                       if retain_rows else [])
        self.pairing = plugin.retain_pairing if plugin is not None else "drawn"
        if self.pairing not in ("drawn", "cycled"):
            raise ValueError(f"{benchmark}: retain_pairing must be 'drawn' or 'cycled', got {self.pairing!r}")
        self.refusals = None
        self.alternate = None
        self._encode_alternate = None
        # A row's own preferred answer (`alternate`: RWKU's pair / reject corpora) wins over a drawn refusal.
        self._row_alternates = [row_alternate(r, i) for i, r in enumerate(forget_rows)]
        if refusals is not None or any(self._row_alternates):
            if self.own_examples:   # alternate answers are per row
                raise InputError(f"{benchmark} trains on {len(self.forget)} examples of its own built from "
                                 f"{len(self.forget_rows)} forget rows: a method with alternate answers (refusals) "
                                 "cannot pair them")
            if refusals is None and not all(self._row_alternates):
                missing = [i for i, a in enumerate(self._row_alternates) if a is None]
                raise InputError(f"forget rows {missing[:5]} have no `alternate` answer and no refusals were given")
            forget_question = [row_to_qa(r, i, "forget")[0] for i, r in enumerate(forget_rows)]
            self.refusals = list(refusals) if refusals is not None else None  # [] is refused by `pick_refusals`
            # (forget item, answer) -> its encoding: each pair is tokenised once, however many epochs draw it
            self._encode_alternate = functools.lru_cache(maxsize=None)(
                lambda i, refusal: encode_qa(tokenizer, forget_question[i], refusal, max_length, **fmt,
                                             **row_prompt(forget_rows[i])))
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        if self.retain and self.pairing == "cycled":
            self._retain_index = [i % len(self.retain) for i in range(len(self.forget))]
        elif self.retain:
            rng = random.Random(f"retain-{self.seed}-{epoch}")
            self._retain_index = [rng.randrange(len(self.retain)) for _ in self.forget]
        if self._encode_alternate is not None:
            drawn = (pick_refusals(len(self.forget), self.refusals, self.seed, epoch) if self.refusals is not None
                     else [None] * len(self.forget))
            self.alternate = [self._encode_alternate(i, own or refusal)
                              for i, (own, refusal) in enumerate(zip(self._row_alternates, drawn))]

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, i: int) -> dict[str, EncodedExample]:
        item = {"forget": self.forget[i]}
        if self.retain:
            item["retain"] = self.retain[self._retain_index[i]]
        if self.alternate is not None:
            item["alternate"] = self.alternate[i]
        return item

    def collate(self, items: Sequence[dict[str, EncodedExample]]) -> dict[str, dict[str, torch.Tensor]]:
        return {key: collate([it[key] for it in items], self.pad_token_id) for key in items[0]}


class DomainAlternatingDataset(ForgetRetainDataset):
    """WMDP's joint RMU run (centerforaisafety/wmdp rmu/unlearn.py): forget rows tagged with their `domain`, each
    domain's rows cut in corpus order into batches of `batch_size`, the batches alternating over the domains in the
    order they first appear (step `idx` trains domain `idx % k` on its batch `idx // k`); domain d's b-th forget
    batch is paired with the b-th batch of d's retain rows (the retain rows tagged d, or every retain row when none
    is tagged: WMDP's `--retain_corpora wikitext,wikitext`). Batches per domain: the fewest whole batches any
    domain's forget or retain rows fill (WMDP's `num_batches`). `ordered`: the trainer reads it in this order,
    unshuffled; each item carries its domain's index in `domains` (RMU's control vector)."""

    ordered = True

    def __init__(self, tokenizer, forget_rows: Sequence[dict], retain_rows: Sequence[dict] | None = None, *,
                 batch_size: int, **kwargs):
        super().__init__(tokenizer, forget_rows, retain_rows, **kwargs)
        untagged = [i for i, row in enumerate(forget_rows) if not isinstance(row.get("domain"), str)]
        if untagged:
            raise InputError(f"forget rows {untagged[:5]} have no `domain` tag; a joint unit tags every row")
        self.domains = list(dict.fromkeys(row["domain"] for row in forget_rows))
        forget_by = {d: [i for i, row in enumerate(forget_rows) if row["domain"] == d] for d in self.domains}
        retain = list(retain_rows or [])
        tagged = any(isinstance(row.get("domain"), str) for row in retain)
        retain_by = {d: [i for i, row in enumerate(retain) if not tagged or row.get("domain") == d]
                     for d in self.domains} if retain else {}
        counts = [len(rows) // batch_size for rows in (*forget_by.values(), *retain_by.values())]
        batches = min(counts)
        if batches == 0:
            sizes = {f"{side} {d}": len(rows) for side, by in (("forget", forget_by), ("retain", retain_by))
                     for d, rows in by.items()}
            raise InputError(f"a joint unit needs a whole batch of {batch_size} rows per domain and side, got {sizes}")
        self._order = []
        for idx in range(batches * len(self.domains)):
            k, b = idx % len(self.domains), idx // len(self.domains)
            domain = self.domains[k]
            for j in range(b * batch_size, (b + 1) * batch_size):
                self._order.append((forget_by[domain][j], retain_by[domain][j] if retain else None, k))

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i: int) -> dict:
        forget, retain, domain = self._order[i]
        item = {"forget": self.forget[forget], "domain": domain}
        if retain is not None:
            item["retain"] = self.retain[retain]
        return item

    def collate(self, items: Sequence[dict]) -> dict[str, dict[str, torch.Tensor]]:
        batch = super().collate([{k: v for k, v in it.items() if k != "domain"} for it in items])
        batch["forget"]["domain"] = torch.tensor([it["domain"] for it in items], dtype=torch.long)
        return batch
