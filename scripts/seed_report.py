"""Figure, table and example skills of the SEED comparison (scripts/seed_experiment.sh).

    .venv/bin/python scripts/seed_report.py --root runs/seed grpo seed grpo_opsd

Writes ``ROOT/val_success.png`` (held-out success rate against RL steps, every run in one plot, with
:func:`tether.track.plot_compare`), ``ROOT/table.md`` (per run: success at step 0, at each validation step, best,
final) and ``ROOT/skills.md`` (skills the policy wrote at the first and the last update of each run that has a
``skills.jsonl``: up to three analysed successes and three analysed failures each, and the analysis success rate).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tether.track import mean_series, metric_series, plot_compare, read_metrics, seed_groups


def val_table(runs: dict[str, Path], metric: str) -> str:
    series = {name: metric_series(read_metrics(d / "metrics.jsonl")).get(metric, ([], [])) for name, d in runs.items()}
    steps = sorted({int(s) for s_, _ in series.values() for s in s_})
    head = f"| run | {' | '.join(f'step {s}' for s in steps)} | best | final |\n|---|{'---|' * (len(steps) + 2)}\n"
    lines = []
    for name, (s_, v_) in series.items():
        by_step = dict(zip((int(s) for s in s_), v_, strict=True))
        cells = [f"{by_step[s]:.3f}" if s in by_step else "" for s in steps]
        best, final = (f"{max(v_):.3f}", f"{v_[-1]:.3f}") if v_ else ("", "")
        lines.append(f"| {name} | {' | '.join(cells)} | {best} | {final} |")
    return head + "\n".join(lines) + "\n"


def seed_means(runs: dict[str, Path], metric: str) -> str:
    """Per method (run name without its ``_sN`` seed suffix), the mean over seeds at each step every seed reached."""
    series = {name: metric_series(read_metrics(d / "metrics.jsonl")).get(metric, ([], [])) for name, d in runs.items()}
    means = {m: mean_series([series[n] for n in names]) for m, names in seed_groups(list(runs)).items()}
    steps = sorted(set.intersection(*(set(s_) for s_, *_ in means.values())))
    head = f"| method (seeds) | {' | '.join(f'step {s:g}' for s in steps)} |\n|---|{'---|' * len(steps)}\n"
    rows = [f"| {m} ({len(seed_groups(list(runs))[m])}) | "
            f"{' | '.join(f'{dict(zip(s_, mean, strict=True))[s]:.3f}' for s in steps)} |"
            for m, (s_, mean, _, _) in means.items()]
    return head + "\n".join(rows) + "\n"


def skill_examples(name: str, path: Path, per_kind: int = 3) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        return f"## {name}\n\n(no skills yet)\n"
    out = [f"## {name}\n"]
    updates = sorted({r["step"] for r in records})
    for step in dict.fromkeys([updates[0], updates[-1]]):
        batch = [r for r in records if r["step"] == step]
        rate = sum(r["ok"] for r in batch) / len(batch)
        out.append(f"### update {step} (analysis success {rate:.2f} over {len(batch)} trajectories)\n")
        for outcome in ("success", "failure"):
            for r in [r for r in batch if r["ok"] and r["outcome"] == outcome][:per_kind]:
                out.append(f"- **{outcome}** (return {r['return']:.2f}): {r['skill']}")
        bad = [r for r in batch if not r["ok"]][:1]
        if bad:
            out.append(f"- *failed analysis* ({bad[0]['error']}): `{bad[0]['raw'][:200]!r}`")
        out.append("")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run names under --root")
    parser.add_argument("--root", type=Path, default=Path("runs/seed"))
    parser.add_argument("--metric", default="val/success_rate")
    args = parser.parse_args()
    runs = {name: args.root / name for name in args.runs if (args.root / name / "metrics.jsonl").is_file()}
    png = plot_compare(runs, args.metric, args.root / "val_success.png")
    table = val_table(runs, args.metric)
    if any(re.search(r"_s\d+$", name) for name in runs):
        table += "\nMean over seeds:\n\n" + seed_means(runs, args.metric)
    (args.root / "table.md").write_text(f"Held-out {args.metric} (greedy=false, temperature from the configs).\n\n"
                                        + table)
    skills = [skill_examples(n, d / "skills.jsonl") for n, d in runs.items() if (d / "skills.jsonl").is_file()]
    (args.root / "skills.md").write_text("# Skills the policy wrote (first and last update)\n\n" + "\n".join(skills))
    print(table)
    print(png, args.root / "table.md", args.root / "skills.md", sep="\n")


if __name__ == "__main__":
    main()
