"""Multi-digit addition whose structure is a parameter: carries and answer modes (the miniature lab, docs/lab.md).

A prompt is ``"478+356"``. Two answer modes are scored alike (only the final answer after ``#`` counts):

* ``direct``: ``#834``
* ``scratchpad``: one column at a time from the right, the carry written as ``+1``, the answer growing leftwards::

      8+6=14:4,7+5+1=13:34,4+3+1=8:834#834

  The token after ``7+5`` (``+`` for a carry, ``=`` for none) is where a policy that never learned to carry
  goes wrong; that is the decisive point EAPO's prior can fix (docs/methods/eapo.md).

``overflow: {0: 0.5, 1: 0.5}`` draws half the prompts whose sum has one more digit than the terms
(``964+572``: the top column's ``9+5+1=15:1536`` writes the new leading digit, a single decisive token for a policy
that has only seen sums of ``digits`` digits); ``inner_carries`` weights the carries below the top column
(``carries`` = ``inner_carries`` + ``overflow``), so ``inner_carries: {0: 1.0}`` with those overflow weights gives
sums whose only carry, if any, is the overflow; ``train_`` and ``sft_`` variants as for carries.

Splits never share a pair ``(a, b)``: ``report`` is drawn first, then ``val`` (the selection split, used to pick
checkpoints and priors), ``train`` and ``sft`` (demonstrations for warm starts), each from its own seeded stream,
so a split does not change when a later one is resized. Each split's items are drawn with the carry-count
weights given for it; :meth:`AdditionTask.features` reports the realised fractions.
"""

from __future__ import annotations

import random
from collections import Counter

from tether.tasks.base import RewardMap, Score, TaskItem
from tether.tasks.registry import register_task

SPLIT_ORDER = ("report", "val", "train", "sft")  # draw order: earlier splits never change with later sizes
MODES = ("scratchpad", "direct")
_MAX_DRAWS = 200  # per item: a carry count the digits cannot produce fails fast instead of looping


def carries_of(a: int, b: int) -> int:
    """Number of columns that carry into the next one (the top column's carry included)."""
    count = carry = 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        count += carry
        a, b = a // 10, b // 10
    return count


def overflows(a: int, b: int, digits: int) -> int:
    """1 when ``a + b`` has more digits than the terms (the top column's carry writes a new leading digit), else 0."""
    return int(a + b >= 10 ** digits)


def scratchpad(a: int, b: int) -> str:
    """The column-by-column working of ``a + b`` (module docstring), ending in ``#<sum>``."""
    da, db = str(a)[::-1], str(b)[::-1]
    width = max(len(da), len(db))
    parts, suffix, carry = [], "", 0
    for i in range(width):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        total = x + y + carry
        lhs = f"{x}+{y}" + ("+1" if carry else "")
        suffix = (str(total) if i == width - 1 else str(total % 10)) + suffix
        parts.append(f"{lhs}={total}:{suffix}")
        carry = int(total >= 10)
    return ",".join(parts) + f"#{a + b}"


def demonstration(a: int, b: int, mode: str) -> str:
    """The response a demonstrator gives in ``mode`` (``scratchpad`` or ``direct``)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    return scratchpad(a, b) if mode == "scratchpad" else f"#{a + b}"


def extract_final(text: str) -> str | None:
    """The digits after the last ``#`` (up to the first non-digit), or None when there is no ``#`` or no digit."""
    if "#" not in text:
        return None
    tail = text.rsplit("#", 1)[1].strip()
    digits = ""
    for ch in tail:
        if not ch.isdigit():
            break
        digits += ch
    return digits or None


def response_mode(text: str) -> str:
    """``scratchpad`` when the text works a column (an ``=`` before the final ``#``), else ``direct``."""
    return "scratchpad" if "=" in text.rsplit("#", 1)[0] else "direct"


def _weights(given: dict[int, float] | None, most: int, where: str, what: str = "carry counts") -> dict[int, float]:
    """Weights over counts, checked: keys in 0..most, weights >= 0 with a positive sum."""
    if given is None:
        return {}
    weights = {int(k): float(v) for k, v in given.items()}
    bad = [k for k in weights if not 0 <= k <= most]
    if bad or any(v < 0 for v in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"{where}={given!r}: keys must be {what} 0..{most} and weights >= 0 with a positive sum")
    return weights


def _split_weights(given: dict[int, float] | None, train: dict[int, float] | None, sft: dict[int, float] | None,
                   most: int, name: str, what: str) -> dict[str, dict[int, float]]:
    """Each split's weights: ``given`` for val and report, ``train_<name>`` and ``sft_<name>`` where set."""
    weights = _weights(given, most, name, what)
    return {"train": _weights(train, most, f"train_{name}", what) if train is not None else weights,
            "val": weights, "report": weights,
            "sft": _weights(sft, most, f"sft_{name}", what) if sft is not None else weights}


@register_task("addition")
class AdditionTask:
    """``digits``-digit addition with train / val (selection) / report / sft splits; see the module docstring."""

    def __init__(self, *, digits: int = 3, train_size: int = 64, val_size: int = 256, report_size: int = 512,
                 sft_size: int = 0, seed: int = 0, carries: dict[int, float] | None = None,
                 sft_carries: dict[int, float] | None = None, train_carries: dict[int, float] | None = None,
                 overflow: dict[int, float] | None = None, train_overflow: dict[int, float] | None = None,
                 sft_overflow: dict[int, float] | None = None, inner_carries: dict[int, float] | None = None,
                 train_inner_carries: dict[int, float] | None = None,
                 sft_inner_carries: dict[int, float] | None = None, sft_scratchpad: float = 1.0, sft_recall: int = 0,
                 correct_reward: float = 1.0, wrong_reward: float = 0.0, system_prompt: str | None = None) -> None:
        if not 1 <= digits <= 9:
            raise ValueError(f"digits={digits}: use 1 to 9")
        if not 0 <= sft_scratchpad <= 1:
            raise ValueError(f"sft_scratchpad={sft_scratchpad}: a share, 0 to 1")
        if sft_recall < 0:
            raise ValueError(f"sft_recall={sft_recall}: copies of each training sum, 0 or more")
        sizes = {"train": train_size, "val": val_size, "report": report_size, "sft": sft_size}
        if any(n < 0 for n in sizes.values()) or train_size == 0 or val_size == 0:
            raise ValueError(f"split sizes {sizes}: train and val need at least one item, none may be negative")
        self.digits, self.seed, self.sft_recall = digits, seed, sft_recall
        self.name = f"addition/{digits}digit"
        self.system_prompt = system_prompt
        self.reward = RewardMap(mode="binary", correct=correct_reward, wrong=wrong_reward)
        carry_weights = _split_weights(carries, train_carries, sft_carries, digits, "carries", "carry counts")
        overflow_weights = _split_weights(overflow, train_overflow, sft_overflow, 1, "overflow",
                                          "overflow flags")  # 1: the sum has one more digit than the terms
        inner_weights = _split_weights(inner_carries, train_inner_carries, sft_inner_carries, digits - 1,
                                       "inner_carries", "carry counts below the top column")
        self.reports_overflow = any(overflow_weights.values())
        taken: set[tuple[int, int]] = set()
        self.splits: dict[str, list[TaskItem]] = {}
        for split in SPLIT_ORDER:
            conditions = {"carries": carry_weights[split], "overflow": overflow_weights[split],
                          "inner_carries": inner_weights[split]}
            self.splits[split] = self._draw(split, sizes[split], conditions, taken, sft_scratchpad)

    @property
    def train(self) -> list[TaskItem]:
        return self.splits["train"]

    @property
    def val(self) -> list[TaskItem]:
        return self.splits["val"]

    def _draw(self, split: str, n: int, conditions: dict[str, dict[int, float]], taken: set[tuple[int, int]],
              scratchpad_share: float) -> list[TaskItem]:
        """``n`` new pairs; for each, a wanted value of every weighted quantity (``carries``, ``overflow``,
        ``inner_carries``) is drawn in that order, then pairs until one has them all."""
        rng = random.Random(f"addition/{self.seed}/{self.digits}/{split}")
        low, high = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10 ** self.digits - 1
        items = []
        for index in range(n):
            # a value is drawn only for a weighted quantity, so the splits of a task without the later ones stay
            # what they were
            want = {name: rng.choices(list(w), list(w.values()))[0] for name, w in conditions.items() if w}
            for _ in range(_MAX_DRAWS):
                a, b = rng.randint(low, high), rng.randint(low, high)
                if (a, b) not in taken and (not want or all(
                        q == want.get(name, q) for name, q in self._quantities(a, b).items())):
                    break
            else:
                wanted = ", ".join(f"{name}={v}" for name, v in want.items())
                raise ValueError(f"addition: could not draw a new {self.digits}-digit pair with {wanted} for split "
                                 f"{split!r} in {_MAX_DRAWS} tries; lower that split's size or weight (overflow 1 "
                                 "needs at least one carry; carries = inner_carries + overflow)")
            taken.add((a, b))
            mode = "scratchpad" if rng.random() < scratchpad_share else "direct"
            items.append(TaskItem(prompt=f"{a}+{b}", answer=str(a + b), id=f"addition/{split}/{index}",
                                  meta={"a": a, "b": b, "carries": carries_of(a, b),
                                        "overflow": overflows(a, b, self.digits), "mode": mode}))
        return items

    def _quantities(self, a: int, b: int) -> dict[str, int]:
        """What the weights condition on, for the pair ``(a, b)``."""
        carries, overflow = carries_of(a, b), overflows(a, b, self.digits)
        return {"carries": carries, "overflow": overflow, "inner_carries": carries - overflow}

    def sft_items(self, limit: int | None = None) -> list[TaskItem]:
        """What ``tether sft`` (data: task) demonstrates: the first ``limit`` sft items, then ``sft_recall``
        copies of each training sum answered directly. The copies model a warm start that has seen its RL
        prompts' answers (the ARMOR study, docs/methods/armor.md): it can recall some of them without working."""
        recall = [TaskItem(item.prompt, item.answer, meta={**item.meta, "mode": "direct"}, id=f"{item.id}/recall{k}")
                  for k in range(self.sft_recall) for item in self.train]
        return self.splits["sft"][:limit] + recall

    def demonstration(self, item: TaskItem) -> str:
        """The demonstrated response of an item (its ``meta["mode"]``; sft items draw it with ``sft_scratchpad``)."""
        return demonstration(item.meta["a"], item.meta["b"], item.meta.get("mode", "scratchpad"))

    def features(self) -> dict[str, dict[str, float]]:
        """Per split, the fraction of items with each carry count (``carries=k``), with and without overflow
        (``overflow=k``, when overflow weights were given) and, for sft, each mode."""
        out = {}
        for split, items in self.splits.items():
            if not items:
                continue
            counts = Counter(f"carries={item.meta['carries']}" for item in items)
            if self.reports_overflow:
                counts.update(f"overflow={item.meta['overflow']}" for item in items)
            if split == "sft":
                counts.update(f"mode={item.meta['mode']}" for item in items)
            out[split] = {key: counts[key] / len(items) for key in sorted(counts)}
        return out

    def response_features(self, item: TaskItem, response_text: str) -> dict[str, bool]:
        """Which mode a response answers in (``mode/scratchpad``, ``mode/direct``), for validation metrics; with
        overflow weights also whether its prompt overflows (``overflow``: its share and the accuracy on those)."""
        mode = response_mode(response_text)
        features = {f"mode/{m}": mode == m for m in MODES}
        if self.reports_overflow:
            features["overflow"] = item.meta["overflow"] == 1
        return features

    def score(self, item: TaskItem, response_text: str) -> Score:
        extracted = extract_final(response_text)
        correct = extracted is not None and extracted == item.answer
        return Score(reward=self.reward(float(correct), correct), correct=correct, extracted=extracted)
