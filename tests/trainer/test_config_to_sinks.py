"""The run's settings, and the code that runs it, reach every tracker sink that records a config (W&B, MLflow,
TensorBoard), once per start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.trainer.helpers import RecordingSink, tiny_config
from tether.checks import load_checked_config
from tether.provenance import code_provenance
from tether.track import JsonlSink, Tracker
from tether.trainer import Trainer


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
    assert sent.pop("provenance") == code_provenance()  # the code that ran it, beside its settings
    assert sent == cfg.model_dump(mode="json")
    assert sent["optim"]["lr"] == 3e-4 and sent["task"]["name"] == "parity"
    assert yaml.safe_load((Path(cfg.run_dir) / "config.yaml").read_text()) == sent  # the file says the same


def test_config_yaml_loads_back_with_the_configs_own_mapping_keys(tmp_path, tiny_policy):
    """config.yaml is written once, by dump_config: a task argument keyed by ints stays keyed by ints, so
    ``tether eval --config RUN/config.yaml`` accepts it (the JSON-mode copy handed to the sinks had '0')."""
    cfg = tiny_config(tmp_path, "train.steps=1",
                      task={"name": "addition", "kwargs": {"inner_carries": {0: 1.0}}})
    model, tok = tiny_policy
    Trainer(cfg, policy=model, tokenizer=tok).fit()
    again = load_checked_config(Path(cfg.run_dir) / "config.yaml")  # the strict argument check eval runs
    assert again.task.kwargs == {"inner_carries": {0: 1.0}}
    assert again == cfg
