"""``tether sft`` resumes (tether/recipes/sft_state.py): a run stopped by a signal, or crashed after a periodic save,
continues from ``run_dir/sft_state`` to the weights and metric rows of a run that never stopped; a changed setting or
example file, a damaged state, a finished run and an earlier run with nothing to resume are each settled before any
model loads."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tether.cli import app
from tether.config import dump_config, load_command_config
from tether.errors import TrainingStopped
from tether.models import load_policy
from tether.provenance import code_provenance, read_provenance
from tether.recipes.sft import run_sft
from tether.recipes.sft_state import check_sft_run_dir
from tether.start import RunDirError

STEPS = 6  # 48 training examples in batches of 16, 2 epochs; steps 3 and 6 end an epoch (then the held-out loss)


@pytest.fixture(autouse=True)
def char_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))


def sft_config(run_dir: Path, *overrides: str):
    data = {"run_dir": str(run_dir), "model": {"name": "char-64x1"},
            "task": {"name": "addition", "kwargs": {"digits": 2, "train_size": 8, "val_size": 8, "report_size": 8,
                                                    "sft_size": 64}},
            "logging": {"tensorboard": False, "progress": False}, "train": {"device": "cpu"},
            "sft": {"data": "task", "batch_size": 16, "micro_batch_size": 8, "lr": 3e-3, "epochs": 2,
                    "val_fraction": 0.25}}
    return load_command_config("sft", data=data, overrides=list(overrides))


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_policy(str(run_dir / "checkpoint"))[0].state_dict()


def assert_same_run(got: Path, want: Path) -> None:
    """Bit for bit: every weight of the checkpoint, every metric row, the summary's numbers."""
    a, b = weights(got), weights(want)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(got) == rows(want)
    sa, sb = (json.loads((d / "sft_summary.json").read_text()) for d in (got, want))
    for key in ("checkpoint", "wall_s"):
        sa.pop(key), sb.pop(key)
    assert json.dumps(sa) == json.dumps(sb)  # NaN-safe equality
    assert not (got / "sft_state").exists()  # removed once the checkpoint is written


@pytest.fixture
def reference(tmp_path) -> Path:
    """An uninterrupted run."""
    run_sft(sft_config(tmp_path / "reference"))
    return tmp_path / "reference"


def signal_at(monkeypatch, step: int, sig: int = signal.SIGINT) -> None:
    """Send ``sig`` to this process once the loss of optimiser step ``step`` is logged (a real signal)."""
    from tether.track.tracker import Tracker

    log = Tracker.log

    def log_then_signal(self, metrics, at):
        logged = log(self, metrics, at)
        if "sft/loss" in metrics and at == step:
            os.kill(os.getpid(), sig)
        return logged

    monkeypatch.setattr(Tracker, "log", log_then_signal)


def stopped_run(monkeypatch, run_dir: Path, step: int, *overrides: str) -> TrainingStopped:
    with monkeypatch.context() as patch:
        signal_at(patch, step)
        with pytest.raises(TrainingStopped) as stop:
            run_sft(sft_config(run_dir, *overrides))
    return stop.value


def no_model_loads(monkeypatch) -> None:
    def refuse(name: str) -> None:
        pytest.fail(f"{name} loaded")

    monkeypatch.setattr("tether.models.load_policy", refuse)


# step 1: inside epoch 0; 3: the last batch of epoch 0 (the stop waits for the held-out loss); 5: inside epoch 1;
# 6: the last step (the resume trains nothing and writes the checkpoint)
@pytest.mark.parametrize("step", [1, 3, 5, 6])
def test_a_run_stopped_by_a_signal_resumes_to_the_uninterrupted_run_bit_for_bit(tmp_path, monkeypatch, reference,
                                                                               step):
    run_dir = tmp_path / "run"
    stop = stopped_run(monkeypatch, run_dir, step)
    assert stop.exit_code == 130
    assert str(stop) == (f"sft stopped by SIGINT after step {step} of {STEPS}; its state is in {run_dir / 'sft_state'}"
                         ": run the same command again to resume")
    saved = json.loads((run_dir / "sft_state" / "sft_state.json").read_text())["progress"]
    next_batch = {1: (0, 16), 3: (1, 0), 5: (1, 32), 6: (2, 0)}[step]  # (epoch, the next batch's first example)
    assert saved["step"] == step and (saved["epoch"], saved["next"]) == next_batch
    assert not (run_dir / "checkpoint").exists() and not (run_dir / "sft_summary.json").exists()
    assert rows(run_dir) == [row for row in rows(reference) if row["step"] <= step]  # the held-out loss of step 3
    run_sft(sft_config(run_dir))
    assert_same_run(run_dir, reference)


def test_a_crash_after_a_periodic_save_resumes_from_it_and_logs_each_row_once(tmp_path, monkeypatch, reference):
    from tether.track.tracker import Tracker

    run_dir = tmp_path / "run"
    log = Tracker.log
    seen = []

    def log_then_crash(self, metrics, step):
        logged = log(self, metrics, step)
        if "sft/loss" in metrics:
            state = run_dir / "sft_state" / "sft_state.json"
            seen.append(json.loads(state.read_text())["progress"]["step"] if state.is_file() else None)
            if step == 5:
                raise RuntimeError("the machine went away")
        return logged

    with monkeypatch.context() as patch:
        patch.setattr(Tracker, "log", log_then_crash)
        with pytest.raises(RuntimeError, match="went away"):
            run_sft(sft_config(run_dir, "sft.save_every=2"))
    # saved after steps 2 and 4 (each before the next step's rows); step 5's rows were logged after the last save
    assert seen == [None, None, 2, 2, 4]
    assert [r["step"] for r in rows(run_dir)][-1] == 5
    run_sft(sft_config(run_dir, "sft.save_every=3"))  # the one setting a resume may change
    assert_same_run(run_dir, reference)


def test_a_resume_tells_the_metric_sinks_its_step_and_reads_each_file_it_checks_once(tmp_path, monkeypatch):
    import tether.recipes.sft_state as sft_state
    import tether.track

    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    seen, hashed, verified = [], [], []
    build, digest, problem = tether.track.build_tracker, sft_state.file_sha256, sft_state.checkpoint_problem
    monkeypatch.setattr(tether.track, "build_tracker", lambda *a, **k: seen.append(k["resumed_at"]) or build(*a, **k))
    monkeypatch.setattr(sft_state, "file_sha256", lambda path: hashed.append(path) or digest(path))
    monkeypatch.setattr(sft_state, "checkpoint_problem", lambda path: verified.append(path) or problem(path))
    files = sorted(sft_state.data_files(run_dir).values())
    run_sft(sft_config(run_dir))
    assert seen == [2]
    # choosing the start checks the example files and the state's checksums; the resumed state keeps what it found
    assert files and sorted(hashed) == files
    assert verified == [run_dir / "sft_state"]
    # each start names the code that ran it, as train's runs do: the first at step 0, the resume at its step
    entries = read_provenance(run_dir)
    assert [e["from_step"] for e in entries] == [0, 2]
    assert all(e == {**e, **code_provenance()} for e in entries)
    run_sft(sft_config(run_dir, "train.resume=never", "train.overwrite=true"))  # the earlier run goes, with its code
    assert [e["from_step"] for e in read_provenance(run_dir)] == [0]


def test_a_changed_setting_or_example_file_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    no_model_loads(monkeypatch)
    with pytest.raises(RunDirError, match=r"^sft\.lr: 0\.002 differs from 0\.003 in the run being resumed \(.*sft_state"
                                          r"\); set it back, or set another run_dir \(or start afresh over this one: "
                                          r"train\.resume=never train\.overwrite=true deletes it\)$"):
        run_sft(sft_config(run_dir, "sft.lr=0.002"))
    with pytest.raises(RunDirError, match=r"^model\.name: 'char-128x1' differs from 'char-64x1'"):
        run_sft(sft_config(run_dir, "model.name=char-128x1"))
    train = run_dir / "data" / "train.jsonl"
    train.write_text(train.read_text().replace("#", "# ", 1))
    with pytest.raises(RunDirError, match=r"^data/train\.jsonl changed since .*sft_state was saved: a resume trains "
                                          "on the examples the run started with"):
        run_sft(sft_config(run_dir))
    assert not (run_dir / "checkpoint").exists()


def test_validate_says_what_an_sft_start_would_do_without_touching_anything(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    config = tmp_path / "sft.yaml"

    def validate(*overrides: str):
        config.write_text(dump_config(sft_config(run_dir, *overrides)))
        return CliRunner().invoke(app, ["validate", str(config)])

    result = validate()
    assert result.exit_code == 0 and result.output.strip().endswith(f"; would start {run_dir}"), result.output
    assert not run_dir.exists()
    stopped_run(monkeypatch, run_dir, 2)
    listing = sorted(p.name for p in run_dir.rglob("*"))
    assert validate().output.strip().endswith(f"; would resume {run_dir} at step 2")
    result = validate("sft.lr=0.002")
    assert result.exit_code == 2 and result.output.startswith("sft.lr: 0.002 differs from 0.003"), result.output
    assert validate("train.resume=never", "train.overwrite=true").output.strip().endswith(
        f"; would start {run_dir} (deleting the earlier run in it: train.overwrite)")
    assert sorted(p.name for p in run_dir.rglob("*")) == listing
    run_sft(sft_config(run_dir))
    assert validate().output.strip().endswith(f"; {run_dir} is finished: nothing to do")


def test_a_crash_while_saving_leaves_the_previous_state_which_resumes(tmp_path, monkeypatch, reference):
    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    state = run_dir / "sft_state"
    # a kill inside the swap: the old state renamed aside, the new one (torn) not yet in place
    os.replace(state, run_dir / "sft_state.old")
    (run_dir / "sft_state.tmp").mkdir()
    (run_dir / "sft_state.tmp" / "model.pt").write_bytes(b"torn")
    assert check_sft_run_dir(sft_config(run_dir)) == f"would resume {run_dir} at step 2"  # validate, read-only
    assert (run_dir / "sft_state.old").is_dir()
    run_sft(sft_config(run_dir))
    assert_same_run(run_dir, reference)
    assert not (run_dir / "sft_state.old").exists() and not (run_dir / "sft_state.tmp").exists()


def test_a_damaged_state_is_refused_clearly_and_overwrite_starts_afresh(tmp_path, monkeypatch, reference):
    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    model = run_dir / "sft_state" / "model.pt"
    size = model.stat().st_size
    with model.open("r+b") as f:
        f.truncate(size // 2)
    with monkeypatch.context() as patch:
        no_model_loads(patch)
        with pytest.raises(RunDirError, match=rf"holds an earlier run with a damaged sft_state \(model\.pt has "
                                              rf"{size // 2} bytes, {size} were written\): nothing to resume; .*"
                                              r"add train\.overwrite=true"):
            run_sft(sft_config(run_dir))
        with pytest.raises(RunDirError, match=r"train\.resume=must but run_dir .* has no sft_state to resume \(it "
                                              r"holds a damaged sft_state"):
            run_sft(sft_config(run_dir, "train.resume=must"))
    run_sft(sft_config(run_dir, "train.overwrite=true"))
    assert_same_run(run_dir, reference)


def test_a_finished_run_is_left_as_it_is_unless_overwrite(tmp_path, monkeypatch, reference):
    checkpoint = reference / "checkpoint" / "model.safetensors"
    before = (checkpoint.stat().st_mtime_ns, (reference / "metrics.jsonl").read_text())
    summary = json.loads((reference / "sft_summary.json").read_text())
    with monkeypatch.context() as patch:
        no_model_loads(patch)
        assert run_sft(sft_config(reference)) == summary  # nothing trained: the summary of the run
        assert run_sft(sft_config(reference, "train.resume=must")) == summary
        assert (checkpoint.stat().st_mtime_ns, (reference / "metrics.jsonl").read_text()) == before
        with pytest.raises(RunDirError, match=r"^sft\.epochs: 3 differs from 2 in the finished run in "):
            run_sft(sft_config(reference, "sft.epochs=3"))
        with pytest.raises(RunDirError, match=r"holds an earlier run with a finished run \(checkpoint, "
                                              r"sft_summary\.json\): train\.resume=never starts at step 0"):
            run_sft(sft_config(reference, "train.resume=never"))
    again = tmp_path / "again"
    shutil.copytree(reference, again)
    (again / "sft_state").mkdir()  # left by a kill between sft_summary.json and the state's removal
    with monkeypatch.context() as patch:
        no_model_loads(patch)
        assert run_sft(sft_config(again)) == summary and not (again / "sft_state").exists()
    run_sft(sft_config(again, "train.overwrite=true"))  # trained again from step 0, its rows replacing the old
    assert_same_run(again, reference)
    assert checkpoint.stat().st_mtime_ns == before[0]


def test_an_older_tethers_state_and_finished_run_lack_a_later_setting_which_reads_as_its_default(tmp_path,
                                                                                                 monkeypatch,
                                                                                                 reference):
    """``sft_state.json``'s fingerprint and a finished run's ``config.yaml`` written before a setting existed lack
    its key: it read as None, so every resume after an upgrade was refused ("sft.grad_clip: 1.0 differs from None");
    it now stands for the default, and another value is still refused."""
    import yaml

    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    state = run_dir / "sft_state" / "sft_state.json"
    saved = json.loads(state.read_text())
    del saved["fingerprint"]["settings"]["sft.grad_clip"], saved["fingerprint"]["settings"]["rollout.top_k"]
    state.write_text(json.dumps(saved, indent=1))
    (run_dir / "sft_state" / "manifest.json").unlink()  # an older state: the manifest would name the edit
    with monkeypatch.context() as patch:
        no_model_loads(patch)
        with pytest.raises(RunDirError, match=r"^sft\.grad_clip: 0\.5 differs from 1\.0 in the run being resumed"):
            run_sft(sft_config(run_dir, "sft.grad_clip=0.5"))
    run_sft(sft_config(run_dir))
    assert_same_run(run_dir, reference)

    config = reference / "config.yaml"
    old = yaml.safe_load(config.read_text())
    del old["sft"]["grad_clip"], old["rollout"]
    config.write_text(yaml.safe_dump(old))
    summary = json.loads((reference / "sft_summary.json").read_text())
    with monkeypatch.context() as patch:
        no_model_loads(patch)
        assert run_sft(sft_config(reference)) == summary
        with pytest.raises(RunDirError, match=r"^sft\.grad_clip: 0\.5 differs from 1\.0 in the finished run in "):
            run_sft(sft_config(reference, "sft.grad_clip=0.5"))


def test_an_older_tethers_state_without_a_global_generator_resumes_and_says_so_in_one_line(tmp_path, monkeypatch,
                                                                                           reference):
    """``trainer_state.pt`` of an ``sft_state`` without NumPy's generator (a KeyError traceback): the resume goes on,
    one warning line names it, and the run ends as the uninterrupted one (the SFT loop does not draw from it)."""
    import warnings

    run_dir = tmp_path / "run"
    stopped_run(monkeypatch, run_dir, 2)
    path = run_dir / "sft_state" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    del state["rng"]["numpy"]
    torch.save(state, path)
    (run_dir / "sft_state" / "manifest.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_sft(sft_config(run_dir))
    lines = [str(w.message) for w in caught if "older tether" in str(w.message)]
    assert len(lines) == 1 and "the global numpy generator" in lines[0] and "python" not in lines[0], lines
    assert_same_run(run_dir, reference)


def test_a_finished_seed_sft_run_whose_config_yaml_has_stage_ones_settings_under_methods_seed_sft_is_finished(
        tmp_path):
    """``tether seed-sft``'s settings were ``methods.seed.sft`` before they became the top-level ``sft`` section
    (MOVED_KEYS): a finished run's ``config.yaml`` of that time is read with them at their new place; it read as
    "sft.epochs: 2 differs from None"."""
    import yaml

    from tests.rollout.helpers import seed_sft_config
    from tether.recipes.sft_state import check_finished_settings

    cfg = seed_sft_config(tmp_path, sft={"tasks": 2, "epochs": 2})
    old = yaml.safe_load(dump_config(cfg))
    old.setdefault("methods", {}).setdefault("seed", {})["sft"] = old.pop("sft")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    check_finished_settings(cfg, tmp_path)
    changed = seed_sft_config(tmp_path, sft={"tasks": 2, "epochs": 3})
    with pytest.raises(RunDirError, match=r"^sft\.epochs: 3 differs from 2 in the finished run in "):
        check_finished_settings(changed, tmp_path)


def test_an_earlier_run_with_nothing_to_resume_needs_overwrite(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "sft/loss": 2.0}\n')
    no_model_loads(monkeypatch)
    with pytest.raises(RunDirError, match=r"holds an earlier run with metrics\.jsonl but no sft_state: nothing to "
                                          "resume; set another run_dir, or add train.overwrite=true"):
        run_sft(sft_config(run_dir))
    with pytest.raises(RunDirError, match=r"^train\.resume=must but run_dir .* has no sft_state to resume \(it "
                                          r"holds metrics\.jsonl but no sft_state\)$"):
        run_sft(sft_config(run_dir, "train.resume=must"))
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1, "sft/loss": 2.0}\n'  # nothing was deleted


def test_seed_sft_resumes_without_rolling_out_again_to_the_uninterrupted_run(tmp_path, monkeypatch, tiny_policy):
    """``tether seed-sft`` trains through the same loop: stopped in its SFT, it resumes on the records it wrote (no
    rollout, no labels), keeping the parse rate it measured before SFT."""
    import copy

    from tests.rollout.helpers import seed_sft_config
    from tether.recipes.seed_sft import run_skill_sft

    model, tok = tiny_policy

    def stage_one(run_dir: Path, engine: object = None) -> dict:
        cfg = seed_sft_config(tmp_path, "env.name=frozenlake", "env.kwargs={size: 3}", "env.max_turns=2",
                              "rollout.max_new_tokens=6", f"run_dir={run_dir}",
                              methods={"seed": {"analysis_max_new_tokens": 8, "analysis_context_length": 512}},
                              sft={"tasks": 2, "rollouts_per_task": 2, "epochs": 2, "batch_size": 2,
                                   "micro_batch_size": 2, "lr": 1e-3, "eval_examples": 1, "val_fraction": 0.25})
        return run_skill_sft(cfg, policy=copy.deepcopy(model), tokenizer=tok, engine=engine)

    want = stage_one(tmp_path / "reference")
    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        signal_at(patch, 3)
        with pytest.raises(TrainingStopped, match=r"after step 3 of 4; its state is in .*sft_state"):
            stage_one(run_dir)
    extra = json.loads((run_dir / "sft_state" / "sft_state.json").read_text())["extra"]
    got = stage_one(run_dir, engine=object())  # an engine that cannot generate: a rollout would fail
    a, b = (load_policy(s["checkpoint"])[0].state_dict() for s in (got, want))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert rows(run_dir) == rows(tmp_path / "reference")
    assert got["rollout_s"] == extra["rollout_s"] and got["parse_rate_before"] == extra["parse_rate_before"]
    for key in ("checkpoint", "wall_s", "rollout_s"):  # times of this machine
        got.pop(key), want.pop(key)
    assert json.dumps(got) == json.dumps(want) and not (run_dir / "sft_state").exists()


def test_overwrite_removes_the_earlier_sft_runs_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tether.recipes.sft_state import delete_earlier_run
    from tether.track import build_tracker

    run_dir = tmp_path / "run"
    with build_tracker(run_dir) as earlier:
        for step in (1, 2, 3):
            earlier.log({"sft/train_loss": 1.0}, step=step)
    delete_earlier_run(run_dir)  # train.overwrite over it
    with build_tracker(run_dir) as tracker:
        tracker.log({"sft/train_loss": 2.0}, step=1)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("sft/train_loss")] == [(1, 2.0)]
