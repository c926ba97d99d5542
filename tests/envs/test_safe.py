"""Fault containment: crashing or hanging envs end the episode as failed, the caller carries on."""

from __future__ import annotations

import time

import pytest

from tether.envs import EpisodeOverError, SafeEnv, TextEnv, call_with_timeout
from tether.envs.safe import EnvFault
from tether.envs.scripted import ScriptedEnv


def _factory(*envs: ScriptedEnv):
    """A make() that hands out the given envs in order (a faulty one first, then a healthy one)."""
    queue = list(envs)
    return lambda: queue.pop(0)


def _win(env: SafeEnv, seed: int = 0) -> bool:
    env.reset(seed)
    return env.step(env.solution()[0]).won


def test_healthy_env_passes_through():
    env = SafeEnv(ScriptedEnv, timeout_s=5.0)
    assert isinstance(env, TextEnv) and env.name == "scripted"
    assert _win(env) and env.faults == 0
    with pytest.raises(EpisodeOverError):  # caller bugs are not faults
        env.step("apple")
    assert env.faults == 0


def test_step_exception_ends_episode_and_next_episode_uses_a_fresh_env():
    env = SafeEnv(_factory(ScriptedEnv(fault="step_raise"), ScriptedEnv()), timeout_s=5.0)
    env.reset(0)
    step = env.step("apple")
    assert step.done and not step.won and step.reward == 0.0
    assert "RuntimeError: scripted fault" in step.info["fault"] and env.faults == 1
    with pytest.raises(EpisodeOverError):
        env.step("apple")
    assert _win(env) and env.faults == 1


def test_step_hang_times_out():
    env = SafeEnv(_factory(ScriptedEnv(fault="step_hang", hang_s=3.0), ScriptedEnv()), timeout_s=0.2)
    env.reset(0)
    start = time.monotonic()
    step = env.step("apple")
    assert time.monotonic() - start < 2.0
    assert step.done and not step.won and "timed out after 0.2s" in step.info["fault"]
    assert env.faults == 1 and env.last_fault == step.info["fault"]
    assert _win(env)


def test_a_solution_past_its_limit_ends_the_episode_without_touching_the_busy_env_again():
    """In a thread the timed-out solver is still running on the env: the episode's next step would race with it."""
    busy = ScriptedEnv(fault="solution_hang", hang_s=3.0)
    env = SafeEnv(_factory(busy, ScriptedEnv()), timeout_s=0.2)
    env.reset(0)
    assert env.solution() is None and env.faults == 1
    step = env.step("apple")
    assert step.done and not step.won and step.info["fault"] == "scripted solution() timed out after 0.2s"
    assert busy._steps == 0  # never stepped
    assert _win(env)  # the next episode gets a fresh env


@pytest.mark.parametrize("fault", ["reset_raise", "reset_hang"])
def test_reset_fault_is_reported_and_ends_the_episode_at_the_first_step(fault):
    env = SafeEnv(_factory(ScriptedEnv(), ScriptedEnv(fault=fault, hang_s=3.0), ScriptedEnv()),
                  timeout_s=0.2)
    env.close()  # drop the first env so that the faulty one serves the next reset
    first = env.reset(0)
    assert "fault" in first.info and env.faults == 1
    step = env.step("apple")
    assert step.done and not step.won and step.info["fault"] == first.info["fault"]
    with pytest.raises(EpisodeOverError):
        env.step("apple")
    assert _win(env) and env.faults == 1


def test_many_faulty_episodes_are_counted():
    env = SafeEnv(lambda: ScriptedEnv(fault="step_raise"), timeout_s=5.0)
    for seed in range(3):
        env.reset(seed)
        assert env.step("apple").info["fault"]
    assert env.faults == 3


def test_call_with_timeout():
    assert call_with_timeout(lambda: 7, 1.0, "seven") == 7
    with pytest.raises(EnvFault, match="boom raised ZeroDivisionError"):
        call_with_timeout(lambda: 1 / 0, 1.0, "boom")


def _flaky_make(fail_on: int, how: str):
    """A make() whose ``fail_on``-th call raises or hangs."""
    calls = []

    def make() -> ScriptedEnv:
        calls.append(1)
        if len(calls) == fail_on and how == "raise":
            raise RuntimeError("constructor broke")
        if len(calls) == fail_on and how == "hang":
            time.sleep(3.0)
        return ScriptedEnv()

    return make


@pytest.mark.parametrize("how", ["raise", "hang"])
def test_a_constructor_that_raises_or_hangs_fails_one_episode(how):
    make = _flaky_make(fail_on=4, how=how)
    envs = [SafeEnv(make, timeout_s=0.2) for _ in range(3)]
    start = time.monotonic()
    fourth = SafeEnv(make, timeout_s=0.2)
    assert time.monotonic() - start < 2.0
    assert fourth.faults == 1 and ("constructor broke" in fourth.last_fault or "timed out" in fourth.last_fault)
    assert fourth.reset(0).info["fault"] == fourth.last_fault  # the first episode reports it ...
    step = fourth.step("apple")
    assert step.done and not step.won and step.info["fault"] == fourth.last_fault
    assert _win(fourth) and fourth.faults == 1  # ... and the next one builds a working env
    assert all(_win(env) for env in envs)


class _Broken(ScriptedEnv):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def parse_action(self, response_text: str):
        if self.what == "parse_raise":
            raise ValueError("cannot parse")
        if self.what == "parse_none":
            return None
        return super().parse_action(response_text)

    def reset(self, seed: int):
        reset = super().reset(seed)
        if self.what == "reset_gym":  # gymnasium's (observation, info)
            return reset.observation, reset.info
        return reset

    def step(self, action: str):
        if self.what == "step_none":
            return None
        step = super().step(action)
        if self.what == "step_nan":
            step.reward = float("nan")
        if self.what == "step_bool":
            step.reward = True
        if self.what.startswith("numpy_"):  # gymnasium-style numpy rewards: numpy_float32, numpy_int64
            import numpy as np

            step.reward = getattr(np, self.what.removeprefix("numpy_"))(step.reward * 2 + 1)
        return step


@pytest.mark.parametrize("what, message", [("parse_raise", "parse_action() raised ValueError: cannot parse"),
                                           ("parse_none", "parse_action() returned None, not (action, valid)"),
                                           ("step_none", "returned NoneType, not an EnvStep"),
                                           ("step_nan", "returned the reward nan, not a finite number"),
                                           ("step_bool", "returned the reward True, not a finite number")])
def test_a_parse_or_step_that_raises_or_returns_garbage_is_a_fault(what, message):
    env = SafeEnv(_factory(_Broken(what), ScriptedEnv()), timeout_s=5.0)
    env.reset(0)
    action, _ = env.parse_action("apple")
    step = env.step(action)
    assert step.done and not step.won and step.reward == 0.0
    assert message in step.info["fault"] and env.faults == 1
    assert _win(env)


@pytest.mark.parametrize("kind", ["numpy_float32", "numpy_int64"])
def test_a_numpy_reward_is_a_float_not_a_fault(kind):
    """A gymnasium-style env's ``np.float32`` / ``np.int64`` reward: every step of it was a fault ("returned the reward
    np.float32(3.0), not a finite number")."""
    reference, numpy_env = ScriptedEnv(), SafeEnv(lambda: _Broken(kind), timeout_s=5.0)
    reference.reset(0)
    numpy_env.reset(0)
    action = reference.solution()[0]
    expected = reference.step(action).reward * 2 + 1
    step = numpy_env.step(action)
    assert numpy_env.faults == 0 and "fault" not in step.info and step.won
    assert type(step.reward) is float and step.reward == expected


def test_a_gym_style_reset_is_a_fault_not_a_crash_of_the_loop():
    """A reset returning gymnasium's ``(observation, info)`` passed through and the rollout loop died on
    ``reset.task`` (AttributeError, with a traceback) after the model had loaded."""
    env = SafeEnv(_factory(_Broken("reset_gym"), ScriptedEnv()), timeout_s=5.0)
    reset = env.reset(0)
    assert reset.info["fault"] == "scripted reset(0) returned tuple, not an EnvReset" and env.faults == 1
    assert env.step("apple").info["fault"] == reset.info["fault"]  # the episode ends as failed
    assert _win(env)  # the next episode gets a fresh env


@pytest.mark.parametrize("what, phase, kind", [("constructor", "constructor", "RuntimeError"),
                                               ("reset_raise", "reset", "RuntimeError"),
                                               ("parse_raise", "parse_action", "ValueError"),
                                               ("step_raise", "step", "RuntimeError"),
                                               ("step_nan", "step", "bad result")])
def test_a_fault_carries_its_phase_kind_and_traceback_to_the_step_that_ends_the_episode(what, phase, kind):
    """What the agent loop logs (health/env_faults.jsonl) travels in ``info["fault_report"]``, so it is the same
    wherever the env ran; the traceback is the env's own (None for a bad result: nothing raised)."""
    envs = {"constructor": _flaky_make(fail_on=1, how="raise"), "reset_raise": lambda: ScriptedEnv(fault=what),
            "step_raise": lambda: ScriptedEnv(fault=what)}
    env = SafeEnv(envs.get(what, lambda: _Broken(what)), timeout_s=5.0)
    reset = env.reset(0)
    action, _ = env.parse_action("<action>apple</action>")
    step = env.step(action)
    report = step.info["fault_report"]
    assert (report.phase, report.kind) == (phase, kind) and report.message == step.info["fault"] == env.last_fault
    assert reset.info.get("fault_report") is (report if phase in ("constructor", "reset") else None)
    if kind == "bad result":
        assert report.traceback is None
    else:
        assert report.traceback.rstrip().splitlines()[-1] == env.last_fault.split(" raised ", 1)[1]
