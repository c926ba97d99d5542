"""SEED lab study: the mechanism metrics of every run, from its training log (issue #21).

    python scripts/lab/seed_mechanism.py [RUN_ROOT] [--out FILE.md]

For each arm and seed under RUN_ROOT (default runs/lab/seed/study), the mean over training steps of the metrics
the protocol names as mechanism metrics, and per arm the mean over seeds. A metric a run does not log (GRPO has no
teacher) is left blank. Training metrics are sampled at the rollout temperature on training maps: they say what
the distillation term saw, not how well the policy generalises (that is the report's endpoint). Under the table,
the third design's training gate (:func:`tether.lab.seed_third.training_gate`) for every arm that logs the fork
metrics, on the mean over its seeds.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tether.lab.seed_third import training_gate

METRICS = ("env/success_rate", "env/fell_through_ice_frac", "env/fell_in_hole_frac", "env/all_fail_group_frac",
           "seed/analysis_success_rate", "seed/skill_correct_rate", "seed/delta_fatal", "seed/delta_safe",
           "seed/delta_deadly", "seed/delta_alive", "seed/delta_fork", "seed/delta_fork_safe",
           "seed/delta_fork_fatal", "seed/opd_gate_mean", "seed/opsd_delta_mean")


def run_means(metrics_file: Path) -> tuple[dict[str, float], int]:
    """Mean of each metric over the run's training steps, and the number of steps logged."""
    sums: dict[str, list[float]] = {m: [] for m in METRICS}
    steps = set()
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        for m in METRICS:
            if m in row and isinstance(row[m], (int, float)) and math.isfinite(row[m]):
                sums[m].append(float(row[m]))
                steps.add(row.get("step"))
    return {m: sum(v) / len(v) for m, v in sums.items() if v}, len(steps)


def table(root: Path) -> str:
    lines = ["| arm | seed | steps | " + " | ".join(METRICS) + " |", "|---|---|---|" + "---|" * len(METRICS)]
    gates: list[str] = []
    for arm in sorted(p for p in root.iterdir() if p.is_dir()):
        per_seed = []
        for run in sorted(arm.glob("seed*")):
            if (run / "metrics.jsonl").is_file():
                means, steps = run_means(run / "metrics.jsonl")
                per_seed.append(means)
                lines.append(f"| {arm.name} | {run.name[4:]} | {steps} | "
                             + " | ".join(f"{means[m]:.3f}" if m in means else "" for m in METRICS) + " |")
        if per_seed:
            avg = {m: [s[m] for s in per_seed if m in s] for m in METRICS}
            lines.append(f"| **{arm.name}** | mean | | "
                         + " | ".join(f"**{sum(v) / len(v):.3f}**" if v else "" for v in avg.values()) + " |")
            means = {m: sum(v) / len(v) for m, v in avg.items() if v}
            if "seed/delta_fork" in means:
                gates.append(gate_line(arm.name, training_gate(means)))
    return "\n".join([*lines, "", *gates]) + "\n"


def gate_line(arm: str, gate: dict) -> str:
    checks = ", ".join(f"{name} {c['value']:.3f} ({c['threshold']}: {'yes' if c['passed'] else 'no'})"
                       for name, c in gate["checks"].items())
    return f"training gate, {arm}: {'passed' if gate['passed'] else 'FAILED'}: {checks}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="runs/lab/seed/study")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    text = table(Path(args.root))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
