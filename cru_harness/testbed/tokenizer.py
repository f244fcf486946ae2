"""Train a small byte-level BPE tokenizer offline with `tokenizers`, wrapped as a HF fast tokenizer."""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, UNK = "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"

# A minimal chat template so the chat-template code paths can be exercised on tiny models too.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|eos|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, chat_template: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`; distinct pad and EOS so padding never masks EOS.

    No BOS is prepended; a BOS token exists so models that expect one can be configured.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, UNK, "<|user|>", "<|assistant|>", "<|system|>"],
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
        model_max_length=512,
    )
    fast.padding_side = "right"
    if chat_template:
        fast.chat_template = TINY_CHAT_TEMPLATE
    return fast
