"""Progress a person can see: a status line per phase before the first step, validation start and result, and one
plain line per step with its ETA when stderr is not a terminal (tether/track/progress.py)."""

from __future__ import annotations

import re

from tests.trainer.helpers import tiny_config
from tether.sft import progress_log
from tether.track import progress as progress_module
from tether.track.progress import Progress, StepLines, format_eta
from tether.trainer import Trainer


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
    cfg = tiny_config(tmp_path, "train.steps=1", "val.every=1", "logging.progress=true")
    policy, tokenizer = tiny_policy
    Trainer(cfg, policy=policy, tokenizer=tokenizer).fit()
    err = capsys.readouterr().err
    phases = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[tether ")]
    assert phases[:2] == [f"starting {cfg.run_dir}", "starting the hf engine and the task"]
    assert phases[2].startswith("validating at step 0 on split 'val' (all prompts x 2 samples)")
    assert re.fullmatch(r"validation at step 0: val/avg@k=\d\.\d{4} \(\d+ s\)", phases[3])
    assert phases[4].startswith("validating at step 1") and "step 1/1  reward" in err


def test_sft_prints_a_line_per_step_and_each_held_out_loss(capsys):
    logged = []
    log = progress_log(lambda metrics, step: logged.append((step, metrics)), total=2)
    log({"sft/loss": 0.75}, 1)
    log({"sft/val_loss": 0.5}, 1)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("sft step 1/2  loss 0.7500  ") and err[1].endswith("held-out loss after step 1: 0.5000")
    assert logged == [(1, {"sft/loss": 0.75}), (1, {"sft/val_loss": 0.5})]


def test_a_long_validation_reports_its_samples_as_they_finish(tmp_path, capsys):
    from tether.rollout.single_turn import validation_progress

    report = validation_progress(tiny_config(tmp_path, "logging.progress=true"))
    report(64, 256)
    report(10, 10)  # one engine call: nothing to report
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert lines == ["validation: 64/256 samples"]
    assert validation_progress(tiny_config(tmp_path)) is None  # logging.progress=false
