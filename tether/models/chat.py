"""Prompt encoding with the tokenizer's chat template.

A message's ``content`` is a string, or a list of text parts (``[{"type": "text", "text": ...}]``, the OpenAI and
Hugging Face multi-part format). Templates differ on such lists: a multimodal one (Qwen2-VL's, SmolVLM's) loops over
the parts and writes their texts one after the other, SmolLM2's adds the content to a string and raises, a template
that writes ``{{ message['content'] }}`` prints the list's Python repr. So a part list goes to the template unchanged
only where the template renders a one-part list exactly as it renders that part's text
(:func:`renders_text_parts`); elsewhere its texts are joined with a newline first (:func:`content_text`), as vLLM
does for a template that reads its content as a string.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

#: encode_chat's warning for a tokenizer without a chat template (``tether validate`` gives it before a model loads)
NO_CHAT_TEMPLATE = "the tokenizer has no chat template: encoding the messages as plain text"
_PROBE = "tether-text-part-probe"
_RENDERS_PARTS: dict[str, bool] = {}  # template text -> verdict: a template is probed once per process


def content_text(content: str | Sequence[dict[str, Any]]) -> str:
    """A message's content as one text: a string as it is, text parts' texts joined with a newline.

    >>> content_text([{"type": "text", "text": "What is"}, {"type": "text", "text": "7 + 5?"}])
    'What is\\n7 + 5?'
    """
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def renders_text_parts(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders a message of text parts as it renders their text: a one-part
    list and the string give the same prompt (a template that raises on the list renders it not at all)."""
    template = tokenizer.chat_template
    if template not in _RENDERS_PARTS:
        def render(content: Any) -> str:
            return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                 tokenize=False)

        try:
            _RENDERS_PARTS[template] = render([{"type": "text", "text": _PROBE}]) == render(_PROBE)
        except Exception:  # whatever the template raises on a list (TypeError, jinja2's TemplateError...)
            _RENDERS_PARTS[template] = False
    return _RENDERS_PARTS[template]


def template_messages(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as ``tokenizer``'s chat template should get them: text parts as they are where it renders them
    (:func:`renders_text_parts`), else each part list joined into one text (:func:`content_text`)."""
    messages = list(messages)
    if all(isinstance(m["content"], str) for m in messages) or renders_text_parts(tokenizer):
        return messages
    return [{**m, "content": content_text(m["content"])} for m in messages]


def encode_chat(tokenizer: Any, messages: str | Sequence[dict[str, str]], *,
                system: str | None = None) -> list[int]:
    """Token ids of a chat prompt that ends where the assistant's reply begins.

    Args:
        tokenizer: a Hugging Face tokenizer, ideally with a chat template, or a vision-language model's processor.
        messages: a user message, or a list of ``{"role", "content"}`` dicts (content a string or text parts).
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
        return encode("\n\n".join(content_text(m["content"]) for m in msgs) + "\n\n").input_ids
    text = tokenizer.apply_chat_template(template_messages(tokenizer, msgs), add_generation_prompt=True,
                                         tokenize=False)
    # The template writes its own special tokens (BOS included, where it has one).
    return encode(text, add_special_tokens=False).input_ids
