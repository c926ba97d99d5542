"""The text-environment protocol every tether environment follows.

An environment is text in, text (or text with images) out: ``reset(seed)`` starts an episode and returns
the first observation plus the task (goal) text; ``step(action)`` applies one action string. The rollout loop
turns a model response into that action string with the env's own ``parse_action``, which also
says whether the response was a *valid* action (the trainer penalises invalid ones, verl-agent style).

Conventions shared by all envs (the tests in ``tests/envs`` check them for every registered env):

* ``done`` means the episode reached a terminal state (won or lost). Envs never truncate on a turn
  count; the rollout loop stops after ``max_turns`` (a recommended default per env) and records the
  truncation itself, like gymnasium's ``terminated`` vs ``truncated``.
* ``step`` accepts any string and matches it against the env's actions ignoring case and runs of
  whitespace. An action the env does not recognise is a no-op: the state does not change,
  ``reward`` is 0.0 (plus any per-step shaping the env documents), the observation says so and
  ``info["invalid_action"]`` is True. The loop still counts it as a turn and the trainer applies the
  invalid-action penalty from ``parse_action``'s flag (verl-agent style).
* ``step`` before the first ``reset``, or after ``done``, raises :class:`EpisodeOverError`: that is a
  bug in the caller, not something a policy can cause.
* ``info`` of every step has ``won`` (bool), ``admissible_actions`` (list or None) and
  ``invalid_action`` (bool); envs add their own keys (events, scores, failure reasons).
* Same seed and same actions give the same observations (all randomness is seeded by ``reset``).
* An observation is a ``str``, or an :class:`Observation` (text with :data:`IMAGE_PLACEHOLDER` where
  each of its images goes) for visual envs; text-only code can read any observation through
  :func:`observation_text`.

Action parsing (:func:`parse_tagged_action`, the default ``parse_action`` of every env):

1. Find every ``<action>...</action>`` pair (tags case-insensitive, content may span lines). None
   found, or an unclosed last tag only: returns ``("", False)``.
2. Take the **last** pair; the action is its content with runs of whitespace collapsed to one space
   and the ends stripped (case kept). Empty content: ``("", False)``.
3. If the env lists no admissible actions (``None``), the action is valid.
4. Otherwise the action is valid iff it equals an admissible action after lower-casing and collapsing
   whitespace on both sides; the returned action is then the admissible action's own spelling, so
   ``step`` receives it exactly. No match: ``(action, False)``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from PIL.Image import Image

#: Eval seeds start here; train seeds are ``0 .. EVAL_SEED_OFFSET - 1``. One offset for every env
#: family keeps the two splits disjoint without per-env bookkeeping.
EVAL_SEED_OFFSET = 1_000_000

_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


#: Where an image of an :class:`Observation` sits in its text; the prompt builder turns each one into
#: the chat template's image slot (SEED's ``seed_visual`` prompts write ``<image>`` the same way).
IMAGE_PLACEHOLDER = "<image>"


class Observation:
    """A visual observation: text with one :data:`IMAGE_PLACEHOLDER` per image, and the images (PIL, RGB).

    Equality and hashing go by the text and the pixels (a digest of mode, size and bytes), so
    observations can be compared and grouped (GiGPO's step groups) like strings.

    Args:
        text: the observation's text, with a placeholder where each image goes, in order.
        images: the images, as many as there are placeholders.

    Raises:
        ValueError: the number of placeholders differs from the number of images.
    """

    def __init__(self, text: str, images: tuple[Image, ...] | list[Image]) -> None:
        if text.count(IMAGE_PLACEHOLDER) != len(images):
            raise ValueError(f"an Observation needs one {IMAGE_PLACEHOLDER} per image: "
                             f"{text.count(IMAGE_PLACEHOLDER)} in the text, {len(images)} images")
        self.text, self.images = text, tuple(images)
        digest = hashlib.sha1()
        for image in self.images:
            digest.update(f"{image.mode}{image.size}".encode())
            digest.update(image.tobytes())
        #: the text plus a digest of the pixels: equal iff text and images are equal
        self.key = f"{text}\n[images {digest.hexdigest()[:16]}]" if self.images else text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Observation) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Observation({self.text!r}, {len(self.images)} image(s))"


def observation_text(observation: str | Observation) -> str:
    """The text of an observation (a visual one keeps its image placeholders)."""
    return observation.text if isinstance(observation, Observation) else observation


def escape_placeholders(text: str) -> str:
    """Text a model or user wrote, made safe to put next to image placeholders: each :data:`IMAGE_PLACEHOLDER`
    in it becomes ``[image]``, so the placeholders of a prompt are exactly its images'.

    >>> escape_placeholders("<action><image></action>")
    '<action>[image]</action>'
    """
    return text.replace(IMAGE_PLACEHOLDER, "[image]")


NEEDS_PILLOW = ("image observations need Pillow: pip install 'tether[vision]' (or build the env with "
                "observation='text')")


def require_pillow() -> None:
    """Raise :class:`EnvUnavailableError` unless Pillow is installed: a visual env calls it when built, so a
    missing renderer fails before the run starts, not mid-rollout."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise EnvUnavailableError(NEEDS_PILLOW) from None


# info key of a step whose observation carries feedback on top of the env's state (an invalid action's note): the
# key of the observation the same state gives without it, so GiGPO's anchor states group by state, not by the
# model's text quoted in the note (verl-agent anchors its grid envs on the state too)
STATE_KEY = "state_key"


def observation_key(observation: str | Observation) -> str:
    """A string equal for two observations iff they are equal (text and pixels)."""
    return observation.key if isinstance(observation, Observation) else observation


class EpisodeOverError(RuntimeError):
    """``step`` was called before ``reset`` or after the episode ended."""


class EnvUnavailableError(RuntimeError):
    """An env's package or local data is missing; the message says what and where."""


@dataclass
class EnvReset:
    """What ``reset`` returns.

    Attributes:
        observation: the first observation: text, or an :class:`Observation` in a visual env.
        task: the goal of this episode in words (for the prompt's "Your task is to: ..." line).
        admissible_actions: the actions valid now, or None where the env does not enumerate them.
        info: env-specific extras (e.g. the optimal solution length, the game file).
    """

    observation: str | Observation
    task: str
    admissible_actions: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvStep:
    """What ``step`` returns.

    Attributes:
        observation: the observation after the action (text or an :class:`Observation`).
        reward: the reward of this step.
        done: True when the episode reached a terminal state (won or lost).
        info: at least ``won`` (bool), ``admissible_actions`` (list[str] | None) and
            ``invalid_action`` (bool); :class:`tether.envs.SafeEnv` adds ``fault`` (str) when the env
            crashed or hung. An env whose observation adds a note to its state (an invalid action's) may set
            :data:`STATE_KEY` to the :func:`observation_key` of the observation without it.
    """

    observation: str | Observation
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))

    @property
    def admissible_actions(self) -> list[str] | None:
        return self.info.get("admissible_actions")


@runtime_checkable
class TextEnv(Protocol):
    """A text environment (see the module docstring for the shared conventions).

    Attributes:
        name: the registry name.
        max_turns: the recommended turn budget of the rollout loop for this env.
        action_format: one instruction for the prompt saying how to write an action.
    """

    name: str
    max_turns: int
    action_format: str

    def reset(self, seed: int) -> EnvReset: ...

    def step(self, action: str) -> EnvStep: ...

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        """Returns ``(action, valid)`` for a model response (rules in :func:`parse_tagged_action`)."""
        ...

    def solution(self) -> list[str] | None:
        """Actions that win from the current state, or None if unknown, unsolvable or not running."""
        ...

    def close(self) -> None: ...

    def train_seeds(self, n: int) -> list[int]:
        """The first ``n`` seeds of the training split (disjoint from ``eval_seeds``)."""
        ...

    def eval_seeds(self, n: int) -> list[int]:
        """The first ``n`` seeds of the evaluation split."""
        ...


def normalize_action(text: str) -> str:
    """Lower-case and collapse whitespace: the key actions are compared by."""
    return " ".join(text.split()).lower()


def parse_tagged_action(response_text: str, admissible: list[str] | None = None) -> tuple[str, bool]:
    """Extract the last ``<action>...</action>`` from a response and check it.

    Args:
        response_text (str): the model's full response.
        admissible (list[str] | None): the env's current admissible actions, or None.

    Returns:
        tuple[str, bool]: the action (the admissible spelling when matched) and whether it is valid.

    >>> parse_tagged_action("<think>go</think><action> Up </action>", ["up", "down"])
    ('up', True)
    >>> parse_tagged_action("<action>up</action> then <action>jump</action>", ["up"])
    ('jump', False)
    >>> parse_tagged_action("no tags here")
    ('', False)
    """
    matches = _ACTION_TAG.findall(response_text)
    if not matches:
        return "", False
    action = " ".join(matches[-1].split())
    if not action:
        return "", False
    if admissible is None:
        return action, True
    by_key = {normalize_action(a): a for a in admissible}
    key = normalize_action(action)
    if key in by_key:
        return by_key[key], True
    return action, False


def check_can_step(name: str, started: bool, done: bool) -> None:
    """Raise :class:`EpisodeOverError` unless an episode is running."""
    if not started:
        raise EpisodeOverError(f"{name}: step() called before reset()")
    if done:
        raise EpisodeOverError(f"{name}: step() called after the episode ended; call reset(seed) first")


def train_seeds(n: int) -> list[int]:
    """The first ``n`` training seeds: ``0 .. n-1``."""
    _check_split_size(n)
    return list(range(n))


def eval_seeds(n: int) -> list[int]:
    """The first ``n`` evaluation seeds: ``EVAL_SEED_OFFSET .. EVAL_SEED_OFFSET + n - 1``."""
    _check_split_size(n)
    return list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + n))


def is_eval_seed(seed: int) -> bool:
    """True for seeds of the evaluation split."""
    return seed >= EVAL_SEED_OFFSET


def _check_split_size(n: int) -> None:
    if not 0 <= n <= EVAL_SEED_OFFSET:
        raise ValueError(f"split size must be in [0, {EVAL_SEED_OFFSET}], got {n}")
