"""Figure and table of the ARMOR miniature experiment (scripts/armor_experiment.sh).

    .venv/bin/python scripts/armor_report.py --root runs/armor --stage1 stage1_dapo \
        dapo_continued dapo_kl_k3_0.01 dapo_kl_k3_1.0 armor

Writes ``ROOT/val_compare.png`` (the metric of every stage-2 run against steps after the peak, with
:func:`tether.track.plot_compare`) and ``ROOT/table.md``: per run the value at step 0, the peak, the step of
the peak, the final value and its step, and the last logged drift ``armor/kl_on_old`` where there is one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tether.track import metric_series, plot_compare, read_metrics

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="stage-2 run names under --root")
    parser.add_argument("--root", type=Path, default=Path("runs/armor"))
    parser.add_argument("--stage1", default="stage1_dapo", help="stage-1 run: a name under --root, or a run dir")
    parser.add_argument("--metric", default="val/avg@k")
    args = parser.parse_args()

    png = plot_compare({name: args.root / name for name in args.runs}, args.metric, args.root / "val_compare.png")
    stage1 = args.root / args.stage1 if (args.root / args.stage1).is_dir() else Path(args.stage1)
    rows = {f"{args.stage1} (stage 1)": summarize(stage1, args.metric)}
    rows.update({name: summarize(args.root / name, args.metric) for name in args.runs})
    text = (f"Stage-2 steps count from the stage-1 peak (step {rows[f'{args.stage1} (stage 1)']['peak_step']} "
            f"of stage 1).\n\n" + table(rows, args.metric))
    (args.root / "table.md").write_text(text)
    print(text)
    print(png)


if __name__ == "__main__":
    main()
