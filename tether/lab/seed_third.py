"""The third SEED design's registered rules (issue #42; docs/methods/seed.md, "Evidence, third design"), written
in ``configs/lab/seed/third/protocol.yaml`` before its warm start existed: the gate read where the distillation
signal acts, and the GRPO pilot that fixes the stage-2 length, this setting's GRPO value, the test size and the
seeds.

**The gate.** The signal is the teacher's shift of a sampled move's log-probability, delta = log pi(a | h + skill)
- log pi(a | h) over the row's response. Read on the mean over all rows it says little: a policy already sure of
its safe moves (log-probability near 0) leaves a skill no room to raise them, and fork rows (where the naive move
steps on ``~``) are a few percent of all rows. So the gate reads it where the lesson changes the move and where it
must not hurt:

* **on the warm start** (``scripts/lab/seed_precheck.py``, its ``positive_control``): the skill raises the *safe*
  move at fork rows, sampled or not (``fork_safe_move``), by at least :data:`FORK_SAFE_MOVE_MIN` nats on average,
  with the mean two standard errors above 0 over at least :data:`MIN_FORK_ROWS` rows; at forks it lowers the
  sampled moves onto ``~`` (``fork_fatal``, upper two-standard-error bound below 0) and raises the sampled safe
  ones (``safe_at_fork``, lower bound above 0), each read where at least :data:`MIN_SAMPLED_ROWS` were sampled;
  and it lowers the other sampled moves (non-ice rows, ``safe``) by less than :data:`NON_ICE_MIN` on average;
* **on the calibration's teacher** (the precheck's ``opsd_hint``): the same two thresholds for the safe move at
  forks and the non-ice rows with OPSD's privileged hint in place of the skill. A policy that does not read the
  hint gives the positive control nothing to distil, and a control that cannot work calibrates nothing;
* **during training** (``scripts/lab/seed_mechanism.py``, the SEED arm's ``metrics.jsonl``: each run's mean over
  its steps, then the mean over runs): ``seed/delta_fork_safe`` > 0, ``seed/delta_fork_fatal`` < 0 and
  ``seed/delta_safe`` >= :data:`NON_ICE_MIN`.

**The pilot** (``scripts/lab/seed_pilot.py``): GRPO alone, :data:`PILOT_SEEDS`, validated every 4 steps on the
selection maps up to a horizon H (64; 96 if it has not flattened by 64); the report maps are never read.
v(s) is the mean over the pilot's seeds of ``val/success_rate`` at step s, W(s) the mean of v at s - 8, s - 4 and s.
The stage-2 length L is the smallest multiple of 8 from 16 to H - 16 after which W never rises by more than
:data:`FLAT_EPS` (W(t) - W(L) <= FLAT_EPS at every later multiple of 8 up to H): GRPO has *flattened* by L, and no
such L means it has not flattened by H (a later fall does not count: the comparison then reads GRPO near its
peak, which favours the baseline, not SEED). This setting's GRPO value is G = W(L); the test size is
delta = :data:`PAPER_RELATIVE_GAIN` x G, rounded to two decimals; the seeds are the fewest whose minimum detectable
effect at the second design's spread (:data:`SPREAD`) is at most delta, and never fewer than :data:`MIN_SEEDS`.
When delta > 1 - G no arm could show it above GRPO: the study is then not testable in this setting, by arithmetic.
With no L by H = 96, L = 96 and the docs say GRPO had not flattened (a deviation, declared before any run).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from tether.lab.stats import mde, seeds_for
from tether.track import read_metrics

FORK_SAFE_MOVE_MIN = 1.0  # nats: the skill at least e-folds the safe move's probability at a fork
NON_ICE_MIN = -0.10  # nats: on moves not onto ~ the teacher may be at most ~10% less sure than the student
MIN_FORK_ROWS = 20  # fork rows the warm-start reading needs (32 selection maps x 4 episodes give ~60)
MIN_SAMPLED_ROWS = 5  # sampled moves at forks (onto ~, or safe) below which their sign is not read

PILOT_SEEDS = (100, 101, 102)  # none of them a calibration (200-202) or comparison (0-13) seed
HORIZONS = (64, 96)  # the pilot's length, and its one extension when GRPO has not flattened by the first
FLAT_EPS = 0.03  # success: half the design's MDE (0.06); a difference of two W's has a standard error of ~0.03
PAPER_RELATIVE_GAIN = 0.294  # Table 1, Qwen3-1.7B (the smallest model), WebShop score, GRPO 67.3 -> SEED 87.1
SPREAD = 0.0736  # s_d of the second design's paired differences at lambda 1 (8 seeds, 95% CI +-0.0615)
MIN_SEEDS = 14  # MDE 0.060 at SPREAD: the "about 14 at the observed variance"
# the design's files whose lines marked PROVISIONAL the pilot's rule fixes (apply_rule)
PROVISIONAL_FILES = ("configs/lab/seed/third/grpo.yaml", "configs/lab/seed/third/protocol.yaml",
                     "configs/lab/seed/third/calibration/protocol.yaml")
PROVISIONAL_LINE = re.compile(r"^(?P<indent> *)(?P<key>\w+): (?P<value>\S.*?)\s+# PROVISIONAL.*$", re.M)


def _check(value: float, passed: bool, threshold: str, rows: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"value": value, "threshold": threshold, "passed": bool(passed)}
    return out if rows is None else {**out, "rows": rows}


def _sampled_sign(kind: dict[str, float], sign: int) -> dict[str, Any]:
    """Sampled rows at forks: the mean two standard errors on the side ``sign`` says, where enough were sampled
    (a policy that rarely makes that move at a fork gives the teacher nothing to move there, and nothing to read)."""
    n, mean, se = int(kind["rows"]), kind["delta_mean"], kind["delta_se"]
    if n < MIN_SAMPLED_ROWS:
        return _check(mean, True, f"not read below {MIN_SAMPLED_ROWS} rows", n)
    return _check(mean, sign * mean - 2 * se > 0, "mean - 2 se > 0" if sign > 0 else "mean + 2 se < 0", n)


def _raises_where_it_matters(control: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """The two thresholds a teacher's context must meet: the safe move at forks, the non-ice rows."""
    safe_move, non_ice = control["fork_safe_move"], control["safe"]
    n, mean, se = int(safe_move["rows"]), safe_move["delta_mean"], safe_move["delta_se"]
    return {"fork_safe_move": _check(mean, n >= MIN_FORK_ROWS and mean >= FORK_SAFE_MOVE_MIN and mean - 2 * se > 0,
                                     f">= {FORK_SAFE_MOVE_MIN} and mean - 2 se > 0 over >= {MIN_FORK_ROWS} rows", n),
            "non_ice": _check(non_ice["delta_mean"], non_ice["delta_mean"] >= NON_ICE_MIN, f">= {NON_ICE_MIN}",
                              int(non_ice["rows"]))}


def warm_start_gate(control: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The warm-start reading from the precheck's ``positive_control`` (kind -> rows, delta_mean, delta_se)."""
    checks = {**_raises_where_it_matters(control), "fork_fatal": _sampled_sign(control["fork_fatal"], -1),
              "safe_at_fork": _sampled_sign(control["safe_at_fork"], +1)}
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}


def hint_gate(hint: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The calibration teacher's reading from the precheck's ``opsd_hint``."""
    checks = _raises_where_it_matters(hint)
    return {"checks": checks, "passed": all(c["passed"] for c in checks.values())}


def third_design_gate(control: dict[str, dict[str, float]], hint: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Step 1 of the design: the skill's reading and the hint's; both must pass."""
    skill, privileged = warm_start_gate(control), hint_gate(hint)
    return {"skill": skill, "opsd_hint": privileged, "passed": skill["passed"] and privileged["passed"]}


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


# -- the pilot -------------------------------------------------------------------------------------------------


def pilot_curve(runs: list[Path], metric: str = "val/success_rate") -> dict[int, float]:
    """step -> the mean over ``runs`` of ``metric`` on the selection split (steps every run validated; a later
    row of a step wins, as a resumed run logs it again; a line that is not a JSON object, as a kill mid-write
    leaves, is skipped)."""
    per_run = []
    for run in runs:
        values: dict[int, float] = {}
        for row in read_metrics(run / "metrics.jsonl"):
            if metric in row:
                values[int(row["step"])] = float(row[metric])
        per_run.append(values)
    steps = sorted(set.intersection(*(set(v) for v in per_run))) if per_run else []
    return {s: sum(v[s] for v in per_run) / len(per_run) for s in steps}


def window(curve: dict[int, float], step: int) -> float:
    """W(step): the mean of the curve at step - 8, step - 4 and step (KeyError where one was not validated)."""
    return sum(curve[s] for s in (step - 8, step - 4, step)) / 3


def stage2_length(curve: dict[int, float], horizon: int) -> int | None:
    """L of the registered rule (module docstring), or None when GRPO has not flattened by ``horizon``."""
    windows = {s: window(curve, s) for s in range(16, horizon + 1, 8)}
    return next((s for s in range(16, horizon - 15, 8)
                 if max(w for t, w in windows.items() if t > s) - windows[s] <= FLAT_EPS), None)


def seeds_needed(delta: float, spread: float = SPREAD) -> int:
    """The fewest seeds whose paired-t MDE at ``spread`` is at most ``delta`` (:func:`stats.seeds_for`), never
    fewer than MIN_SEEDS.

    Raises:
        ValueError: ``delta`` is not positive (no number of seeds reaches it), or ``spread`` is not (no MDE).
    """
    return max(seeds_for(spread, delta), MIN_SEEDS)


def pilot_rule(curve: dict[int, float], horizon: int) -> dict[str, Any]:
    """Everything the rule fixes from the pilot's curve (module docstring)."""
    length = stage2_length(curve, horizon)
    out: dict[str, Any] = {"horizon": horizon, "curve": curve,
                           "window": {s: window(curve, s) for s in range(16, horizon + 1, 8)},
                           "flattened": length is not None}
    if length is None and horizon < HORIZONS[-1]:
        return out  # extend the pilot
    length = length or horizon  # not flattened by the last horizon: stage 2 runs all of it (a declared deviation)
    value = round(window(curve, length), 3)
    delta = round(PAPER_RELATIVE_GAIN * value, 2)
    if delta <= 0:  # GRPO at about 0: a relative gain of it is no test size
        return {**out, "train_steps": length, "grpo_value": value, "delta": delta, "testable": False}
    n = seeds_needed(delta)
    return {**out, "train_steps": length, "grpo_value": value, "delta": delta, "seeds": n, "mde": mde(SPREAD, n),
            "testable": delta <= 1 - value}


def apply_rule(text: str, rule: dict[str, Any], source: str) -> str:
    """``text`` (one of :data:`PROVISIONAL_FILES`) with each line marked PROVISIONAL set from the pilot's ``rule``
    and marked as fixed by ``source``: ``steps`` (the stage-2 length), ``delta``, ``min_movement`` and
    ``min_difference`` (the test size), ``setting_baseline`` (G), and the top-level ``seeds`` (0 .. n-1 when the
    rule needs more than :data:`MIN_SEEDS`, else as they are).

    Raises:
        ValueError: a PROVISIONAL line with a key the rule does not fix.
    """
    values = {"steps": rule["train_steps"], "delta": rule["delta"], "min_movement": rule["delta"],
              "min_difference": rule["delta"], "setting_baseline": rule["grpo_value"]}

    def fixed(m: re.Match[str]) -> str:
        key, value = m["key"], m["value"]
        if key == "seeds" and not m["indent"]:
            value = f"[{', '.join(map(str, range(rule['seeds'])))}]" if rule["seeds"] > MIN_SEEDS else value
        elif key in values:
            value = str(values[key])
        else:
            raise ValueError(f"a PROVISIONAL line sets {key!r}, which the pilot's rule does not fix")
        return f"{m['indent']}{key}: {value}   # fixed by the pilot's rule ({source})"

    return PROVISIONAL_LINE.sub(fixed, text)
