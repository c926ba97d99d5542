"""Resume never restarts silently: damaged checkpoints are passed over, crashes mid-save are settled, an earlier run
that cannot be continued stops the start, changed settings are refused, and one process writes a run directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import lock_held_elsewhere, tiny_config
from tether.config import dump_config
from tether.distributed import DataParallel
from tether.start import LOCK, RunDirError
from tether.track import build_tracker
from tether.trainer.checkpoint import CheckpointManager
from tether.trainer.rundir import prepare_run_dir


def write_marker(text: str):
    def write(directory: Path) -> None:
        (directory / "trainer_state.pt").write_text(text)
        (directory / "model.safetensors").write_text(text * 100)

    return write


def manager(cfg) -> CheckpointManager:
    return CheckpointManager(Path(cfg.run_dir), cfg.train.keep_last, DataParallel())


def write_metrics(run_dir: Path, steps: list[int], torn: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = "".join(json.dumps({"step": s, "train/reward_mean": 0.5}) + "\n" for s in steps)
    (run_dir / "metrics.jsonl").write_text(rows + ('{"step": 9, "trai' if torn else ""))


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("damage", ["truncate", "zero", "delete_state"])
def test_resume_passes_over_a_damaged_newest_checkpoint_and_says_so(tmp_path, damage):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    ckpts.save(1, write_marker("one"))
    newest = ckpts.save(2, write_marker("two"))
    weights = newest / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:10])
    elif damage == "zero":
        weights.write_bytes(b"\0" * weights.stat().st_size)
    else:
        (newest / "trainer_state.pt").unlink()
    with pytest.warns(UserWarning, match=r"step_000002 is damaged \((model\.safetensors|trainer_state\.pt)"):
        assert prepare_run_dir(cfg, ckpts, DataParallel()) == ckpts.root / "step_000001"


def test_resume_takes_a_complete_checkpoint_newer_than_the_latest_pointer(tmp_path):
    """A kill between renaming step_2 into place and updating ``latest``: step_2 is complete and is used."""
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    ckpts.save(1, write_marker("one"))
    ckpts.save(2, write_marker("two"))
    (ckpts.root / "latest").write_text("step_000001")
    assert prepare_run_dir(cfg, ckpts, DataParallel()) == ckpts.root / "step_000002"


@pytest.mark.parametrize("new_best_in_place", [False, True])
def test_a_kill_inside_the_best_swap_is_settled_at_the_next_start(tmp_path, new_best_in_place):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    ckpts.save_best(write_marker("old best"))
    best = ckpts.root / "best"
    os.replace(best, ckpts.root / "best.old")  # killed after best -> best.old ...
    if new_best_in_place:
        ckpts.save_best(write_marker("new best"))  # ... or after the new one was renamed in, before the removal
    (ckpts.root / "step_000003.tmp").mkdir()
    (ckpts.root / ".latest.tmp.12345").write_text("step_000003")
    (Path(cfg.run_dir) / ".config.yaml.tmp.12345").write_text("half")
    prepare_run_dir(cfg, ckpts, DataParallel())
    want = "new best" if new_best_in_place else "old best"
    assert (best / "trainer_state.pt").read_text() == want
    assert sorted(p.name for p in ckpts.root.iterdir()) == ["best"]
    assert not list(Path(cfg.run_dir).glob(".*.tmp.*"))
    ckpts.save_best(write_marker("newer best"))  # and the next swap works
    assert (best / "trainer_state.pt").read_text() == "newer best"


@pytest.mark.parametrize("leftover", ["metrics", "damaged_checkpoint"])
def test_an_earlier_run_that_cannot_be_resumed_stops_the_start(tmp_path, leftover):
    cfg = tiny_config(tmp_path)
    run_dir, ckpts = Path(cfg.run_dir), manager(cfg)
    write_metrics(run_dir, [0, 1, 2])
    if leftover == "damaged_checkpoint":
        (ckpts.save(2, write_marker("two")) / "trainer_state.pt").write_text("zz")
    with pytest.raises(RunDirError, match=r"holds an earlier run .*: nothing to resume; set another run_dir, or add "
                                          r"train\.overwrite=true"), \
            pytest.warns(UserWarning) if leftover == "damaged_checkpoint" else contextlib.nullcontext():
        prepare_run_dir(cfg, ckpts, DataParallel())
    assert metric_steps(run_dir) == [0, 1, 2]  # nothing touched


def test_resume_false_starts_afresh_and_removes_the_earlier_run(tmp_path):
    cfg = tiny_config(tmp_path, "train.resume=false")
    run_dir, ckpts = Path(cfg.run_dir), manager(cfg)
    write_metrics(run_dir, [0, 1, 2])
    (run_dir / "samples.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    ckpts.save(2, write_marker("two"))
    ckpts.save_best(write_marker("best"))
    assert prepare_run_dir(cfg, ckpts, DataParallel()) is None
    assert (run_dir / "metrics.jsonl").read_text() == "" == (run_dir / "samples.jsonl").read_text()
    assert not ckpts.step_dirs() and not (ckpts.root / "best").exists() and not (ckpts.root / "latest").exists()


def test_overwrite_removes_the_earlier_runs_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tmp_path, "train.resume=never", "train.overwrite=true")
    run_dir, ckpts = Path(cfg.run_dir), manager(cfg)
    with build_tracker(run_dir) as earlier:  # steps 1-3, and a metric of a method the new run does not use
        for step in (1, 2, 3):
            earlier.log({"train/loss": 1.0, "method/x": 1.0}, step=step)
    assert prepare_run_dir(cfg, ckpts, DataParallel()) is None
    with build_tracker(run_dir) as tracker:
        tracker.log({"train/loss": 2.0}, step=1)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/loss"]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.0)]


def test_metric_rows_after_the_resumed_step_are_dropped_not_duplicated(tmp_path):
    cfg = tiny_config(tmp_path)
    run_dir, ckpts = Path(cfg.run_dir), manager(cfg)
    write_metrics(run_dir, [0, 1, 2, 3, 4, 5], torn=True)  # killed mid-line at step 6, after saving step 3
    for name in ("samples.jsonl", "transcripts.jsonl"):  # a row of step s was sampled in step s + 1
        (run_dir / name).write_text("".join(json.dumps({"step": s, "group": g}) + "\n" for s in range(6)
                                            for g in range(2)))
    ckpts.save(3, write_marker("three"))
    prepare_run_dir(cfg, ckpts, DataParallel())
    assert metric_steps(run_dir) == [0, 1, 2, 3]
    for name in ("samples.jsonl", "transcripts.jsonl"):  # steps 4 to 6 are replayed: `tether show` showed them twice
        assert [json.loads(line)["step"] for line in (run_dir / name).read_text().splitlines()] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("override", ["optim.lr=0.5", "seed=7", "rollout.group_size=2",
                                      "algorithm.loss_kwargs={clip_low: 0.1}"])
def test_resume_refuses_settings_that_change_the_run_and_keeps_its_config(tmp_path, override):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    prepare_run_dir(cfg, ckpts, DataParallel())
    ckpts.save(1, write_marker("one"))
    saved = (Path(cfg.run_dir) / "config.yaml").read_text()
    key = override.split("=")[0]
    with pytest.raises(RunDirError, match=rf"^{key.replace('.', r'.')}.*: .* differs from .* in the run being resumed"):
        prepare_run_dir(tiny_config(tmp_path, override), ckpts, DataParallel())
    assert (Path(cfg.run_dir) / "config.yaml").read_text() == saved  # never claims what was not used


@pytest.mark.parametrize(("damage", "problem"), [
    ("garbage: [\n", r"line 2: expected the node content, but found '<stream end>'"),
    ("", "holds NoneType, not the run's settings"),
    ("- a list\n", "holds list, not the run's settings"),
])
def test_a_config_yaml_edited_into_garbage_is_one_line_naming_it(tmp_path, damage, problem):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    prepare_run_dir(cfg, ckpts, DataParallel())
    ckpts.save(1, write_marker("one"))
    saved = Path(cfg.run_dir) / "config.yaml"
    saved.write_text(damage)  # a YAML error was a traceback (exit 1); an empty file read every setting as changed
    with pytest.raises(RunDirError) as err:
        prepare_run_dir(cfg, ckpts, DataParallel())
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{saved} cannot be read (")
    assert re.search(problem, message) and "differs" not in message
    assert saved.read_text() == damage  # nothing rewritten
    saved.unlink()  # the way out the message gives
    assert prepare_run_dir(cfg, ckpts, DataParallel()) == ckpts.root / "step_000001"


def test_resume_applies_and_records_more_steps(tmp_path):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    prepare_run_dir(cfg, ckpts, DataParallel())
    ckpts.save(1, write_marker("one"))
    assert prepare_run_dir(tiny_config(tmp_path, "train.steps=9"), ckpts, DataParallel()) is not None
    assert "steps: 9" in (Path(cfg.run_dir) / "config.yaml").read_text()


def test_one_process_per_run_directory_and_a_dead_holder_leaves_no_stale_lock(tmp_path):
    cfg = tiny_config(tmp_path)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True)
    with lock_held_elsewhere(run_dir) as pid, \
            pytest.raises(RunDirError, match=rf"is in use by process {pid} on .*; wait for it"):
        prepare_run_dir(cfg, manager(cfg), DataParallel())
    assert prepare_run_dir(cfg, manager(cfg), DataParallel()) is None  # the kernel released the dead one's lock


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path):
    cfg = tiny_config(tmp_path)
    Path(cfg.run_dir).write_text("not a directory")
    with pytest.raises(RunDirError, match=r"^run_dir .*run is a file, not a directory"):
        prepare_run_dir(cfg, manager(cfg), DataParallel())


def test_resume_never_refuses_an_earlier_run_without_overwrite_and_deletes_nothing(tmp_path):
    cfg = tiny_config(tmp_path, "train.resume=never")
    run_dir, ckpts = Path(cfg.run_dir), manager(cfg)
    write_metrics(run_dir, [0, 1, 2])
    ckpts.save(2, write_marker("two"))
    with pytest.raises(RunDirError, match=r"holds an earlier run with checkpoints up to step_000002: train\.resume="
                                          r"never starts at step 0; .* train\.overwrite=true"):
        prepare_run_dir(cfg, ckpts, DataParallel())
    assert metric_steps(run_dir) == [0, 1, 2] and [p.name for p in ckpts.step_dirs()] == ["step_000002"]
    fresh = tiny_config(tmp_path, "train.resume=never", "train.overwrite=true")
    assert prepare_run_dir(fresh, ckpts, DataParallel()) is None
    assert not ckpts.step_dirs() and (run_dir / "metrics.jsonl").read_text() == ""


def test_resume_must_stops_without_a_checkpoint_and_resumes_with_one(tmp_path):
    cfg = tiny_config(tmp_path, "train.resume=must")
    with pytest.raises(RunDirError, match=r"train\.resume=must but run_dir .* has no checkpoint to resume \(it does "
                                          r"not exist\)$"):
        prepare_run_dir(cfg, manager(cfg), DataParallel())
    assert not Path(cfg.run_dir).exists()  # a misspelt run_dir is not made (with its lock)
    with pytest.raises(RunDirError, match=r"train\.resume=must but run_dir .* has no checkpoint to resume$"):
        Path(cfg.run_dir).mkdir()
        prepare_run_dir(cfg, manager(cfg), DataParallel())
    ckpts = manager(cfg)
    ckpts.save(3, write_marker("three"))
    assert prepare_run_dir(cfg, ckpts, DataParallel()) == ckpts.root / "step_000003"


def test_the_start_says_whether_it_resumes(tmp_path, capsys):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    prepare_run_dir(cfg, ckpts, DataParallel())
    assert f"starting {cfg.run_dir}" in capsys.readouterr().err
    ckpts.save(50, write_marker("fifty"))
    prepare_run_dir(cfg, ckpts, DataParallel())
    assert f"resuming {cfg.run_dir} at step 50" in capsys.readouterr().err


def test_a_boolean_resume_keeps_its_meaning():
    assert tiny_config(Path("x"), "train.resume=true").train.resume == "auto"
    with pytest.warns(FutureWarning, match="train.resume=never train.overwrite=true"):
        old = tiny_config(Path("x"), "train.resume=false")
    assert (old.train.resume, old.train.overwrite) == ("never", True)


def test_validate_sees_what_the_start_would_refuse_without_touching_anything(tmp_path):
    from tether.trainer.rundir import check_run_dir

    cfg = tiny_config(tmp_path)
    assert check_run_dir(cfg) == f"would start {cfg.run_dir}" and not Path(cfg.run_dir).exists()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("a file")
    with pytest.raises(RunDirError, match=r"checkpoints is a file, not the run's checkpoint directory"):
        check_run_dir(cfg)
    (run_dir / "checkpoints").unlink()
    ckpts = manager(cfg)
    ckpts.save(4, write_marker("four"))
    assert check_run_dir(cfg) == f"would resume {cfg.run_dir} at step 4"
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    with pytest.raises(RunDirError, match="differs from"):
        check_run_dir(tiny_config(tmp_path, "seed=3"))
    assert [p.name for p in ckpts.step_dirs()] == ["step_000004"] and not (run_dir / LOCK).exists()


def test_a_garbage_latest_pointer_is_reported(tmp_path):
    cfg = tiny_config(tmp_path)
    ckpts = manager(cfg)
    ckpts.save(1, write_marker("one"))
    (ckpts.root / "latest").write_text("\x00\x07garbage")
    with pytest.warns(UserWarning, match=r"latest holds .*not a step directory's name; it is ignored"):
        assert prepare_run_dir(cfg, ckpts, DataParallel()) == ckpts.root / "step_000001"


def finished_run(tmp_path, steps_done: int = 2, *overrides: str):
    """A run directory whose run reached ``steps_done`` (marker checkpoints) and wrote its summary there."""
    cfg = tiny_config(tmp_path, *overrides)
    Path(cfg.run_dir).mkdir(parents=True)
    (Path(cfg.run_dir) / "config.yaml").write_text(dump_config(cfg))
    for step in range(1, steps_done + 1):
        manager(cfg).save(step, write_marker(str(step)))
    summary = {"steps": steps_done, "best": {"val/avg@k": 0.5}}
    (Path(cfg.run_dir) / "summary.json").write_text(json.dumps(summary))
    return cfg, summary


def test_train_over_a_finished_run_returns_its_summary_without_loading_a_model(tmp_path, monkeypatch, capsys):
    from tether import cli
    from tether.trainer import trainer
    from tether.trainer.rundir import check_run_dir, finished_summary

    cfg, summary = finished_run(tmp_path)
    assert finished_summary(cfg) == summary
    monkeypatch.setattr(trainer, "Trainer", lambda *a, **k: pytest.fail("a finished run built a trainer"))
    assert cli._train(cfg) == summary
    assert "is finished at step 2: nothing to do" in capsys.readouterr().err
    assert check_run_dir(cfg).endswith("is finished at step 2: train would do nothing")


@pytest.mark.parametrize("case", ["more_steps", "health_stop", "resume_never", "no_summary", "damaged_summary",
                                  "torchrun"])
def test_a_run_that_is_not_finished_goes_the_way_of_a_start(tmp_path, case, monkeypatch):
    from tether.trainer.rundir import finished_summary

    if case == "torchrun":  # the ranks' collective start decides, rank 0 alone warning and refusing
        monkeypatch.setenv("WORLD_SIZE", "2")
    cfg, _ = finished_run(tmp_path, 1 if case == "health_stop" else 2,
                          *{"more_steps": ["train.steps=3"], "resume_never": ["train.resume=never"]}.get(case, []))
    summary = Path(cfg.run_dir) / "summary.json"
    if case == "no_summary":
        summary.unlink()
    if case == "damaged_summary":
        summary.write_text('{"steps": 2, "be')
    assert finished_summary(cfg) is None


def test_a_finished_run_with_a_changed_setting_is_refused_as_a_resume_is(tmp_path):
    from tether.trainer.rundir import finished_summary

    cfg, _ = finished_run(tmp_path)
    changed = tiny_config(tmp_path, "optim.lr=0.5")
    with pytest.raises(RunDirError, match=r"optim\.lr: 0\.5 differs from 0\.001"):
        finished_summary(changed)
    assert finished_summary(cfg) is not None


def test_a_best_of_steps_the_resumed_run_replays_is_removed(tmp_path, tiny_policy, monkeypatch):
    """A validation wrote checkpoints/best at step 2, then the run died before step 2's checkpoint: the resumed run
    replays step 2 from step 1, and a replay that is not bit-exact (GPU sampling) need not reach that peak again;
    best.txt kept naming the lost weights, which the lab evaluates."""
    import copy
    import shutil
    import warnings

    from tether.rollout.single_turn import SingleTurnCollector
    from tether.trainer import Trainer

    model, tok = tiny_policy
    start = copy.deepcopy(model)
    cfg = tiny_config(tmp_path, "val.every=1", "train.steps=3", "train.save_every=1", "train.keep_last=5")
    values = {0: 0.1, 1: 0.2, 2: 0.5, 3: 0.05}  # val/avg@k by step
    at: dict[str, Trainer] = {}
    monkeypatch.setattr(SingleTurnCollector, "validate", lambda self, engine, seed: {"val/avg@k": values[at["t"].step]})
    at["t"] = Trainer(cfg, policy=model, tokenizer=tok)
    at["t"].fit()
    run = Path(cfg.run_dir)
    assert (run / "best.txt").read_text() == "val/avg@k=0.5 step=2\n"
    for step in (2, 3):  # the kill: after step 2's validation, before its checkpoint
        shutil.rmtree(run / "checkpoints" / f"step_00000{step}")
    (run / "checkpoints" / "latest").write_text("step_000001")
    (run / "summary.json").unlink()
    values.update({2: 0.15, 3: 0.12})  # the replay differs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        at["t"] = Trainer(cfg, policy=start, tokenizer=tok)
    assert any("checkpoints/best held step 2" in str(w.message) for w in caught)
    assert not (run / "checkpoints" / "best").exists() and not (run / "best.txt").exists()
    at["t"].fit()
    # the best of the resumed run's own steps (its value at step 1, 0.2, went with the removed peak's record)
    assert (run / "best.txt").read_text() == "val/avg@k=0.15 step=2\n"
    assert torch.load(run / "checkpoints" / "best" / "trainer_state.pt")["step"] == 2


def older_checkpoint(step_dir: Path, *fields: str) -> None:
    """``step_dir`` as a tether that did not write ``fields`` (dotted paths into ``trainer_state.pt``) left it, and
    without a manifest (the oldest checkpoints had none; ours would name the edit)."""
    state = torch.load(step_dir / "trainer_state.pt", weights_only=False)
    for field in fields:
        *parents, key = field.split(".")
        node = state
        for part in parents:
            node = node[part]
        del node[key]
    torch.save(state, step_dir / "trainer_state.pt")
    (step_dir / "manifest.json").unlink()


def test_a_checkpoint_of_an_older_tether_resumes_without_what_it_lacks_and_says_so_in_one_line(
        tmp_path, tiny_policy, monkeypatch):
    """A checkpoint written before a field existed made the resume a KeyError traceback ('rng' parts, the step, the
    validation history, the best value). The step comes from the directory's name and the best value from
    checkpoints/best; the global generators and the validation history are named in one warning line, and the run
    goes on to the uninterrupted run's weights (tether's sampling does not draw from the global generators)."""
    import copy
    import warnings

    from tether.rollout.single_turn import SingleTurnCollector
    from tether.trainer import Trainer

    model, tok = tiny_policy
    monkeypatch.setattr(SingleTurnCollector, "validate", lambda self, engine, seed: {"val/avg@k": 0.5})

    def run(name: str, steps: int, policy) -> Trainer:
        trainer = Trainer(tiny_config(tmp_path / name, f"train.steps={steps}", "val.every=1"), policy=policy,
                          tokenizer=tok)
        trainer.fit()
        return trainer

    straight = run("straight", 2, copy.deepcopy(model))
    run("run", 1, copy.deepcopy(model))
    older_checkpoint(tmp_path / "run" / "run" / "checkpoints" / "step_000001", "step", "best_value", "val_history",
                     "rng.python", "rng.numpy", "provenance")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Trainer(tiny_config(tmp_path / "run", "train.steps=2", "val.every=1"), policy=copy.deepcopy(model),
                          tokenizer=tok)
    lines = [str(w.message) for w in caught if "older tether" in str(w.message)]
    assert not [w for w in caught if "was written by" in str(w.message)]  # no version recorded: no version compared
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "the global python generator" in lines[0] and "the global numpy generator" in lines[0]
    assert "torch generator" not in lines[0] and "the validations before it" in lines[0]
    assert (resumed.step, resumed.best_value, resumed.val_history) == (1, 0.5, [])
    resumed.fit()
    got, want = resumed.policy.state_dict(), straight.policy.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("field,named", [("scheduler", "'scheduler'"), ("optimizer", "'optimizer'"),
                                         ("collector.stream", "'stream' in its 'collector'")])
def test_a_checkpoint_lacking_what_the_run_cannot_continue_without_is_one_line(tmp_path, tiny_policy, field, named):
    """Without the optimiser's state, the schedule or the data position the run cannot continue as it would have: the
    resume stops with one line naming the file, the field and the section holding it (a field of the collector's
    was named as if the file lacked it at the top), and no other tether version: this one wrote it."""
    import copy

    from tether.config import ConfigError
    from tether.trainer import Trainer

    model, tok = tiny_policy
    Trainer(tiny_config(tmp_path, "train.steps=1"), policy=copy.deepcopy(model), tokenizer=tok).fit()
    older_checkpoint(tmp_path / "run" / "checkpoints" / "step_000001", field)
    with pytest.raises(ConfigError, match=rf"^\S+step_000001/trainer_state\.pt lacks {named}, which this tether "
                                          r"needs to continue the run; set another run_dir \(or train\.resume=never "
                                          r"train\.overwrite=true: deletes this run\)$"):
        Trainer(tiny_config(tmp_path, "train.steps=2"), policy=copy.deepcopy(model), tokenizer=tok)


def test_each_start_and_each_checkpoint_records_the_code_that_ran_it(tmp_path, tiny_policy):
    """A run directory and its checkpoints named no code: provenance.json gets an entry per start (a resume adds one,
    from its step) and trainer_state.pt a provenance key, each what code_provenance says of this process."""
    import copy

    from tether.provenance import code_provenance
    from tether.trainer import Trainer

    model, tok = tiny_policy
    Trainer(tiny_config(tmp_path, "train.steps=1"), policy=copy.deepcopy(model), tokenizer=tok).fit()
    Trainer(tiny_config(tmp_path, "train.steps=2"), policy=copy.deepcopy(model), tokenizer=tok).fit()
    run = tmp_path / "run"
    entries = json.loads((run / "provenance.json").read_text())
    assert [e.pop("from_step") for e in entries] == [0, 1]
    assert [{k: v for k, v in e.items() if k != "at"} for e in entries] == [code_provenance()] * 2
    for step in ("step_000001", "step_000002"):
        assert torch.load(run / "checkpoints" / step / "trainer_state.pt", weights_only=False)["provenance"] == \
            code_provenance()


def written_by(step_dir: Path, tether: str | None) -> None:
    """``step_dir`` as tether ``tether`` wrote it (None: one from before checkpoints recorded their code), its
    manifest written again so the checkpoint verifies."""
    from tether.trainer.checkpoint import write_manifest

    state = torch.load(step_dir / "trainer_state.pt", weights_only=False)
    if tether is None:
        del state["provenance"]
    else:
        state["provenance"] = {**state["provenance"], "tether": tether, "commit": "01234567" * 5, "clean": True}
    torch.save(state, step_dir / "trainer_state.pt")
    write_manifest(step_dir)


def test_a_checkpoint_of_another_tether_version_is_said_once_and_resumes(tmp_path, tiny_policy):
    import copy
    import warnings

    from tether.provenance import tether_version
    from tether.trainer import Trainer

    model, tok = tiny_policy
    Trainer(tiny_config(tmp_path, "train.steps=1"), policy=copy.deepcopy(model), tokenizer=tok).fit()
    written_by(tmp_path / "run" / "checkpoints" / "step_000001", "0.0.1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Trainer(tiny_config(tmp_path, "train.steps=2"), policy=copy.deepcopy(model), tokenizer=tok)
    lines = [str(w.message) for w in caught if "was written by" in str(w.message)]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{tmp_path / 'run' / 'checkpoints' / 'step_000001'} was written by tether 0.0.1 "
                               f"(commit 01234567); this is tether {tether_version()}")
    assert lines[0].endswith(": the run continues with this version's code")
    assert resumed.step == 1


@pytest.mark.parametrize("tether,writer", [
    ("0.0.1", r"\(tether 0\.0\.1 \(commit 01234567\) wrote it; this is tether [^;]+\)"),
    (None, r"\(it records no tether version: a tether from before checkpoints recorded one wrote it\)")])
def test_a_missing_field_names_the_tether_that_wrote_the_checkpoint(tmp_path, tiny_policy, tether, writer):
    import copy
    import warnings

    from tether.config import ConfigError
    from tether.trainer import Trainer

    model, tok = tiny_policy
    Trainer(tiny_config(tmp_path, "train.steps=1"), policy=copy.deepcopy(model), tokenizer=tok).fit()
    step_dir = tmp_path / "run" / "checkpoints" / "step_000001"
    older_checkpoint(step_dir, "scheduler")
    written_by(step_dir, tether)
    with pytest.raises(ConfigError, match=rf"trainer_state\.pt lacks 'scheduler', which this tether needs to continue "
                                          rf"the run {writer}; set another run_dir"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(tiny_config(tmp_path, "train.steps=2"), policy=copy.deepcopy(model), tokenizer=tok)
