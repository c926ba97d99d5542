"""What layer checkpointing costs the update, and what it saves: one batch, updated again and again with the
decoder layers' activations kept and recomputed in turn.

    .venv/bin/python benchmarks/bench_checkpointing.py --reps 5 --threads 2 [--max-new-tokens 256 --ignore-eos]
        [--tether-override optim.max_tokens_per_micro_batch=1024]

The quickstart's trainer as ``bench_trl.py`` builds it (its flags), with ``train.gradient_checkpointing: true`` so
the switch exists. Since 2026-12-07 the LM head follows the switch (its logits kept where the layers are and the
budget fits them), so "kept" keeps both and "recomputed" recomputes both; the 2026-12-06 results recomputed the
head in both modes. It samples one batch, scores it, makes its advantages and runs one warm-up update (AdamW's
state exists from then on, as in every later step of a run). Then, ``--reps`` times and in alternating order,
each mode restores the weights and optimiser state of that moment and updates a copy of the same batch, timed,
with the process's peak resident set reset before (``/proc/self/clear_refs``) and read after (``VmHWM``).
Same batch, same weights: the two modes do the same arithmetic but for the recomputation, and their gradients
agree to rounding. Results go to ``--out`` as JSON: each update's seconds and peak, the medians and the ratio
on ÷ off with its 95% paired-bootstrap interval (docs/benchmarks.md).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peak_phases
import bench_trl

MODES = {"kept": False, "recomputed": True}


def prepared_batch(trainer: Any) -> Any:
    """One batch as ``Trainer.train_step`` hands it to ``update``: collected, on the device, scored, with
    advantages."""
    batch, _ = trainer.collect()
    batch = batch.to(trainer.device)
    trainer.score(batch)
    trainer.compute_advantages(batch)
    return batch


def restore(trainer: Any, policy_state: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
    """The weights and optimiser state of the snapshot, which stays as it is."""
    trainer.policy.load_state_dict(policy_state)  # copies into the parameters
    # an optimiser adopts the state tensors it is given (same dtype and device) and steps them in place
    trainer.optimizer.load_state_dict(copy.deepcopy(optimizer_state))


def timed_update(trainer: Any, batch: Any, recompute: bool) -> dict[str, float]:
    trainer.activation_checkpointing.on = recompute
    batch = copy.deepcopy(batch)  # the update may write into it; copied before the clock and the peak start
    bench_peak_phases.reset_peak()
    start = time.perf_counter()
    metrics = trainer.update(batch)
    return {"s": time.perf_counter() - start, "peak_gb": bench_peak_phases.status_gb("VmHWM"),
            "checkpointed": metrics["perf/checkpointed_micro_batches"], "activation_gb": metrics["perf/activation_gb"]}


def parsed(argv: list[str] | None, reps: int) -> tuple[Any, int]:
    """bench_trl.py's flags and this script's ``--reps`` (default ``reps``); the thread count set, and
    ``train.gradient_checkpointing: true`` added so that the layers' switch exists."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--reps" in argv:
        i = argv.index("--reps")
        reps = int(argv[i + 1])
        del argv[i:i + 2]
    args = bench_trl.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.tether_override = [*args.tether_override, "train.gradient_checkpointing=true"]
    return args, reps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, reps = parsed(argv, reps=5)
    cfg = bench_trl.tether_config(args, "/tmp/tether-bench-checkpointing")
    trainer = bench_trl.TetherBench(cfg, bench_trl.model_dir(cfg.model.name)).trainer
    batch = prepared_batch(trainer)
    tokens = float(batch.response_mask.sum())
    timed_update(trainer, batch, recompute=False)  # warm-up: AdamW's state now exists
    policy_state = copy.deepcopy(trainer.policy.state_dict())
    optimizer_state = copy.deepcopy(trainer.optimizer.state_dict())
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    for rep in range(reps):
        order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
        for name in order:
            restore(trainer, policy_state, optimizer_state)
            runs[name].append(timed_update(trainer, batch, MODES[name]))
        print(f"rep {rep + 1}: " + ", ".join(f"{n} {runs[n][-1]['s']:.2f} s, {runs[n][-1]['peak_gb']:.2f} GB"
                                             for n in MODES), flush=True)
    seconds = {n: [r["s"] for r in runs[n]] for n in MODES}
    summary = {n: {"median_s": float(np.median(seconds[n])),
                   "median_peak_gb": float(np.median([r["peak_gb"] for r in runs[n]]))} for n in MODES}
    ratio = summary["recomputed"]["median_s"] / summary["kept"]["median_s"]
    result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "command": " ".join(["python", *sys.argv]),
              "settings": vars(args) | {"reps": reps, "config": str(args.config), "out": str(args.out)},
              "environment": bench_trl.environment(),
              "tokens": tokens, "rows": len(batch), "summary": summary,
              "ratio_recomputed_over_kept_s": ratio,
              # median(recomputed) / median(kept), the reps resampled in pairs (rep i of each ran back to back)
              "ratio_95ci": bench_trl.ratio_interval([{"step_s": s} for s in seconds["recomputed"]],
                                                     [{"step_s": s} for s in seconds["kept"]], warmup=0),
              "runs": runs}
    out = args.out or bench_trl.RESULTS / f"{dt.date.today()}-checkpointing.json"
    out.write_text(json.dumps(result, indent=1))
    lo, hi = result["ratio_95ci"]
    print(f"{tokens:.0f} response tokens, {len(batch)} rows: update {summary['kept']['median_s']:.2f} s kept, "
          f"{summary['recomputed']['median_s']:.2f} s recomputed ({ratio:.3f}x [{lo:.3f}, {hi:.3f}]); peak "
          f"{summary['kept']['median_peak_gb']:.2f} against {summary['recomputed']['median_peak_gb']:.2f} GB; "
          f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
