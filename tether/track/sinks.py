"""Metric sinks: where a step's ``{name: float}`` goes. Each follows :class:`MetricSink`.

Sinks receive plain floats; converting tensors happens once, in :class:`tether.track.Tracker`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tether.files import jsonl_line


@runtime_checkable
class MetricSink(Protocol):
    """Anything that records metrics. Optional extra: ``log_config(config: dict)``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (plain floats) at ``step``."""
        ...

    def close(self) -> None:
        """Flush and release resources; the sink is not used afterwards."""
        ...


class JsonlSink:
    """Appends one JSON object per :meth:`log` call to ``path``: ``{"step": step, **metrics}``.

    Each line is flushed at once, so a crashed run keeps every step it logged and ``plot_run`` can
    read a live run. The file is opened for appending, so a resumed run continues it.
    Non-finite values are written as ``NaN``/``Infinity`` (Python's JSON dialect), which
    ``json.loads`` and pandas read back.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(jsonl_line({"step": step, **metrics}))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Scalars to a TensorBoard event file under ``log_dir`` (``torch.utils.tensorboard``). ``resumed_at``: the
    step a resumed run continues from; events an earlier process logged after it are purged from view, since the
    resumed run logs those steps again (as ``metrics.jsonl`` is cut back to it)."""

    def __init__(self, log_dir: str | Path, resumed_at: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30,
                                     purge_step=resumed_at + 1 if resumed_at else None)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._writer.add_text("config", "```yaml\n" + to_yaml(config) + "```")

    def close(self) -> None:
        self._writer.close()


def _require(module: str) -> Any:
    """Import an optional tracker, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{module} is configured but not installed: pip install {module}") from error


class WandbSink:
    """Weights & Biases. ``settings`` go to ``wandb.init`` (project, entity, name, mode, tags...)."""

    def __init__(self, run_dir: str | Path, settings: Mapping[str, Any]) -> None:
        self._wandb = _require("wandb")
        self._run = self._wandb.init(dir=str(run_dir), **settings)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(to_plain(config), allow_val_change=True)

    def close(self) -> None:
        self._run.finish()


# MLflow accepts only these characters in metric names; "val/pass@8" would be rejected.
_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(name: str) -> str:
    """Metric name MLflow accepts: ``@`` becomes ``_at_``, other odd characters ``_``.

    >>> mlflow_key("val/pass@8")
    'val/pass_at_8'
    """
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


MLFLOW_SETTINGS = ("tracking_uri", "experiment", "run_name", "tags")


def check_mlflow_settings(settings: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` naming unknown keys and the allowed ones."""
    unknown = sorted(set(settings) - set(MLFLOW_SETTINGS))
    if unknown:
        raise ValueError(f"unknown mlflow settings {unknown}; allowed: {', '.join(MLFLOW_SETTINGS)}")


class MlflowSink:
    """MLflow. ``settings``: optional ``tracking_uri``, ``experiment``, ``run_name``, ``tags``."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        check_mlflow_settings(settings)
        self._mlflow = _require("mlflow")
        if settings.get("tracking_uri"):
            self._mlflow.set_tracking_uri(settings["tracking_uri"])
        if settings.get("experiment"):
            self._mlflow.set_experiment(settings["experiment"])
        self._run = self._mlflow.start_run(run_name=settings.get("run_name"), tags=settings.get("tags"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_key(k): v for k, v in metrics.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._mlflow.log_params(_flatten(to_plain(config)))

    def close(self) -> None:
        self._mlflow.end_run()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow params are flat)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def to_yaml(config: Mapping[str, Any]) -> str:
    """``config`` as block-style YAML, key order kept."""
    import yaml

    return yaml.safe_dump(to_plain(config), sort_keys=False)


def to_plain(value: Any) -> Any:
    """Recursively turn dataclasses, pydantic models, tuples, Paths... into YAML/JSON-safe values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_plain(dataclasses.asdict(value))
    if hasattr(value, "model_dump"):  # pydantic v2
        return to_plain(value.model_dump())
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
