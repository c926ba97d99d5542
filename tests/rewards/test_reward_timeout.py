"""task.rewards[i].timeout_s: a reward function called in a process of its own, stopped at its limit."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tether.config import ConfigError, RewardTermConfig, load_config
from tether.files import read_jsonl
from tether.rewards import RewardedTask, RewardTerm
from tether.tasks import Score, TaskItem

M = "tests.rewards.user_rewards"
LIMIT_S = 0.5


class NoScore:
    name, system_prompt = "none", None

    def score(self, item, text):
        return Score(0.0, False, text)


def task(tmp_path, fn: str = "stalls_on", **spec) -> RewardedTask:
    term = RewardTerm(RewardTermConfig(fn=f"{M}:{fn}", **spec), "task.rewards[0]")
    return RewardedTask(NoScore(), [term], keep_score=False, fault_log=tmp_path / "faults.jsonl")


def score(rewarded: RewardedTask, texts: list[str]) -> list[Score]:
    return rewarded.score_batch([TaskItem(f"q{i}", None, id=str(i)) for i in range(len(texts))], texts)


def waves(texts: list[str]) -> list[float]:
    """user_rewards.waves, written out: the reference the rewards are compared with."""
    return [math.sin(len(t)) / 3 + math.sqrt(len(t) + 0.1) for t in texts]


@pytest.mark.parametrize("stall", ["hang", "spin"])
def test_a_reward_that_hangs_or_busy_loops_is_killed_at_its_limit_and_faults_its_batch(tmp_path, stall):
    rewarded = task(tmp_path, timeout_s=LIMIT_S)
    assert [s.reward for s in score(rewarded, ["a", "bb"])] == waves(["a", "bb"])  # starts the term's process
    child = rewarded.terms[0].process.children.idle[0].pid
    start = time.perf_counter()
    with pytest.warns(UserWarning, match=r"^reward function 'stalls_on' faulted \(the call timed out after 0\.5s "
                                         r"\(its process was killed\)\): its rows get the fault reward"):
        faulted = score(rewarded, [stall, "ccc"])
    assert LIMIT_S <= time.perf_counter() - start < LIMIT_S + 2.0
    assert [(s.fault, s.correct, s.reward) for s in faulted] == [(True, False, 0.0)] * 2
    with pytest.raises(ProcessLookupError):  # stopped, not left spinning (and reaped)
        os.kill(child, 0)
    assert [s.reward for s in score(rewarded, ["dddd"])] == waves(["dddd"])  # a fresh process serves the next batch
    [row] = read_jsonl(tmp_path / "faults.jsonl", "fault log")
    assert (row["term"], row["kind"]) == ("stalls_on", "timeout")


def test_os_exit_in_a_reward_is_a_fault_of_its_batch_and_the_next_batch_is_scored(tmp_path):
    rewarded = task(tmp_path, timeout_s=5.0)
    with pytest.warns(UserWarning, match="the call: the reward function's process ended with exit code 7"):
        faulted = score(rewarded, ["exit", "a"])
    assert [s.fault for s in faulted] == [True, True]
    assert "exit code 7" in faulted[0].error
    assert [s.reward for s in score(rewarded, ["a", "bb"])] == waves(["a", "bb"])
    assert read_jsonl(tmp_path / "faults.jsonl", "fault log")[0]["kind"] == "process ended"


def test_a_reward_gives_the_same_values_bit_for_bit_with_the_limit_on_and_off(tmp_path):
    texts = ["x" * n for n in (1, 7, 30, 255)]
    off, on = task(tmp_path, "waves"), task(tmp_path, "waves", timeout_s=5.0)
    assert on.terms[0].process is not None and off.terms[0].process is None  # no process without a limit
    assert [s.reward for s in score(on, texts)] == [s.reward for s in score(off, texts)] == waves(texts)


def test_a_reward_class_is_built_in_its_process_and_its_faults_are_contained(tmp_path):
    on = task(tmp_path, "Counter", kwargs={"bonus": 0.25}, timeout_s=5.0)
    assert on.terms[0].fn is None  # built there, not here
    assert [s.reward for s in score(on, ["a", "b"])] == [0.25, 0.25]
    with pytest.warns(UserWarning, match=r"RuntimeError: reward server down"):
        broken = score(task(tmp_path, "broken", timeout_s=5.0), ["a"])
    assert broken[0].fault and broken[0].error == "broken: RuntimeError: reward server down"


@pytest.mark.parametrize("value, message", [
    (0, "greater than 0"), (-1.5, "greater than 0"), ("soon", "valid number"), (float("inf"), "finite number"),
])
def test_a_bad_reward_limit_is_refused_by_the_schema(value, message):
    with pytest.raises(ConfigError, match=rf"task\.rewards\[0\]\.timeout_s: .*{message}"):
        load_config(data={"task": {"name": "addition", "rewards": [{"fn": f"{M}:waves", "timeout_s": value}]}})


class Interrupted(BaseException):
    """Raised in the main thread as KeyboardInterrupt is, past the term's own containment of exceptions."""


def test_a_call_interrupted_in_the_trainer_leaves_no_late_reply_for_the_next_call(tmp_path):
    rewarded = task(tmp_path, timeout_s=5.0)
    term = rewarded.terms[0]
    assert term(["p"], ["a"], {}).values == waves(["a"])  # the process started

    def interrupt(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # as Ctrl-C's second press raises in the main thread
        with pytest.raises(Interrupted):
            term(["p"], ["hang"], {})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    start = time.perf_counter()
    assert term(["p"], ["a"], {}).values == waves(["a"])  # not the hung call's child, waiting out its limit
    assert time.perf_counter() - start < 3.0


def test_a_reward_process_imports_the_terms_without_torch():
    """The term's process imports tether.rewards.terms; through the package's eager imports that was torch (the
    reward model's), and the process took 6.6 s to start on the 2-core VM instead of 0.9 s."""
    code = "import sys, tether.rewards.terms; print('torch' in sys.modules, 'tether.tasks' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split() == ["False", "False"]
