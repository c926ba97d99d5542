"""Over-optimisation guard: validation falls from its peak while the training reward keeps rising.

Small models trained with RL often climb on the training reward while the held-out score peaks and collapses
(open-r1 #538: MATH-500 55.4 -> 18.2; open-rs #21), which is ARMOR's subject. The guard tracks
``train.best_metric``'s peak, which is also the validation that wrote ``checkpoints/best``, and the mean training
reward over the steps before each validation. A *collapse* is ``patience`` validations in a row more than ``drop``
below the peak while that mean reward is above its value at the peak. Then, by ``action``: a warning, or
:attr:`CollapseGuard.failure`, which stops the run (``stop``). Continuing from the peak with ARMOR after a collapse
is a recipe (``tether recipe armor CONFIG --after-collapse``, :mod:`tether.recipes.armor`), which runs stage 1 with
``stop``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from tether.config import CollapseConfig


class CollapseGuard:
    """Feed it each step's training reward (:meth:`observe_train`) and each validation (:meth:`observe_val`)."""

    def __init__(self, cfg: CollapseConfig, metric: str, best_dir: Path, from_step: int = 0) -> None:
        # from_step: train.best_from_step; an earlier validation never becomes checkpoints/best, so it is not the
        # peak the message sends the user (and `tether recipe armor --after-collapse`) back to
        self.cfg, self.metric, self.best_dir, self.from_step = cfg, metric, best_dir, from_step
        self.peak, self.peak_step = -math.inf, 0
        self.peak_reward: float | None = None  # mean training reward before the peak (or just after it)
        self.below = 0  # validations in a row more than ``drop`` below the peak
        self.window: list[float] = []  # training rewards since the last validation
        self.warned = False
        self.failure: str | None = None
        self.failed_at: int | None = None  # the step whose validation completed the collapse

    def observe_train(self, reward: float | None) -> None:
        if reward is not None and math.isfinite(reward):
            self.window.append(reward)

    def observe_val(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        value = metrics.get(self.metric)
        if self.cfg.action == "off" or value is None:
            return {}
        reward = sum(self.window) / len(self.window) if self.window else None
        self.window = []
        if step < self.from_step:
            return {}
        if value > self.peak:
            self.peak, self.peak_step, self.peak_reward, self.below, self.warned = value, step, reward, 0, False
        else:
            if self.peak_reward is None:  # the peak came before any training (step 0): the first window is the base
                self.peak_reward = reward
            self.below = self.below + 1 if value < self.peak - self.cfg.drop else 0
            rising = reward is not None and self.peak_reward is not None and reward > self.peak_reward
            if self.below >= self.cfg.patience and rising:
                self._collapse(step, value, reward)
        return {"health/val_peak": self.peak, "health/val_below_peak": self.peak - value,
                "health/val_drops": float(self.below)}

    def _collapse(self, step: int, value: float, reward: float) -> None:
        text = (f"over-optimisation: {self.metric} peaked at {self.peak:.4g} at step {self.peak_step} and has been "
                f"more than {self.cfg.drop} below it for {self.below} validations (now {value:.4g} at step {step}) "
                f"while the mean training reward rose from {self.peak_reward:.4g} to {reward:.4g}. The peak's weights "
                f"are in {self.best_dir}; ")
        text += ("continue from them with a lower learning rate, a KL term (algorithm.kl.coef) or ARMOR "
                 "(tether recipe armor CONFIG --after-collapse, or methods.armor). health.collapse.action sets "
                 "off/warn/stop (docs/health.md).")
        if self.cfg.action == "stop":
            self.failure, self.failed_at = text, step
        elif not self.warned:
            warnings.warn(text, stacklevel=2)
            self.warned = True

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("peak", "peak_step", "peak_reward", "below", "window", "warned")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
