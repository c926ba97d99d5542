"""An environment whose constructor or reset keeps failing: each start is retried (env.reset_retries), every fault is
counted, and when no episode can start the run stops with one line naming the env, the phase and the first error
(exit code 5), not a traceback (issue #43)."""

from __future__ import annotations

import pytest

from tests.rollout.helpers import agent_config
from tether.config import ConfigError
from tether.envs import SafeEnv
from tether.envs.registry import ENVS, register_env
from tether.envs.scripted import ScriptedEnv
from tether.errors import EXIT_ENV_FAULT, EnvFaultError


class FlakyResetEnv(ScriptedEnv):
    """The scripted env whose first ``fails`` resets (counted over every instance) raise."""

    resets = 0
    fails = 2

    def reset(self, seed: int):
        type(self).resets += 1
        if type(self).resets <= self.fails:
            raise OSError(f"flaky reset {type(self).resets}")
        return super().reset(seed)


class BrokenConstructorEnv(ScriptedEnv):
    broken = False  # the builds before it is set (the config check's, the collector's probe) stand
    builds_before_broken: int | None = None  # or: this many builds stand, every later one fails
    built = 0

    def __init__(self, *, turns: int = 3) -> None:
        type(self).built += 1
        limit = type(self).builds_before_broken
        if type(self).broken or (limit is not None and type(self).built > limit):
            raise RuntimeError("no licence server")
        super().__init__(turns=turns)


@pytest.fixture
def registered():
    names = []

    def register(name: str, cls: type) -> str:
        register_env(name, f"{cls.__module__}:{cls.__name__}")
        names.append(name)
        return name

    with ENVS.restored():
        yield register


def test_a_flaky_reset_is_retried_with_a_fresh_env_and_every_fault_counted():
    FlakyResetEnv.resets = 0
    env = SafeEnv(FlakyResetEnv, timeout_s=5.0, reset_retries=2)
    reset = env.reset(0)
    assert not reset.info.get("fault") and env.faults == 2 and reset.task
    FlakyResetEnv.resets = 0
    once = SafeEnv(FlakyResetEnv, timeout_s=5.0, reset_retries=1)
    failed = once.reset(0)
    assert failed.info["fault"] == "scripted reset(0) raised OSError: flaky reset 1"  # the first, not the last
    assert once.faults == 2


def test_no_episode_can_start_is_one_line_naming_env_phase_and_first_error(tmp_path, agent_trainer):
    cfg = agent_config(tmp_path, "env.reset_retries=1", env={"kwargs": {"turns": 3, "fault": "reset_raise"}})
    trainer = agent_trainer(cfg)
    with pytest.raises(EnvFaultError) as stop:
        trainer.train_step()
    assert stop.value.exit_code == EXIT_ENV_FAULT == 5
    assert str(stop.value) == (
        "env scripted (reset), step 1: none of 6 episodes could start, each after env.reset_retries=1 retries; the "
        "first error: scripted reset(4) raised RuntimeError: scripted fault: reset raised on purpose")
    assert trainer.collector.faults == 12  # 6 episodes x 2 tries: every try's fault


def test_a_reset_that_a_retry_outlives_is_counted_logged_and_told(tmp_path, agent_trainer, registered):
    """Only the fault that ended an episode reached env/faults: a flaky reset that a retry outlived was counted
    nowhere but in the env wrapper, with no warning and no row of health/env_faults.jsonl."""
    import json

    name = registered("flaky_reset", FlakyResetEnv)
    trainer = agent_trainer(agent_config(tmp_path, f"env.name={name}", "env.reset_retries=2"))
    FlakyResetEnv.resets = 0  # the first two resets of the step raise, the first episode's third try stands
    with pytest.warns(UserWarning, match=r"faulted in reset \(seed \d+\): scripted reset\(\d+\) raised OSError: "
                                         r"flaky reset 1; it was tried again with a fresh env \(env.reset_retries\) "
                                         r"and counts in env/faults"):
        metrics = trainer.train_step()
    assert trainer.collector.faults == 2 and metrics["env/faults"] == 2.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "health" / "env_faults.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["error"]) for r in rows] == [("reset", "scripted reset(4) raised OSError: flaky reset 1")]


def test_a_constructor_that_fails_is_named_as_the_constructor(tmp_path, agent_trainer, registered):
    BrokenConstructorEnv.broken = False
    name = registered("broken_ctor", BrokenConstructorEnv)
    trainer = agent_trainer(agent_config(tmp_path, f"env.name={name}"))
    BrokenConstructorEnv.broken = True  # every env built from now on
    with pytest.raises(EnvFaultError, match=r"^env broken_ctor \(constructor\), step 1: none of 6 episodes could "
                                            r"start, each after env.reset_retries=2 retries; the first error: "
                                            r".*make\(\) raised RuntimeError: no licence server$"):
        trainer.train_step()


def test_a_constructor_that_fails_at_once_is_one_config_line_before_the_trainer_builds(tmp_path, agent_trainer,
                                                                                         registered):
    BrokenConstructorEnv.broken = True  # the config check's build fails
    name = registered("broken_ctor0", BrokenConstructorEnv)
    with pytest.raises(ConfigError, match=r"^env.kwargs: building env broken_ctor0 raised RuntimeError: no licence "
                                          r"server$"):
        agent_trainer(agent_config(tmp_path, f"env.name={name}"))


def test_a_constructor_that_fails_from_the_collectors_probe_on_stops_before_any_step(tmp_path, agent_trainer,
                                                                                       registered):
    BrokenConstructorEnv.broken, BrokenConstructorEnv.built = False, 0
    BrokenConstructorEnv.builds_before_broken = 1  # the config check's build stands, the collector's probe fails
    name = registered("broken_ctor1", BrokenConstructorEnv)
    try:
        with pytest.raises(EnvFaultError, match=r"^env broken_ctor1 \(constructor\): .*raised RuntimeError: no "
                                                r"licence server; no episode can start$"):
            agent_trainer(agent_config(tmp_path, f"env.name={name}"))
    finally:
        BrokenConstructorEnv.builds_before_broken = None


class MakeInItsResetErrorEnv(ScriptedEnv):
    """A reset whose own error text says make(): the fault is still the reset's."""

    def reset(self, seed: int):
        raise OSError("level make() found no map file")


def test_the_phase_is_the_recorded_one_not_a_guess_from_the_message(tmp_path, agent_trainer, registered):
    """The stop named "constructor" for any first error whose text held "make()"; the env wrapper records the phase
    (FaultReport.phase), and the stop names that one."""
    name = registered("make_in_reset", MakeInItsResetErrorEnv)
    trainer = agent_trainer(agent_config(tmp_path, f"env.name={name}", "env.reset_retries=0"))
    with pytest.raises(EnvFaultError) as stop:
        trainer.train_step()
    assert str(stop.value) == (
        f"env {name} (reset), step 1: none of 6 episodes could start, each after env.reset_retries=0 retries; the "
        "first error: scripted reset(4) raised OSError: level make() found no map file")


def test_a_validation_whose_every_episode_faults_closes_its_envs_before_it_stops(tmp_path, agent_trainer):
    """The stop was raised before the episodes' envs were closed: a caller that catches it kept every one open."""
    cfg = agent_config(tmp_path, "env.reset_retries=0", env={"kwargs": {"turns": 3, "fault": "reset_raise"}})
    collector = agent_trainer(cfg).collector
    closed = []
    close_all = collector.envs.close_all
    collector.envs.close_all = lambda envs: closed.extend(envs) or close_all(envs)
    with pytest.raises(EnvFaultError, match="validation: none of"):
        collector.validate(None, seed=0)
    v = collector.cfg.val
    assert len(closed) == (1 if v.greedy else v.samples) * len(collector.val_seeds) > 0  # one per episode
    assert all(env is not None for env in closed)
