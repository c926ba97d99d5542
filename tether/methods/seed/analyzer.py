"""SEED's trajectory analyzer: the prompt that renders a finished episode, and robust parsing of the JSON answer.

The same prompt serves both stages (seed.md Sec. 2.1): stage 1 sends it to an external analyzer (an
OpenAI-compatible endpoint, or tether's rule-based analyzers) to build SFT data; stage 2 sends it to the policy
itself, greedily, every update. tether implements the paper's variant: ``skill_mode="episode_only"``, with or
without the episode summary, text observations. The text is the authors' ``SEEDEpisodeAnalyzer.
_build_default_episode_analysis_prompt`` word for word; parsing follows ``_parse_analysis_response`` /
``_extract_json_object`` (fenced blocks first, every ``{`` decoded, ``ast.literal_eval`` on balanced slices for
single quotes, trailing commas stripped, the object holding ``episode_skill`` preferred).

An analysis *succeeds* iff the answer parsed and its ``episode_skill`` is non-empty after stripping (the
policy-analyzer rule of the code; the OpenAI backend also wants five words, :func:`is_nontrivial_skill`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tether.envs.base import escape_placeholders

# Task-line patterns, in the code's order (seed/analysis.py ``_TASK_DESCRIPTION_PATTERNS``).
TASK_PATTERNS = (
    re.compile(r"Your task is to:\s*(.+?)(?:\n|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"Your task is:\s*(.+?)(?:\n|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"Your current task is:\s*(.+?)(?:\n|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"Your question:\s*(.+?)(?:\n|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"Your goal is to\s*(.+?)(?:\n|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"You are [^\n]*?\bhelping to\s*(.+?)(?:\n|$)", re.IGNORECASE),
)

SUCCESS_INSTRUCTION = ("Write one episode_skill that extracts the successful trajectory into workflow: "
                       "the core decision rule and action ordering that made this trajectory work. ")
FAILURE_INSTRUCTION = ("Write one episode_skill that extracts the failed trajectory into avoidance rules: "
                       "the core mistake and warning signs that agent should avoid. ")
UNKNOWN_INSTRUCTION = ("Write one episode_skill distilled from the trajectory. If it succeeded, extract "
                       "the successful workflow; if it failed, extract the avoidance rules. ")


@dataclass(frozen=True)
class Step:
    """One turn as the analyzer sees it: the raw env observation, the full response, the validity flag."""

    observation: str
    response: str
    action_valid: bool | None = None


@dataclass
class Analysis:
    """A parsed analyzer answer.

    Attributes:
        summary: ``episode_summary`` ("" when the prompt did not ask for it or it was missing).
        skill: ``episode_skill`` ("" when missing).
        error: why the answer did not parse, or None.
        raw: the answer text as generated.
    """

    summary: str
    skill: str
    error: str | None
    raw: str

    @property
    def ok(self) -> bool:
        """The analysis counts as successful: it parsed and has a non-empty skill."""
        return self.error is None and bool(self.skill.strip())


def clean_task(text: object) -> str:
    """Whitespace runs collapsed to one space (the code's ``_clean_task_description``)."""
    return " ".join(str(text or "").split())


def extract_task(text: object) -> str:
    """The task description from a prompt or observation, by the first matching task-line pattern; "" if none.

    >>> extract_task("Your task is to: put a mug in the sink.\\nYou see a mug.")
    'put a mug in the sink.'
    """
    for pattern in TASK_PATTERNS:
        match = pattern.search(str(text or ""))
        if match and (task := clean_task(match.group(1))):
            return task
    return ""


def success_label(episode_return: float | None, threshold: float = 1.0) -> str:
    """``success`` iff the return reaches ``threshold`` (the code's ``failure_success_threshold``), else
    ``failure``; ``unknown`` without a return."""
    if episode_return is None:
        return "unknown"
    return "success" if float(episode_return) >= threshold else "failure"


def format_steps(steps: Sequence[Step]) -> str:
    """``Step {i}\\nObservation: ...\\nResponse: ...\\nAction valid: true|false\\n`` per step, 0-based."""
    lines = []
    for i, step in enumerate(steps):
        valid = "" if step.action_valid is None else f"\nAction valid: {str(bool(step.action_valid)).lower()}"
        lines.append(f"Step {i}\nObservation: {step.observation}\nResponse: {step.response}{valid}\n")
    return "".join(lines)


def analysis_prompt(task: str, steps: Sequence[Step], outcome: str, *, include_summary: bool = True) -> str:
    """The analyzer's user message for one trajectory (seed.md Sec. 2.1, ``episode_only``).

    Args:
        task: the task description (whitespace is collapsed).
        steps: the trajectory's turns in order.
        outcome: ``success``, ``failure`` or ``unknown`` (:func:`success_label`).
        include_summary: ask for ``episode_summary`` too (the paper's setting).

    Returns:
        The prompt text; encode it with the chat template (:func:`tether.models.encode_chat`).
    """
    instruction = {"success": SUCCESS_INSTRUCTION, "failure": FAILURE_INSTRUCTION}.get(outcome, UNKNOWN_INSTRUCTION)
    context = (f"Episode context:\n- Task description: {clean_task(task) or '(not available)'}\n"
               f"- episode_success: {outcome if outcome in ('success', 'failure') else 'unknown'}\n"
               f"- Interaction trajectory: {format_steps(steps)}\n")
    constraint = ("- Write episode_skill as one short policy-facing skill, not as retrospective explanation of the "
                  "trajectory.\n")
    if not include_summary:
        return ("Analyze the following agent episode and return ONLY valid JSON.\n\n"
                f"You need to complete one field:\n1. {instruction}\n\n"
                f"Important constraints:\n{constraint}- Return only this top-level field: episode_skill.\n\n"
                'Return format:\n{\n  "episode_skill": "string"\n}\n\n' + context)
    return ("Analyze the following agent episode and return ONLY valid JSON.\n\n"
            f"You need to complete two fields:\n1. Write a concise episode_summary.\n2. {instruction}\n\n"
            f"Important constraints:\n{constraint}"
            "- Return only these top-level fields: episode_summary, episode_skill.\n\n"
            'Return format:\n{\n  "episode_summary": "string",\n  "episode_skill": "string"\n}\n\n' + context)


def episode_analysis_prompt(episode: Any, *, threshold: float = 1.0, include_summary: bool = True) -> str:
    """:func:`analysis_prompt` of a :class:`tether.rollout.multi_turn.Episode` (task, turns, return)."""
    # a response is model text: escaped, so a visual episode's placeholders are exactly its frames
    steps = [Step(t["observation"], escape_placeholders(t["response"]), t.get("valid")) for t in episode.turns]
    return analysis_prompt(episode.task, steps, success_label(episode.ret, threshold), include_summary=include_summary)


def analysis_target(summary: str, skill: str, *, include_summary: bool = True) -> str:
    """The SFT target for a labelled trajectory: ``json.dumps`` of the fields the prompt asks for."""
    fields = {"episode_summary": summary, "episode_skill": skill} if include_summary else {"episode_skill": skill}
    return json.dumps(fields)


# -- parsing -----------------------------------------------------------------------------------


def _candidate_texts(text: str) -> list[str]:
    """Fenced blocks (```json ... ```) first, then the whole text."""
    blocks = re.findall(r"```(?:json|JSON)?\s*(.*?)```", text, flags=re.DOTALL)
    return [b.strip() for b in blocks if b.strip()] + [text.strip()]


def _variants(text: str) -> list[str]:
    repaired = re.sub(r",\s*([}\]])", r"\1", text)  # trailing commas
    return [text] if repaired == text else [text, repaired]


def _balanced_slices(text: str) -> list[str]:
    """Top-level ``{...}`` slices, skipping braces inside single- or double-quoted strings."""
    slices, start, depth, quote, escape = [], None, 0, "", False
    for i, ch in enumerate(text):
        if escape:
            escape = False
        elif quote:
            if ch == "\\":
                escape = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "{":
            start = i if depth == 0 else start
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0 and start is not None:
                slices.append(text[start:i + 1])
                start = None
    return slices


def _decode_objects(text: str) -> tuple[list[dict], Exception | None]:
    """Every dict that ``raw_decode`` finds at a ``{``; failing that, ``ast.literal_eval`` of balanced slices."""
    objects: list[dict] = []
    error: Exception | None = None
    decoder = json.JSONDecoder(strict=False)
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            value, _ = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            error = exc
            continue
        if isinstance(value, dict):
            objects.append(value)
    if objects:
        return objects, error
    for piece in _balanced_slices(text):
        try:
            value = ast.literal_eval(piece)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
            error = exc
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects, error


def extract_json_object(text: str, prefer: str = "episode_skill") -> dict:
    """The JSON object of an analyzer answer.

    Raises:
        ValueError: no ``{`` in the text, or nothing decodes to an object.
    """
    objects: list[dict] = []
    error: Exception | None = None
    seen_brace = False
    for candidate in _candidate_texts(str(text or "")):
        seen_brace = seen_brace or "{" in candidate
        for variant in _variants(candidate):
            found, err = _decode_objects(variant)
            objects += found
            error = err or error
    for obj in objects:
        if prefer in obj:
            return obj
    if objects:
        return objects[0]
    if not seen_brace:
        raise ValueError("No JSON object found in SEED analyzer response.")
    raise ValueError(f"Could not parse JSON object in SEED analyzer response: {error}")


def parse_analysis(text: str, *, include_summary: bool = True) -> Analysis:
    """Parse an analyzer answer into an :class:`Analysis`; never raises (a failure is in ``error``).

    >>> parse_analysis('```json\\n{"episode_summary": "won", "episode_skill": "push right",}\\n```').ok
    True
    >>> parse_analysis("no json here").error
    'No JSON object found in SEED analyzer response.'
    """
    try:
        obj = extract_json_object(text)
    except ValueError as exc:
        return Analysis("", "", str(exc), str(text or ""))
    summary = _field_text(obj.get("episode_summary")) if include_summary else ""
    return Analysis(summary, _field_text(obj.get("episode_skill")), None, str(text or ""))


def _field_text(value: object) -> str:
    """A field's text: a string as it is, a list its strings one per line; null, a number or an object is no text
    (``str(None)`` was the skill "None", which passed as a written skill and was distilled from)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(item for item in value if isinstance(item, str) and item.strip())
    return ""


def is_nontrivial_skill(text: object, min_words: int = 5) -> bool:
    """The OpenAI backend's stricter check: not just dots or dashes, and at least ``min_words`` words."""
    value = str(text or "").strip()
    if not value or re.fullmatch(r"[\s.。…,_-]+", value):
        return False
    return len(value.split()) >= min_words
