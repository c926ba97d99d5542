"""EZPoints: two playing cards; build a formula equal to 12, one symbol per step (SEED's EZPoints).

Reconstructed from the rules of gym-cards' ``EZPointEnv`` (RL4VLM, Zhai et al. 2024; SEED trains
Qwen2.5-VL-3B on it for 8 steps), written anew here; the cards are drawn with PIL, not read from files.

* **Cards.** The first card's rank is uniform over 2..K, its value the rank with J, Q, K worth 10. The
  second card's value makes 12 reachable: with probability 1/2 ``12 // first`` when the first value
  divides 12 (2, 3, 4, 6), else ``12 - first``. Suits are uniform; the two cards are swapped with
  probability 1/2. Values are therefore in 2..10, and a 10 is drawn as T, J, Q or K.
* **Actions** (13): the numbers ``1`` .. ``10``, ``+``, ``*`` and ``=``, one per step, in ``<action>`` tags
  (SEED asks for a JSON ``"action"`` field instead; tether's envs share the tag format).
* **Dynamics.** A number or operator is appended to the formula; numbers and operators must alternate (in
  gym-cards adjacent numbers concatenate under ``eval``, but with card values 2..10 no concatenation
  makes 12, so the same formulas win). A number is *illegal* when the cards do
  not hold it that many times: as in gym-cards the formula then gets a blank (it can no longer evaluate),
  the reward is -1 and the episode goes on. ``=`` ends the episode: reward 10 (won) when the formula
  evaluates to 12 and both cards are used, else -1. A step taken once the formula holds more than 5
  symbols ends the episode with -1 (gym-cards' length limit). Other steps give 0.
* **Unrecognised actions** (not one of the 13) follow tether's convention: a no-op, reward 0,
  ``info["invalid_action"]`` True.

Observation: the image of the two cards on a green table, with the formula as text (``observation=
"text"`` names the cards in words instead, for debugging without a vision model).
"""

from __future__ import annotations

import importlib.util
import itertools
import random
from typing import Any

from tether.envs.base import (
    IMAGE_PLACEHOLDER,
    NEEDS_PILLOW,
    STATE_KEY,
    EnvReset,
    EnvStep,
    Observation,
    check_can_step,
    escape_placeholders,
    eval_seeds,
    normalize_action,
    observation_key,
    parse_tagged_action,
    require_pillow,
    train_seeds,
)

TARGET = 12
NUMBERS = [str(n) for n in range(1, 11)]
OPERATORS = ["+", "*", "="]
ACTIONS = NUMBERS + OPERATORS
MAX_FORMULA = 5  # a step on a longer formula ends the episode (gym-cards)
MIN_CARD_PX = 16  # below this the rank and the pip no longer fit on a card
SUITS = {"H": "hearts", "D": "diamonds", "S": "spades", "C": "clubs"}
RANK_NAMES = {11: "J", 12: "Q", 13: "K", 10: "10"}


def draw_cards(rng: random.Random) -> list[tuple[str, str]]:
    """Two ``(rank, suit)`` cards whose values can make 12 (module docstring)."""
    first = rng.randint(2, 13)
    value = min(first, 10)
    second = TARGET // value if TARGET % value == 0 and rng.random() <= 0.5 else TARGET - value
    cards = [(RANK_NAMES.get(first, str(first)), rng.choice(list(SUITS))),
             (RANK_NAMES.get(second, str(second)), rng.choice(list(SUITS)))]
    if rng.random() <= 0.5:
        cards.reverse()
    return cards


def card_value(rank: str) -> int:
    """Face cards are worth 10."""
    return 10 if rank in ("J", "Q", "K") else int(rank)


def evaluate(formula: list[str]) -> int | None:
    """The value of a formula of numbers, ``+`` and ``*`` (usual precedence); None if it is not well formed."""
    if not formula or len(formula) % 2 == 0:
        return None
    terms, product = [], None
    for i, symbol in enumerate(formula):
        is_number = symbol in NUMBERS
        if is_number != (i % 2 == 0):
            return None  # numbers and operators must alternate; a blank (illegal number) is neither
        if is_number:
            product = int(symbol) if product is None else product * int(symbol)
        elif symbol == "+":
            terms.append(product)
            product = None
    return sum(terms) + product


def render_table(cards: list[tuple[str, str]], card_px: int = 112) -> Any:
    """The two cards side by side on a green table, as an RGB ``PIL.Image``."""
    from PIL import Image, ImageDraw, ImageFont

    w, h = card_px, card_px * 7 // 5
    margin = card_px // 8
    image = Image.new("RGB", (2 * w + 3 * margin, h + 2 * margin), (53, 101, 77))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=card_px // 3)
    for i, (rank, suit) in enumerate(cards):
        x, y = margin + i * (w + margin), margin
        draw.rounded_rectangle((x, y, x + w, y + h), radius=card_px // 10, fill="white", outline="black")
        colour = (200, 30, 30) if suit in "HD" else (20, 20, 20)
        draw.text((x + w // 2, y + h // 3), rank, fill=colour, font=font, anchor="mm")
        _draw_suit(draw, suit, (x + w // 2, y + 2 * h // 3), card_px // 5, colour)
    return image


def _draw_suit(draw: Any, suit: str, centre: tuple[int, int], size: int, colour: tuple[int, int, int]) -> None:
    """A suit pip of about ``size`` pixels from simple shapes (no font has to carry the glyphs)."""
    cx, cy = centre
    r = size // 2
    if suit == "D":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
        return
    stem = [(cx, cy), (cx - r // 2, cy + r), (cx + r // 2, cy + r)]
    if suit == "H":
        draw.ellipse((cx - r, cy - r, cx, cy), fill=colour)
        draw.ellipse((cx, cy - r, cx + r, cy), fill=colour)
        draw.polygon([(cx - r, cy - r // 2), (cx + r, cy - r // 2), (cx, cy + r)], fill=colour)
    elif suit == "S":
        draw.polygon([(cx, cy - r), (cx + r, cy + r // 3), (cx - r, cy + r // 3)], fill=colour)
        draw.polygon(stem, fill=colour)
    else:  # clubs: three leaves and a stem
        q = r // 2
        for dx, dy in ((0, -q), (-q, q // 2), (q, q // 2)):
            draw.ellipse((cx + dx - q, cy + dy - q, cx + dx + q, cy + dy + q), fill=colour)
        draw.polygon(stem, fill=colour)


class EZPointsEnv:
    """EZPoints (module docstring: cards, actions, rewards).

    Args:
        observation: "image" (an :class:`~tether.envs.base.Observation`: the cards' image and the
            formula as text) or "text" (the cards in words, for debugging).
        card_px: width of a card in the image, in pixels.
    """

    name = "ezpoints"
    max_turns = 8
    action_format = ("Reply with exactly one symbol inside <action> </action> tags: a number from 1 to 10, "
                     "+, * or =, e.g. <action>+</action>.")
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, observation: str = "image", card_px: int = 112, **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if observation not in ("image", "text"):
            raise ValueError(f"observation must be 'image' or 'text', got {observation!r}")
        if card_px < MIN_CARD_PX:
            raise ValueError(f"card_px must be >= {MIN_CARD_PX}, got {card_px}")

    @staticmethod
    def check_inputs(*, observation: str = "image", **_: object) -> None:
        """Pillow is here when the cards are drawn (``tether validate`` and the start of a run ask)."""
        if observation == "image" and importlib.util.find_spec("PIL") is None:
            raise ValueError(NEEDS_PILLOW)

    def __init__(self, *, observation: str = "image", card_px: int = 112) -> None:
        self.check_config(observation=observation, card_px=card_px)
        if observation == "image":
            require_pillow()
        self.observation, self.card_px = observation, card_px
        self.cards: list[tuple[str, str]] = []
        self.formula: list[str] = []
        self._image: Any = None
        self._done = False

    @property
    def renders_images(self) -> bool:
        """True when observations carry images (the collector then needs a vision-language processor)."""
        return self.observation == "image"

    @property
    def values(self) -> list[int]:
        return [card_value(rank) for rank, _ in self.cards]

    def reset(self, seed: int) -> EnvReset:
        self.cards = draw_cards(random.Random(seed))
        self.formula, self._done = [], False
        self._image = render_table(self.cards, self.card_px) if self.observation == "image" else None
        task = (f"Build a formula that equals {TARGET} from the numbers on the two cards, one symbol per step. "
                "Use each card's number exactly once (J, Q and K count as 10); you may use + and *. "
                "Finish with = to submit the formula.")
        return EnvReset(observation=self._observe(), task=task, admissible_actions=list(ACTIONS),
                        info={"cards": [r + s for r, s in self.cards]})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, bool(self.cards), self._done)
        symbol = normalize_action(action)
        if symbol not in ACTIONS:
            note = f"Invalid action '{escape_placeholders(action)}'; the valid actions are 1-10, +, * and =."
            step = self._result(self._observe(note), 0.0, invalid=True)
            step.info[STATE_KEY] = observation_key(self._observe())
            return step
        if len(self.formula) > MAX_FORMULA:
            self._done = True
            return self._result(self._observe("The formula is too long."), -1.0)
        if symbol in NUMBERS and not self._can_use(symbol):
            self.formula.append(" ")  # gym-cards: the blank keeps the formula growing and unevaluable
            return self._result(self._observe(f"No card left with the number {symbol}."), -1.0)
        if symbol == "=":
            self._done = True
            won = self._solved(self.formula)
            return self._result(self._observe(), 10.0 if won else -1.0, won=won)
        self.formula.append(symbol)
        return self._result(self._observe(), 0.0)

    def _can_use(self, number: str) -> bool:
        return self.formula.count(number) < self.values.count(int(number))

    def _solved(self, formula: list[str]) -> bool:
        used = sorted(int(s) for s in formula if s in NUMBERS)
        return used == sorted(self.values) and evaluate(formula) == TARGET

    def _result(self, obs: str | Observation, reward: float, *, won: bool = False,
                invalid: bool = False) -> EnvStep:
        info = {"won": won, "admissible_actions": list(ACTIONS), "invalid_action": invalid,
                "formula": " ".join(self.formula)}
        return EnvStep(observation=obs, reward=reward, done=self._done, info=info)

    def _observe(self, note: str = "") -> str | Observation:
        formula = f"Formula: {' '.join(self.formula)}".rstrip()
        prefix = f"{note}\n" if note else ""
        if self.observation == "text":
            cards = " and ".join(f"{rank} of {SUITS[suit]}" for rank, suit in self.cards)
            return f"{prefix}Cards: {cards}.\n{formula}"
        return Observation(f"{prefix}{IMAGE_PLACEHOLDER}\n{formula}", (self._image,))

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, ACTIONS)

    def solution(self) -> list[str] | None:
        """The shortest winning continuation of the current formula, or None if there is none."""
        if not self.cards or self._done:
            return None
        room = MAX_FORMULA - len(self.formula)  # "=" on a formula of more than 5 symbols loses
        alphabet = [*sorted(set(str(v) for v in self.values)), "+", "*"]
        for k in range(room + 1):
            for tail in itertools.product(alphabet, repeat=k):
                if self._solved(self.formula + list(tail)):
                    return [*tail, "="]
        return None

    def close(self) -> None:
        self.cards, self.formula, self._image = [], [], None
