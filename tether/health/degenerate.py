"""Collapsed-policy warning: the policy samples uniformly, or always the same tokens, or its gradient is exactly 0.

A learning rate far too high drives a policy to uniform sampling within a step or two, after which the gradient
norm can be exactly 0 and nothing more changes (issue #22: ``optim.lr=1e3``); a policy that has become deterministic
samples the same response for every member of a group, so every advantage is 0 and nothing trains either. Both runs
otherwise go on to the end, exit 0 and look like slow learning. The check reads what every step logs anyway
(``actor/entropy``, the token-mean entropy in nats, and ``actor/grad_norm``), so it costs nothing.

A step is *collapsed* when its entropy is at least ``max_entropy_frac`` of its maximum ``log(V)`` (V: the model's
vocabulary) after an earlier step below that (a randomly initialised model starts there, and is learning, not
collapsed), at most ``min_entropy``, or its gradient norm is exactly 0. ``patience`` collapsed steps in a row give
one warning line; a healthy step ends the run of them, and a later run of them warns again.
``health/degenerate_steps`` counts the collapsed steps since the start of the run.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from tether.config import DegenerateConfig


def vocab_size(model: Any) -> int | None:
    """The size of the model's output vocabulary (a VLM's text model's), which bounds the entropy: log(V)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return size if isinstance(size, int) else None


class DegenerateCheck:
    """Feed it each step's metrics (:meth:`observe`); it returns the counted metric and warns on a long run."""

    def __init__(self, cfg: DegenerateConfig, vocab_size: int | None) -> None:
        self.cfg = cfg
        self.max_entropy = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        self.steps = 0  # collapsed steps since the start
        self.in_a_row = 0
        self.warned = False  # for the current run of collapsed steps
        self.was_below_max = False  # a step's entropy was below max_entropy_frac * log(V): uniform now is a collapse

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        if not self.cfg.enabled:
            return {}
        symptom = self.symptom(metrics.get("actor/entropy"), metrics.get("actor/grad_norm"))
        if symptom is None:
            self.in_a_row, self.warned = 0, False
        else:
            self.steps += 1
            self.in_a_row += 1
            if self.in_a_row >= self.cfg.patience and not self.warned:
                warnings.warn(self._message(step, symptom), stacklevel=2)
                self.warned = True
        return {"health/degenerate_steps": float(self.steps)}

    def symptom(self, entropy: float | None, grad_norm: float | None) -> str | None:
        """What makes a step collapsed, in words, or None for a healthy step (or one whose numbers are missing or
        not finite: non-finite updates are counted and stopped by the trainer itself)."""
        if entropy is not None and math.isfinite(entropy):
            near_max = self.max_entropy is not None and entropy >= self.cfg.max_entropy_frac * self.max_entropy
            self.was_below_max = self.was_below_max or not near_max
            if near_max and self.was_below_max:
                return (f"entropy {entropy:.4g} nats per token, {entropy / self.max_entropy:.1%} of its maximum "
                        f"log(vocabulary) = {self.max_entropy:.4g}: it samples uniformly")
            if entropy <= self.cfg.min_entropy:
                return (f"entropy {entropy:.2g} nats per token: it always samples the same tokens, so every response "
                        "of a group is the same and no advantage is non-zero")
        if grad_norm == 0.0:
            return "gradient norm exactly 0: no update changes the weights"
        return None

    def _message(self, step: int, symptom: str) -> str:
        return (f"step {step}: the policy looks collapsed for {self.in_a_row} steps in a row "
                f"(health.degenerate.patience={self.cfg.patience}): {symptom}. Likely causes: optim.lr far too high; "
                "rewards equal within every group (reward/zero_adv_group_frac near 1); a reference or KL term that "
                "pins the policy. Continue from a checkpoint before it with a lower optim.lr (docs/health.md)")

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "in_a_row": self.in_a_row, "warned": self.warned,
                "was_below_max": self.was_below_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.in_a_row = state.get("steps", 0), state.get("in_a_row", 0)
        self.warned, self.was_below_max = state.get("warned", False), state.get("was_below_max", False)
