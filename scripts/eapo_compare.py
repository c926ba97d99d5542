"""Compare runs of the EAPO experiment: validation avg@k per step and per generated token, one PNG and a table.

    python scripts/eapo_compare.py --out runs/eapo/comparison grpo=runs/eapo/grpo_baseline \
        seq_gated=runs/eapo/eapo_seq_gated none=runs/eapo/eapo_none

writes ``<out>.png`` (two panels) and ``<out>.md`` (a markdown table). "Generated tokens" are response
tokens of training rollouts, summed over steps (``train/rows * train/response_length``); injected tokens
count like any other, and the prior's lock-step forward passes (EAPO's extra decoding cost) show in the
rollout seconds column instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tether.track.plot import metric_series, read_metrics

METRIC = "val/avg@k"


def cumulative_tokens(series: dict) -> dict[float, float]:
    """Step -> response tokens generated in training up to and including that step (0 at step 0)."""
    rows = dict(zip(*series.get("train/rows", ([], [])), strict=True))
    lengths = dict(zip(*series.get("train/response_length", ([], [])), strict=True))
    total, out = 0.0, {0.0: 0.0}
    for step in sorted(rows):
        total += rows[step] * lengths.get(step, 0.0)
        out[step] = total
    return out


def summarize(label: str, run_dir: Path, max_step: float = float("inf")) -> tuple[dict, list[float], list[float],
                                                                                  list[float]]:
    series = {key: tuple(zip(*[(s, v) for s, v in zip(*sv, strict=True) if s <= max_step], strict=True)) or ([], [])
              for key, sv in metric_series(read_metrics(run_dir / "metrics.jsonl")).items()}
    if METRIC not in series:
        raise SystemExit(f"{run_dir}: no {METRIC} in metrics.jsonl (has the run validated yet?)")
    steps, values = series[METRIC]
    tokens = cumulative_tokens(series)
    x_tokens = [tokens.get(s, float("nan")) for s in steps]

    def total(key: str) -> float:
        return sum(series.get(key, ([], []))[1])

    def mean(key: str) -> float | None:
        vals = series.get(key, ([], []))[1]
        return sum(vals) / len(vals) if vals else None

    best = max(range(len(values)), key=values.__getitem__)
    row = {
        "run": label, "first": values[0], "last": values[-1], "best": values[best], "best_step": int(steps[best]),
        "steps": int(max(series.get("train/rows", ([0], [0]))[0], default=0)),
        "tokens": max(tokens.values()), "rollout_s": total("perf/rollout_s"), "step_s": total("perf/step_s"),
        "injected_token_frac": mean("eapo/injected_token_frac"), "is_weight_mean": mean("eapo/is_weight_mean"),
        "is_trunc_frac": mean("eapo/is_trunc_frac"),
    }
    return row, steps, x_tokens, values


def table(rows: list[dict]) -> str:
    def fmt(v: object) -> str:
        if v is None:
            return "-"
        return f"{v:.3f}" if isinstance(v, float) and abs(v) < 100 else f"{v:,.0f}" if isinstance(v, float) else str(v)

    cols = ["run", "first", "last", "best", "best_step", "steps", "tokens", "rollout_s", "step_s",
            "injected_token_frac", "is_weight_mean", "is_trunc_frac"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="label=run_dir")
    parser.add_argument("--out", required=True, help="output path without extension")
    parser.add_argument("--max-step", type=float, default=float("inf"),
                        help="ignore steps after this one (a longer baseline run cut to the others' length)")
    args = parser.parse_args()

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    by_step, by_token = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rows = []
    for item in args.runs:
        label, _, run_dir = item.partition("=")
        row, steps, x_tokens, values = summarize(label, Path(run_dir), args.max_step)
        rows.append(row)
        by_step.plot(steps, values, marker="o", markersize=3, label=label)
        by_token.plot(x_tokens, values, marker="o", markersize=3, label=label)
    by_step.set(title=f"{METRIC} per RL step", xlabel="step", ylabel=METRIC)
    by_token.set(title=f"{METRIC} per generated training token", xlabel="response tokens generated", ylabel=METRIC)
    for ax in (by_step, by_token):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.13, top=0.9, wspace=0.2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=100)
    out.with_suffix(".md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
