"""Where tether's RL step peaks in memory: the resident set at the start, peak and end of each phase of each step.

    .venv/bin/python benchmarks/bench_peak_phases.py --max-new-tokens 256 --steps 1 --warmup 1 --threads 1 \\
        --tether-override optim.max_tokens_per_micro_batch=1024 [--tether-override train.gradient_checkpointing=true]

The quickstart's trainer as ``bench_trl.py`` builds it (``--max-new-tokens``, ``--threads``, ``--steps``,
``--warmup`` and ``--tether-override`` as there), stepped by hand. Around each phase of ``Trainer.train_step``
(``collect``: sampling and rewards; ``score``: old and reference log-probs; ``update``: the optimiser steps) the
process's high-water mark is reset (``/proc/self/clear_refs``, Linux) and read after it (``VmHWM``), so each phase
reports its own peak, not the run's. A peak above the live tensors that stays resident after the phase (``end_rss``
far above the next phase's needs) is memory the C allocator holds; glibc's variables ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` change that, and the results record them (docs/benchmarks.md). ``--malloc-trim`` calls
glibc's ``malloc_trim(0)`` before each phase (freed heap pages back to the system; what a trainer could do between
phases). Results go to ``--out`` as JSON.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trl  # the same trainer setup as the TRL comparison

PHASES = ("collect", "score", "update")
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


def status_gb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in GB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def measured(phases: dict[str, list[dict[str, float]]], name: str, inner: Any, trim: bool = False) -> Any:
    """``inner``, recording the phase's resident set at start and end, its peak and its seconds into ``phases``;
    with ``trim``, after glibc's ``malloc_trim(0)``."""
    def phase(*args: Any, **kwargs: Any) -> Any:
        if trim:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        reset_peak()
        start_rss, start = status_gb("VmRSS"), time.perf_counter()
        out = inner(*args, **kwargs)
        phases[name].append({"start_rss_gb": start_rss, "peak_gb": status_gb("VmHWM"),
                             "end_rss_gb": status_gb("VmRSS"), "s": time.perf_counter() - start})
        return out
    return phase


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    trim = "--malloc-trim" in argv  # this script's own flag; the rest are bench_trl's
    args = bench_trl.parse_args([a for a in argv if a != "--malloc-trim"])
    torch.set_num_threads(args.threads)
    cfg = bench_trl.tether_config(args, "/tmp/tether-bench-peak-phases")
    trainer = bench_trl.TetherBench(cfg, bench_trl.model_dir(cfg.model.name)).trainer
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in PHASES}
    for name in PHASES:
        setattr(trainer, name, measured(phases, name, getattr(trainer, name), trim))
    loaded_gb = status_gb("VmRSS")
    steps = []
    for step in range(args.warmup + args.steps):
        m = trainer.train_step()
        steps.append({"step": step + 1, "tokens": m["perf/rollout_tok_s"] * m["perf/rollout_s"],
                      "activation_gb": m["perf/activation_gb"],
                      "checkpointed": m["perf/checkpointed_micro_batches"],
                      **{name: phases[name][-1] for name in PHASES}})
        peaks = ", ".join(f"{name} {phases[name][-1]['peak_gb']:.2f}" for name in PHASES)
        print(f"step {step + 1}: {steps[-1]['tokens']:.0f} tokens; peak GB by phase: {peaks}", flush=True)
    result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "command": " ".join(["python", *sys.argv]),
              "settings": vars(args) | {"config": str(args.config), "out": str(args.out)},
              "environment_variables": {k: os.environ[k] for k in MALLOC_VARIABLES if k in os.environ},
              "malloc_trim_before_each_phase": trim,
              "loaded_rss_gb": loaded_gb, "steps": steps}
    out = args.out or bench_trl.RESULTS / f"{dt.date.today()}-peak-phases.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
