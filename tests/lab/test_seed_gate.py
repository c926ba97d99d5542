"""The third SEED design's registered gate (tether/lab/seed_gate.py): each threshold decides, and an unread
metric never passes."""

from __future__ import annotations

import math

import pytest

from tether.lab.seed_gate import FORK_SAFE_MOVE_MIN, NON_ICE_MIN, training_gate, warm_start_gate


def kind(rows: int, mean: float, se: float) -> dict[str, float]:
    return {"rows": rows, "delta_mean": mean, "delta_se": se}


def control(**changes: dict[str, float]) -> dict[str, dict[str, float]]:
    """A precheck positive_control that passes (the smoke run's +6.46 at forks), with ``changes`` applied."""
    return {"fork_safe_move": kind(60, 6.46, 0.5), "fork_fatal": kind(30, -7.0, 0.2), "safe": kind(900, -0.03, 0.016),
            **changes}


def test_a_warm_start_that_raises_the_safe_move_at_forks_passes():
    gate = warm_start_gate(control())
    assert gate["passed"] and set(gate["checks"]) == {"fork_safe_move", "non_ice", "fork_fatal"}
    assert gate["checks"]["fork_safe_move"]["rows"] == 60


@pytest.mark.parametrize(("changes", "failing"), [
    ({"fork_safe_move": kind(60, FORK_SAFE_MOVE_MIN - 0.01, 0.1)}, "fork_safe_move"),  # too small a raise
    ({"fork_safe_move": kind(60, 1.5, 0.8)}, "fork_safe_move"),  # mean - 2 se = -0.1: not clearly above 0
    ({"fork_safe_move": kind(19, 6.0, 0.1)}, "fork_safe_move"),  # too few fork rows to read
    ({"safe": kind(900, NON_ICE_MIN - 0.001, 0.01)}, "non_ice"),  # the teacher lowers the other moves
    ({"fork_fatal": kind(30, -0.1, 0.06)}, "fork_fatal"),  # mean + 2 se = +0.02: not lowered
])
def test_each_warm_start_threshold_decides(changes, failing):
    gate = warm_start_gate(control(**changes))
    assert not gate["passed"]
    assert [name for name, c in gate["checks"].items() if not c["passed"]] == [failing]


def test_the_boundaries_are_inclusive_where_registered_so():
    at = control(fork_safe_move=kind(20, FORK_SAFE_MOVE_MIN, 0.1), safe=kind(10, NON_ICE_MIN, 0.01))
    assert warm_start_gate(at)["passed"]


def test_fatal_moves_at_forks_are_not_read_when_too_few_were_sampled():
    gate = warm_start_gate(control(fork_fatal=kind(4, 3.0, 1.0)))
    assert gate["passed"] and "not read" in gate["checks"]["fork_fatal"]["threshold"]


def test_a_control_without_fork_rows_fails():
    empty = kind(0, math.nan, math.nan)
    assert not warm_start_gate(control(fork_safe_move=empty, fork_fatal=empty))["passed"]


def test_training_gate_reads_the_fork_and_non_ice_deltas():
    good = {"seed/delta_fork_safe": 0.4, "seed/delta_fork_fatal": -2.0, "seed/delta_safe": -0.05}
    assert training_gate(good)["passed"]
    # the second design's training logs: non-ice rows -0.19 at lambda 1 fail the registered -0.10
    assert [n for n, c in training_gate({**good, "seed/delta_safe": -0.19})["checks"].items()
            if not c["passed"]] == ["non_ice"]
    assert not training_gate({**good, "seed/delta_fork_safe": 0.0})["passed"]
    assert not training_gate({**good, "seed/delta_fork_fatal": 0.1})["passed"]
    missing = {k: v for k, v in good.items() if k != "seed/delta_fork_safe"}
    assert not training_gate(missing)["passed"]  # an arm that never logged the fork rows was not read


def test_the_mechanism_table_reads_the_training_gate_per_arm(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    rows = {"seed_oracle_w1": [{"step": 1, "seed/delta_fork": 0.1, "seed/delta_fork_safe": 0.5,
                                "seed/delta_fork_fatal": -3.0, "seed/delta_safe": -0.05},
                               {"step": 2, "seed/delta_fork": 0.3, "seed/delta_fork_safe": 0.3,
                                "seed/delta_fork_fatal": -1.0, "seed/delta_safe": -0.25}],
            "grpo": [{"step": 1, "env/success_rate": 0.5}]}
    for arm, lines in rows.items():
        (tmp_path / arm / "seed0").mkdir(parents=True)
        (tmp_path / arm / "seed0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = subprocess.run([sys.executable, "scripts/lab/seed_mechanism.py", str(tmp_path)], cwd=repo,
                          capture_output=True, text=True, check=True)
    gates = [line for line in done.stdout.splitlines() if line.startswith("training gate")]
    # the run's means: fork_safe 0.4, fork_fatal -2.0, non-ice -0.15 (below -0.10); grpo logs no fork rows
    assert gates == ["training gate, seed_oracle_w1: FAILED: fork_safe 0.400 (> 0: yes), fork_fatal -2.000 (< 0: "
                     "yes), non_ice -0.150 (>= -0.1: no)"]
