"""Shared by the CRU tests on tiny models: one forget / retain corpus, the fast training setting, and the tiny
tokenizer and Llama built on that corpus (module-scoped: each test module builds its own, as before)."""
from __future__ import annotations

import pytest

from cru_harness.testbed.models import build_tiny_model
from cru_harness.testbed.tokenizer import train_tokenizer

FORGET = [f"Question: Who is Zorbo {i}?\nAnswer: Zorbo {i} paints {['red', 'blue', 'green'][i % 3]} "
          f"ships in Quell{'-' * (i % 4)}." for i in range(12)]
RETAIN = [f"Question: What is the capital of land {i}?\nAnswer: It is city number {i * 3}{'!' * (i % 3)}."
          for i in range(12)]
FAST = dict(epochs=2, batch_size=6, lr=1e-2, percentile=80, progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(FORGET + RETAIN, 400)


@pytest.fixture(scope="module")
def llama(tokenizer):
    return build_tiny_model("llama", tokenizer)
