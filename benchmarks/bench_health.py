"""What each run health check costs, as a share of the RL step it runs in (docs/health.md, "Cost").

    .venv/bin/python benchmarks/bench_health.py --model char-128x4 --steps 8 --warmup 1

Issue 25 asks that a check be on by default only where it costs under 2% of a step. The character models' steps are
the fastest tether runs (a few hundred milliseconds of model work for 64 rows), so they are where a check's fixed,
per-row Python work weighs most: the worst case. Each check's own code is timed where it runs inside real training
steps, all checks on (every default), and its seconds are divided by the step's ``perf/step_s``:

* round trip: the recording engine's bookkeeping (its time around the wrapped engine's ``generate``, minus that
  call) plus ``check_round_trip``;
* reward audit: ``reward_audit`` plus writing the examples without an answer;
* parity: ``ParityCheck.observe`` per micro-batch plus ``finish`` (its one host sync);
* over-optimisation guard: ``observe_train`` per step and ``observe_val`` per validation (every step here).

The untrained character model answers almost nothing on the addition task, so the audit writes its examples every
step: its worst case too.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.config import load_config
from tether.health import monitor
from tether.health.collapse import CollapseGuard
from tether.health.parity import ParityCheck
from tether.health.round_trip import RecordingEngine
from tether.trainer import Trainer

CHECKS = ("round_trip", "reward_audit", "parity", "collapse")
SECONDS: dict[str, float] = defaultdict(float)  # check -> seconds spent in it since the last reset


def timed(check: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, its time added to ``SECONDS[check]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[check] += time.perf_counter() - start

    return wrapper


class TimedEngine:
    """An engine whose ``generate`` time is kept, so the recording wrapper's own time can be told from it."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.seconds = engine, 0.0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        gen = self.engine.generate(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return gen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class TimedRecordingEngine(RecordingEngine):
    """The trainer's recording wrapper, its bookkeeping (not the sampling) counted as the round trip's cost."""

    def __init__(self, engine: Any, samples: set) -> None:
        super().__init__(TimedEngine(engine), samples)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start, sampling_before = time.perf_counter(), self.engine.seconds
        gen = super().generate(*args, **kwargs)
        SECONDS["round_trip"] += time.perf_counter() - start - (self.engine.seconds - sampling_before)
        return gen


def instrument() -> None:
    """Time every check where the trainer calls it (the checks' code itself is unchanged)."""
    monitor.RecordingEngine = TimedRecordingEngine
    monitor.check_round_trip = timed("round_trip", monitor.check_round_trip)
    monitor.reward_audit = timed("reward_audit", monitor.reward_audit)
    monitor.HealthMonitor._report_no_answer = timed("reward_audit", monitor.HealthMonitor._report_no_answer)
    ParityCheck.observe = timed("parity", ParityCheck.observe)
    ParityCheck.finish = timed("parity", ParityCheck.finish)
    CollapseGuard.observe_train = timed("collapse", CollapseGuard.observe_train)
    CollapseGuard.observe_val = timed("collapse", CollapseGuard.observe_val)


def overrides(run_dir: str, model: str) -> list[str]:
    """bench_lab.py's character-model step (64 rows, up to 32 new tokens, one thread), every check at its default."""
    return ["task.name=addition", "task.kwargs={digits: 3, train_size: 256, val_size: 8, report_size: 8}",
            f"model.name={model}", "rollout.prompts_per_step=8", "rollout.group_size=8",
            "rollout.max_new_tokens=32", "optim.lr=1e-4", "optim.micro_batch_size=32", "val.every=0",
            "train.save_every=0", "train.save_every_s=0", "logging.tensorboard=false", "logging.progress=false",
            f"run_dir={run_dir}", "train.threads=1", "train.device=cpu"]


def measure(model: str, steps: int, warmup: int) -> dict[str, Any]:
    """Per measured step: each check's seconds over the step's seconds; medians and the largest share."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(load_config("configs/quickstart.yaml", overrides(tmp, model)))
        shares: dict[str, list[float]] = {c: [] for c in CHECKS}
        step_s: list[float] = []
        for i in range(warmup + steps):
            SECONDS.clear()
            metrics = trainer.train_step()
            # the guard's per-validation call, timed apart from validation itself (which is not a step)
            trainer.health.on_validation(trainer.step, {trainer.cfg.train.best_metric: 0.5 - 0.01 * i})
            if i < warmup:
                continue
            step_s.append(metrics["perf/step_s"])
            for check in CHECKS:
                shares[check].append(SECONDS[check] / metrics["perf/step_s"])
            print(model, i, round(metrics["perf/step_s"], 3),
                  {c: f"{shares[c][-1]:.3%}" for c in CHECKS}, flush=True)
        rows = trainer.cfg.rollout.prompts_per_step * trainer.cfg.rollout.group_size
    return {"model": model, "rows_per_step": rows, "median_step_s": statistics.median(step_s),
            "median_share": {c: statistics.median(v) for c, v in shares.items()},
            "max_share": {c: max(v) for c, v in shares.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="tether alias; repeatable (default: char-64x2, char-128x4)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/2026-12-04-health-cost.json", help="where the JSON goes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    instrument()
    results = [measure(m, args.steps, args.warmup) for m in args.model or ["char-64x2", "char-128x4"]]
    out = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
