"""The skill-augmented context H(h, s): the skill block goes right after the task line of a step's prompt.

The authors' ``seed/prompting.py::build_augmented_observation_text`` (seed.md Sec. 2.2), for the episode skill
(tether runs ``episode_only``, so there is no step skill):

* the block is ``**Episode-Level Skill**\\nRefer to this episode-level skill when deciding what action to take
  in the current episode:\\n[<skill>]``;
* it goes in its own paragraph right after the first line matching "Your task is to:", "Your current task is:",
  "Your task is:", "Your question:" or "Your goal is" / "Your goal is to" followed by ":" or whitespace (the
  code's patterns at ``2cf2fad``; tether's agent loop starts every prompt with "Your task is to: ...");
* else before "Now it's your turn to" / "Now it's your turn"; else at the end;
* an empty skill returns the prompt unchanged.

The teacher's prompt is this text re-encoded with the same chat template, and the *same* sampled response ids
follow it: only prompt tokens differ (seed.md Sec. 6, property 16). :func:`user_message` recovers a row's user
message from its prompt ids, so the plug-in needs nothing from the collector but ``prompt_ids``;
:func:`user_messages` does it for a batch's rows, once per distinct prompt, around the template's frame
(:func:`chat_frame`) rendered once per tokenizer and template.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import Any

from tether.models import encode_chat

EPISODE_SKILL_TITLE = "Episode-Level Skill"
EPISODE_SKILL_INSTRUCTION = "Refer to this episode-level skill when deciding what action to take in the current episode"

TASK_LINE_PATTERNS = (
    r"^.*\bYour task is to:\s*.*(?:\n|$)",
    r"^.*\bYour current task is:\s*.*(?:\n|$)",
    r"^.*\bYour task is:\s*.*(?:\n|$)",
    r"^.*\bYour question:\s*.*(?:\n|$)",
    # "Your goal is" or "Your goal is to", then ":" or whitespace (a line break too, so the next line is the task)
    r"^.*\bYour goal is(?: to)?\b[:\s].*(?:\n|$)",
)
TURN_ANCHORS = ("Now it's your turn to", "Now it's your turn")

_SENTINEL = "\x00tether-seed-user-message\x00"
# tokenizer -> (its chat template, the frame around a user message): a step's rows all share it, and so do its steps
_FRAMES: weakref.WeakKeyDictionary[Any, tuple[Any, tuple[str, str] | None]] = weakref.WeakKeyDictionary()


def skill_section(title: str, instruction: str, body: object) -> str:
    """``**title**\\ninstruction:\\n[body]``, or "" for an empty body."""
    text = str(body or "").strip()
    return f"**{title}**\n{instruction}:\n[{text}]" if text else ""


def _join(prefix: str, block: str, suffix: str) -> str:
    if prefix and suffix:
        return f"{prefix}\n\n{block}\n\n{suffix}"
    return f"{prefix}\n\n{block}" if prefix else f"{block}\n\n{suffix}"


def insert_before_anchor(prompt: str, block: str, anchors: Sequence[str] = TURN_ANCHORS) -> str:
    """``block`` in its own paragraph before the first anchor found; appended at the end if none is."""
    for anchor in anchors:
        at = prompt.find(anchor)
        if at != -1:
            return _join(prompt[:at].rstrip(), block, prompt[at:].lstrip())
    return f"{prompt}\n\n{block}" if prompt else block


def insert_after_task_line(prompt: str, block: str) -> str:
    """``block`` in its own paragraph after the task line (:data:`TASK_LINE_PATTERNS`), with the fallbacks of
    :func:`insert_before_anchor`; "" leaves ``prompt`` unchanged."""
    if not block.strip():
        return prompt
    for pattern in TASK_LINE_PATTERNS:
        match = re.search(pattern, prompt, flags=re.MULTILINE)
        if match is not None:
            return _join(prompt[:match.end()].rstrip(), block, prompt[match.end():].lstrip())
    return insert_before_anchor(prompt, block)


def augment_with_skill(prompt: str, skill: str) -> str:
    """H(h, s): ``prompt`` with the episode-skill block after its task line; unchanged for an empty skill.

    >>> print(augment_with_skill("Your task is to: go.\\n\\nNow act.", "Move right first."))
    Your task is to: go.
    <BLANKLINE>
    **Episode-Level Skill**
    Refer to this episode-level skill when deciding what action to take in the current episode:
    [Move right first.]
    <BLANKLINE>
    Now act.
    """
    section = skill_section(EPISODE_SKILL_TITLE, EPISODE_SKILL_INSTRUCTION, skill)
    return insert_after_task_line(prompt.strip(), section) if section else prompt


def chat_frame(tokenizer: Any) -> tuple[str, str] | None:
    """The text the chat template writes before and after a user message (with the generation prompt), from one
    render around a sentinel message, kept while the tokenizer and its template live; None when the render does not
    hold the message exactly once."""
    template = tokenizer.chat_template
    cached = _FRAMES.get(tokenizer)
    if cached is None or cached[0] != template:  # a template set after the first call (model.chat_template)
        frame = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], add_generation_prompt=True,
                                              tokenize=False)
        cached = template, (tuple(frame.split(_SENTINEL)) if frame.count(_SENTINEL) == 1 else None)
        _FRAMES[tokenizer] = cached
    return cached[1]


def user_messages(tokenizer: Any, prompts: Sequence[Sequence[int]]) -> list[str | None]:
    """:func:`user_message` of each prompt, computed once for each distinct prompt (a group's rows share theirs)."""
    found: dict[tuple[int, ...], str | None] = {}
    for ids in map(tuple, prompts):
        if ids not in found:
            found[ids] = user_message(tokenizer, ids)
    return [found[tuple(ids)] for ids in prompts]


def user_message(tokenizer: Any, prompt_ids: Sequence[int]) -> str | None:
    """The user message that :func:`tether.models.encode_chat` turned into ``prompt_ids``, or None.

    The decoded prompt must start and end with the template's frame around a message (:func:`chat_frame`). The
    result is checked by re-encoding it: None unless ``encode_chat(tokenizer, message) == prompt_ids`` (a template
    that edits the message, say).
    """
    text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if getattr(tokenizer, "chat_template", None):
        frame = chat_frame(tokenizer)
        if frame is None:
            return None
        head, tail = frame
        if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
            return None
        message = text[len(head):len(text) - len(tail)]
    else:  # encode_chat's plain-text fallback: the message followed by a blank line, BOS possibly in front
        bos = tokenizer.bos_token or ""
        message = text[len(bos):] if bos and text.startswith(bos) else text
        message = message[:-2] if message.endswith("\n\n") else message
    return message if list(encode_chat(tokenizer, message)) == list(prompt_ids) else None
