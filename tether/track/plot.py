"""PNG curves from ``metrics.jsonl``: one run (:func:`plot_run`) or several runs (:func:`plot_compare`).

Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas, never pyplot, so plotting
needs no display and leaves matplotlib's global backend alone.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Series = tuple[list[float], list[float]]  # (steps, values)

# Curves with at least this many points get a smoothed line over the faint raw one.
_SMOOTH_MIN_POINTS = 20
_GRID_COLS = 3


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; a line that is not a JSON object (torn by a kill or a live run mid-write,
    or edited by hand) is skipped."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def metric_series(rows: list[dict[str, Any]]) -> dict[str, Series]:
    """Per metric, the steps where it has a finite number, and those numbers.

    A key may appear at some steps only (validation every N steps); each curve keeps its own steps.
    """
    series: dict[str, Series] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def _rolling(values: list[float], window: int) -> list[float]:
    """Centred moving average, the window shrinking at the ends.

    Centred rather than an EMA: an EMA lags a trend, which reads as a slower learning curve.
    """
    half = window // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half): i + half + 1]
        out.append(sum(part) / len(part))
    return out


def _draw(ax: Any, series: Series, label: str, smooth: int | None = None) -> None:
    """One curve: raw points, plus a moving average when the curve is long (window ``smooth``)."""
    steps, values = series
    if smooth is None:
        smooth = max(3, len(values) // 20) if len(values) >= _SMOOTH_MIN_POINTS else 1
    if smooth > 1:
        (raw,) = ax.plot(steps, values, alpha=0.3, linewidth=1)
        ax.plot(steps, _rolling(values, smooth), color=raw.get_color(), label=label, linewidth=1.5)
    else:
        ax.plot(steps, values, marker="o" if len(values) < _SMOOTH_MIN_POINTS else None, markersize=3,
                label=label)


def _save(fig: Any, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _single(series: dict[str, Series], keys: list[str], title: str, path: Path) -> Path:
    """One axes with several curves of related metrics."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.12)
    ax = fig.add_subplot()
    for key in keys:
        _draw(ax, series[key], key)
    ax.set(title=title, xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _grid(series: dict[str, Series], keys: list[str], title: str, path: Path) -> Path:
    """One small axes per metric."""
    from matplotlib.figure import Figure

    rows = math.ceil(len(keys) / _GRID_COLS)
    cols = min(len(keys), _GRID_COLS)
    height = 2.8 * rows + 0.6
    fig = Figure(figsize=(4 * cols, height))
    # Fixed margins: constrained layout would double the drawing time on a 2-core machine. The top 0.8 inch holds
    # the figure's title above the first row's own titles, so the two never overlap.
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.08, top=1 - 0.8 / height, wspace=0.3, hspace=0.5)
    fig.suptitle(title, y=1 - 0.12 / height, va="top")
    for index, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, index + 1)
        _draw(ax, series[key], key)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def _leaf(key: str) -> str:
    return key.rsplit("/", 1)[-1]


# The named figures: file stem, title, which keys go in it.
_NAMED: list[tuple[str, str, Callable[[str], bool]]] = [
    ("reward", "training reward", lambda k: k.startswith("train/reward") or k == "train/accuracy"),
    # lengths and turn counts have their own scale (response_length.png); keep rates readable here
    ("val", "validation", lambda k: k.startswith("val/") and "length" not in k and "turns" not in k),
    ("entropy", "entropy", lambda k: "entropy" in _leaf(k)),
    ("kl", "KL", lambda k: "kl" in _leaf(k)),
    ("response_length", "response length", lambda k: "length" in _leaf(k)),
]


def _prefix(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else "other"


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write PNG curves of one run from ``run_dir/metrics.jsonl``.

    Writes ``reward.png``, ``val.png``, ``entropy.png``, ``kl.png``, ``response_length.png`` (each
    only if it has data), and ``metrics_<prefix>.png``: a grid of every numeric metric sharing
    the prefix before the first ``/``.

    Args:
        run_dir: folder with ``metrics.jsonl``.
        out_dir: where to write; default ``run_dir/plots``.

    Returns:
        The written files, in the order above.

    Raises:
        FileNotFoundError: ``run_dir/metrics.jsonl`` does not exist.
    """
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    series = metric_series(read_metrics(run_dir / "metrics.jsonl"))
    written = []
    for stem, title, wanted in _NAMED:
        keys = sorted(k for k in series if wanted(k))
        if keys:
            written.append(_single(series, keys, f"{title} ({run_dir.name})", out / f"{stem}.png"))
    groups: dict[str, list[str]] = {}
    for key in sorted(series):
        groups.setdefault(_prefix(key), []).append(key)
    for prefix, keys in groups.items():
        path = out / f"metrics_{_safe_name(prefix)}.png"
        written.append(_grid(series, keys, f"{prefix} ({run_dir.name})", path))
    return written


def plot_compare(run_dirs: Mapping[str, str | Path], metric: str, out: str | Path,
                 smooth: int = 1) -> Path:
    """One PNG with ``metric`` of several runs, e.g. ``val/pass@1`` of each method.

    Args:
        run_dirs: legend label -> run folder with ``metrics.jsonl``.
        metric: the metric key to plot.
        out: the PNG to write.
        smooth: centred moving-average window in points; 1 plots the raw values only.

    Returns:
        ``out`` as a Path.

    Raises:
        ValueError: no run has ``metric`` (the message lists the keys that exist).
    """
    from matplotlib.figure import Figure

    if smooth < 1:
        raise ValueError(f"smooth is a window in points and must be >= 1, got {smooth}")
    fig = Figure(figsize=(7, 4))
    fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.12)
    ax = fig.add_subplot()
    available: set[str] = set()
    drawn = 0
    for label, run_dir in run_dirs.items():
        series = metric_series(read_metrics(Path(run_dir) / "metrics.jsonl"))
        available.update(series)
        if metric in series:
            _draw(ax, series[metric], label, smooth=smooth)
            drawn += 1
    if not drawn:
        raise ValueError(f"no run has metric {metric!r}; available: {', '.join(sorted(available)) or 'none'}")
    ax.set(title=metric, xlabel="step", ylabel=metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, Path(out))


SEED_SUFFIX = re.compile(r"_s\d+$")  # run names of repeated seeds: NAME, NAME_s1, NAME_s2, ...


def seed_groups(names: list[str]) -> dict[str, list[str]]:
    """Run names grouped by method, in first-seen order: ``armor`` and ``armor_s1`` are two seeds of ``armor``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(SEED_SUFFIX.sub("", name), []).append(name)
    return groups


def mean_series(runs: list[Series]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Mean, min and max over runs at the steps every run has logged: (steps, mean, low, high)."""
    tables = [dict(zip(steps, values, strict=True)) for steps, values in runs]
    steps = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
    columns = [[t[s] for t in tables] for s in steps]
    return (steps, [sum(c) / len(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns])


def plot_seed_means(run_dirs: Mapping[str, str | Path], metrics: list[str], out: str | Path) -> Path:
    """One panel per metric: each method's mean over its seeds, with the band from the lowest to the highest seed.

    Args:
        run_dirs: run name -> run folder; names that differ only by ``_sN`` are seeds of one method.
        metrics: metric keys, one panel each, e.g. ``["val/avg@k", "val/pass@k"]``.
        out: the PNG to write.
    """
    from matplotlib.figure import Figure

    series = {name: metric_series(read_metrics(Path(d) / "metrics.jsonl")) for name, d in run_dirs.items()}
    fig = Figure(figsize=(6 * len(metrics), 4.2))
    fig.subplots_adjust(left=0.07, right=0.98, top=0.9, bottom=0.12, wspace=0.25)
    for index, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), index + 1)
        for method, names in seed_groups(list(run_dirs)).items():
            have = [series[n][metric] for n in names if metric in series[n]]
            if not have:
                continue
            steps, mean, low, high = mean_series(have)
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=f"{method} ({len(have)})")
            if len(have) > 1:
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set(title=f"{metric}: mean over seeds, band = min..max", xlabel="step", ylabel=metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, Path(out))
