"""Env faults reach the console and the run's health folder, as reward-function faults do: the first fault of each
phase and kind is a warning and a row of ``health/env_faults.jsonl`` (env, phase, seed, turn, error, traceback), and a
step with faults warns with their count, wherever the env ran (a thread, a process; Ray workers:
tests/envs/test_workers.py)."""

from __future__ import annotations

import warnings

import pytest

from tests.rollout.helpers import ScriptedEngine, agent_config
from tether.files import read_jsonl
from tether.rollout.base import NoHooks
from tether.rollout.multi_turn import FAULT_LOG, AgentCollector
from tether.seeding import StepSeeds

FIELDS = ("env", "phase", "kind", "seed", "turn", "episode", "error", "traceback")


def collect_warning_lines(collector: AgentCollector, tokenizer, step: int) -> tuple[dict, list[str]]:
    """The step's episodes by id, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, _ = collector.collect(ScriptedEngine(tokenizer), StepSeeds(0, step), NoHooks())
    return {e.episode_id: e for e in batch.info["episode"]}, [str(w.message) for w in caught]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_the_first_step_fault_warns_and_is_logged_with_its_traceback_and_each_step_counts(tmp_path, tokenizer,
                                                                                         isolation):
    cfg = agent_config(tmp_path, f"env.isolation={isolation}",
                       env={"kwargs": {"turns": 3, "fault": "step_raise", "fault_turn": 2}})
    collector = AgentCollector(cfg, tokenizer)
    episodes, first = collect_warning_lines(collector, tokenizer, 0)
    # episodes 1, 2, 4, 5 (the invalid and wrong clones of 2 tasks) fault on their 2nd step (turn 1): one warning
    # for the first, one count for the step
    assert collector.faults == 4 and sorted(i for i, e in episodes.items() if e.fault) == [1, 2, 4, 5]
    [row] = read_jsonl(tmp_path / "run" / FAULT_LOG, "env fault log", FIELDS)
    assert (row["env"], row["phase"], row["kind"], row["seed"], row["turn"], row["episode"]) == (
        "scripted", "step", "RuntimeError", episodes[1].seed, 1, 1)
    action = episodes[1].turns[1]["action"]
    assert row["error"] == episodes[1].fault == \
        f"scripted step({action!r}) raised RuntimeError: scripted fault: step raised on purpose"
    lines = row["traceback"].rstrip().splitlines()
    assert lines[-1] == "RuntimeError: scripted fault: step raised on purpose"
    assert any("in _misbehave" in line for line in lines)  # the env's own frame, from its thread or its process
    assert first == [f"env scripted faulted in step (seed {row['seed']}, turn 1): {row['error']}; the episode ends "
                     "as failed and counts in env/faults (later step faults of this kind are only counted); the run "
                     f"goes on; details in {tmp_path / 'run' / FAULT_LOG}",
                     f"step 1: 4 env faults in 6 episodes (env/faults=4 so far; the first of each kind in "
                     f"{tmp_path / 'run' / FAULT_LOG})"]
    _, second = collect_warning_lines(collector, tokenizer, 1)
    assert second == [f"step 2: 4 env faults in 6 episodes (env/faults=8 so far; the first of each kind in "
                      f"{tmp_path / 'run' / FAULT_LOG})"]
    assert len(read_jsonl(tmp_path / "run" / FAULT_LOG, "env fault log", FIELDS)) == 1  # no second row


def test_reset_faults_and_timeouts_are_kinds_of_their_own(tmp_path, tokenizer):
    cfg = agent_config(tmp_path, "env.reset_timeout_s=0.2", env={"kwargs": {"turns": 3, "fault": "reset_hang",
                                                                           "hang_s": 1.0}})
    collector = AgentCollector(cfg, tokenizer)
    episodes = collector.start_episodes(collector.train_seeds[:1], 2)
    assert collector.faults == 6  # 2 episodes x 3 tries (env.reset_retries=2): every try's fault
    [row] = read_jsonl(tmp_path / "run" / FAULT_LOG, "env fault log", FIELDS)
    assert (row["phase"], row["kind"], row["turn"], row["seed"]) == ("reset", "timeout", None, episodes[0].seed)
    assert row["error"] == f"scripted reset({episodes[0].seed}) timed out after 0.2s" == episodes[0].fault
    assert "time.sleep(self.hang_s)" in row["traceback"]  # the line the hung thread is in


def test_a_clean_step_warns_nothing(tmp_path, tokenizer):
    collector = AgentCollector(agent_config(tmp_path), tokenizer)
    assert collect_warning_lines(collector, tokenizer, 0)[1] == []
    assert not (tmp_path / "run" / FAULT_LOG).exists()
