"""The run's settings reach every tracker sink that records a config (W&B, MLflow, TensorBoard), once per start."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.trainer.helpers import tiny_config
from tether.track import JsonlSink, Tracker
from tether.trainer import Trainer


class RecordingSink:
    """A sink like WandbSink: logs metrics and records a config."""

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []
        self.steps: list[int] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.steps.append(step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.configs.append(dict(config))

    def close(self) -> None:
        pass


def test_the_trainer_hands_its_config_to_the_sinks_once(tmp_path, tiny_policy, monkeypatch):
    sink = RecordingSink()

    def tracker_with_fake_sink(run_dir: Path, **_: Any) -> Tracker:
        return Tracker(run_dir, [JsonlSink(Path(run_dir) / "metrics.jsonl"), sink])

    monkeypatch.setattr("tether.track.build_tracker", tracker_with_fake_sink)  # what tether.start.run_tracker calls
    cfg = tiny_config(tmp_path, "optim.lr=3e-4", "train.steps=1")
    model, tok = tiny_policy
    Trainer(cfg, policy=model, tokenizer=tok).fit()
    assert len(sink.configs) == 1 and sink.steps == [1]
    sent = sink.configs[0]
    assert sent == cfg.model_dump(mode="json")
    assert sent["optim"]["lr"] == 3e-4 and sent["task"]["name"] == "parity"
    assert yaml.safe_load((Path(cfg.run_dir) / "config.yaml").read_text()) == sent  # the file says the same
