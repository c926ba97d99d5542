"""Progress a person can see: a status line per phase before the first step, validation start and result, and one
plain line per step with its ETA when stderr is not a terminal, and a validation's own bar or sparse plain lines
(tether/track/progress.py)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from tests.trainer.helpers import tiny_config
from tether.config import ValConfig
from tether.recipes.sft import progress_log
from tether.track import progress as progress_module
from tether.track.progress import CountProgress, Progress, StepLines, format_eta
from tether.trainer import Trainer
from tether.trainer.loop import validation_scope


def test_eta_is_the_rate_of_this_sessions_steps_times_the_steps_left(monkeypatch):
    clock = iter([100.0, 112.0])  # created at 100 s; 4 steps (from step 2 to 6) done at 112 s: 3 s per step
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    lines = StepLines(50, start=2)
    assert lines.line(6, "reward 0.500") == "step 6/50  reward 0.500  3.0 s/step  eta 2:12"  # 44 steps x 3 s
    assert format_eta(3725) == "1:02:05" and format_eta(59.6) == "1:00"


def test_without_a_terminal_every_step_is_one_plain_line(capsys):
    with Progress(3, enabled=True, plain=True) as bar:
        for step in (1, 2, 3):
            bar.update(step, {"train/reward_mean": 0.25 * step, **({"val/avg@k": 0.5} if step == 2 else {})})
    err = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[:3] for line in err] == [["step 1/3", "reward 0.250", "val -"],
                                                      ["step 2/3", "reward 0.500", "val 0.500"],
                                                      ["step 3/3", "reward 0.750", "val 0.500"]]
    assert all(re.search(r"eta \d+:\d\d$", line) for line in err)


def test_a_run_says_each_phase_before_its_first_step(tmp_path, tiny_policy, capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    cfg = tiny_config(tmp_path, "train.steps=1", "val.every=1", "val.samples=1", "logging.progress=true")
    policy, tokenizer = tiny_policy
    Trainer(cfg, policy=policy, tokenizer=tokenizer).fit()
    err = capsys.readouterr().err
    phases = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[tether ")]
    assert phases[:2] == [f"starting {cfg.run_dir}", "starting the hf engine and the task"]
    assert phases[2].startswith("validating at step 0 on split 'val' (all prompts x 1 sample)")  # was "1 samples"
    assert re.fullmatch(r"validation at step 0: val/avg@k=\d\.\d{4} \(\d+ s\)", phases[3])
    assert phases[6].startswith("validating at step 1") and "step 1/1  reward" in err


@pytest.mark.parametrize("settings, scope", [
    ({"samples": 1}, "all prompts x 1 sample"),
    ({"samples": 4, "max_prompts": 1}, "1 prompt x 4 samples"),
    ({"samples": 4, "max_prompts": 8, "greedy": True}, "8 prompts x 1 sample"),
])
def test_a_validations_status_line_counts_its_prompts_and_samples_in_words(settings, scope):
    """It said "x 1 samples" (and "1 prompts"): tether eval's line and the run's."""
    assert validation_scope(ValConfig(**settings)) == scope


def test_each_checkpoint_save_is_said_before_and_after(tmp_path, tiny_policy, capsys, monkeypatch):
    """The save after a step (10-20 s for SmolLM2-135M on a CPU) and a new best printed nothing: the log stood still
    after the step's validation line."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    cfg = tiny_config(tmp_path, "train.steps=1", "val.every=1", "logging.progress=true")
    policy, tokenizer = tiny_policy
    Trainer(cfg, policy=policy, tokenizer=tokenizer).fit()
    phases = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines() if line.startswith("[tether ")]
    best = float((tmp_path / "run" / "best.txt").read_text().split("=")[1].split()[0])  # what the run picked
    checkpoints = tmp_path / "run" / "checkpoints"
    assert phases[4] == f"saving checkpoints/best (val/avg@k={best:.4f} at step 0)"
    assert re.fullmatch(re.escape(f"saved {checkpoints / 'best'} (") + r"\d+ s\)", phases[5])
    saves = [p for p in phases if p.startswith(("saving the", "saved"))]
    assert saves[-2] == "saving the checkpoint of step 1"
    assert re.fullmatch(re.escape(f"saved {checkpoints / 'step_000001'} (") + r"\d+ s\)", saves[-1])


def test_sft_prints_a_line_per_step_and_each_held_out_loss(capsys):
    logged = []
    log = progress_log(lambda metrics, step: logged.append((step, metrics)), total=2)
    log({"sft/loss": 0.75}, 1)
    log({"sft/val_loss": 0.5}, 1)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("sft step 1/2  loss 0.7500  ") and err[1].endswith("held-out loss after step 1: 0.5000")
    assert logged == [(1, {"sft/loss": 0.75}), (1, {"sft/val_loss": 0.5})]


def test_without_a_terminal_a_validation_prints_sparse_lines_with_rate_and_eta(monkeypatch, capsys):
    now = [100.0]  # made at 100 s; then each update at its own time
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    with CountProgress("validation", 256, "samples", plain=True, every_s=10.0) as bar:
        for now[0], done in ((110.0, 64), (112.0, 128), (121.0, 192), (130.0, 256)):  # 112 s: skipped (2 s after)
            bar.update(done, 256)
    assert capsys.readouterr().err.splitlines() == [
        "validation 64/256 samples  0.2 s/sample  eta 0:30",  # 10 s for 64: 192 x 0.156 s left
        "validation 192/256 samples  0.1 s/sample  eta 0:07",  # 21 s for 192: 64 x 0.109 s left
        "validation 256/256 samples  0.1 s/sample  eta 0:00"]


def test_a_count_reported_twice_is_one_line(capsys):
    """The agent loop reports its last count after the last chunk and again at the end: an agent validation's last
    line was printed twice."""
    with CountProgress("validation", 6, "episodes", plain=True) as bar:
        for done in (2, 6, 6):
            bar.update(done, 6)
    assert [line.split("  ")[0] for line in capsys.readouterr().err.splitlines()] == [
        "validation 2/6 episodes", "validation 6/6 episodes"]


def test_on_a_terminal_a_validation_has_a_bar_of_its_own_or_a_row_under_the_training_bar():
    screen = Console(file=io.StringIO(), force_terminal=True, width=120)
    with CountProgress("validation", 8, "samples", plain=False, console=screen) as first:  # before the first step
        first.update(8, 8)
    assert re.search(r"validation 8/8 .*samples", screen.file.getvalue())
    screen = Console(file=io.StringIO(), force_terminal=True, width=120)
    with Progress(3, plain=False, console=screen) as training:
        training.update(1, {"train/reward_mean": 0.5})
        with CountProgress("validation", 6, "episodes", plain=False) as val:  # joins the live training bar
            val.update(6, 6)
            training._bar.refresh()  # draw now, not at rich's next tick
            assert [task.description for task in training._bar.tasks] == ["step", "validation"]
        assert [task.description for task in training._bar.tasks] == ["step"]  # its row goes when it ends
    shown = screen.file.getvalue()
    assert re.search(r"validation 6/6 .*episodes", shown) and "step 1/3" in shown


def test_progress_off_prints_nothing(capsys):
    with CountProgress("validation", 4, "samples", enabled=False, plain=True, every_s=0.0) as bar:
        bar.update(4, 4)
    assert capsys.readouterr().err == ""


def test_a_single_turn_validation_reports_its_samples_as_they_finish(tmp_path, tiny_policy, capsys):
    cfg = tiny_config(tmp_path, "logging.progress=true")
    policy, tokenizer = tiny_policy
    Trainer(cfg, policy=policy, tokenizer=tokenizer).validate()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("validation ")]
    assert len(lines) == 1 and re.fullmatch(r"validation (\d+)/\1 samples  \d+\.\d s/sample  eta 0:00", lines[0])


def test_an_agent_validation_reports_its_episodes_as_they_finish(tmp_path, tokenizer, capsys):
    from tests.rollout.helpers import ScriptedEngine, agent_config
    from tether.rollout.multi_turn import AgentCollector

    collector = AgentCollector(agent_config(tmp_path, "logging.progress=true", "val.greedy=false", "val.samples=2"),
                               tokenizer)
    collector.validate(ScriptedEngine(tokenizer), seed=0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("validation ")]
    assert lines[0].startswith("validation ") and re.fullmatch(r"validation 6/6 episodes  .*eta 0:00", lines[-1])
