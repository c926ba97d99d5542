"""``tether show`` (text and HTML transcripts) and ``tether eval`` on an agent checkpoint."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.rollout.helpers import agent_config
from tether.cli import app
from tether.rollout.transcripts import format_episode, read_transcripts, show_transcripts


def test_transcripts_are_written_and_shown_as_text_and_html(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "train.steps=2"))
    trainer.train_step()
    trainer.train_step()
    run = tmp_path / "run"
    episodes = read_transcripts(run)
    # one episode per task group (its first clone, the 'win' one), 2 groups per step
    assert [(e["step"], e["group"]) for e in episodes] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    first = episodes[0]
    assert first["won"] and first["return"] == 1.0 and first["fault"] is None and "seed" in first
    assert first["turns"][0]["valid"] and first["turns"][0]["reward"] == 1.0

    text = show_transcripts(run, limit=2)
    # the newest two, of the second step: shown as the run counts its steps, from 1 (the log keeps the 0-based one)
    assert text.count("step 2  episode") == 2 and "WON" in text
    assert "task: Say the secret word." in text and "(valid, reward 1)" in text
    assert "response: <action>" in text and "observation: You have 3 guesses." in text

    message = show_transcripts(run, html=True, limit=4)
    page = (run / "transcripts.html").read_text()
    assert message == f"wrote {run / 'transcripts.html'}"
    assert page.startswith("<!doctype html>") and page.count("<table>") == 4
    assert "&lt;action&gt;" in page  # responses are escaped


def test_format_episode_marks_invalid_actions_and_faults():
    ep = {"step": 3, "episode": 7, "group": 2, "won": False, "return": -0.0, "fault": "scripted step('x') timed out",
          "task": "t", "turns": [{"observation": "o", "response": "r", "action": "", "valid": False, "reward": 0.0}]}
    text = format_episode(ep)
    assert "FAULT scripted step('x') timed out" in text and "action: '' (INVALID, reward 0)" in text


def test_cli_show(tmp_path, agent_trainer):
    agent_trainer(agent_config(tmp_path)).train_step()
    runner = CliRunner()
    out = runner.invoke(app, ["show", str(tmp_path / "run"), "--limit", "1"])
    assert out.exit_code == 0 and out.output.split("\n\n")[1].startswith("step 1  episode")  # after the code
    out = runner.invoke(app, ["show", str(tmp_path / "run"), "--html"])
    assert out.exit_code == 0 and (tmp_path / "run" / "transcripts.html").is_file()
    out = runner.invoke(app, ["show", str(tmp_path)])  # no transcripts there
    assert out.exit_code != 0


def test_cli_eval_reports_success_rate_of_a_checkpoint(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path))
    trainer.fit()  # one step, saved at the end
    ckpt = trainer.checkpoints.latest()
    assert ckpt is not None and ckpt.is_dir()
    runner = CliRunner()
    out = runner.invoke(app, ["eval", str(ckpt), "val.max_prompts=2", "val.greedy=true", "env.max_turns=2"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["env"] == "scripted" and result["val/episodes"] == 2.0
    assert 0.0 <= result["val/success_rate"] <= 1.0 and result["val/faults"] == 0.0
    # a different agent config, passed explicitly
    other = tmp_path / "other.yaml"
    other.write_text((tmp_path / "run" / "config.yaml").read_text().replace("turns: 3", "turns: 1"))
    out = runner.invoke(app, ["eval", str(ckpt), "--config", str(other), "val.max_prompts=1", "env.max_turns=1"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["val/episodes"] == 1.0
