"""Figures and tables of the ARMOR miniature experiments (scripts/armor_experiment.sh).

    .venv/bin/python scripts/armor_report.py --root runs/armor --stage1 stage1_dapo \
        dapo_continued dapo_kl_k3_0.01 dapo_kl_k3_1.0 armor [armor_s1 ...]

Writes
* ``ROOT/val_compare.png``: the metric and ``val/pass@k`` of every stage-2 method against steps after
  the peak, the mean over its seeds (runs named ``NAME_sN``) with a min..max band
  (:func:`tether.track.plot_seed_means`);
* ``ROOT/stage1.png``: stage 1's training accuracy over all sampled rows (``rollout/accuracy_all``,
  before DAPO's filter) against its held-out metric, the reward-validation gap the paper starts from;
* ``ROOT/table.md``: per run the value at step 0, the peak, the step of the peak, the final value and
  its step, and the last logged drift ``armor/kl_on_old``; with seeds, the same per method over the mean
  curve, and late means (drift included) with standard errors over seeds.

``--tag TAG`` names the first and the last ``val_compare_TAG.png`` and ``table_TAG.md``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from tether.track import mean_series, metric_series, plot_seed_means, read_metrics, seed_groups

DRIFT = "armor/kl_on_old"


def summarize(run_dir: Path, metric: str) -> dict[str, float | int | None]:
    """Start, peak, step of the peak, final value and step of ``metric``; last ``armor/kl_on_old``."""
    series = metric_series(read_metrics(run_dir / "metrics.jsonl"))
    if metric not in series:
        raise SystemExit(f"{run_dir}: no {metric!r} in metrics.jsonl yet")
    steps, values = series[metric]
    peak = max(range(len(values)), key=values.__getitem__)  # the first step that reaches the maximum
    drift = series.get(DRIFT, ([], []))[1]
    return {"start": values[0], "peak": values[peak], "peak_step": int(steps[peak]), "final": values[-1],
            "final_step": int(steps[-1]), "drift": drift[-1] if drift else None}


def table(rows: dict[str, dict], metric: str) -> str:
    head = (f"| run | {metric} at step 0 | peak | step of peak | final | final step | last {DRIFT} |\n"
            "|---|---|---|---|---|---|---|\n")
    lines = []
    for name, r in rows.items():
        drift = "" if r["drift"] is None else f"{r['drift']:.4f}"
        lines.append(f"| {name} | {r['start']:.4f} | {r['peak']:.4f} | {r['peak_step']} | {r['final']:.4f} | "
                     f"{r['final_step']} | {drift} |")
    return head + "\n".join(lines) + "\n"


LATE = 4  # validation points averaged for the "late" value: one point is noisier than the differences sought


def late_mean(values: list[list[float]], last: int = LATE) -> tuple[float, float]:
    """Mean over seeds of each seed's mean over its last ``last`` points, and its standard error over seeds."""
    late = [statistics.fmean(v[-last:]) for v in values]
    se = statistics.stdev(late) / len(late) ** 0.5 if len(late) > 1 else float("nan")
    return statistics.fmean(late), se


def seed_table(root: Path, runs: list[str], metric: str) -> str:
    """Per method over its seeds: the mean curve's start, peak and final value; the late means of metric,
    val/pass@k, the training accuracy before DAPO's filter, the entropy and the drift from the reference, with
    standard errors over seeds."""
    late_keys = [(metric, LATE), ("val/pass@k", LATE), ("rollout/accuracy_all", 10), ("actor/entropy", 10),
                 (DRIFT, 10)]
    lines = [f"| method (seeds) | {metric} at step 0 | peak of the mean (step) | final mean | "
             + " | ".join(f"{key}, last {n}" for key, n in late_keys) + " |", "|---" * (4 + len(late_keys)) + "|"]
    for method, names in seed_groups(runs).items():
        series = [metric_series(read_metrics(root / n / "metrics.jsonl")) for n in names]
        steps, mean, _, _ = mean_series([s[metric] for s in series])
        peak = max(range(len(mean)), key=mean.__getitem__)
        cells = []
        for key, n in late_keys:
            if any(key not in s for s in series):  # drift is logged only by runs with the armor plug-in
                cells.append("")
                continue
            late, se = late_mean([s[key][1] for s in series], n)
            cells.append(f"{late:.3f}" if math.isnan(se) else f"{late:.3f} ± {se:.3f}")
        lines.append(f"| {method} ({len(names)}) | {mean[0]:.3f} | {mean[peak]:.3f} ({steps[peak]:g}) | "
                     f"{mean[-1]:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stage1_figure(stage1: Path, metric: str, out: Path) -> Path:
    """Stage 1's training accuracy (all sampled rows, 10-step mean) against its held-out metric and pass@k."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = metric_series(read_metrics(stage1 / "metrics.jsonl"))
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if "rollout/accuracy_all" in series:
        steps, values = series["rollout/accuracy_all"]
        smooth = [sum(values[max(0, i - 9): i + 1]) / len(values[max(0, i - 9): i + 1]) for i in range(len(values))]
        ax.plot(steps, values, alpha=0.25, color="C0")
        ax.plot(steps, smooth, color="C0", label="training accuracy, all sampled rows (10-step mean)")
    for key, color in ((metric, "C3"), ("val/pass@k", "C1")):
        if key in series:
            ax.plot(*series[key], marker="o", markersize=3, color=color, label=f"held-out {key}")
    ax.set(title=f"stage 1: {stage1.name}", xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="stage-2 run names under --root")
    parser.add_argument("--root", type=Path, default=Path("runs/armor"))
    parser.add_argument("--stage1", default="stage1_dapo", help="stage-1 run: a name under --root, or a run dir")
    parser.add_argument("--metric", default="val/avg@k")
    parser.add_argument("--tag", default="", help="suffix of the output names, e.g. ablations -> "
                                                   "val_compare_ablations.png, table_ablations.md")
    args = parser.parse_args()
    tag = f"_{args.tag}" if args.tag else ""

    png = plot_seed_means({name: args.root / name for name in args.runs}, [args.metric, "val/pass@k"],
                          args.root / f"val_compare{tag}.png")
    stage1 = args.root / args.stage1 if (args.root / args.stage1).is_dir() else Path(args.stage1)
    stage1_png = stage1_figure(stage1, args.metric, args.root / "stage1.png")
    rows = {f"{stage1.name} (stage 1)": summarize(stage1, args.metric)}
    rows.update({name: summarize(args.root / name, args.metric) for name in args.runs})
    text = (f"Stage-2 steps count from the stage-1 peak (step {rows[f'{stage1.name} (stage 1)']['peak_step']} "
            f"of stage 1).\n\n" + table(rows, args.metric))
    if any(len(names) > 1 for names in seed_groups(args.runs).values()):
        text += "\nMean over seeds:\n\n" + seed_table(args.root, args.runs, args.metric)
    (args.root / f"table{tag}.md").write_text(text)
    print(text)
    print(png, stage1_png)


if __name__ == "__main__":
    main()
