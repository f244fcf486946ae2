"""Train a small byte-level BPE tokenizer offline with `tokenizers`, wrapped as a HF fast tokenizer."""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, UNK = "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"
CHAT_ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|system|>"]

# Qwen2's exact pre-tokenization (NFC, this split regex, byte-level without its own regex). transformers 5
# always reloads a saved `qwen2` tokenizer as `Qwen2Tokenizer`, which rebuilds this pipeline around the saved
# vocab and merges whatever `tokenizer_class` says; using the same pipeline for every family makes that reload
# (and every other family's `TokenizersBackend` reload) give identical ids.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# A minimal chat template so the chat-template code paths can be exercised on tiny models too.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *,
                    chat_template: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`; distinct pad and EOS so padding never masks EOS.

    No BOS is prepended; a BOS token exists so models that expect one can be configured. Uses Qwen2's
    pre-tokenization for every family (see `QWEN2_PRETOKENIZE_REGEX`) so saved tokenizers reload identically.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, UNK, *CHAT_ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        # Declared special so every reload (including Qwen2Tokenizer's) keeps them as single tokens.
        additional_special_tokens=CHAT_ROLE_TOKENS,
        model_max_length=512,
    )
    fast.padding_side = "right"
    if chat_template:
        fast.chat_template = TINY_CHAT_TEMPLATE
    return fast
