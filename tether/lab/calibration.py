"""The calibration a protocol runs before any comparison: does the endpoint move on the selection split by the
movement ``calibration.min_movement`` asks, in this setting?

Every value is read from the runs' own validation on the selection split (``metrics.jsonl``), so the endpoint
split is not read unless it is the selection split (``endpoint.split: val`` with ``at: final``). The start is step
0's validation and the end is the step the protocol's ``endpoint.at`` picks (``best.txt`` for ``best``,
``checkpoints/latest`` for ``final``), except a rise's, always the last step (:meth:`Calibration.end_at`). The
movement per seed is

* ``positive_control``: the control arm's endpoint value minus the baseline's, paired by seed;
* ``fall``: the arm's start minus its endpoint (the collapse a study of forgetting rests on);
* ``rise``: the arm's last step minus its start.

The calibration passes when the mean movement over its seeds reaches ``min_movement`` and its 95% interval lies
above 0: a mean alone let noise pass (with 5 seeds, 38 of 400 calibrations of runs that did not move reached a
``min_movement`` of 0.05), so the movement must also be told apart from none. Each movement is a paired difference
(control minus baseline, start minus end, end minus start), read as a comparison's is (:func:`stats.paired_difference`):
movements all equal (up to float rounding) have no spread, so no interval, and a mean that reaches ``min_movement``
is then *spread not estimable*, not passed (a zero-width interval "above 0" passed such a calibration on its mean
alone); so is one seed's movement, which has no spread to estimate (it failed, so every comparison read *not
testable in this setting*, a claim about the setting one seed cannot make). A mean below it fails all the same.
It is incomplete while a run it needs has not finished training, or lacks a validation it reads, or that
validation is not finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.lab import stats
from tether.lab.protocol import Protocol
from tether.track import read_metrics

BEST_STEP = re.compile(r"step=(\d+)")
PASSED, FAILED, INCOMPLETE = "passed", "failed", "incomplete"
# neither passed nor failed: the mean reaches the minimum, but equal movements (or one seed's) give no interval to
# hold above 0
NOT_ESTIMABLE = stats.SPREAD_NOT_ESTIMABLE


def selection_values(directory: Path, metric: str) -> dict[int, float]:
    """step -> the metric on the selection split, from the run's ``metrics.jsonl`` (a later row of a step wins:
    a resumed run logs its steps again)."""
    path = directory / "metrics.jsonl"
    values: dict[int, float] = {}
    if not path.is_file():
        return values
    for row in read_metrics(path):  # a line cut by a kill, or not an object, is skipped
        if metric in row and "step" in row:
            values[int(row["step"])] = float(row[metric])
    return values


def endpoint_step(directory: Path, at: str) -> int:
    """The step of the endpoint checkpoint: the validation that wrote ``checkpoints/best`` (``best.txt``), or the
    step directory ``checkpoints/latest`` names.

    Raises:
        RuntimeError: the run wrote neither (no validation became the best, or no step was saved).
    """
    path = directory / ("best.txt" if at == "best" else "checkpoints/latest")
    if not path.is_file():
        raise RuntimeError(f"{directory}: no {path.name}, so no endpoint checkpoint (endpoint.at={at})")
    if at == "best":
        found = BEST_STEP.search(path.read_text())
        if found is None:
            raise RuntimeError(f"{path} names no step")
        return int(found.group(1))
    return int(path.read_text().strip().removeprefix("step_"))


def trained(directory: Path) -> bool:
    """The runner writes ``trained.json`` when a run's training exited cleanly."""
    return (directory / "trained.json").is_file()


def measure(protocol: Protocol, locate: Callable[[str, int], Path]) -> dict[str, Any]:
    """The calibration's movement per seed, its mean and interval, and whether it passed (``status``).

    ``locate(arm, seed)`` is the run directory of one run (a pooled report's runs live under several roots).
    """
    c = protocol.calibration
    metric = protocol.endpoint.metric
    measured = c.measured_arm(protocol.baseline)
    seeds = protocol.calibration_seeds()
    missing = [f"{arm}/seed{seed}" for arm in protocol.calibration_arms() for seed in seeds
               if not trained(locate(arm, seed))]
    result: dict[str, Any] = {"kind": c.kind, "arm": measured, "metric": metric, "split": "val (selection)",
                              "min_movement": c.min_movement, "seeds": seeds, "why": c.why,
                              "added_after_registration": c.added_after_registration, "missing": missing}
    if missing:
        return {**result, "status": INCOMPLETE, "per_seed": {}, "mean": None}
    try:
        ends = {seed: movement_ends(protocol, locate, seed) for seed in seeds}
    except RuntimeError as err:  # a trained run without the validation the calibration reads
        return {**result, "status": INCOMPLETE, "per_seed": {}, "mean": None, "missing": [str(err)]}
    return {**result, "per_seed": {s: a - b for s, (a, b) in ends.items()},
            **judged({s: e[0] for s, e in ends.items()}, {s: e[1] for s, e in ends.items()}, c.min_movement)}


def judged(first: dict[int, float], second: dict[int, float], min_movement: float) -> dict[str, Any]:
    """The status, mean and interval of a calibration whose movement per seed is ``first - second``, by today's
    rules: what :func:`measure` derives from the two ends, and a report rebuilt from a published ``report.json``
    from the recorded movements (``second`` 0)."""
    diff = stats.paired_difference(first, second)
    return {"status": verdict(diff, min_movement), "mean": diff.mean, "ci_low": diff.low, "ci_high": diff.high}


def verdict(diff: stats.Interval, min_movement: float) -> str:
    """Passed when the mean reaches ``min_movement`` and the 95% interval lies above 0; failed when either falls
    short, except that a mean which reaches it with no estimate of the movements' spread is neither: there is no
    interval to hold above 0, yet nothing shows the setting cannot move the endpoint either. The spread has no
    estimate with movements all equal (:func:`stats.spread_not_estimable`) or a single seed (NaN ``sd``, an
    unbounded interval)."""
    if diff.mean < min_movement:
        return FAILED
    if diff.n < 2 or stats.spread_not_estimable(diff):
        return NOT_ESTIMABLE
    return PASSED if diff.low > 0 else FAILED


def movement_ends(protocol: Protocol, locate: Callable[[str, int], Path], seed: int) -> tuple[float, float]:
    """The two values one seed's movement is the difference of (the first minus the second)."""
    c = protocol.calibration
    metric, at = protocol.endpoint.metric, c.end_at(protocol.endpoint.at)
    arm = c.measured_arm(protocol.baseline)
    if c.kind == "positive_control":
        control, baseline = locate(arm, seed), locate(protocol.baseline, seed)
        [lifted] = values_at(control, metric, [endpoint_step(control, at)])
        [base] = values_at(baseline, metric, [endpoint_step(baseline, at)])
        return lifted, base
    directory = locate(arm, seed)
    start, end = values_at(directory, metric, [0, endpoint_step(directory, at)])  # one read of its metrics.jsonl
    return (start, end) if c.kind == "fall" else (end, start)


def values_at(directory: Path, metric: str, steps: list[int]) -> list[float]:
    """The metric's selection-split values at ``steps``, in order.

    Raises:
        RuntimeError: no validation at one of them, or a non-finite one (a NaN would compare below any minimum and
            fail the calibration, which would end the study as not testable).
    """
    values = selection_values(directory, metric)
    for step in steps:
        if step not in values:
            raise RuntimeError(f"{directory}: no validation of {metric!r} on the selection split at step {step}")
        if not math.isfinite(values[step]):
            raise RuntimeError(f"{directory}: {metric!r} on the selection split at step {step} is {values[step]}")
    return [values[step] for step in steps]
