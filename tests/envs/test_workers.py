"""Env workers (``env.workers``): envs in Ray actors play exactly like envs in this process, and a fault of the
env or of the whole worker process ends the episode as failed, counted, while the rollout goes on.

Uses the session's Ray instance (tests/conftest.py); each worker reserves a quarter CPU, so the workers of
the collectors alive at once fit in its 2 CPUs.
"""

from __future__ import annotations

import os

import pytest

from tests.rollout.helpers import ScriptedEngine, agent_config
from tether.engine.base import sampling_params
from tether.envs import ENVS
from tether.envs import workers as workers_module
from tether.envs.workers import LocalEnvPool, RayEnvPool, RemoteEnv
from tether.files import read_jsonl
from tether.rollout.multi_turn import FAULT_LOG, AgentCollector


@pytest.fixture
def process_fault_env():
    with ENVS.restored():
        ENVS.add("process_fault", "tests.envs.worker_envs:ProcessFaultEnv")
        yield


def collector(tmp_path, tokenizer, workers: int, *overrides: str) -> AgentCollector:
    cfg = agent_config(tmp_path, f"env.workers={workers}", "env.worker_cpus=0.25", *overrides)
    return AgentCollector(cfg, tokenizer)


def play(collector: AgentCollector, tokenizer, tasks: int = 2, copies: int = 3) -> tuple[list, list]:
    """(turn rows, episode outcomes) of ``copies`` episodes of the first ``tasks`` training tasks."""
    episodes = collector.start_episodes(collector.train_seeds[:tasks], copies)
    rows = collector.run_episodes(ScriptedEngine(tokenizer), episodes, sampling_params(collector.cfg.rollout), seed=0)
    return ([(r["episode"].episode_id, r["turn"], r["text"], r["valid"]) for r in rows],
            [(e.ret, e.won, e.fault, [t["action"] for t in e.turns]) for e in episodes])


def test_workers_play_exactly_like_local_envs(ray_session, tmp_path, tokenizer):
    local = collector(tmp_path, tokenizer, 0)
    remote = collector(tmp_path, tokenizer, 2)
    assert isinstance(local.envs, LocalEnvPool) and isinstance(remote.envs, RayEnvPool)
    rows, episodes = play(remote, tokenizer)
    assert (rows, episodes) == play(local, tokenizer)
    assert {len(e[3]) for e in episodes} == {1, 2, 3} and remote.faults == 0  # wins, invalid first, losses
    envs = [pool.make() for pool in (local.envs, remote.envs)]
    for pool, env in zip((local.envs, remote.envs), envs, strict=True):
        pool.reset_all([env], [3])
    assert envs[0].solution() == envs[1].solution() == ["grape"]  # SEED's SFT stage records it


@pytest.mark.parametrize("fault", ["reset_raise", "step_raise"])
def test_env_faults_inside_workers_are_contained_and_counted_as_in_process(ray_session, tmp_path, tokenizer, fault):
    kwargs = f"env.kwargs={{turns: 3, fault: {fault}, fault_turn: 2}}"
    local, remote = collector(tmp_path, tokenizer, 0, kwargs), collector(tmp_path, tokenizer, 1, kwargs)
    _, episodes = play(remote, tokenizer)
    assert episodes == play(local, tokenizer)[1]
    faulted = [e for e in episodes if e[2] is not None]
    assert faulted and all("RuntimeError: scripted fault" in e[2] for e in faulted)
    tries = 3 if fault == "reset_raise" else 1  # a reset is tried env.reset_retries=2 more times, each counted
    assert remote.faults == local.faults == tries * len(faulted)


@pytest.mark.parametrize("fault, phase, turn", [("reset_raise", "reset", None), ("step_raise", "step", 1)])
def test_env_faults_inside_workers_are_logged_as_in_process(ray_session, tmp_path, tokenizer, fault, phase, turn):
    """The fault's report (phase, kind, traceback) comes back from the actor with the step or reset it ended."""
    kwargs = f"env.kwargs={{turns: 3, fault: {fault}, fault_turn: 2}}"
    logs = []
    for workers in (0, 1):
        played = collector(tmp_path / str(workers), tokenizer, workers, kwargs)
        with pytest.warns(UserWarning, match=f"^env scripted faulted in {phase} "):
            play(played, tokenizer)
        logs.append(read_jsonl(tmp_path / str(workers) / "run" / FAULT_LOG, "env fault log", ("traceback",)))
    [row] = logs[1]
    assert logs[0] == logs[1]  # the same row, traceback included
    assert (row["phase"], row["kind"], row["turn"]) == (phase, "RuntimeError", turn)
    assert row["traceback"].rstrip().endswith(f"RuntimeError: scripted fault: {phase} raised on purpose")


def test_a_crashed_worker_faults_its_episodes_and_is_replaced(ray_session, tmp_path, tokenizer, process_fault_env):
    remote = collector(tmp_path, tokenizer, 1, "env.name=process_fault",
                       f"env.kwargs={{process_fault: exit, safe_pid: {os.getpid()}}}")
    crashed = remote.envs.actors[0]
    _, episodes = play(remote, tokenizer, tasks=1, copies=2)
    assert [(e[2], e[3]) for e in episodes] == [("env worker died: ActorDiedError", [""])] * 2
    assert remote.faults == 2
    [row] = read_jsonl(tmp_path / "run" / FAULT_LOG, "env fault log", ("traceback",))
    assert (row["phase"], row["kind"], row["turn"], row["traceback"]) == ("step", "worker died", 0, None)
    assert remote.envs.make().actor is not crashed  # new envs go to the replacement
    assert RemoteEnv(crashed, 0, 1.0).solution() is None  # a dead worker's env has no solution, as a faulted one
    fresh = remote.envs.actors[0]
    assert fresh != crashed and ray_session.get(fresh.close.remote(0)) is None  # a live worker took the slot


def test_a_stuck_worker_is_timed_out_killed_and_replaced(ray_session, tmp_path, tokenizer, process_fault_env,
                                                         monkeypatch):
    monkeypatch.setattr(workers_module, "GRACE_S", 1.0)
    remote = collector(tmp_path, tokenizer, 1, "env.name=process_fault", "env.reset_timeout_s=1", "env.reset_retries=0",
                       f"env.kwargs={{process_fault: block, safe_pid: {os.getpid()}, hang_s: 60}}")
    stuck = remote.envs.actors[0]
    rows, episodes = play(remote, tokenizer, tasks=1, copies=2)
    assert rows == [] and remote.faults == 2
    # 2 resets queued on the one worker, each allowed 2 s (a build and a reset of 1 s each), and the grace
    assert all("env worker did not answer within 5s" in e[2] for e in episodes), [e[2] for e in episodes]
    assert remote.envs.actors[0] != stuck


def test_a_slow_worker_within_its_limits_is_not_killed(ray_session, tmp_path, tokenizer, monkeypatch):
    """A reset may build the env and reset it, an act parse and step, each call up to its limit inside the worker;
    the worker's deadline allowed one limit for the two, so a healthy worker (0.8 s + 0.8 s under limits of 1 s)
    was killed as "did not answer" and its episodes faulted."""
    monkeypatch.setattr(workers_module, "GRACE_S", 0.3)
    with ENVS.restored():
        ENVS.add("slow", "tests.envs.worker_envs:SlowEnv")
        remote = collector(tmp_path, tokenizer, 1, "env.name=slow", "env.kwargs={reset_s: 0.8, act_s: 0.6}",
                           "env.timeout_s=1", "env.reset_timeout_s=1", "env.reset_retries=0", "env.max_turns=1")
        ray_session.get(remote.envs.actors[0].close.remote(-1))  # the actor is up: its start is not the env's time
        _, episodes = play(remote, tokenizer, tasks=1, copies=1)
    assert remote.faults == 0 and [e[2] for e in episodes] == [None]
