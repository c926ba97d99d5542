"""Metric tracking (JSONL, TensorBoard, W&B, MLflow) and plotting. Naming convention: docs/metrics.md."""

from tether.track.names import METHOD_NAMESPACES, METRICS
from tether.track.plot import (
    mean_series,
    metric_series,
    plot_compare,
    plot_run,
    plot_seed_means,
    read_metrics,
    seed_groups,
)
from tether.track.sinks import JsonlSink, MetricSink, MlflowSink, TensorBoardSink, WandbSink, mlflow_key
from tether.track.tracker import (
    TENSORBOARD_DIR,
    Tracker,
    build_tracker,
    finite_or_none,
    to_floats,
    write_json_atomic,
    write_text_atomic,
)

__all__ = [
    "METHOD_NAMESPACES",
    "METRICS",
    "TENSORBOARD_DIR",
    "JsonlSink",
    "MetricSink",
    "MlflowSink",
    "TensorBoardSink",
    "Tracker",
    "WandbSink",
    "build_tracker",
    "finite_or_none",
    "mean_series",
    "metric_series",
    "mlflow_key",
    "plot_compare",
    "plot_run",
    "plot_seed_means",
    "read_metrics",
    "seed_groups",
    "to_floats",
    "write_json_atomic",
    "write_text_atomic",
]
