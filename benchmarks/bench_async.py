"""Asynchronous rollouts against synchronous ones on the quickstart, with the in-process and the Ray engine.

    .venv/bin/python benchmarks/bench_async.py --steps 10 --warmup 2

Four trainers on ``configs/quickstart.yaml`` (SmolLM2-135M, float32) in one process, built once (startup is not
timed) and stepped in turn, one RL step each per round, the order rotating every round, so machine load falls on all
of them alike:

* ``hf-sync`` (a): synchronous, the in-process HF engine, ``--threads`` torch threads (the default setup);
* ``ray-sync`` (b): synchronous, ``rollout.engine=ray`` with one actor (one Ray CPU, one torch thread) pinned to the
  second core; the trainer one thread, pinned to the first core during its steps;
* ``ray-async`` (c): (b) with ``rollout.max_staleness=1``: the actor samples the next batch while the trainer updates;
* ``hf-async`` (d): ``rollout.max_staleness=1`` with the in-process engine: the next batch is sampled in the
  trainer's background thread (over a copy of the weights) while the main thread updates, one torch thread each,
  unpinned.

Every setting samples with ``rollout.correction.mode=tis`` (the asynchronous ones need a correction; the synchronous
ones get it too, so all compute the same step); parity and the nothing-trains stop only log. Per step: ``perf/step_s``
and the phases the trainer logs (``perf/rollout_s``: until the trainer has its batch, ``perf/weight_sync_s``: the
weight push, which in an asynchronous step also waits for the sampling job), and, timed here, ``rollout_work_s`` (the
collector's sampling and reward, wherever it runs) and ``push_s`` (the engine's ``load_weights`` alone). Per
asynchronous setting: the overlap achieved (its synchronous baseline's step / its step) and the ideal (the baseline's
step / (max(rollout, update) + push)). Medians over the timed steps go to the terminal and, with every step, to
``--out`` (default ``benchmarks/results/<date>-async.json``). docs/benchmarks.md has the expected gain on GPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.engine.hf import cpu_flags

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
RAY_ACTOR = "rollout.engine_kwargs={num_actors: 1, num_cpus_per_actor: 1, threads: 1}"


@dataclass(frozen=True)
class Setting:
    """One trainer of the comparison; ``baseline``: the synchronous setting an asynchronous one is compared with."""

    label: str
    overrides: tuple[str, ...]
    threads: int | None  # None: --threads
    pinned: bool  # trainer on the first core during its steps, Ray actor on the second
    baseline: str | None = None
    uses_ray: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uses_ray", "rollout.engine=ray" in self.overrides)


SETTINGS = {
    "hf-sync": Setting("(a) synchronous, in-process HF engine, --threads threads", (), None, pinned=False),
    "ray-sync": Setting("(b) synchronous, Ray engine: 1 actor on core 2, trainer 1 thread on core 1",
                        ("rollout.engine=ray", RAY_ACTOR), 1, pinned=True),
    "ray-async": Setting("(c) max_staleness=1, Ray engine: as (b)", ("rollout.engine=ray", RAY_ACTOR,
                         "rollout.max_staleness=1"), 1, pinned=True, baseline="ray-sync"),
    "hf-async": Setting("(d) max_staleness=1, in-process HF engine in a background thread, 1 thread each",
                        ("rollout.max_staleness=1",), 1, pinned=False, baseline="hf-sync"),
}
COMMON = ("val.every=0", "logging.tensorboard=false", "logging.progress=false", "train.resume=never",
          "rollout.correction.mode=tis", "health.parity.patience=0", "health.no_signal.action=warn")
KEYS = ("step_s", "wall_s", "rollout_s", "update_s", "weight_sync_s", "push_s", "rollout_work_s", "waited_s",
        "tokens", "staleness")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed RL steps per setting (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed RL steps per setting before them (default 2)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the hf-sync trainer (default 2)")
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                   help="which settings to run (default: all four)")
    p.add_argument("--model", default=None, help="model.name instead of the config's (a smoke run: tiny-64x1)")
    p.add_argument("--tether-override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every setting (repeatable), e.g. rollout.max_new_tokens=64")
    p.add_argument("--config", type=Path, default=QUICKSTART, help="default configs/quickstart.yaml")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-async.json")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (the first asynchronous step also fills the pipeline)")
    for name in args.settings:
        baseline = SETTINGS[name].baseline
        if baseline and baseline not in args.settings:
            p.error(f"--settings {name} is compared with {baseline}: run it too")
    return args


# -- cores --------------------------------------------------------------------------------------------------------


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (threads started later inherit their creator's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def cores() -> tuple[set[int], set[int], set[int]] | None:
    """(every core, the trainer's, the rollout actor's) of this process, or None with fewer than two."""
    mine = sorted(os.sched_getaffinity(0))
    return None if len(mine) < 2 else (set(mine), {mine[0]}, {mine[1]})


# -- trainers -----------------------------------------------------------------------------------------------------


class Bench:
    """One setting's trainer, stepped by hand, with its sampling and weight pushes timed."""

    def __init__(self, name: str, args: argparse.Namespace, run_dir: str) -> None:
        from tether.config import load_config
        from tether.trainer import Trainer

        self.name, self.setting = name, SETTINGS[name]
        self.threads = self.setting.threads or args.threads
        # one step more than are run: the last timed asynchronous step still samples the next batch
        overrides = [f"run_dir={run_dir}/{name}", f"train.steps={args.warmup + args.steps + 1}",
                     f"train.threads={self.threads}", *COMMON, *self.setting.overrides]
        if args.model:
            overrides.append(f"model.name={args.model}")
        self.trainer = Trainer(load_config(args.config, [*overrides, *args.tether_override]))
        self.records: list[dict[str, float]] = []
        self.work: list[float] = []  # sampling durations ended since the step began (a job's thread appends)
        self.pushes: list[float] = []
        collector = getattr(self.trainer.collector, "inner", self.trainer.collector)  # AsyncCollector wraps it
        engine = getattr(self.trainer.engine, "engine", self.trainer.engine)  # and its LockedEngine the engine
        collector.collect = self._timed(collector.collect, self.work)
        engine.load_weights = self._timed(engine.load_weights, self.pushes)

    @staticmethod
    def _timed(fn: Any, into: list[float]) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - start)

        return timed

    def actor_pids(self) -> list[int]:
        import ray

        return [ray.get(a.__ray_call__.remote(lambda _: os.getpid())) for a in self.trainer.engine.actors] \
            if self.setting.uses_ray else []

    def step(self) -> dict[str, float]:
        import torch

        torch.set_num_threads(self.threads)  # the process's setting: each trainer has its own
        self.work.clear()
        self.pushes.clear()
        start = time.perf_counter()
        m = self.trainer.train_step()
        wall = time.perf_counter() - start
        record = step_record(m, wall, self.pushes, self.work)
        self.records.append(record)
        return record


def step_record(m: dict[str, float], wall: float, pushes: list[float], work: list[float]) -> dict[str, float]:
    """One step's timings from the trainer's metrics ``m`` and the pushes and sampling jobs timed during it."""
    push = sum(pushes)
    return {"step_s": m["perf/step_s"], "wall_s": wall, "rollout_s": m["perf/rollout_s"],
            "update_s": m["perf/step_s"] - m["perf/rollout_s"] - m["perf/weight_sync_s"],
            "weight_sync_s": m["perf/weight_sync_s"], "push_s": push, "rollout_work_s": sum(work),
            # the trainer idle, waiting for a batch: its rollout phase, and in an asynchronous step the part of the
            # weight sync spent waiting for the sampling job that holds the engine
            "waited_s": m["perf/rollout_s"] + m["perf/weight_sync_s"] - push,
            "tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"],
            "staleness": m.get("rollout/staleness", 0.0), "reward_mean": m["train/reward_mean"],
            "sampling_jobs": float(len(work))}


# -- report -------------------------------------------------------------------------------------------------------


def compare(medians: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per setting: speed-up over hf-sync; per asynchronous one also over its baseline, and the ideal."""
    out: dict[str, dict[str, Any]] = {}
    for name, m in medians.items():
        s = SETTINGS[name]
        row: dict[str, Any] = {"over_hf_sync": medians["hf-sync"]["step_s"] / m["step_s"]
                               if "hf-sync" in medians else None}
        if s.baseline:
            b = medians[s.baseline]
            ideal_step = max(b["rollout_s"], b["update_s"]) + b["push_s"]  # the push cannot overlap its update
            row.update({"baseline": s.baseline, "overlap": b["step_s"] / m["step_s"], "ideal": b["step_s"] / ideal_step,
                        "ideal_step_s": ideal_step})
        out[name] = row
    return out


def times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def print_table(medians: dict[str, dict[str, float]], comparison: dict[str, dict[str, Any]]) -> None:
    cols = [("s/step", "step_s"), ("rollout", "rollout_s"), ("update", "update_s"), ("push", "push_s"),
            ("sampling", "rollout_work_s"), ("waited", "waited_s")]
    header = f"{'median seconds':<11}" + "".join(f"{c:>9}" for c, _ in cols) + \
        f"{'overlap':>9}{'ideal':>7}{'vs (a)':>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for name, m in medians.items():
        c = comparison[name]
        print(f"{name:<11}" + "".join(f"{m[k]:>9.2f}" for _, k in cols) + f"{times(c.get('overlap')):>9}"
              f"{times(c.get('ideal')):>7}{times(c.get('over_hf_sync')):>8}")
    print("rollout: until the trainer has its batch; update: scoring to the optimiser step; push: load_weights; "
          "sampling: the collector's work wherever it ran; waited: the trainer idle on a batch.\noverlap: the "
          "baseline's s/step / this s/step (ray-async: ray-sync, hf-async: hf-sync); ideal: the baseline's s/step / "
          "(max(its rollout, its update) + its push)")


def environment() -> dict[str, Any]:
    import torch

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    flags = sorted((cpu_flags() or set()) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu, "cpu_flags": flags,
            "cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}


def start_ray(n_actors: int) -> None:
    """A local Ray instance with one logical CPU per Ray setting's actor (started here, so both engines join it)."""
    import ray

    ray.init(num_cpus=n_actors, include_dashboard=False, log_to_driver=False)


# -- main ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    layout = cores()
    if layout is None:
        print("WARNING: fewer than 2 cores: nothing is pinned, and nothing can overlap", flush=True)
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        print(f"WARNING: load average {load_start[0]:.1f}: other processes are running; measure on an idle "
              "machine.", flush=True)
    ray_settings = [n for n in args.settings if SETTINGS[n].uses_ray]
    if ray_settings:
        start_ray(len(ray_settings))  # before any pinning: Ray's own processes keep every core
    benches: dict[str, Bench] = {}
    pinned: dict[str, list[dict[str, Any]]] = {}  # each Ray setting's actors, their cores read back
    with tempfile.TemporaryDirectory(prefix="tether-bench-async-") as run_dir:
        for name in args.settings:
            print(f"building {name}: {SETTINGS[name].label}", flush=True)
            benches[name] = Bench(name, args, run_dir)
            if layout is not None:
                for pid in benches[name].actor_pids():
                    pin(pid, layout[2])
                    pinned.setdefault(name, []).append({"pid": pid, "cores": sorted(os.sched_getaffinity(pid))})
        steps = args.warmup + args.steps
        for i in range(steps):
            k = i % len(benches)
            for name in [*args.settings[k:], *args.settings[:k]]:  # each round starts with the next setting
                bench = benches[name]
                if layout is not None:
                    pin(os.getpid(), layout[1] if bench.setting.pinned else layout[0])
                r = bench.step()
                print(f"step {i + 1}/{steps}{' (warm-up)' if i < args.warmup else ''} {name:>9}: {r['step_s']:.2f} s"
                      f" (rollout {r['rollout_s']:.2f}, update {r['update_s']:.2f}, push {r['push_s']:.2f}, "
                      f"sampling {r['rollout_work_s']:.2f}, waited {r['waited_s']:.2f})", flush=True)
        if layout is not None:
            pin(os.getpid(), layout[0])
    medians = {name: {k: statistics.median(r[k] for r in b.records[args.warmup:]) for k in KEYS}
               for name, b in benches.items()}
    comparison = compare(medians)
    print_table(medians, comparison)
    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {"steps": args.steps, "warmup": args.warmup, "threads": args.threads, "config": str(args.config),
                     "model": args.model, "tether_overrides": args.tether_override, "common_overrides": list(COMMON),
                     "each": {n: {"label": SETTINGS[n].label, "overrides": list(SETTINGS[n].overrides),
                                  "threads": benches[n].threads, "pinned": SETTINGS[n].pinned}
                              for n in args.settings}},
        "cores": None if layout is None else {"trainer_when_pinned": sorted(layout[1]), "actor": sorted(layout[2]),
                                              "actors": pinned},
        "environment": environment(), "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "medians": medians, "comparison": comparison, "steps": {n: b.records for n, b in benches.items()},
    }
    out = args.out or RESULTS / f"{dt.date.today()}-async.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {load_start[0]:.1f} at start, {result['loadavg_end'][0]:.1f} at end\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
