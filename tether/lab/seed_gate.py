"""The third SEED design's gate, read where the distillation signal acts (issue #42; docs/methods/seed.md,
"Evidence, third design"). Thresholds registered in ``configs/lab/seed/third/protocol.yaml`` before its warm start
existed.

The signal is the teacher's shift of a sampled move's log-probability, delta = log pi(a | h + skill) - log pi(a | h)
over the row's response. Read on the mean over all rows it says little: a policy already sure of its safe moves
(log-probability near 0) leaves a skill no room to raise them, and fork rows (where the naive move steps on ``~``)
are a few percent of all rows. So the gate reads it where the lesson changes the move and where it must not hurt:

* **on the warm start** (``scripts/lab/seed_precheck.py``, its ``positive_control``): the skill raises the *safe*
  move at fork rows, sampled or not (``fork_safe_move``), by at least :data:`FORK_SAFE_MOVE_MIN` nats on average,
  with the mean two standard errors above 0 over at least :data:`MIN_FORK_ROWS` rows; it lowers the sampled moves
  onto ``~`` at forks (``fork_fatal``, upper two-standard-error bound below 0, where at least
  :data:`MIN_FATAL_ROWS` were sampled); and it lowers the other sampled moves (non-ice rows, ``safe``) by less
  than :data:`NON_ICE_MIN` on average;
* **during training** (``scripts/lab/seed_mechanism.py``, the SEED arm's ``metrics.jsonl``: each run's mean over
  its steps, then the mean over runs): ``seed/delta_fork_safe`` > 0, ``seed/delta_fork_fatal`` < 0 and
  ``seed/delta_safe`` >= :data:`NON_ICE_MIN`.
"""

from __future__ import annotations

import math
from typing import Any

FORK_SAFE_MOVE_MIN = 1.0  # nats: the skill at least e-folds the safe move's probability at a fork
NON_ICE_MIN = -0.10  # nats: on moves not onto ~ the teacher may be at most ~10% less sure than the student
MIN_FORK_ROWS = 20  # fork rows the warm-start reading needs (32 selection maps x 4 episodes give ~60)
MIN_FATAL_ROWS = 5  # sampled moves onto ~ at forks below which their sign is not read


def _check(value: float, passed: bool, threshold: str, rows: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"value": value, "threshold": threshold, "passed": bool(passed)}
    return out if rows is None else {**out, "rows": rows}


def warm_start_gate(control: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The warm-start reading from the precheck's ``positive_control`` (kind -> rows, delta_mean, delta_se)."""
    safe_move, fatal, non_ice = control["fork_safe_move"], control["fork_fatal"], control["safe"]
    n, mean, se = int(safe_move["rows"]), safe_move["delta_mean"], safe_move["delta_se"]
    checks = {"fork_safe_move": _check(mean, n >= MIN_FORK_ROWS and mean >= FORK_SAFE_MOVE_MIN and mean - 2 * se > 0,
                                       f">= {FORK_SAFE_MOVE_MIN} and mean - 2 se > 0 over >= {MIN_FORK_ROWS} rows",
                                       n),
              "non_ice": _check(non_ice["delta_mean"], non_ice["delta_mean"] >= NON_ICE_MIN, f">= {NON_ICE_MIN}",
                                int(non_ice["rows"]))}
    m = int(fatal["rows"])
    if m >= MIN_FATAL_ROWS:
        checks["fork_fatal"] = _check(fatal["delta_mean"], fatal["delta_mean"] + 2 * fatal["delta_se"] < 0,
                                      "mean + 2 se < 0", m)
    else:  # the policy rarely stepped on ~ at a fork: nothing for the teacher to lower, nothing to read
        checks["fork_fatal"] = _check(fatal["delta_mean"], True, f"not read below {MIN_FATAL_ROWS} rows", m)
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}


def training_gate(means: dict[str, float]) -> dict[str, Any]:
    """The training reading from one arm's metric means (``seed/delta_fork_safe``, ``seed/delta_fork_fatal``,
    ``seed/delta_safe``); a metric the arm never logged fails its check (the gate was not read)."""
    nan = float("nan")
    fork_safe, fork_fatal, non_ice = (means.get(f"seed/delta_{k}", nan) for k in ("fork_safe", "fork_fatal", "safe"))
    checks = {"fork_safe": _check(fork_safe, fork_safe > 0, "> 0"),
              "fork_fatal": _check(fork_fatal, fork_fatal < 0, "< 0"),
              "non_ice": _check(non_ice, non_ice >= NON_ICE_MIN, f">= {NON_ICE_MIN}")}
    read = all(math.isfinite(c["value"]) for c in checks.values())
    return {"checks": checks, "passed": read and all(c["passed"] for c in checks.values())}
