"""The runner's decisions (tether/lab/experiment.py): the endpoint is read where the protocol says, never where the
checkpoint was chosen (``tether eval`` of the chosen checkpoint on the endpoint split); a best checkpoint at step 0
is refused unless allowed; a required protocol's difference must reach its minimum. The processes are stood in
for, so only the commands and files are checked."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lab.test_experiment import CLEAN, write_config, write_protocol
from tether.config import ConfigError
from tether.lab import experiment
from tether.lab.experiment import load_protocol
from tether.lab.protocol import arm_config, run_dir


@pytest.fixture(autouse=True)
def clean_code(monkeypatch):
    monkeypatch.setattr(experiment, "code_state", lambda root=None: dict(CLEAN))


def fake_processes(monkeypatch, stdout="", on_run=None):
    """``tether train``/``tether eval`` replaced: each command is recorded, ``on_run(cmd)`` stands in for its
    effect, and it exits 0 printing ``stdout``."""
    commands = []

    def run(cmd, **kwargs):
        commands.append(cmd)
        if on_run is not None:
            on_run(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(experiment, "subprocess", SimpleNamespace(run=run, STDOUT=subprocess.STDOUT))
    return commands


def trained_run(protocol, arm, seed, best_step, latest_step):
    directory = run_dir(protocol, arm, seed)
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "best.txt").write_text(f"val/avg@k=0.5 step={best_step}\n")
    (directory / "checkpoints" / "latest").write_text(f"step_{latest_step:06d}")
    (directory / "config.yaml").write_text("")
    return directory


@pytest.mark.parametrize(("at", "checkpoint", "step"), [("best", "best", 1), ("final", "step_000002", 2)])
def test_the_endpoint_is_evaluated_on_the_endpoint_split_at_the_protocols_checkpoint(tmp_path, monkeypatch, at,
                                                                                     checkpoint, step):
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path),
                                            endpoint={"metric": "val/avg@k", "split": "report", "at": at,
                                                      "overrides": ["val.samples=4"]}))
    directory = trained_run(protocol, "high", 1, best_step=1, latest_step=2)
    commands = fake_processes(monkeypatch, stdout='loading...\n{"val/avg@k": 0.625}')
    record = experiment.evaluate_one(protocol, "high", 1)
    [cmd] = commands
    assert cmd[cmd.index("eval") + 1] == str(directory / "checkpoints" / checkpoint)
    splits = [a for a in cmd if a.startswith("val.split=")]
    assert splits == ["val.split=report"]  # the report split only: never val, the split that chose the checkpoint
    assert cmd[-1] == "val.samples=4"  # the endpoint's own overrides come last
    assert record["split"] == "report" and record["step"] == step and record["metrics"] == {"val/avg@k": 0.625}
    assert json.loads((directory / "endpoint.json").read_text()) == record
    assert experiment.evaluate_one(protocol, "high", 1) == record and len(commands) == 1  # done once


@pytest.mark.parametrize("start_selectable", [False, True])
def test_a_best_checkpoint_at_step_0_is_refused_unless_the_protocol_allows_it(tmp_path, monkeypatch,
                                                                              start_selectable):
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), endpoint={
        "metric": "val/avg@k", "split": "report", "at": "best", "start_selectable": start_selectable}))
    directory = run_dir(protocol, "low", 0)

    def train(cmd):  # the trainer wrote checkpoints/best at its first validation, the starting policy's
        (directory / "best.txt").write_text("val/avg@k=0.5 step=0\n")

    commands = fake_processes(monkeypatch, on_run=train)
    if start_selectable:
        experiment.train_one(protocol, "low", 0)
        assert json.loads((directory / "trained.json").read_text())["endpoint_step"] == 0
        assert not any(a.startswith("train.best_from_step") for a in commands[0])
    else:
        with pytest.raises(RuntimeError, match="checkpoints/best is the starting policy"):
            experiment.train_one(protocol, "low", 0)
        assert not (directory / "trained.json").exists()  # not trained: the calibration and report never read it
        assert "train.best_from_step=1" in commands[0]


def test_a_required_difference_is_met_at_exactly_its_minimum(tmp_path):
    config = write_config(tmp_path)
    first = load_protocol(write_protocol(tmp_path / "first", config))
    requirement = {"protocol": str(tmp_path / "first" / "protocol.yaml"), "arm": "high", "min_difference": 0.25,
                   "why": "the control must move the endpoint"}
    protocol = load_protocol(write_protocol(tmp_path / "second", config, requires=[requirement]))
    root = Path(first.run_root)
    root.mkdir(parents=True)
    for mean, met in ((0.25, True), (0.25 - 2**-20, False), (math.nan, False)):  # NaN: no paired seed
        c = {"mean": mean, "ci_low": mean - 0.125, "ci_high": mean + 0.125}
        (root / "report.json").write_text(json.dumps({
            "protocol": first.model_dump(), "calibration": {"status": "passed", "missing": []}, "failures": [],
            "runs": [{"arm": a, "seed": s} for a in ("low", "high") for s in (0, 1)],
            "summary": {"val/avg@k": {"versus_baseline": {"high": c}}}}))
        if met:
            assert experiment.check_requirements(protocol)[0].endswith("+0.250 [+0.125, +0.375] >= 0.25: met")
        else:
            with pytest.raises(ConfigError, match=r"below 0\.25: nothing of 'smoke' runs"):
                experiment.check_requirements(protocol)


def test_each_run_of_a_study_whose_run_root_has_a_hash_gets_its_own_run_dir(tmp_path):
    """The runner passes run_dir as an override, which is read as YAML: under a run root `study #2` every run's
    `.../study #2/<arm>/seed<n>` was `.../study` (the rest a comment), one run directory for all the study's runs."""
    root = tmp_path / "study #2"
    protocol = load_protocol(write_protocol(tmp_path, write_config(tmp_path), run_root=str(root)))
    runs = [(arm, seed) for arm in ("low", "high") for seed in (0, 1)]
    assert [arm_config(protocol, arm, seed).run_dir for arm, seed in runs] == [
        str(root / arm / f"seed{seed}") for arm, seed in runs]
