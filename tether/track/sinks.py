"""Metric sinks: where a step's ``{name: float}`` goes. Each follows :class:`MetricSink`.

Sinks receive plain floats; converting tensors happens once, in :class:`tether.track.Tracker`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tether.files import jsonl_line, write_text_atomic


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


# Where a run dir remembers the W&B and MLflow runs it logs to, so that a resumed process continues them.
TRACKER_RUNS = "trackers.json"


def tracker_run_ids(run_dir: str | Path) -> dict[str, str]:
    """The W&B and MLflow run ids ``run_dir`` logged to (``{"wandb": id, "mlflow": id}``; missing ones absent, an
    unreadable file reads as none: the resumed process then starts runs of its own, as before the file)."""
    try:
        ids = json.loads((Path(run_dir) / TRACKER_RUNS).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def remember_tracker_run(run_dir: str | Path, tracker: str, run_id: str) -> None:
    """Record ``run_id`` as the ``tracker`` run ``run_dir`` logs to."""
    ids = tracker_run_ids(run_dir) | {tracker: run_id}
    write_text_atomic(Path(run_dir) / TRACKER_RUNS, json.dumps(ids, indent=2) + "\n")


class WandbSink:
    """Weights & Biases. ``settings`` go to ``wandb.init`` (project, entity, name, mode, tags...).

    A resumed run (``resumed_at`` > 0) continues the W&B run the run dir logged to (``id`` and ``resume="allow"``)
    unless ``settings`` name an ``id`` or ``resume`` of their own. W&B keeps a run's steps increasing: the steps an
    earlier process logged after its last checkpoint are logged again by the resumed one and W&B keeps the first
    values, which a bit-exact resume makes the same (docs/reliability.md)."""

    def __init__(self, run_dir: str | Path, settings: Mapping[str, Any], resumed_at: int = 0) -> None:
        self._wandb = _require("wandb")
        settings = dict(settings)
        earlier = tracker_run_ids(run_dir).get("wandb") if resumed_at else None
        if earlier and not {"id", "resume"} & set(settings):
            settings |= {"id": earlier, "resume": "allow"}
        self._run = self._wandb.init(dir=str(run_dir), **settings)
        remember_tracker_run(run_dir, "wandb", self._run.id)

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
    """MLflow. ``settings``: optional ``tracking_uri``, ``experiment``, ``run_name``, ``tags``.

    A resumed run (``resumed_at`` > 0) continues the MLflow run the run dir logged to; if the tracking server no
    longer has it, a new run starts, with a warning naming the old one. MLflow keeps every value logged at a step:
    the steps an earlier process logged after its last checkpoint appear twice, with the same values where the
    resume is bit-exact."""

    def __init__(self, settings: Mapping[str, Any], run_dir: str | Path, resumed_at: int = 0) -> None:
        check_mlflow_settings(settings)
        self._mlflow = _require("mlflow")
        if settings.get("tracking_uri"):
            self._mlflow.set_tracking_uri(settings["tracking_uri"])
        if settings.get("experiment"):
            self._mlflow.set_experiment(settings["experiment"])
        earlier = tracker_run_ids(run_dir).get("mlflow") if resumed_at else None
        self._run = self._continue(earlier) if earlier else None
        if self._run is None:
            self._run = self._mlflow.start_run(run_name=settings.get("run_name"), tags=settings.get("tags"))
        remember_tracker_run(run_dir, "mlflow", self._run.info.run_id)

    def _continue(self, run_id: str) -> Any:
        """The earlier MLflow run ``run_id``, reopened, or None when the tracking server cannot reopen it."""
        try:
            return self._mlflow.start_run(run_id=run_id)
        except Exception as error:  # MlflowException, or the server's own; a new run beats a failed resume
            warnings.warn(f"MLflow could not continue run {run_id} ({error}); this process logs to a new run",
                          stacklevel=2)
            return None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_key(k): v for k, v in metrics.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Log the settings as params. A continued run already holds them, and MLflow refuses to change a param
        ("Changing param values is not allowed"), while a resume may change settings that leave the run's meaning
        alone (``train.steps``, ``rollout.partial_batches``...): those keep their first value, with a warning
        naming them, instead of failing the resumed run."""
        params = _flatten(to_plain(config))
        logged = self._run.data.params  # a continued run's params (MLflow keeps them as strings); a new run's: none
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != str(v))
        if changed:
            warnings.warn(f"MLflow keeps the first value of a run's params: {', '.join(changed)} changed on resume "
                          "and keep their earlier values there (the run dir's config.yaml has the new ones)",
                          stacklevel=2)
        self._mlflow.log_params({k: v for k, v in params.items() if k not in changed})

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
    if value is None or type(value) in (bool, int, float, str):
        return value
    for plain in (bool, int, float):  # a subclass (numpy's bool_ is not one; an IntEnum is) as its plain value
        if isinstance(value, plain):
            return plain(value)
    return str(value)  # a str subclass too (torch's TorchVersion), which yaml.safe_dump cannot represent
