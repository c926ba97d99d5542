"""``env.isolation: process`` in the agent loop (issue #43): a well-behaved env plays exactly as in-process (same rows,
same metrics of a tiny run), an env whose constructor ends its process stops the run with one line, and the setting is
checked before any model loads."""

from __future__ import annotations

import copy
import os
import re

import pytest

from tests.rollout.helpers import ScriptedEngine, agent_config
from tether.config import ConfigError
from tether.engine.base import sampling_params
from tether.envs import ENVS
from tether.errors import EnvFaultError
from tether.rollout.multi_turn import AgentCollector
from tether.trainer import Trainer


@pytest.fixture
def process_fault_env():
    with ENVS.restored():
        ENVS.add("process_fault", "tests.envs.worker_envs:ProcessFaultEnv")
        yield


def play(collector: AgentCollector, tokenizer) -> tuple[list, list]:
    episodes = collector.start_episodes(collector.train_seeds[:2], 3)
    rows = collector.run_episodes(ScriptedEngine(tokenizer), episodes, sampling_params(collector.cfg.rollout), seed=0)
    return ([(r["episode"].episode_id, r["turn"], r["text"], r["valid"]) for r in rows],
            [(e.ret, e.won, e.fault, [t["action"] for t in e.turns]) for e in episodes])


def test_a_well_behaved_env_plays_exactly_as_in_process(tmp_path, tokenizer):
    thread = AgentCollector(agent_config(tmp_path, "env.isolation=thread"), tokenizer)
    process = AgentCollector(agent_config(tmp_path, "env.isolation=process"), tokenizer)
    assert process.envs.children is not None and thread.envs.children is None
    assert (process.train_seeds, process.val_seeds, process.action_format) == (
        thread.train_seeds, thread.val_seeds, thread.action_format)
    rows, episodes = play(process, tokenizer)
    assert (rows, episodes) == play(thread, tokenizer)
    assert {len(e[3]) for e in episodes} == {1, 2, 3} and process.faults == 0


def test_a_tiny_run_has_the_same_metrics_in_processes_as_in_process(tmp_path, tiny_policy):
    model, tok = tiny_policy
    metrics = {}
    for isolation in ("thread", "process"):
        cfg = agent_config(tmp_path / isolation, f"env.isolation={isolation}")
        trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)  # each run from the same weights
        trainer.use_engine(ScriptedEngine(tok))
        step = {**trainer.train_step(), **trainer.validate()}
        metrics[isolation] = {k: v for k, v in step.items() if not k.startswith(("time/", "perf/"))}
    assert metrics["process"] == metrics["thread"]
    assert metrics["process"]["env/faults"] == 0.0 and metrics["process"]["val/episodes"] == 3.0


def test_a_constructor_that_ends_its_process_stops_the_run_with_one_line(tmp_path, tokenizer, process_fault_env):
    cfg = agent_config(tmp_path, "env.isolation=process", "env.name=process_fault",
                       f"env.kwargs={{process_fault: exit_init, safe_pid: {os.getpid()}, exit_code: 3}}")
    with pytest.raises(EnvFaultError) as stop:
        AgentCollector(cfg, tokenizer)
    assert str(stop.value) == ("env process_fault (constructor): env process_fault: building the first environment: "
                               "the env's process ended with exit code 3; no episode can start")


def test_isolation_is_checked_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"env\.isolation"):
        agent_config(tmp_path, "env.isolation=fork")



def test_an_env_that_ends_its_process_mid_step_faults_its_episodes_and_the_step_goes_on(tmp_path, tokenizer,
                                                                                        process_fault_env):
    cfg = agent_config(tmp_path, "env.isolation=process", "env.name=process_fault",
                       f"env.kwargs={{process_fault: exit, safe_pid: {os.getpid()}, exit_code: 9}}")
    collector = AgentCollector(cfg, tokenizer)
    _, episodes = play(collector, tokenizer)
    assert len(episodes) == 6 and all(re.fullmatch(r"scripted step\('\w+'\): the env's process ended with exit code 9",
                                                    e[2]) for e in episodes), [e[2] for e in episodes]
    assert collector.faults == 6
    play(collector, tokenizer)  # fresh processes serve the next episodes (and fault the same way)
    assert collector.faults == 12 and collector.envs.children.started == 12  # the probe's served the first episode


@pytest.fixture
def parse_fault_env():
    with ENVS.restored():
        ENVS.add("parse_fault", "tests.envs.worker_envs:ParseFaultEnv")
        yield


def test_a_step_that_faulted_is_not_an_invalid_action(tmp_path, tokenizer, parse_fault_env):
    """The fault judged nothing: no invalid-action penalty on its row, and it does not count in
    env/invalid_action_frac (a dead env worker answered ("", False) and got both)."""
    cfg = agent_config(tmp_path, "env.isolation=thread", "env.name=parse_fault", "env.invalid_action_penalty=0.1")
    collector = AgentCollector(cfg, tokenizer)
    rows, episodes = play(collector, tokenizer)
    assert len(rows) == 6 and all(fault and "parser crashed" in fault for _, _, fault, _ in episodes)
    batch = collector.to_batch(collector.run_episodes(ScriptedEngine(tokenizer), collector.start_episodes(
        collector.train_seeds[:2], 3), sampling_params(collector.cfg.rollout), seed=0))
    assert batch.rewards.tolist() == [0.0] * 6  # the faulted episodes' return, 0, and no -0.1
    assert all(valid for *_, valid in rows)
