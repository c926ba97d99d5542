"""The third SEED design's registered rules (tether/lab/seed_third.py): each gate threshold decides and an unread
metric never passes; the pilot fixes the stage-2 length, GRPO's value, the test size and the seeds as registered."""

from __future__ import annotations

import json
import math
import re

import pytest

from tether.lab.seed_third import (
    FORK_SAFE_MOVE_MIN,
    NON_ICE_MIN,
    PAPER_RELATIVE_GAIN,
    SPREAD,
    hint_gate,
    pilot_curve,
    pilot_rule,
    seeds_needed,
    stage2_length,
    third_design_gate,
    training_gate,
    warm_start_gate,
)
from tether.lab.stats import mde


def kind(rows: int, mean: float, se: float) -> dict[str, float]:
    return {"rows": rows, "delta_mean": mean, "delta_se": se}


def control(**changes: dict[str, float]) -> dict[str, dict[str, float]]:
    """A precheck positive_control that passes (the smoke run's +6.46 at forks), with ``changes`` applied."""
    return {"fork_safe_move": kind(60, 6.46, 0.5), "fork_fatal": kind(30, -7.0, 0.2), "safe_at_fork": kind(6, 5.0, 1.0),
            "safe": kind(900, -0.03, 0.016), **changes}


def test_a_warm_start_that_raises_the_safe_move_at_forks_passes():
    gate = warm_start_gate(control())
    assert gate["passed"] and set(gate["checks"]) == {"fork_safe_move", "non_ice", "fork_fatal", "safe_at_fork"}
    assert gate["checks"]["fork_safe_move"]["rows"] == 60


@pytest.mark.parametrize(("changes", "failing"), [
    ({"fork_safe_move": kind(60, FORK_SAFE_MOVE_MIN - 0.01, 0.1)}, "fork_safe_move"),  # too small a raise
    ({"fork_safe_move": kind(60, 1.5, 0.8)}, "fork_safe_move"),  # mean - 2 se = -0.1: not clearly above 0
    ({"fork_safe_move": kind(19, 6.0, 0.1)}, "fork_safe_move"),  # too few fork rows to read
    ({"safe": kind(900, NON_ICE_MIN - 0.001, 0.01)}, "non_ice"),  # the teacher lowers the other moves
    ({"fork_fatal": kind(30, -0.1, 0.06)}, "fork_fatal"),  # mean + 2 se = +0.02: not lowered
    ({"safe_at_fork": kind(8, 0.07, 0.11)}, "safe_at_fork"),  # the local-view warm start's: not clearly raised
])
def test_each_warm_start_threshold_decides(changes, failing):
    gate = warm_start_gate(control(**changes))
    assert not gate["passed"]
    assert [name for name, c in gate["checks"].items() if not c["passed"]] == [failing]


def test_the_boundaries_are_inclusive_where_registered_so():
    at = control(fork_safe_move=kind(20, FORK_SAFE_MOVE_MIN, 0.1), safe=kind(10, NON_ICE_MIN, 0.01))
    assert warm_start_gate(at)["passed"]


def test_sampled_moves_at_forks_are_not_read_when_too_few_were_sampled():
    gate = warm_start_gate(control(fork_fatal=kind(4, 3.0, 1.0), safe_at_fork=kind(1, -2.0, math.nan)))
    assert gate["passed"]
    assert all("not read" in gate["checks"][k]["threshold"] for k in ("fork_fatal", "safe_at_fork"))


def test_a_control_without_fork_rows_fails():
    empty = kind(0, math.nan, math.nan)
    assert not warm_start_gate(control(fork_safe_move=empty, fork_fatal=empty, safe_at_fork=empty))["passed"]


def test_the_design_gate_needs_the_skill_and_the_calibrations_hint_to_pass():
    hint = {"fork_safe_move": kind(60, 3.0, 0.4), "safe": kind(900, 0.01, 0.01)}
    assert hint_gate(hint)["passed"] and third_design_gate(control(), hint)["passed"]
    unread = {**hint, "fork_safe_move": kind(60, 0.2, 0.05)}  # the policy barely reads the hint's block
    gate = third_design_gate(control(), unread)
    assert gate["skill"]["passed"] and not gate["opsd_hint"]["passed"] and not gate["passed"]
    assert not third_design_gate(control(safe=kind(900, -0.5, 0.02)), hint)["passed"]


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


# -- the pilot -------------------------------------------------------------------------------------------------


def curve_of(value) -> dict[int, float]:
    return {s: value(s) for s in range(0, 65, 4)}


def test_the_curve_is_the_mean_over_runs_of_the_steps_every_run_validated(tmp_path):
    logs = {"a": [(0, 0.5), (4, 0.6), (4, 0.7), (8, 0.9)], "b": [(0, 0.3), (4, 0.5)]}  # a logs step 4 twice
    for run, rows in logs.items():
        (tmp_path / run).mkdir()
        lines = [json.dumps({"step": s, "val/success_rate": v}) for s, v in rows]
        (tmp_path / run / "metrics.jsonl").write_text("\n".join([*lines, json.dumps({"step": 9, "loss": 1})]))
    assert pilot_curve([tmp_path / "a", tmp_path / "b"]) == {0: pytest.approx(0.4), 4: pytest.approx(0.6)}


def test_the_curve_skips_a_line_a_kill_tore(tmp_path):
    """A run killed mid-write leaves a torn last line (and a hand edit may leave a line that is no object): the curve
    is that of the whole rows, as tether's other metrics readers take it; it raised JSONDecodeError."""
    (tmp_path / "a").mkdir()
    whole = [json.dumps({"step": s, "val/success_rate": v}) for s, v in [(0, 0.5), (4, 0.75)]]
    (tmp_path / "a" / "metrics.jsonl").write_text("\n".join([*whole, "[1, 2]", '{"step": 8, "val/succ']))
    assert pilot_curve([tmp_path / "a"]) == {0: 0.5, 4: 0.75}


def test_the_stage2_length_is_the_first_step_after_which_grpo_never_rises_by_more_than_eps():
    # rises 0.01 a step to 0.8 at step 30, then flat: W(24) = 0.70 and W(32) = 0.773 (0.027 short), W(40) = 0.8
    rise = curve_of(lambda s: min(0.5 + 0.01 * s, 0.8))
    assert stage2_length(rise, 64) == 32
    still_rising = curve_of(lambda s: 0.3 + 0.005 * s)  # W(64) - W(48) = 0.08
    assert stage2_length(still_rising, 64) is None and not pilot_rule(still_rising, 64)["flattened"]
    assert "train_steps" not in pilot_rule(still_rising, 64)  # the pilot goes on to 96 first
    longer = {s: 0.3 + 0.005 * s for s in range(0, 97, 4)}
    last = pilot_rule(longer, 96)  # still rising at 96: stage 2 runs all 96 steps, and the rule says so
    assert not last["flattened"] and last["train_steps"] == 96 and last["grpo_value"] == round(0.3 + 0.005 * 92, 3)
    assert stage2_length(curve_of(lambda s: 0.5), 64) == 16  # flat from the start: the shortest candidate
    # up to 0.8 at step 30, then down to 0.3: a later fall never makes a still-rising step look flat
    peak = curve_of(lambda s: min(0.5 + 0.01 * s, 0.8) - max(0.0, 0.02 * (s - 40)))
    assert stage2_length(peak, 64) == 32


def test_the_rule_fixes_value_test_size_seeds_and_says_when_delta_exceeds_the_room_left():
    low = pilot_rule(curve_of(lambda s: min(0.3 + 0.01 * s, 0.5)), 64)
    # L = 24: W(24) = (0.46 + 0.5 + 0.5) / 3 = 0.487, 0.013 below the plateau; W(16) = 0.42, 0.08 below
    assert low["train_steps"] == 24 and low["grpo_value"] == 0.487
    assert low["delta"] == round(PAPER_RELATIVE_GAIN * 0.487, 2) == 0.14
    assert low["seeds"] == 14 and low["testable"] and low["mde"] == pytest.approx(mde(SPREAD, 14))
    high = pilot_rule(curve_of(lambda s: min(0.6 + 0.01 * s, 0.9)), 64)
    # L = 32: W(32) = (0.84 + 0.88 + 0.9) / 3 = 0.873; delta = 0.294 x 0.873 = 0.257 -> 0.26 > 1 - 0.873
    assert high["train_steps"] == 32 and high["grpo_value"] == 0.873 and high["delta"] == 0.26
    assert not high["testable"]


def test_seeds_reach_an_mde_at_or_below_delta_and_never_fall_below_fourteen():
    assert mde(SPREAD, 13) > 0.06 >= mde(SPREAD, 14)  # the "about 14 at the observed variance"
    assert seeds_needed(0.06) == 14 and seeds_needed(0.30) == 14
    n = seeds_needed(0.05)
    assert mde(SPREAD, n) <= 0.05 < mde(SPREAD, n - 1) and n > 14
    with pytest.raises(ValueError, match="cannot be reached"):
        seeds_needed(0.0)
    assert not pilot_rule(curve_of(lambda s: 0.01), 64)["testable"]  # GRPO at ~0: delta rounds to 0


def test_the_pilot_script_reads_the_three_pilot_runs_and_prints_what_the_rule_fixes(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tether.lab.seed_third import PILOT_SEEDS

    for k, seed in enumerate(PILOT_SEEDS):  # seeds 0.02 apart around the curve of the test above
        (tmp_path / f"seed{seed}").mkdir()
        rows = [{"step": s, "val/success_rate": min(0.3 + 0.01 * s, 0.5) + 0.02 * (k - 1)} for s in range(0, 65, 4)]
        (tmp_path / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "scripts/lab/seed_pilot.py", "--root", str(tmp_path), "--out",
                           str(tmp_path / "rule.json")], cwd=repo, capture_output=True, text=True, check=True)
    rule = json.loads((tmp_path / "rule.json").read_text())
    assert (rule["train_steps"], rule["grpo_value"], rule["delta"], rule["seeds"]) == (24, 0.487, 0.14, 14)
    assert done.stdout.startswith("step") and "\"train_steps\": 24" in done.stdout
    missing = subprocess.run([sys.executable, "scripts/lab/seed_pilot.py", "--root", str(tmp_path / "none")],
                             cwd=repo, capture_output=True, text=True)
    assert missing.returncode != 0 and "run the pilot first" in missing.stderr


# -- the precheck's readings on scripted thin-ice episodes -----------------------------------------------------


def test_the_precheck_splits_fork_rows_and_reads_the_hint_on_scripted_walkers(tmp_path, monkeypatch):
    """Walkers that take the naive or the safe move (alternately by position) on a random char model: every
    reading the gate uses gets its rows, and the splits count exactly the moves the env reports."""
    import importlib.util
    import math
    from pathlib import Path

    from tests.rollout.helpers import ScriptedEngine
    from tether.checks import load_checked_config
    from tether.envs.thin_ice import at_fork, parse_ahead, walker_move
    from tether.models import load_policy
    from tether.rollout.multi_turn import AgentCollector

    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))
    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("seed_precheck", repo / "scripts/lab/seed_precheck.py")
    precheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precheck)

    class Walkers(ScriptedEngine):
        def respond(self, prompt: str, j: int) -> str:
            return f"<action>{walker_move(parse_ahead(prompt), 'O' if j % 2 else 'O~')}</action>"

    cfg = load_checked_config(repo / "configs/lab/seed/third/grpo.yaml",
                              ["model.name=char-64x1", "env.isolation=thread", f"run_dir={tmp_path / 'run'}"])
    model, tok = load_policy(cfg.model.name)
    collector = AgentCollector(cfg, tok)
    episodes, rows = precheck.play(collector, Walkers(tok), collector.val_seeds[:12], 2, None, seed=1)
    valid = [(r["episode"], r["turn"]) for r in rows if r["episode"].turns[r["turn"]]["valid"]]
    fork = [(ep, t) for ep, t in valid if at_fork(ep.infos[t])]
    onto_ice = [(ep, t) for ep, t in valid if ep.infos[t + 1].get("fell_through_ice")]
    assert fork and onto_ice and len(valid) == len(rows)

    control = precheck.skill_deltas(model, tok, precheck.oracle_skills(episodes), rows, cfg.env.history,
                                    collector.action_format)
    assert control["fork"]["rows"] == control["fork_safe_move"]["rows"] == len(fork)
    assert control["fork_fatal"]["rows"] == len([x for x in fork if x in onto_ice])
    assert control["safe_at_fork"]["rows"] == len(fork) - control["fork_fatal"]["rows"]
    assert control["safe"]["rows"] == len(valid) - len(onto_ice)
    hint = precheck.hint_deltas(model, tok, rows, cfg.env.history, collector.action_format)
    assert hint["safe"]["rows"] == len(valid) - len(onto_ice) and hint["fork_safe_move"]["rows"] == len(fork)
    assert all(math.isfinite(k["delta_mean"]) for k in (*control.values(), *hint.values()) if k["rows"])
    gate = precheck.third_design_gate(control, hint)
    assert set(gate) == {"skill", "opsd_hint", "passed"}


FIXED_LINE = re.compile(r"(?m)^(?P<line>\s*\w+: .*?)   # fixed by the pilot's rule \((?P<source>[^)]*)\)$")


def as_registered(text: str) -> str:
    """A registered file as it was before the pilot's rule was applied: each line the rule fixed marked PROVISIONAL
    again (its value is the rule's; the tests set other values)."""
    return FIXED_LINE.sub(lambda m: f"{m['line']}   # PROVISIONAL: set by the pilot", text)


def test_the_committed_files_hold_exactly_the_committed_pilot_rule():
    """The rule was applied (2026-12-06) from the committed pilot_rule.json, to every marked line, and nothing
    else differs from what applying it to the registered files gives."""
    import json
    from pathlib import Path

    from tether.lab.seed_third import PROVISIONAL_FILES, apply_rule

    repo = Path(__file__).resolve().parents[2]
    source = "docs/results/seed_third_gate/pilot_rule.json"
    rule = json.loads((repo / source).read_text())
    assert (rule["train_steps"], rule["grpo_value"], rule["delta"], rule["seeds"]) == (16, 0.656, 0.19, 14)
    for name in PROVISIONAL_FILES:
        text = (repo / name).read_text()
        assert "# PROVISIONAL:" not in text and {m["source"] for m in FIXED_LINE.finditer(text)} == {source}
        assert apply_rule(as_registered(text), rule, source) == text


def test_the_rule_fixes_every_provisional_line_of_the_registered_files_and_nothing_else(tmp_path):
    from pathlib import Path

    import yaml

    from tether.lab.protocol import load_protocol
    from tether.lab.seed_third import PROVISIONAL_FILES, apply_rule

    repo = Path(__file__).resolve().parents[2]
    rule = {"train_steps": 40, "grpo_value": 0.512, "delta": round(PAPER_RELATIVE_GAIN * 0.512, 2), "seeds": 14}
    texts = {name: as_registered((repo / name).read_text()) for name in PROVISIONAL_FILES}
    fixed = {name: apply_rule(text, rule, "rule.json") for name, text in texts.items()}
    for name, text in fixed.items():
        assert "# PROVISIONAL" not in text and "fixed by the pilot's rule (rule.json)" in text
        changed = [(a, b) for a, b in zip(texts[name].splitlines(), text.splitlines(), strict=True) if a != b]
        assert changed and all("# PROVISIONAL" in a for a, _ in changed)  # only the marked lines
    assert yaml.safe_load(fixed[PROVISIONAL_FILES[0]])["train"]["steps"] == 40
    for name in PROVISIONAL_FILES[1:]:
        path = tmp_path / "p.yaml"
        path.write_text(fixed[name])
        protocol = load_protocol(path)  # the schema's own check: delta = gain x baseline
        assert protocol.test_size.delta == protocol.calibration.min_movement == 0.15
        assert protocol.test_size.setting_baseline == 0.512
    assert load_protocol(tmp_path / "p.yaml").seeds == [200, 201, 202]  # the calibration keeps its own
    path.write_text(fixed[PROVISIONAL_FILES[1]])
    assert load_protocol(path).requires[0].min_difference == 0.15  # the calibration's report must reach delta
    comparison = tmp_path / "c.yaml"
    comparison.write_text(apply_rule(texts[PROVISIONAL_FILES[1]], {**rule, "delta": 0.05, "grpo_value": 0.17,
                                                                    "seeds": 19}, "rule.json"))
    assert load_protocol(comparison).seeds == list(range(19))
    with pytest.raises(ValueError, match="'lr'"):
        apply_rule("  lr: 0.1   # PROVISIONAL: who knows\n", rule, "rule.json")


def test_two_standard_errors_and_five_sampled_rows_are_the_registered_bounds():
    # mean -+ 2 se misses 0 by 0.001 here; with 1.96 se the check would pass
    assert not warm_start_gate(control(fork_fatal=kind(30, -0.1, 0.0505)))["checks"]["fork_fatal"]["passed"]
    assert not warm_start_gate(control(safe_at_fork=kind(8, 0.1, 0.0505)))["checks"]["safe_at_fork"]["passed"]
    assert not warm_start_gate(control(fork_safe_move=kind(60, 1.5, 0.7505)))["passed"]
    assert warm_start_gate(control(fork_fatal=kind(30, -0.1, 0.0495)))["passed"]
    # five sampled rows are read (and here fail: the skill raised the moves onto ~); four are not
    five = warm_start_gate(control(fork_fatal=kind(5, 3.0, 1.0)))["checks"]["fork_fatal"]
    assert five["threshold"] == "mean + 2 se < 0" and not five["passed"]


def test_a_rise_of_exactly_flat_eps_is_flat():
    from tether.lab.seed_third import FLAT_EPS, window

    step_up = {s: (0.22 if s <= 32 else 0.25) for s in range(0, 65, 4)}  # W rises from 0.22 to 0.25 after 32
    assert window(step_up, 48) - window(step_up, 16) == FLAT_EPS  # exactly, in floating point
    assert stage2_length(step_up, 64) == 16
    more = {s: (0.22 if s <= 32 else 0.2501) for s in range(0, 65, 4)}
    assert stage2_length(more, 64) == 40  # W(40) = (0.22 + 2 x 0.2501) / 3, within FLAT_EPS of W(48) on
