"""``model.chat_template``: a Jinja chat template file that replaces the tokenizer's own.

The file is read and compiled before any model loads (a syntax error is one line naming the file and the line), and
set on the tokenizer the run uses (``tether train``, ``tether sft`` and ``tether seed-sft`` alike), so the prompts
are rendered with it and every checkpoint's tokenizer carries it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.config import anchoring_rule
from tether.files import nearest_path_guess


def read_chat_template(path: str) -> str:
    """The template in file ``path``, compiled once as transformers compiles it (a sandboxed Jinja environment).

    Raises:
        ValueError: the file is missing or does not compile (the message names the file, the line, the problem).
    """
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"model.chat_template: {path!r} is not a file (a Jinja chat template; {anchoring_rule()})"
                         f"{nearest_path_guess(path)}")
    text = file.read_text(encoding="utf-8")
    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=["jinja2.ext.loopcontrols"]).from_string(text)
    except TemplateSyntaxError as err:
        raise ValueError(f"model.chat_template: {path}:{err.lineno}: not a valid Jinja template ({err.message})") \
            from None
    return text


def apply_chat_template(tokenizer: Any, path: str | None) -> None:
    """Set the template in file ``path`` on ``tokenizer`` (a processor's tokenizer too); nothing when ``path`` is
    None."""
    if path is None:
        return
    text = read_chat_template(path)
    tokenizer.chat_template = text
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None:
        inner.chat_template = text
