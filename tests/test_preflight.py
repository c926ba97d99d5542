"""What a config names must be on this machine: checked before any model loads, one line each, exit code 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.helpers import tiny_config
from tether.cli import app
from tether.config import ConfigError, load_config
from tether.preflight import check_inputs
from tether.trainer import Trainer


def jsonl_config(tmp_path: Path, lines: list[str] | None, **kwargs) -> object:
    path = tmp_path / "data.jsonl"
    if lines is not None:
        path.write_text("".join(line + "\n" for line in lines))
    return load_config(data={"run_dir": str(tmp_path / "run"),
                             "task": {"name": "jsonl", "kwargs": {"path": str(path), **kwargs}}})


GOOD = json.dumps({"prompt": "1+1?", "answer": "2"})


@pytest.mark.parametrize("lines, message", [
    (None, r"^task\.kwargs: path: data file '.*data\.jsonl' does not exist"),
    ([], r"data\.jsonl holds no rows"),
    ([GOOD, "{not json"], r"data\.jsonl line 2 is not JSON"),
    ([GOOD, "", "[1, 2]"], r"data\.jsonl line 3 is list, not an object"),
    ([GOOD, json.dumps({"prompt": "3+3?"})], r"data\.jsonl line 2 has no 'answer' field \(fields: prompt\)"),
])
def test_jsonl_data_is_checked_to_the_first_bad_line(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        check_inputs(jsonl_config(tmp_path, lines), model=False)


def test_jsonl_fields_can_be_renamed(tmp_path):
    check_inputs(jsonl_config(tmp_path, [json.dumps({"q": "1+1?", "a": "2"})], prompt_field="q", answer_field="a"),
                 model=False)


@pytest.mark.parametrize("name, message", [
    ("./no/such/checkpoint", r"^model\.name: './no/such/checkpoint' is not a directory here, nor a tether alias"),
    ("org/never-downloaded", r"^model\.name: 'org/never-downloaded' is not in the local Hugging Face cache and "
                             r"HF_HUB_OFFLINE is set"),
])
def test_a_model_that_is_not_here_is_one_line(tmp_path, monkeypatch, name, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match=message):
        check_inputs(tiny_config(tmp_path, f"model.name={name}"))
    check_inputs(tiny_config(tmp_path, f"model.name={tmp_path}"))  # a local directory
    for alias in ("smollm2-135m-instruct", "char-64x2", "tiny-64x2"):  # tether's aliases, never built here
        check_inputs(tiny_config(tmp_path, f"model.name={alias}"))


def test_a_reference_that_is_not_here_is_one_line_even_when_the_policy_is_given(tmp_path):
    with pytest.raises(ConfigError, match=r"^model\.ref_name: 'a/b/c' is not a directory here"):
        check_inputs(tiny_config(tmp_path, "model.ref_name=a/b/c"), model=False)


def test_a_tracker_that_is_not_installed_is_one_line(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"^logging\.wandb is set but the package 'wandb' is not installed"):
        check_inputs(tiny_config(tmp_path, "logging.wandb={}"))


def test_train_checks_inputs_before_the_run_directory_is_written(tmp_path):
    cfg = tiny_config(tmp_path, "model.name=./missing-checkpoint")
    with pytest.raises(ConfigError, match=r"^model\.name"):
        Trainer(cfg)
    assert not Path(cfg.run_dir).exists()


def test_validate_and_train_end_with_one_line_and_exit_code_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: jsonl, kwargs: {{path: {tmp_path}/x.jsonl}}}}\n")
    for command in ("validate", "train"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2, result.output
        assert result.output.strip().count("\n") == 0 and "x.jsonl' does not exist" in result.output
    assert not (tmp_path / "run").exists()
