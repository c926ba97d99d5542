"""What ``tether sft`` and ``tether seed-sft`` share (``open_sft_session``/``finish_sft`` in tether/recipes/sft.py):
the settings handed to the tracker's sinks, a line per step, the refusal of data that nothing of fits, the summary.

Each test runs both commands: they once had a skeleton each, and seed-sft's had lost all three."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.rollout.helpers import ScriptedEngine, seed_sft_config
from tests.trainer.helpers import RecordingSink
from tether.config import ConfigError, load_command_config
from tether.provenance import code_provenance
from tether.recipes.seed_sft import run_skill_sft
from tether.recipes.sft import run_sft
from tether.track import JsonlSink, Tracker

COMMANDS = ("sft", "seed-sft")


@pytest.fixture(autouse=True)
def char_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))


def command_config(command: str, tmp_path: Path, sft: dict[str, Any] | None = None, **logging: Any) -> Any:
    """A two-step run of ``command``: 4 training examples in batches of 2, none held out."""
    logging = {"tensorboard": False, "progress": False, **logging}
    sft = {"epochs": 1, "batch_size": 2, "micro_batch_size": 2, "val_fraction": 0.0, **(sft or {})}
    if command == "sft":
        return load_command_config("sft", data={
            "run_dir": str(tmp_path / "run"), "model": {"name": "char-64x1"}, "train": {"device": "cpu"},
            "task": {"name": "addition", "kwargs": {"digits": 2, "train_size": 8, "val_size": 8, "report_size": 8,
                                                    "sft_size": 4}},
            "logging": logging, "sft": {"data": "task", **sft}})
    return seed_sft_config(tmp_path, "env.max_turns=1", f"run_dir={tmp_path / 'run'}", logging=logging,
                           sft={"tasks": 4, "rollouts_per_task": 1, "eval_examples": 0, **sft})


def run(command: str, cfg: Any, tiny_policy: Any) -> dict[str, Any]:
    if command == "sft":
        return run_sft(cfg)
    model, tok = tiny_policy
    return run_skill_sft(cfg, policy=model, tokenizer=tok, engine=ScriptedEngine(tok))


@pytest.mark.parametrize("command", COMMANDS)
def test_both_commands_hand_their_settings_to_the_sinks_and_write_the_summary(command, tmp_path, tiny_policy,
                                                                              monkeypatch):
    sink = RecordingSink()
    monkeypatch.setattr("tether.track.build_tracker",  # what tether.start.run_tracker calls
                        lambda run_dir, **_: Tracker(run_dir, [JsonlSink(Path(run_dir) / "metrics.jsonl"), sink]))
    cfg = command_config(command, tmp_path)
    summary = run(command, cfg, tiny_policy)
    assert summary["steps"] == 2 and sink.steps == [1, 2]
    # seed-sft's W&B/MLflow/TensorBoard runs had none; beside them the code that ran it, when it started (peft,
    # imported by the policy's load after that, is listed by code_provenance now)
    (sent,) = sink.configs
    assert sent.pop("provenance").items() <= code_provenance().items() and sent == cfg.model_dump(mode="json")
    # the tracker's summary.json (a W&B run's summary) is the command's own sft_summary.json
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written == json.loads((tmp_path / "run" / "sft_summary.json").read_text())
    assert written["checkpoint"] == summary["checkpoint"]


@pytest.mark.parametrize("command", COMMANDS)
def test_both_commands_time_the_same_span_as_wall_s(command, tmp_path, tiny_policy, monkeypatch):
    """wall_s counts from the run directory's opening: the policy's load and the examples (or rollouts) included.
    sft's left the examples out, seed-sft's was total_s and left the load out. A clock of sft.py's that each of those
    steps moves by 1000 s tells which steps a wall_s spans."""
    import types

    import tether.recipes.seed_sft as seed_sft
    import tether.recipes.sft as sft
    from tether.recipes.sft import SFTSession

    moved = [0.0]
    monkeypatch.setattr(sft, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + moved[0]))

    def taking_1000_s(step):
        def run_step(*args, **kwargs):
            moved[0] += 1000.0
            return step(*args, **kwargs)
        return run_step

    monkeypatch.setattr(SFTSession, "load_policy", taking_1000_s(SFTSession.load_policy))
    module, name = (sft, "sft_examples") if command == "sft" else (seed_sft, "rollout_and_label")
    monkeypatch.setattr(module, name, taking_1000_s(getattr(module, name)))
    summary = run(command, command_config(command, tmp_path), tiny_policy)
    assert 2000 <= summary["wall_s"] < 2000 + 300 and "total_s" not in summary


@pytest.mark.parametrize("command", COMMANDS)
def test_both_commands_print_a_line_per_step(command, tmp_path, tiny_policy, capsys):
    run(command, command_config(command, tmp_path, progress=True), tiny_policy)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sft step ")]
    assert [line.split()[2] for line in lines] == ["1/2", "2/2"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [f"loss {row['sft/loss']:.4f}" in line for row, line in zip(rows, lines, strict=True)] == [True, True]


@pytest.mark.parametrize("command", COMMANDS)
def test_both_commands_refuse_data_of_which_no_example_fits(command, tmp_path, tiny_policy):
    cfg = command_config(command, tmp_path, {"max_length": 16})  # the least allowed: below every prompt's length
    with pytest.raises(ConfigError, match=r"^sft: no training example fits sft\.max_length=16$"):
        run(command, cfg, tiny_policy)  # seed-sft trained 0 steps and saved the untouched policy
    assert not (tmp_path / "run" / "checkpoint").exists()
