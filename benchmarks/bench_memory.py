"""Cost of tether's RL step as responses grow: peak resident memory and seconds per step, one process per cell.

    .venv/bin/python benchmarks/bench_memory.py --max-new-tokens 24 96 --steps 2 --warmup 1 \\
        --setting fixed= --setting budget=optim.max_tokens_per_micro_batch=1024

Each cell (a completion budget and a setting: a name and comma-separated config overrides of
``configs/quickstart.yaml``) runs in a fresh child process, because the operating system's peak resident set
(``ru_maxrss``) is a high-water mark of the whole process. The settings of one budget run one after another,
so the ratios in the table compare runs minutes apart on the same machine. The child runs ``--warmup`` untimed
and ``--steps`` timed ``Trainer.train_step`` calls (sampling, scoring, one optimiser step); peak memory covers
model loading and every step. Results go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart.yaml"
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, nargs="+", default=[24, 96], help="completion budgets (rows)")
    p.add_argument("--setting", action="append", default=None,
                   help="NAME=override,override (columns); default: fixed= and budget=max_tokens 1024")
    p.add_argument("--steps", type=int, default=2, help="timed RL steps per cell (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed RL steps before them (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--config", type=Path, default=QUICKSTART)
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<date>-memory.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON of one cell, run in this process
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> dict[str, list[str]]:
    raw = args.setting or ["fixed=", "budget=optim.max_tokens_per_micro_batch=1024"]
    out = {}
    for item in raw:
        name, _, overrides = item.partition("=")
        out[name] = [o for o in overrides.split(",") if o]
    return out


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports kilobytes


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One Trainer on the quickstart config with the cell's overrides; timings of each step and the peak memory."""
    import torch

    from tether.config import load_config
    from tether.models import load_policy, smollm2_dir
    from tether.trainer import Trainer

    steps = cell["warmup"] + cell["steps"]
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"run_dir={run_dir}", f"train.threads={cell['threads']}", f"train.steps={steps}",
                     "train.resume=never", "train.overwrite=true",
                     "val.every=0", "logging.tensorboard=false", "logging.progress=false",
                     f"rollout.max_new_tokens={cell['max_new_tokens']}", *cell["overrides"]]
        cfg = load_config(cell["config"], overrides)
        policy, tokenizer = load_policy(str(smollm2_dir()), dtype=torch.float32)
        trainer = Trainer(cfg, policy=policy, tokenizer=tokenizer)
        records = []
        for _ in range(steps):
            m = trainer.train_step()
            records.append({"step_s": m["perf/step_s"], "rollout_s": m["perf/rollout_s"],
                            "train_s": m["perf/step_s"] - m["perf/rollout_s"],
                            "tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"]})
    timed = records[cell["warmup"]:]
    summary = {k: statistics.median(r[k] for r in timed) for k in ("step_s", "rollout_s", "train_s", "tokens")}
    return {**cell, "records": records, **summary, "peak_rss_gb": peak_rss_gb()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_cell(json.loads(args.child))))
        return
    load_start = os.getloadavg()[0]
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-memory.json"
    cells = []
    for tokens in args.max_new_tokens:
        for name, overrides in settings(args).items():
            cell = {"name": name, "overrides": overrides, "max_new_tokens": tokens, "steps": args.steps,
                    "warmup": args.warmup, "threads": args.threads, "config": str(args.config)}
            done = subprocess.run([sys.executable, __file__, "--child", json.dumps(cell)], check=True,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            cells.append(json.loads(done.stdout.strip().splitlines()[-1]))
            c = cells[-1]
            print(f"{tokens:>4} new tokens  {name:<10} {c['step_s']:7.1f} s/step (train {c['train_s']:6.1f} s)  "
                  f"{c['tokens']:6.0f} tokens/step  peak {c['peak_rss_gb']:5.2f} GB", flush=True)
            # written after every cell: a long sweep stopped early keeps what it measured
            out.write_text(json.dumps({"load_average": [load_start, os.getloadavg()[0]], "cells": cells}, indent=2))
    print(f"wrote {out}; load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
