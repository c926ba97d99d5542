"""Where the agent loop's environments run: on this machine (``env.workers: 0``) or in Ray actors (``> 0``).

The agent loop (:class:`~tether.rollout.multi_turn.AgentCollector`) hands a pool the envs of a whole batch
of episodes per call (``reset_all``, ``act_all``, ``close_all``). :class:`LocalEnvPool` runs them on this machine:
each env a :class:`~tether.envs.isolated.ProcessEnv` in a child process of its own, the calls of a batch at once
(``env.isolation: process``, the default), or a :class:`~tether.envs.safe.SafeEnv` whose calls run in threads of
this process, one env after the other (``thread``). :class:`RayEnvPool` spreads the envs round-robin over
``workers`` actors (:class:`EnvWorker`) on any node of the Ray cluster, sends every call of the batch at once and
waits for all of them, so slow envs step in parallel.

Faults are contained and end the episode as failed (``info["fault"]``, counted in ``env/faults``) either way:

* an env that raises or hangs: by the :class:`~tether.envs.safe.SafeEnv` it runs in (inside the actor for Ray);
  with ``env.isolation: process`` a call past its limit kills the env's process, so a busy loop ends too, and an
  env that ends its process (``os._exit``, a native crash) faults its episode;
* a worker that dies (a crash in native code) or stops answering (a hang that holds the GIL, which a thread
  cannot outlive): every call waiting on it faults, and the worker is killed and replaced by a fresh one
  for the envs made after that. This is what actors add over threads: a process can be killed.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tether.envs.base import EnvReset, EnvStep, TextEnv
from tether.envs.isolated import ChildPool, ProcessEnv
from tether.envs.registry import check_env_kwargs, env_class
from tether.envs.safe import FaultReport, SafeEnv, call_with_timeout, fault_reset, fault_step

if TYPE_CHECKING:
    from tether.config import EnvConfig

Outcome = tuple[str, bool, EnvStep]  # (parsed action, valid, the env's step)
T = TypeVar("T")
GRACE_S = 10.0  # beyond SafeEnv's own limits, before a worker counts as stuck
PARALLEL_CALLS = 32  # env processes called at once by one pool (the trainer's threads only wait on their pipes)


def act(env: Any, text: str) -> Outcome:
    """Parse the action from a response (against the env's admissible actions) and step the env with it."""
    action, valid = env.parse_action(text)
    return action, valid, env.step(action)


class LocalEnvPool:
    """Envs on this machine, each a :class:`SafeEnv` over ``factory``: with ``processes`` a :class:`ProcessEnv` in a
    process of its own, and the calls of a batch run at once (each waits on its env's pipe in a thread of
    :data:`PARALLEL_CALLS`, so slow envs step in parallel and a call's round trip overlaps the others'); else in
    this process, one env after the other."""

    def __init__(self, factory: Callable[[], TextEnv], *, timeout_s: float,
                 reset_timeout_s: float | None = None, reset_retries: int = 0, processes: bool = False) -> None:
        self.factory, self.timeout_s, self.reset_timeout_s = factory, timeout_s, reset_timeout_s
        self.reset_retries = reset_retries
        self.children = ChildPool(factory) if processes else None
        self._calls = ThreadPoolExecutor(PARALLEL_CALLS, thread_name_prefix="tether-env") if processes else None

    def make(self) -> SafeEnv:
        if self.children is not None:
            return ProcessEnv(self.children, timeout_s=self.timeout_s,
                              reset_timeout_s=self.reset_timeout_s, reset_retries=self.reset_retries)
        return SafeEnv(self.factory, timeout_s=self.timeout_s, reset_timeout_s=self.reset_timeout_s,
                       reset_retries=self.reset_retries)

    def reset_all(self, envs: list[SafeEnv], seeds: list[int]) -> list[EnvReset]:
        return self._each(lambda env, seed: env.reset(seed), envs, seeds)

    def act_all(self, envs: list[SafeEnv], texts: list[str]) -> list[Outcome]:
        return self._each(act, envs, texts)

    def close_all(self, envs: list[SafeEnv]) -> None:
        self._each(lambda env, _: env.close(), envs, envs)

    def _each(self, call: Callable[[SafeEnv, Any], T], envs: list[SafeEnv], args: list[Any]) -> list[T]:
        """``call(env, arg)`` for each pair, in order; at once in the env processes' threads (each env is one
        thread's: the results are those of the one-by-one loop)."""
        if len(envs) != len(args):
            raise ValueError(f"{len(envs)} envs and {len(args)} arguments")
        if self._calls is None or len(envs) < 2:
            return [call(env, arg) for env, arg in zip(envs, args, strict=True)]
        return list(self._calls.map(call, envs, args))


class EnvWorker:
    """The body of one Ray actor: the :class:`SafeEnv` of each episode it serves, by key."""

    def __init__(self, factory: Callable[[], TextEnv], timeout_s: float, reset_timeout_s: float | None,
                 reset_retries: int = 0) -> None:
        self.local = LocalEnvPool(factory, timeout_s=timeout_s, reset_timeout_s=reset_timeout_s,
                                  reset_retries=reset_retries)
        self.envs: dict[int, SafeEnv] = {}

    def reset(self, key: int, seed: int) -> EnvReset:
        """Reset env ``key``, building it on first use (a failing constructor raises to the caller, as in-process)."""
        if key not in self.envs:
            self.envs[key] = self.local.make()
        return self.envs[key].reset(seed)

    def act(self, key: int, text: str) -> Outcome:
        return act(self.envs[key], text)

    def solution(self, key: int) -> list[str] | None:
        return self.envs[key].solution()

    def close(self, key: int) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()


@dataclass
class RemoteEnv:
    """An episode's env inside a worker actor; the pool steps it. ``limit_s`` bounds a single call."""

    actor: Any
    key: int
    limit_s: float

    def solution(self) -> list[str] | None:
        """The env's solution, or None when the worker faults (as :meth:`SafeEnv.solution`)."""
        import ray

        try:
            return ray.get(self.actor.solution.remote(self.key), timeout=self.limit_s + GRACE_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None


class RayEnvPool:
    """Envs in ``workers`` Ray actors, assigned round-robin; every call of a batch runs at once.

    Args:
        factory: builds one env, inside an actor: pickled by reference, so its module must be importable
            on every node (tether's envs are; so is a ``register_env`` target in an installed package).
        timeout_s, reset_timeout_s: :class:`SafeEnv`'s limits, applied inside the actors.
        workers: number of actors.
        worker_cpus: Ray CPUs each actor reserves.
    """

    def __init__(self, factory: Callable[[], TextEnv], *, timeout_s: float, reset_timeout_s: float | None,
                 workers: int, worker_cpus: float, reset_retries: int = 0) -> None:
        from tether.distributed.ray_cluster import connect

        self._ray = connect("env.workers", local_cpus=workers * worker_cpus)
        self._worker = self._ray.remote(EnvWorker).options(num_cpus=worker_cpus)
        self._args = (factory, timeout_s, reset_timeout_s, reset_retries)
        # what a healthy worker may take: an act parses, then steps, each up to the step limit; every try of a reset
        # may build the env, then reset it, each up to the reset limit
        self.step_limit_s = 2 * timeout_s
        self.reset_limit_s = 2 * (reset_timeout_s or timeout_s) * (reset_retries + 1)
        self.actors = [self._worker.remote(*self._args) for _ in range(workers)]
        self._keys = itertools.count()

    def make(self) -> RemoteEnv:
        key = next(self._keys)
        return RemoteEnv(self.actors[key % len(self.actors)], key, max(self.step_limit_s, self.reset_limit_s))

    def reset_all(self, envs: list[RemoteEnv], seeds: list[int]) -> list[EnvReset]:
        calls = [env.actor.reset.remote(env.key, seed) for env, seed in zip(envs, seeds, strict=True)]
        return self._gather(envs, calls, self.reset_limit_s,
                            lambda message, kind: fault_reset(FaultReport(message, "reset", kind)))

    def act_all(self, envs: list[RemoteEnv], texts: list[str]) -> list[Outcome]:
        calls = [env.actor.act.remote(env.key, text) for env, text in zip(envs, texts, strict=True)]
        return self._gather(envs, calls, self.step_limit_s,
                            lambda message, kind: ("", False, fault_step(FaultReport(message, "step", kind))))

    def close_all(self, envs: list[RemoteEnv]) -> None:
        """Close without waiting: a worker closes its envs in call order, before serving later calls."""
        for env in envs:
            env.actor.close.remote(env.key)

    def _gather(self, envs: list[RemoteEnv], calls: list[Any], limit_s: float,
                on_fault: Callable[[str, str], T]) -> list[T]:
        """Every call's result; a call on a worker that died or outlived its deadline gets ``on_fault(message,
        kind)``.

        A worker runs its calls one at a time, so the deadline is the longest queue times the per-call limit.
        """
        queue = Counter(env.key % len(self.actors) for env in envs)
        deadline = limit_s * max(queue.values(), default=1) + GRACE_S
        done, _ = self._ray.wait(calls, num_returns=len(calls), timeout=deadline)
        done = set(done)
        out = []
        for env, call in zip(envs, calls, strict=True):
            if call not in done:
                out.append(on_fault(f"env worker did not answer within {deadline:g}s", "timeout"))
                self._replace(env.actor)
                continue
            try:
                out.append(self._ray.get(call))
            except self._ray.exceptions.RayActorError as err:
                out.append(on_fault(f"env worker died: {type(err).__name__}", "worker died"))
                self._replace(env.actor)
        return out

    def _replace(self, actor: Any) -> None:
        """Kill a dead or stuck worker and give its slot to a fresh one (its other envs fault at their next call)."""
        for i, current in enumerate(self.actors):
            if current == actor:
                self._ray.kill(actor)
                self.actors[i] = self._worker.remote(*self._args)


def env_factory(cfg: EnvConfig) -> Callable[[], TextEnv]:
    """Builds ``cfg``'s env. The class is resolved here, so an env registered in this process also works in the
    actors (it travels by reference)."""
    check_env_kwargs(cfg.name, cfg.kwargs)
    return functools.partial(env_class(cfg.name), **cfg.kwargs)


def in_processes(cfg: EnvConfig) -> bool:
    """Whether envs run in child processes of this machine (``env.workers: 0, env.isolation: process``)."""
    return cfg.workers == 0 and cfg.isolation == "process"


def make_env_pool(cfg: EnvConfig) -> LocalEnvPool | RayEnvPool:
    """``env.workers: 0``: :class:`LocalEnvPool` (its envs in child processes or threads, ``env.isolation``);
    N > 0: :class:`RayEnvPool` with N actors."""
    factory = env_factory(cfg)
    if cfg.workers == 0:
        return LocalEnvPool(factory, timeout_s=cfg.timeout_s, reset_timeout_s=cfg.reset_timeout_s,
                            reset_retries=cfg.reset_retries, processes=in_processes(cfg))
    return RayEnvPool(factory, timeout_s=cfg.timeout_s, reset_timeout_s=cfg.reset_timeout_s, workers=cfg.workers,
                      worker_cpus=cfg.worker_cpus, reset_retries=cfg.reset_retries)


@dataclass(frozen=True)
class EnvProbe:
    """What the agent loop reads of an env before its first episode."""

    train_seeds: list[int]
    val_seeds: list[int]
    action_format: str
    renders_images: bool


def probe(factory: Callable[[], TextEnv], train_tasks: int, val_tasks: int) -> EnvProbe:
    """Build one env and read its seeds of each split and its action format."""
    env = factory()
    try:
        return EnvProbe(list(env.train_seeds(train_tasks)), list(env.eval_seeds(val_tasks)), env.action_format,
                        bool(getattr(env, "renders_images", False)))
    finally:
        env.close()


def probe_env(cfg: EnvConfig, pool: LocalEnvPool | RayEnvPool) -> EnvProbe:
    """:func:`probe` ``cfg``'s env under its reset limit, in one of ``pool``'s env processes if it has them, else in a
    thread of this process (raises :class:`~tether.envs.safe.EnvFault`)."""
    limit, what = cfg.reset_timeout_s or cfg.timeout_s, f"env {cfg.name}: building the first environment"
    children = getattr(pool, "children", None)
    if children is None:
        return call_with_timeout(functools.partial(probe, env_factory(cfg), cfg.train_tasks, cfg.val_tasks),
                                 limit, what)
    child = children.take(what)
    try:
        facts = child.request("make", None, timeout_s=limit, what=what)
        seeds = [child.request("call", (method, (n,)), timeout_s=limit, what=f"{what}: {method}({n})")
                 for method, n in (("train_seeds", cfg.train_tasks), ("eval_seeds", cfg.val_tasks))]
        child.request("call", ("close", ()), timeout_s=limit, what=f"{what}: close()")
    finally:
        children.give(child)
    return EnvProbe(list(seeds[0]), list(seeds[1]), facts.action_format, facts.renders_images)
