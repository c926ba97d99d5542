"""``env.isolation: process`` (issue #43): every env call is bounded even when the env busy-loops, and an env that ends
its process is a counted fault with one line naming the env, the call and the exit code (the agent loop's side:
tests/rollout/test_env_isolation.py)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

from tests.envs.worker_envs import ProcessFaultEnv
from tether.envs.isolated import ChildPool, ProcessEnv
from tether.envs.scripted import ScriptedEnv
from tether.envs.workers import LocalEnvPool


def pool(timeout_s: float = 5.0, reset_retries: int = 0, **kwargs) -> LocalEnvPool:
    return LocalEnvPool(functools.partial(ScriptedEnv, **kwargs), timeout_s=timeout_s, reset_retries=reset_retries,
                        processes=True)


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer exists (it was killed and reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_busy_loop_in_step_is_killed_at_the_limit_and_the_next_episode_gets_a_fresh_process():
    envs = pool(timeout_s=0.5, fault="step_spin", hang_s=60.0)
    env = envs.make()
    assert isinstance(env, ProcessEnv)
    env.reset(0)
    spinning = env._child.pid
    start = time.monotonic()
    step = env.step("apple")
    assert time.monotonic() - start < 5.0
    assert step.done and not step.won
    assert step.info["fault"] == "scripted step('apple') timed out after 0.5s (its process was killed)"
    assert env.faults == 1 and gone(spinning)
    env.reset(1)  # a fresh process serves the next episode (and spins again: the env is the same)
    assert env._child.pid != spinning and envs.children.started == 2


def test_a_hang_in_reset_is_bounded_and_retried_in_a_fresh_process():
    envs = pool(timeout_s=0.5, reset_retries=1, fault="reset_spin", hang_s=60.0)
    env = envs.make()
    start = time.monotonic()
    reset = env.reset(0)
    assert time.monotonic() - start < 8.0  # two tries of 0.5 s, and two process starts
    assert reset.info["fault"] == "scripted reset(0) timed out after 0.5s (its process was killed)"
    assert env.faults == 2 and envs.children.started == 2
    assert env.step("apple").info["fault"] == reset.info["fault"]  # the episode ends at its first step, as in-process


def test_os_exit_in_a_step_is_a_counted_fault_naming_env_call_and_exit_code():
    envs = LocalEnvPool(functools.partial(ProcessFaultEnv, process_fault="exit", safe_pid=os.getpid(), exit_code=7),
                        timeout_s=5.0, processes=True)
    env = envs.make()
    env.reset(0)
    step = env.step("apple")
    assert step.done and not step.won and env.faults == 1
    assert step.info["fault"] == "scripted step('apple'): the env's process ended with exit code 7"
    assert not env.reset(0).info.get("fault")  # the next episode's env runs in a fresh process


def test_a_raising_env_keeps_its_process_and_a_closed_env_hands_it_to_the_next_episode():
    envs = pool(fault="step_raise")
    env = envs.make()
    env.reset(0)
    pid = env._child.pid
    fault = env.step("apple").info["fault"]
    assert fault == "scripted step('apple') raised RuntimeError: scripted fault: step raised on purpose"
    env.close()
    again = envs.make()
    again.reset(0)
    assert again._child.pid == pid and envs.children.started == 1


def test_an_env_class_that_cannot_reach_a_process_is_one_fault_naming_the_fix():
    local = type("LocalEnv", (ScriptedEnv,), {})  # a class made at run time does not pickle by reference
    env = ProcessEnv(ChildPool(local), timeout_s=5.0)
    fault = env.reset(0).info["fault"]
    assert fault.startswith("LocalEnv make(): the env's class and env.kwargs must pickle to reach its process")
    assert fault.endswith("or set env.isolation: thread")


def test_a_step_busy_when_the_trainer_is_killed_does_not_spin_on(tmp_path):
    trainer = subprocess.Popen([sys.executable, "-c", (
        "import functools\n"
        "from tether.envs.scripted import ScriptedEnv\n"
        "from tether.envs.workers import LocalEnvPool\n"
        "pool = LocalEnvPool(functools.partial(ScriptedEnv, fault='step_spin', hang_s=600.0), timeout_s=600.0,"
        " processes=True)\n"
        "env = pool.make()\n"
        "env.reset(0)\n"
        "print(env._child.pid, flush=True)\n"
        "env.step('apple')\n")], stdout=subprocess.PIPE, text=True)
    spinning = int(trainer.stdout.readline())
    trainer.kill()  # SIGKILL, no finaliser runs: the zygote sees its pipe close and ends, the kernel kills the child
    trainer.wait()
    deadline = time.monotonic() + 10.0
    while not ended(spinning) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended(spinning)


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it to reap it: not running either way."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_solution_past_its_limit_ends_the_episode_as_a_fault_and_a_raising_one_does_not():
    """seed-sft asks each started episode's env for its solution. One past the limit killed the env's process while
    the episode went on: its next call went to a fresh process without an env (an AttributeError fault) or to an
    idle one holding another episode's closed env (EpisodeOverError out of the loop, a traceback)."""
    envs = pool(timeout_s=0.5, fault="solution_hang", hang_s=60.0)
    idle = [envs.make() for _ in range(2)]  # an idle process with a closed env of seed 1 waits in the pool
    for env in idle:
        env.reset(1)
    for env in idle:
        env.close()
    env = envs.make()
    env.reset(0)
    assert env.solution() is None and env.faults == 1
    (action, valid, step), = envs.act_all([env], ["<action>apple</action>"])
    assert (action, valid, step.done, step.won) == ("", False, True, False)
    assert step.info["fault"] == "scripted solution() timed out after 0.5s (its process was killed)"
    assert step.info["fault_report"].phase == "solution"

    raising = pool(fault="solution_raise").make()
    raising.reset(0)
    assert raising.solution() is None and raising.faults == 0
    assert raising.step("apple").won  # the episode goes on with its env
