"""The :class:`Tracker`: one ``log`` call per step, fanned out to every configured sink."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tether.files import write_text_atomic
from tether.provenance import code_provenance
from tether.track.sinks import (
    JsonlSink,
    MetricSink,
    MlflowSink,
    TensorBoardSink,
    WandbSink,
    _require,
    check_mlflow_settings,
    to_plain,
)


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Turn metric values (floats, ints, bools, numpy or torch scalars) into Python floats.

    All tensors on one device are stacked and copied to the host together, so a step costs one
    device sync however many tensor metrics it has. ``None`` values are dropped (a metric that
    does not exist at this step).

    Raises:
        ValueError: a tensor or array with more than one element (reduce it first), or a
            value that is not a number.
    """
    out: dict[str, float | None] = {}
    by_device: dict[Any, list[str]] = {}
    for name, value in metrics.items():
        if value is None:
            continue
        if hasattr(value, "detach") and hasattr(value, "device"):  # a torch.Tensor, without importing torch
            if value.numel() != 1:
                raise ValueError(f"metric {name!r} is a tensor of shape {tuple(value.shape)}; log a scalar")
            by_device.setdefault(value.device, []).append(name)
            out[name] = None  # keeps the caller's key order
            continue
        try:
            out[name] = float(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"metric {name!r} is not a number: {value!r}") from error
    for device, names in by_device.items():
        import torch

        # float64 keeps large counts exact; MPS has no float64.
        dtype = torch.float32 if device.type == "mps" else torch.float64
        stacked = torch.stack([metrics[n].detach().reshape(()).to(dtype) for n in names])
        out.update(zip(names, stacked.tolist(), strict=True))  # the one host sync for this device
    return out  # type: ignore[return-value]


def finite_or_none(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, +-inf) replaced by None, in nested dicts and lists: what
    a summary holds, as strict JSON (JSON has no ``NaN`` or ``-Infinity``; readers such as ``jq`` refuse Python's).
    """
    if isinstance(value, Mapping):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: str | Path, data: Mapping[str, Any]) -> Path:
    """``data`` as indented strict JSON, written atomically; tensors become floats, values that are not finite
    numbers None."""
    return write_text_atomic(path, json.dumps(finite_or_none(_summary_plain(data)), indent=2, allow_nan=False) + "\n")


def _summary_plain(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {str(k): _summary_plain(v) for k, v in data.items()}
    if hasattr(data, "detach") and hasattr(data, "numel") and data.numel() == 1:
        return float(data.item())
    return to_plain(data)


class Tracker:
    """Fans each step's metrics out to sinks, after converting them to floats in one place.

    Args:
        run_dir: the run's folder (``config.yaml``, ``summary.json`` and the sinks' files go here).
        sinks: the sinks to write to.

    >>> with build_tracker(run_dir, tensorboard=False) as tracker:  # doctest: +SKIP
    ...     tracker.log({"train/reward_mean": rewards.mean()}, step=0)
    """

    def __init__(self, run_dir: str | Path, sinks: Sequence[MetricSink]) -> None:
        self.run_dir = Path(run_dir)
        self.sinks = list(sinks)

    def log(self, metrics: Mapping[str, Any], step: int) -> dict[str, float]:
        """Convert ``metrics`` (see :func:`to_floats`) and send them to every sink.

        Returns:
            The floats that were logged, for printing.
        """
        floats = to_floats(metrics)
        if floats:
            for sink in self.sinks:
                sink.log(floats, step)
        return floats

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Hand the config (JSON-mode values) to the sinks that record one (W&B, MLflow, TensorBoard's text), with
        the code that runs it under ``provenance`` (:func:`~tether.provenance.code_provenance`).

        ``run_dir/config.yaml`` is not written here: the command writes it once, with
        :func:`~tether.config.dump_config`, which keeps the config's own mapping keys (a JSON-mode dump would turn
        ``{0: 0.5}`` into ``{'0': 0.5}``, which ``tether eval --config`` then refuses)."""
        config = {**config, "provenance": code_provenance()}
        for sink in self.sinks:
            if hasattr(sink, "log_config"):
                sink.log_config(config)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Write ``run_dir/summary.json`` (final metrics, wall time...), replacing any earlier one."""
        return write_json_atomic(self.run_dir / "summary.json", summary)

    def close(self) -> None:
        """Close every sink, even if one of them fails (the first error is raised afterwards)."""
        errors = []
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:  # keep closing the others; their files matter more
                errors.append(error)
        self.sinks = []
        if errors:
            raise errors[0]

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# TensorBoard's folder in a run dir; a start over an earlier run (train.overwrite) deletes it
TENSORBOARD_DIR = "tensorboard"


def build_tracker(run_dir: str | Path, *, tensorboard: bool = True, wandb: Mapping[str, Any] | None = None,
                  mlflow: Mapping[str, Any] | None = None, resumed_at: int = 0) -> Tracker:
    """The tracker for a run: ``metrics.jsonl`` always, plus the sinks that are configured.

    Args:
        run_dir: the run's folder, created if missing.
        tensorboard: also write TensorBoard events to ``run_dir/tensorboard``.
        wandb: ``wandb.init`` settings (``{}`` for the defaults), or ``None`` for no W&B.
        mlflow: MLflow settings (``tracking_uri``, ``experiment``, ``run_name``, ``tags``), or ``None``.
        resumed_at: the step a resumed run continues from (0: a fresh run); TensorBoard hides the later steps an
            earlier process logged; W&B and MLflow continue the runs the run dir logged to (``trackers.json``).

    Returns:
        A :class:`Tracker`; use it as a context manager or call ``close()``.

    Raises:
        ImportError: wandb or mlflow is configured but not installed (before any file is created).
        ValueError: unknown mlflow settings (also before any file is created).
    """
    # Fail on a missing optional tracker before creating any file, so a typo costs nothing.
    if wandb is not None:
        _require("wandb")
    if mlflow is not None:
        check_mlflow_settings(mlflow)
        _require("mlflow")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(run_dir, [JsonlSink(run_dir / "metrics.jsonl")])
    try:
        if tensorboard:
            tracker.sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR, resumed_at))
        if wandb is not None:
            tracker.sinks.append(WandbSink(run_dir, wandb, resumed_at))
        if mlflow is not None:
            tracker.sinks.append(MlflowSink(mlflow, run_dir, resumed_at))
    except BaseException:
        tracker.close()
        raise
    return tracker
