"""Prompt encoding with the tokenizer's chat template."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

#: encode_chat's warning for a tokenizer without a chat template (``tether validate`` gives it before a model loads)
NO_CHAT_TEMPLATE = "the tokenizer has no chat template: encoding the messages as plain text"


def encode_chat(tokenizer: Any, messages: str | Sequence[dict[str, str]], *,
                system: str | None = None) -> list[int]:
    """Token ids of a chat prompt that ends where the assistant's reply begins.

    Args:
        tokenizer: a Hugging Face tokenizer, ideally with a chat template, or a vision-language model's processor.
        messages: a user message, or a list of ``{"role", "content"}`` dicts.
        system: a system message to put first (not allowed when ``messages`` starts with one).

    Returns:
        The ids of the rendered template with ``add_generation_prompt=True``. Without a template the
        contents are joined by blank lines and encoded as plain text (with a warning).

    >>> encode_chat(tok, "What is 7 + 5?", system="Answer briefly.")  # doctest: +SKIP
    """
    msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
    if system is not None:
        if msgs and msgs[0].get("role") == "system":
            raise ValueError("encode_chat: got `system`, but the messages start with a system message")
        msgs.insert(0, {"role": "system", "content": system})
    # a vision-language model's processor renders with its own template, and its tokenizer encodes the text
    # (called on a string, the processor would take it for an image)
    encode = getattr(tokenizer, "tokenizer", None) or tokenizer
    if not getattr(tokenizer, "chat_template", None):
        warnings.warn(NO_CHAT_TEMPLATE, stacklevel=2)
        return encode("\n\n".join(m["content"] for m in msgs) + "\n\n").input_ids
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    # The template writes its own special tokens (BOS included, where it has one).
    return encode(text, add_special_tokens=False).input_ids
