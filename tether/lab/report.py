"""The report of an experiment: ``report.json`` (everything), ``report.md`` (tables), ``curves.png`` (bands)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tether.lab import stats
from tether.lab.protocol import Protocol, arm_config, run_dir


def endpoint_values(records: list[dict[str, Any]], metric: str) -> dict[str, dict[int, float]]:
    """arm -> seed -> the metric's endpoint value."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if metric in r["metrics"]:
            out.setdefault(r["arm"], {})[r["seed"]] = float(r["metrics"][metric])
    return out


def evaluation_answers(protocol: Protocol) -> int | None:
    """Answers behind one run's endpoint value (prompts of the split x samples), for the evaluation-noise MDE."""
    from tether.config import load_config
    from tether.tasks import make_task, task_split

    cfg = arm_config(protocol, protocol.baseline, protocol.seeds[0])
    cfg = load_config(data=cfg.model_dump(mode="json"), overrides=protocol.endpoint.overrides)
    if cfg.task is None:
        return cfg.env.val_tasks * (1 if cfg.val.greedy else cfg.val.samples)
    prompts = len(task_split(make_task(cfg.task.name, **cfg.task.kwargs), protocol.endpoint.split))
    if cfg.val.max_prompts:
        prompts = min(prompts, cfg.val.max_prompts)
    return prompts * (1 if cfg.val.greedy else cfg.val.samples)


def summarise(protocol: Protocol, records: list[dict[str, Any]], answers: int | None) -> dict[str, Any]:
    """Per-arm intervals and paired comparisons for the endpoint and each secondary metric."""
    out: dict[str, Any] = {}
    for metric in [protocol.endpoint.metric, *protocol.secondary]:
        values = endpoint_values(records, metric)
        arms = {arm: {"per_seed": v, **_interval(stats.mean_ci(list(v.values())))} for arm, v in values.items()}
        comparisons = {}
        base = values.get(protocol.baseline, {})
        for arm in protocol.compared():
            if arm not in values or not base or not set(values[arm]) & set(base):
                continue
            diff = stats.paired_difference(values[arm], base)
            entry = {**_interval(diff), "mde": stats.mde(diff.sd, diff.n)}
            if metric == protocol.endpoint.metric:
                p = arms[protocol.baseline]["mean"]
                entry["mde_evaluation_floor"] = (stats.evaluation_floor_mde(p, answers, diff.n)
                                                 if answers and 0 <= p <= 1 else math.nan)
                entry["label"] = stats.label(diff, protocol.paper_effect)
            comparisons[arm] = entry
        out[metric] = {"arms": arms, "versus_baseline": comparisons}
    return out


def _interval(ci: stats.Interval) -> dict[str, float]:
    return {"n": ci.n, "mean": ci.mean, "sd": ci.sd, "ci_low": ci.low, "ci_high": ci.high}


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else f"{x:.3f}"


def markdown(protocol: Protocol, summary: dict[str, Any], reg: dict[str, Any], failures: list[str],
             answers: int | None) -> str:
    e = protocol.endpoint
    lines = [f"# Experiment: {protocol.name}", "", protocol.question, "",
             f"Endpoint: `{e.metric}` on split `{e.split}` at the `{e.at}` checkpoint"
             f"{' (chosen on the selection split)' if e.at == 'best' else ''}; {answers or '?'} answers per run. "
             f"Seeds: {protocol.seeds}. Baseline: `{protocol.baseline}`. "
             f"Paper-sized effect: {protocol.paper_effect if protocol.paper_effect is not None else 'not given'}.",
             "",
             f"Protocol sha256 `{reg['sha256'][:16]}`; first run at commit `{reg['first_run']['commit'][:10]}` "
             f"({reg['first_run']['started']}), protocol committed then: {reg['first_run']['committed']}; "
             f"changed after the first run: **{reg['changed_after_first_run']}**; report at commit "
             f"`{reg['commit_now'][:10]}`.", ""]
    for metric, part in summary.items():
        lines += [f"## `{metric}`" + (" (primary)" if metric == e.metric else ""), "",
                  "| arm | n | mean | 95% CI | per seed |", "|---|---|---|---|---|"]
        for arm, a in part["arms"].items():
            seeds = ", ".join(f"{s}: {v:.3f}" for s, v in sorted(a["per_seed"].items()))
            lines.append(f"| {arm} | {a['n']} | {_fmt(a['mean'])} | [{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}] "
                         f"| {seeds} |")
        if part["versus_baseline"]:
            lines += ["", f"Paired differences against `{protocol.baseline}` (same seeds):", "",
                      "| arm | n | difference | 95% CI | MDE (80% power) | MDE, evaluation noise only | label |",
                      "|---|---|---|---|---|---|---|"]
            for arm, c in part["versus_baseline"].items():
                lines.append(f"| {arm} | {c['n']} | {_fmt(c['mean'])} | [{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] "
                             f"| {_fmt(c['mde'])} | {_fmt(c.get('mde_evaluation_floor', math.nan))} "
                             f"| {c.get('label', '')} |")
        lines.append("")
    if failures:
        lines += ["## Failed runs", "", *[f"- {f}" for f in failures], ""]
    lines += ["Labels: *effect detected* when the difference's 95% interval excludes 0; *no effect of the paper's "
              "size* when it lies within ± the paper-sized effect; otherwise *inconclusive*.", ""]
    return "\n".join(lines)


def training_curves(protocol: Protocol, metric: str) -> dict[str, dict[int, list[float]]]:
    """arm -> step -> the metric's values over seeds, on the selection split during training (metrics.jsonl)."""
    curves: dict[str, dict[int, list[float]]] = {}
    for arm in protocol.arms:
        for seed in protocol.seeds:
            path = run_dir(protocol, arm, seed) / "metrics.jsonl"
            if not path.is_file():
                continue
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if metric in row:
                    curves.setdefault(arm, {}).setdefault(int(row["step"]), []).append(float(row[metric]))
    return curves


def plot_curves(protocol: Protocol, path: Path) -> Path | None:
    """Mean and 95% band over seeds of the endpoint metric on the selection split, per arm, against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = training_curves(protocol, protocol.endpoint.metric)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm, by_step in curves.items():
        steps = sorted(by_step)
        cis = [stats.mean_ci(by_step[s]) for s in steps]
        ax.plot(steps, [c.mean for c in cis], label=f"{arm} (n={max(c.n for c in cis)})")
        low = [c.low if math.isfinite(c.low) else c.mean for c in cis]
        high = [c.high if math.isfinite(c.high) else c.mean for c in cis]
        ax.fill_between(steps, low, high, alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"{protocol.endpoint.metric} (selection split)")
    ax.set_title(f"{protocol.name}: mean and 95% CI over seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(protocol: Protocol, records: list[dict[str, Any]], reg: dict[str, Any],
                 failures: list[str]) -> dict[str, Any]:
    root = Path(protocol.run_root)
    root.mkdir(parents=True, exist_ok=True)
    answers = evaluation_answers(protocol)
    summary = summarise(protocol, records, answers)
    data = {"protocol": protocol.model_dump(), "registration": reg, "answers_per_run": answers,
            "summary": summary, "failures": failures, "runs": records}
    (root / "report.json").write_text(json.dumps(data, indent=2, default=str))
    (root / "report.md").write_text(markdown(protocol, summary, reg, failures, answers))
    plot_curves(protocol, root / "curves.png")
    return data
