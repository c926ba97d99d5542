"""task.timeout_s: a task's own scoring in a process of its own, stopped at its limit."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.rewards.user_tasks import CountedPickles, waves
from tests.trainer.helpers import tiny_config
from tether.config import ConfigError, TaskConfig, load_config
from tether.envs.isolated import end_all
from tether.files import read_jsonl
from tether.rewards import FAULT_LOG, build_task
from tether.rewards.task import ProcessScoredTask
from tether.tasks import Score, TaskItem
from tether.tasks.base import score_batch
from tether.trainer import Trainer

STALLING = "tests.rewards.user_tasks:Stalling"
LIMIT_S = 0.5


def built(tmp_path, name: str = STALLING, **cfg) -> ProcessScoredTask:
    return build_task(TaskConfig(name=name, **cfg), tmp_path)


def score(task, texts: list[str]) -> list[Score]:
    return score_batch(task, [TaskItem(f"q{i}", None, id=f"stalling/train/{i}") for i in range(len(texts))], texts)


def fault_rows(tmp_path) -> list[dict]:
    return read_jsonl(tmp_path / FAULT_LOG, "fault log")


@pytest.mark.parametrize("stall", ["hang", "spin"])
def test_a_task_score_that_hangs_or_busy_loops_is_killed_at_its_limit_and_faults_its_batch(tmp_path, stall):
    task = built(tmp_path, timeout_s=LIMIT_S)
    assert [s.reward for s in score(task, ["a", "bb"])] == [waves("a"), waves("bb")]  # starts the scoring process
    child = task.process.children.idle[0].pid
    start = time.perf_counter()
    with pytest.warns(UserWarning, match=r"^the task's score faulted \(the call timed out after 0\.5s \(its process "
                                         r"was killed\)\): its rows are judged wrong with reward 0\.0"):
        faulted = score(task, [stall, "ccc"])
    assert LIMIT_S <= time.perf_counter() - start < LIMIT_S + 2.0
    assert [(s.fault, s.correct, s.reward) for s in faulted] == [(True, False, 0.0)] * 2
    with pytest.raises(ProcessLookupError):  # stopped, not left spinning (and reaped)
        os.kill(child, 0)
    assert [s.reward for s in score(task, ["dddd"])] == [waves("dddd")]  # a fresh process scores the next batch
    [row] = fault_rows(tmp_path)
    assert (row["term"], row["kind"]) == ("task", "timeout")


@pytest.mark.parametrize(("stall", "kind", "error"), [("exit", "process ended", "exit code 7"),
                                                      ("raise", "RuntimeError", "RuntimeError: verifier down")])
def test_os_exit_or_a_raise_in_a_task_score_faults_its_batch_and_the_next_batch_is_scored(tmp_path, stall, kind,
                                                                                          error):
    task = built(tmp_path, timeout_s=5.0)
    with pytest.warns(UserWarning, match="the task's score faulted"):
        faulted = score(task, [stall, "a"])
    assert [s.fault for s in faulted] == [True, True] and error in faulted[0].error
    assert [s.reward for s in score(task, ["a", "bb"])] == [waves("a"), waves("bb")]
    [row] = fault_rows(tmp_path)
    assert (row["term"], row["kind"]) == ("task", kind)


@pytest.mark.parametrize("kwargs", [{}, {"lock": True}], ids=["pickled", "built-by-name"])
def test_a_task_scores_the_same_bit_for_bit_with_the_limit_on_and_off(tmp_path, kwargs):
    texts = ["x" * n for n in (1, 7, 30, 255)]
    off, on = built(tmp_path, kwargs=kwargs), built(tmp_path, kwargs=kwargs, timeout_s=5.0)
    assert isinstance(on, ProcessScoredTask) and not isinstance(off, ProcessScoredTask)
    assert [s.reward for s in score(on, texts)] == [s.reward for s in score(off, texts)] == [waves(t) for t in texts]
    assert on.val == off.val and on.name == "stalling"  # everything but the scoring is the task's own, read here


def test_a_task_that_pickles_is_pickled_once_to_reach_its_scoring_processes(tmp_path):
    # scorer_factory pickles the task to learn whether it pickles; the pool's zygote pickles its factory: those are
    # the first pickle's bytes. A fresh zygote (the first one gone) costs no pickle either.
    CountedPickles.pickles = 0
    task = built(tmp_path, "tests.rewards.user_tasks:CountedPickles", timeout_s=5.0)
    assert [s.reward for s in score(task, ["a", "bb"])] == [waves("a"), waves("bb")]
    end_all(task.process.children.idle)
    task.process.children.zygote.end()
    assert [s.reward for s in score(task, ["ccc"])] == [waves("ccc")]
    assert CountedPickles.pickles == 1


def test_with_task_rewards_the_task_scored_in_its_process_is_the_task_component(tmp_path):
    rewards = [{"fn": "tests.rewards.user_rewards:scaled", "kwargs": {"scale": 0.25}}]
    task = built(tmp_path, timeout_s=5.0, rewards=rewards)
    [ok] = score(task, ["abc"])
    assert dict(ok.components) == {"task": waves("abc"), "scaled": 0.25}
    with pytest.warns(UserWarning, match="the task's score faulted"):
        [faulted] = score(task, ["exit"])
    assert faulted.fault and faulted.reward == 0.25  # the task's fault reward, 0.0, plus the terms


def test_task_timeout_s_is_checked_for_its_range_and_only_set_with_a_task(tmp_path):
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=r"task\.timeout_s"):
            load_config(data={"task": {"name": "parity"}}, overrides=[f"task.timeout_s={bad}"])
    assert load_config(data={"task": {"name": "parity"}}, overrides=["task.timeout_s=2.5"]).task.timeout_s == 2.5
    with pytest.raises(ConfigError, match=r"task\.timeout_s limits a task's own scoring, and this run has an env, "
                                          r"not a task: an env's calls are limited by env\.timeout_s"):
        load_config(data={"env": {"name": "sokoban"}}, overrides=["task.timeout_s=5"])


def test_a_task_score_past_its_limit_faults_its_rows_counted_per_split(tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=1", "val.samples=1", "task.timeout_s=0.2",
                      task={"name": STALLING, "kwargs": {"stall_split": "val"}})
    policy, tokenizer = tiny_policy
    trainer = Trainer(cfg, policy=policy, tokenizer=tokenizer)
    with pytest.warns(UserWarning, match=r"the task's score faulted \(the call timed out after 0\.2s"):
        metrics = trainer.validate()
    assert metrics["val/reward_faults"] == len(trainer.collector.task.val) and metrics["val/fault_frac"] == 1.0
    assert trainer.collector.reward_faults == 0  # the training count holds training rows only
    batch, step_metrics = trainer.collect()
    assert step_metrics["reward/faults"] == 0  # training's rows scored in the (fresh) process, unlimited values
    assert batch.rewards.tolist() == torch.tensor([waves(t) for t in batch.info["text"]]).tolist()
    [row] = fault_rows(tmp_path / "run")
    assert (row["term"], row["kind"]) == ("task", "timeout")
