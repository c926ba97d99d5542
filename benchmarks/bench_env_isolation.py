"""The cost of ``env.isolation: process`` against ``thread`` on a tiny env, in a trainer-sized process.

    .venv/bin/python benchmarks/bench_env_isolation.py --env thin_ice --envs 32 --ballast-mb 2000

A float32 tensor of ``--ballast-mb`` stands for the model the trainer holds (forking the trainer would cost in
proportion; the zygote does not). For each isolation: the first ``make`` + ``reset`` of ``--envs`` envs (per env,
the zygote's start included), the median over ``--rounds`` batches of one ``parse_action`` + ``step`` of every env
(per env: the batch's wall time over its size), and each env process's private memory (``/proc/PID/smaps_rollup``).
Wall-clock on a shared machine: read the numbers as rough.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

import torch

from tether.envs import env_class
from tether.envs.workers import LocalEnvPool


def private_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = [line.split() for line in f if line.startswith(("Private_Clean", "Private_Dirty"))]
    return sum(int(kb) for _, kb, _ in fields) / 1024


def measure(factory: Any, envs: int, rounds: int, action: str, processes: bool) -> str:
    pool = LocalEnvPool(factory, timeout_s=30.0, processes=processes)
    began = time.perf_counter()
    batch = [pool.make() for _ in range(envs)]
    pool.reset_all(batch, list(range(envs)))
    first = (time.perf_counter() - began) / envs
    per_env = []
    for _ in range(rounds):
        pool.close_all(batch)
        batch = [pool.make() for _ in range(envs)]
        pool.reset_all(batch, list(range(envs)))
        began = time.perf_counter()
        pool.act_all(batch, [f"<action>{action}</action>"] * envs)
        per_env.append((time.perf_counter() - began) / envs)
    memory = statistics.mean(private_mb(env._child.pid) for env in batch) if processes else 0.0
    pool.close_all(batch)
    return (f"{'process' if processes else 'thread'}: first make+reset {1e3 * first:.1f} ms/env, "
            f"parse+step {1e3 * statistics.median(per_env):.2f} ms/env, env process private memory {memory:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="thin_ice")
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ballast-mb", type=int, default=2000)
    parser.add_argument("--action", default="up", help="the action every env is stepped with")
    args = parser.parse_args()
    ballast = torch.ones(args.ballast_mb * 2**18)  # noqa: F841  (held for its memory)
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # torch's thread pool started, as in a trainer
    factory = functools.partial(env_class(args.env))
    for processes in (False, True):
        result = measure(factory, args.envs, args.rounds, args.action, processes)
        print(f"{args.env} x{args.envs}, +{args.ballast_mb} MB, {result}", flush=True)


if __name__ == "__main__":
    main()
