"""A run in which nothing trains: step after step, every advantage is 0, so the policy gradient is 0.

That happens when every group's rewards are equal (all wrong, all right), when every reward was non-finite (each is
replaced by its group's lowest finite one, or 0), or when every row is masked. So does a step whose loss keeps no
token with an advantage (``actor/kept_advantage_abs_mean`` is 0): the rollout correction dropped them all, or
``algorithm.mask_truncated`` left every row out for hitting ``rollout.max_new_tokens``. A run like that spends its
budget standing still and would end with exit code 0; ``health.no_signal`` stops it (or warns) after ``patience``
such steps in a row, with the reason in one line.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from tether.config import NoSignalConfig


class NoSignalCheck:
    """Counts the steps in a row whose mean absolute advantage (``train/advantage_abs_mean``) is 0 or NaN."""

    def __init__(self, cfg: NoSignalConfig) -> None:
        self.cfg = cfg
        self.in_a_row = 0
        self.failure: str | None = None
        self._warned = False

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics in, ``health/no_signal_steps`` out; sets :attr:`failure` under ``action: stop``."""
        if self.cfg.action == "off":
            return {}
        advantage = metrics.get("train/advantage_abs_mean", math.nan)
        # with a rollout correction or algorithm.mask_truncated, only the advantages of the tokens the loss keeps
        # reach the gradient
        kept = metrics.get("actor/kept_advantage_abs_mean", advantage)
        signal = math.isfinite(advantage) and advantage > 0 and kept > 0
        self.in_a_row = 0 if signal else self.in_a_row + 1
        if self.in_a_row >= self.cfg.patience:
            message = self._message(step, metrics)
            if self.cfg.action == "stop":
                self.failure = message
            elif not self._warned:
                warnings.warn(message, stacklevel=2)
                self._warned = True
        return {"health/no_signal_steps": float(self.in_a_row)}

    def _message(self, step: int, metrics: dict[str, float]) -> str:
        faults = metrics.get("reward/faults", 0.0)
        if metrics.get("actor/kept_advantage_abs_mean") == 0.0 < metrics.get("train/advantage_abs_mean", 0.0):
            what = self._what_the_loss_dropped(metrics)
            return (f"nothing trained for {self.in_a_row} steps in a row (steps {step - self.in_a_row + 1}-{step}): "
                    f"{what}; raise health.no_signal.patience={self.cfg.patience} or set "
                    "health.no_signal.action=warn (docs/health.md)")
        why = (f"reward/faults={faults:g} so far: non-finite rewards are replaced, which leaves groups without "
               "variance" if faults else "every group's rewards were equal (all wrong or all right), or every "
               "row was masked")
        return (f"nothing trained for {self.in_a_row} steps in a row (steps {step - self.in_a_row + 1}-{step}): every "
                f"advantage was 0 ({why}); check the task's rewards and the model's answers (tether show RUN_DIR), or "
                f"raise health.no_signal.patience={self.cfg.patience} or set health.no_signal.action=warn "
                "(docs/health.md)")

    @staticmethod
    def _what_the_loss_dropped(metrics: dict[str, float]) -> str:
        """Why the loss kept no token with an advantage, though the batch had some."""
        if metrics.get("train/masked_truncated_frac") == 1.0:
            return ("algorithm.mask_truncated left every row out of the loss (train/masked_truncated_frac=1): every "
                    "response hit rollout.max_new_tokens; raise it, or set algorithm.mask_truncated=false")
        return ("the rollout correction dropped every token (rollout_corr/masked_frac="
                f"{metrics.get('rollout_corr/masked_frac', math.nan):.3g}): the engine's log-probs are far from the "
                "trainer's (health.parity's metrics) or rollout.correction's bounds are too tight")

    def state_dict(self) -> dict[str, Any]:
        return {"in_a_row": self.in_a_row, "warned": self._warned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.in_a_row, self._warned = state.get("in_a_row", 0), state.get("warned", False)
