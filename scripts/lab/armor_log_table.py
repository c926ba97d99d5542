"""ARMOR lab study: per arm, the mean over seeds of training-log metrics averaged over each run's last N steps.

The mechanism beside the endpoint: how far each arm drifted from the reference (armor/kl_on_ref, logged in every
arm), its entropy, its training accuracy over all sampled rows, and the direct answers' share in its rollouts.

Usage: python scripts/lab/armor_log_table.py PROTOCOL [--last 10] [--metrics M ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tether.lab.protocol import load_protocol, run_dir

DEFAULT_METRICS = ("rollout/accuracy_all", "armor/kl_on_ref", "actor/entropy", "rollout/mode/direct/share")


def run_means(path: Path, metrics: list[str], last: int) -> dict[str, float]:
    """Each metric's mean over the run's last ``last`` steps that log it."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = {}
    for metric in metrics:
        values = [row[metric] for row in rows if metric in row][-last:]
        if values:
            out[metric] = statistics.fmean(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--last", type=int, default=10)
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS))
    args = parser.parse_args()
    protocol = load_protocol(args.protocol)
    print("| arm | seeds | " + " | ".join(args.metrics) + " |")
    print("|---|---|" + "---|" * len(args.metrics))
    for arm in protocol.arms:
        per_seed = [run_means(run_dir(protocol, arm, seed) / "metrics.jsonl", args.metrics, args.last)
                    for seed in protocol.seeds if (run_dir(protocol, arm, seed) / "endpoint.json").is_file()]
        cells = []
        for metric in args.metrics:
            values = [means[metric] for means in per_seed if metric in means]
            cells.append(f"{statistics.fmean(values):.3f}" if values else "-")
        print(f"| {arm} | {len(per_seed)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
