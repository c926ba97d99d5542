"""ARMOR on SmolLM2, premise check: does held-out accuracy rise, then fall, and by how much, over stage-1 seeds?

Reads each stage-1 run's metrics.jsonl (validation on the selection split every few steps) and prints, per run,
the validation curve with the working share and accuracy, the peak (the best validation step after step 0) and
the fall (peak minus the last validation); then the fall's mean and 95% t interval over seeds, and the test
size the fall allows (at most half of it; docs/lab.md, "Calibration").

Usage: python scripts/lab/armor_premise.py RUN_DIR [RUN_DIR ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tether.lab import stats
from tether.lab.calibration import selection_values

CURVE_KEYS = ("val/avg@k", "val/working/share", "val/working/accuracy", "val/response_length")
TRAIN_KEYS = ("rollout/accuracy_all",)


def read_run(run_dir: Path) -> dict[str, dict[int, float]]:
    """metric -> step -> value, for the validation and training keys above (the lab's reader of metrics.jsonl: a
    resumed step counts once, a line cut by a kill is skipped)."""
    return {key: values for key in CURVE_KEYS + TRAIN_KEYS if (values := selection_values(run_dir, key))}


def peak_and_fall(curve: dict[int, float]) -> tuple[int, float, float]:
    """(peak step, peak value, fall): the peak is the best step after 0 (ties: the earlier); the fall is the
    peak minus the last validation value (positive when accuracy fell)."""
    later = {step: value for step, value in curve.items() if step > 0}
    peak_step = min(later, key=lambda step: (-later[step], step))
    last_step = max(curve)
    return peak_step, later[peak_step], later[peak_step] - curve[last_step]


def train_windows(series: dict[int, float], every: int = 10) -> list[float]:
    """Mean training accuracy over consecutive windows of ``every`` steps."""
    windows: dict[int, list[float]] = {}
    for step, value in series.items():
        windows.setdefault((step - 1) // every, []).append(value)
    return [sum(v) / len(v) for _, v in sorted(windows.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="also write the per-run summary here")
    args = parser.parse_args()
    summary = []
    for run_dir in args.runs:
        series = read_run(run_dir)
        curve = series.get("val/avg@k", {})
        print(f"\n{run_dir}")
        for step in sorted(curve):
            cells = [f"{key.split('/', 1)[1]}={series[key][step]:.3f}" for key in CURVE_KEYS
                     if step in series.get(key, {})]
            print(f"  step {step:4d}  " + "  ".join(cells))
        if "rollout/accuracy_all" in series:
            print("  train accuracy, 10-step means: "
                  + " ".join(f"{v:.2f}" for v in train_windows(series["rollout/accuracy_all"])))
        if len([s for s in curve if s > 0]) < 2:
            print("  (too few validations for a peak and a fall)")
            continue
        peak_step, peak, fall = peak_and_fall(curve)
        print(f"  peak {peak:.3f} at step {peak_step}; last {curve[max(curve)]:.3f} at step {max(curve)}; "
              f"fall {fall:+.3f}")
        summary.append({"run": str(run_dir), "start": curve.get(0), "peak_step": peak_step, "peak": peak,
                        "last_step": max(curve), "last": curve[max(curve)], "fall": fall})
    if len(summary) >= 2:
        interval = stats.mean_ci([row["fall"] for row in summary])
        print(f"\nfall over {interval.n} seeds: {interval.mean:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]; "
              f"largest test size it allows (half the fall): {interval.mean / 2:.3f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
