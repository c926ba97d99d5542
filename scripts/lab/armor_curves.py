"""ARMOR lab study: training curves of several metrics per arm, mean and 95% band over seeds, one panel each.

The experiment's own curves.png draws the endpoint metric; the study also needs the mechanism beside it: the
scratchpad's share on the selection split, the training accuracy over every sampled row, the drift from pi_ref.

Usage: python scripts/lab/armor_curves.py PROTOCOL --out FILE.png [--metrics M ...] [--every N]
       python scripts/lab/armor_curves.py --runs LABEL=RUN_DIR ... --out FILE.png   (single runs, e.g. stage 1)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tether.lab import stats
from tether.lab.protocol import load_protocol
from tether.lab.report import training_curves

DEFAULT_METRICS = ("val/avg@k", "val/mode/scratchpad/share", "rollout/accuracy_all", "armor/kl_on_ref")


def smooth(by_step: dict[int, list[float]], every: int) -> dict[int, list[float]]:
    """Pool each seed's values over windows of ``every`` steps (training metrics are noisy step to step)."""
    if every <= 1:
        return by_step
    pooled: dict[int, list[float]] = {}
    for step, values in by_step.items():
        pooled.setdefault((step - 1) // every * every + every, []).extend(values)
    return pooled


def run_curves(runs: list[str], metric: str) -> dict[str, dict[int, list[float]]]:
    """LABEL=RUN_DIR pairs -> label -> step -> [value]: one run per label, in the shape training_curves gives."""
    curves: dict[str, dict[int, list[float]]] = {}
    for pair in runs:
        label, directory = pair.split("=", 1)
        for line in (Path(directory) / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if metric in row:
                curves.setdefault(label, {}).setdefault(int(row["step"]), []).append(float(row[metric]))
    return curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", type=Path, nargs="?")
    parser.add_argument("--runs", nargs="+", default=[], help="LABEL=RUN_DIR, instead of a protocol")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS))
    parser.add_argument("--every", type=int, default=10, help="window for metrics logged every step")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocol = load_protocol(args.protocol) if args.protocol else None
    fig, axes = plt.subplots(1, len(args.metrics), figsize=(4.2 * len(args.metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], args.metrics, strict=True):
        curves = training_curves(protocol, metric) if protocol else run_curves(args.runs, metric)
        for arm, by_step in curves.items():
            by_step = by_step if metric.startswith("val/") else smooth(by_step, args.every)
            steps = sorted(by_step)
            cis = [stats.mean_ci(by_step[s]) for s in steps]
            ax.plot(steps, [c.mean for c in cis], label=arm)
            ax.fill_between(steps, [c.low if math.isfinite(c.low) else c.mean for c in cis],
                            [c.high if math.isfinite(c.high) else c.mean for c in cis], alpha=0.15)
        ax.set_title(metric if curves else f"{metric} (not logged)", fontsize=9)
        ax.set_xlabel("RL step")
    axes[0][0].legend(fontsize=7)
    if protocol:
        fig.suptitle(f"{protocol.name}: mean and 95% CI over seeds {protocol.seeds}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
