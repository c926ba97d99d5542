"""Resuming ``tether sft`` and ``tether seed-sft``: the run directory's state, and where a run starts in it.

``run_dir/sft_state/`` is what the SFT loop (:func:`tether.recipes.sft.train_sft`) needs to continue a run bit for
bit: ``model.pt`` (the policy's ``state_dict``), ``optimizer.pt`` (AdamW's), ``trainer_state.pt`` (the learning-rate
schedule and the global generators), and ``sft_state.json``: the step, the position in the batch order (epoch and
the index of the next batch's first example), the last losses, the caller's numbers (``extra``) and the run's
fingerprint. It is written every ``sft.save_every`` optimiser steps and when SIGTERM or SIGINT stops the loop,
atomically as ``tether train`` writes its checkpoints (:func:`tether.trainer.checkpoint.publish_dir`: a temporary
directory with a manifest of checksums, renamed into place), and removed once ``run_dir/checkpoint``, the finished
warm start, is written. It never lives in ``run_dir/checkpoint``: a partial warm start would pass for a finished one.

The fingerprint is what a resume must not change: every setting of :data:`FINGERPRINT_SECTIONS` except
``sft.save_every``, and the SHA-256 of each file the examples are read from (``run_dir/data``: a resume trains on the
examples the run wrote, never on rebuilt ones, which ``sft.data=rejection`` would sample afresh).

Where a run starts is ``train.resume`` and ``train.overwrite``, as for ``tether train`` (:func:`plan_sft_start`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from tether.config import SCHEMAS, move_saved_keys, read_yaml
from tether.distributed import DataParallel
from tether.provenance import PROVENANCE
from tether.start import RunDirError, claim_run_dir
from tether.track import TENSORBOARD_DIR, finite_or_none, write_json_atomic
from tether.trainer.checkpoint import (
    checkpoint_problem,
    publish_dir,
    restore_rng_state,
    rng_state,
    say_not_restored,
    settle_old,
)
from tether.trainer.rundir import SettingDefaults, changed_setting, config_defaults, flat, truncate_metrics

if TYPE_CHECKING:
    from tether.config import SeedSFTRunConfig, SFTRunConfig

STATE = "sft_state"
STATE_FILE = "sft_state.json"
SUMMARY = "sft_summary.json"
# The sections whose settings a resume must keep (a key covers its sub-keys); of them, RESUMABLE_KEYS may change.
FINGERPRINT_SECTIONS = ("seed", "model", "task", "env", "rollout", "methods", "sft")
RESUMABLE_KEYS = ("sft.save_every",)
WAY_OUT = "set another run_dir (or start afresh over this one: train.resume=never train.overwrite=true deletes it)"


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def data_files(run_dir: Path) -> dict[str, Path]:
    """Every file under ``run_dir/data`` (the examples, SEED's records and frames), by its path in ``run_dir``."""
    root = run_dir / "data"
    return {str(p.relative_to(run_dir)): p for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}


def fingerprint_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a config (as JSON) that a resume must keep, flat (``sft.lr``...)."""
    return {key: value for key, value in flat(config).items()
            if key.split(".")[0] in FINGERPRINT_SECTIONS and key not in RESUMABLE_KEYS}


def fingerprint(cfg: SFTRunConfig | SeedSFTRunConfig, files: dict[str, Path]) -> dict[str, Any]:
    """What a resume must match: the settings (:func:`fingerprint_settings`) and the SHA-256 of each of ``files``."""
    return {"settings": fingerprint_settings(cfg.model_dump(mode="json")),
            "files": {name: file_sha256(path) for name, path in files.items()}}


def settings_change(old: dict[str, Any], new: dict[str, Any], run: str, defaults: SettingDefaults) -> str | None:
    """The first setting that differs, as one line with the ways out, or None. A key one side lacks (a setting added
    since the old run was saved) stands for its default (``defaults``: :func:`tether.trainer.rundir.config_defaults`).
    """
    if (change := changed_setting(old, new, defaults)) is None:
        return None
    key, now, was = change
    return f"{key}: {now!r} differs from {was!r} in {run}; set it back, or {WAY_OUT}"


def fingerprint_change(saved: dict[str, Any], current: dict[str, Any], where: Path,
                       defaults: SettingDefaults) -> str | None:
    """The first difference between two fingerprints as one line with the ways out, or None."""
    if (change := settings_change(saved["settings"], current["settings"], f"the run being resumed ({where})",
                                  defaults)):
        return change
    old, new = saved["files"], current["files"]
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            what = "is gone" if name not in new else "is new" if name not in old else "changed"
            return (f"{name} {what} since {where} was saved: a resume trains on the examples the run started with; "
                    f"put it back, or {WAY_OUT}")
    return None


@dataclass
class Progress:
    """Where the SFT loop is: optimiser steps done, the next batch (epoch, index of its first example in the epoch's
    order), the last losses."""

    step: int = 0
    epoch: int = 0
    next: int = 0
    train_loss: float = float("nan")
    val_loss: float = float("nan")


@dataclass
class SFTState:
    """``run_dir/sft_state`` of one run (module docstring).

    Args:
        path: the directory.
        fingerprint: the run's (:func:`fingerprint`); a saved state with another one is not restored.
        defaults: what a setting the saved fingerprint lacks stands for (:func:`tether.trainer.rundir.config_defaults`:
            one added since the state was saved).
        extra: the caller's numbers kept across a resume (``tether seed-sft``'s rollout time and parse rate).
        verified: the saved state's files already matched their manifest (:func:`plan_sft_start` read them to choose
            the resume): :meth:`restore` does not read them twice.
    """

    path: Path
    fingerprint: dict[str, Any]
    defaults: SettingDefaults
    extra: dict[str, Any] = field(default_factory=dict)
    verified: bool = False

    def exists(self) -> bool:
        return self.path.is_dir()

    def saved(self) -> dict[str, Any]:
        """``sft_state.json``: progress, extra, fingerprint."""
        return json.loads((self.path / STATE_FILE).read_text())

    def save(self, model: Any, optimizer: torch.optim.Optimizer, schedule: Any, at: Progress) -> None:
        """Write the state at ``at`` (atomically: a crash mid-write leaves the previous one).

        Raises:
            CheckpointWriteError: the directory cannot be written (a full disk, no permission), one line.
        """
        def write(tmp: Path) -> None:
            torch.save(model.state_dict(), tmp / "model.pt")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save({"schedule": schedule.state_dict(), "rng": rng_state()}, tmp / "trainer_state.pt")
            state = {"progress": asdict(at), "extra": self.extra, "fingerprint": self.fingerprint}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))

        publish_dir(self.path, write, DataParallel())

    def restore(self, model: Any, optimizer: torch.optim.Optimizer, schedule: Any) -> Progress:
        """Load the saved state into ``model``, ``optimizer`` and ``schedule``, and the global generators.

        Raises:
            RunDirError: the state is damaged or belongs to another run (other settings or examples).
        """
        if not self.verified and (problem := checkpoint_problem(self.path)) is not None:
            raise RunDirError(f"{self.path} is damaged ({problem}); {WAY_OUT}")
        saved = self.saved()
        if (change := fingerprint_change(saved["fingerprint"], self.fingerprint, self.path, self.defaults)) is not None:
            raise RunDirError(change)
        model.load_state_dict(torch.load(self.path / "model.pt", map_location="cpu", weights_only=True))
        optimizer.load_state_dict(torch.load(self.path / "optimizer.pt", map_location="cpu", weights_only=True))
        rest = torch.load(self.path / "trainer_state.pt", map_location="cpu", weights_only=False)
        schedule.load_state_dict(rest["schedule"])
        say_not_restored(self.path, restore_rng_state(rest.get("rng", {})))
        self.extra = saved["extra"]
        return Progress(**saved["progress"])

    def remove(self) -> None:
        """Once ``run_dir/checkpoint`` holds the finished model: the disk keeps one copy of it."""
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class SFTStart:
    """Where an SFT command starts (:func:`plan_sft_start`): ``fresh`` (at step 0; ``overwrites`` an earlier run),
    ``resume`` (from ``saved``, the state's ``sft_state.json``, whose fingerprint matched ``fingerprint``, the run's)
    or ``finished`` (nothing to do: ``summary``)."""

    action: Literal["fresh", "resume", "finished"]
    overwrites: bool = False
    saved: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    fingerprint: dict[str, Any] | None = None

    @property
    def step(self) -> int:
        """The step a resume continues from; 0 for a fresh start."""
        return self.saved["progress"]["step"] if self.saved else 0


def state_files(cfg: SFTRunConfig | SeedSFTRunConfig) -> dict[str, Path]:
    """The files besides ``run_dir/data`` a run's examples are read from: SEED's ``sft.replay_data``."""
    replay = getattr(cfg.sft, "replay_data", None)
    return {"sft.replay_data": Path(replay)} if replay else {}


def state_dir(run_dir: Path) -> Path:
    """``run_dir/sft_state``, or the previous state a kill inside the swap left aside (``sft_state.old``), which
    :func:`open_sft_run` puts back: what a start would resume."""
    state, old = run_dir / STATE, run_dir / f"{STATE}.old"
    return old if not state.exists() and old.is_dir() else state


def finished(run_dir: Path) -> bool:
    """``run_dir`` holds a finished SFT run: its checkpoint and summary (written in that order)."""
    return (run_dir / "checkpoint").is_dir() and (run_dir / SUMMARY).is_file()


def earlier_run(run_dir: Path) -> str | None:
    """What in ``run_dir`` shows an earlier SFT run that cannot be resumed, or None."""
    if finished(run_dir):
        return f"a finished run (checkpoint, {SUMMARY})"
    state = state_dir(run_dir)
    if state.exists():
        problem = checkpoint_problem(state)
        return f"a damaged {STATE} ({problem})" if problem else f"a resumable {STATE}"
    if (run_dir / "checkpoint").exists():
        return "a checkpoint but no sft_summary.json"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return f"metrics.jsonl but no {STATE}"
    if (run_dir / "data").is_dir() and any((run_dir / "data").iterdir()):
        return f"data/ but no {STATE}"
    return None


def check_finished_settings(cfg: SFTRunConfig | SeedSFTRunConfig, run_dir: Path) -> None:
    """Refuse to call a finished run finished for a config whose settings differ from its ``config.yaml``.

    Raises:
        RunDirError: the first changed setting, its two values and the ways out.
    """
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    command = next(name for name, schema in SCHEMAS.items() if type(cfg) is schema)
    old = fingerprint_settings(move_saved_keys(read_yaml(saved.read_text()) or {}, command))
    if (change := settings_change(old, fingerprint_settings(cfg.model_dump(mode="json")),
                                  f"the finished run in {run_dir}", config_defaults(cfg))):
        raise RunDirError(change)


def plan_sft_start(cfg: SFTRunConfig | SeedSFTRunConfig, run_dir: Path) -> SFTStart:
    """Where the run in ``run_dir`` starts under ``train.resume`` and ``train.overwrite``, deciding only.

    ``auto`` resumes a valid ``sft_state``, calls a finished run finished when its ``config.yaml`` has the same
    settings (unless ``train.overwrite``: then it trains again from step 0), and starts at step 0 in an empty
    directory; ``never`` starts at step 0; ``must``
    resumes, or calls a finished run finished, or stops. A start at step 0 over anything of an earlier run needs
    ``train.overwrite``.

    Raises:
        RunDirError: the state, or a finished run, belongs to other settings (the first changed setting or file,
            its values and the ways out); ``must`` and nothing to resume; a start at step 0 over an earlier run without
            ``train.overwrite``.
    """
    policy, overwrite = cfg.train.resume, cfg.train.overwrite
    state = state_dir(run_dir)
    if policy != "never" and not finished(run_dir) and state.is_dir() and checkpoint_problem(state) is None:
        saved = json.loads((state / STATE_FILE).read_text())
        current = fingerprint(cfg, {**data_files(run_dir), **state_files(cfg)})
        if (change := fingerprint_change(saved["fingerprint"], current, state, config_defaults(cfg))) is not None:
            raise RunDirError(change)
        return SFTStart("resume", saved=saved, fingerprint=current)
    if finished(run_dir) and (policy == "must" or (policy == "auto" and not overwrite)):
        check_finished_settings(cfg, run_dir)
        return SFTStart("finished", summary=json.loads((run_dir / SUMMARY).read_text()))
    found = earlier_run(run_dir)
    if policy == "must":
        raise RunDirError(f"train.resume=must but run_dir {run_dir} has no {STATE} to resume"
                          + (f" (it holds {found})" if found else ""))
    if found is not None and not overwrite:
        why = "nothing to resume" if policy == "auto" else "train.resume=never starts at step 0"
        raise RunDirError(f"run_dir {run_dir} holds an earlier run with {found}: {why}; set another run_dir, or add "
                          "train.overwrite=true to delete that run's checkpoint, state, data and metrics")
    return SFTStart("fresh", overwrites=found is not None)


def delete_earlier_run(run_dir: Path) -> None:
    """``train.overwrite``: what an earlier SFT run wrote goes, so nothing of it passes for this run's."""
    for name in ("checkpoint", STATE, f"{STATE}.tmp", f"{STATE}.old", "data", TENSORBOARD_DIR):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in (SUMMARY, "summary.json", PROVENANCE):
        (run_dir / name).unlink(missing_ok=True)
    truncate_metrics(run_dir / "metrics.jsonl", -1)


def check_sft_run_dir(cfg: SFTRunConfig | SeedSFTRunConfig) -> str:
    """:func:`plan_sft_start` for ``tether validate``: the same checks, nothing touched.

    Returns:
        What a start would do: "would resume runs/x at step 50", "would start runs/x", "runs/x is finished".

    Raises:
        RunDirError: what would stop the start.
    """
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} is a file, not a directory; set another run_dir")
    start = plan_sft_start(cfg, run_dir) if run_dir.is_dir() else SFTStart("fresh")
    if start.action == "resume":
        return f"would resume {run_dir} at step {start.saved['progress']['step']}"
    if start.action == "finished":
        return f"{run_dir} is finished: nothing to do"
    return f"would start {run_dir}" + (" (deleting the earlier run in it: train.overwrite)" if start.overwrites
                                       else "")


def open_sft_run(cfg: SFTRunConfig | SeedSFTRunConfig) -> tuple[Path, SFTStart]:
    """Claim ``cfg.run_dir`` (:func:`~tether.start.claim_run_dir`), undo what a crash mid-save left, choose where the
    run starts (:func:`plan_sft_start`), tidy for it and say it. Before any model loads.

    A resume drops the metric rows after the saved step (they are logged again), a start over an earlier run
    deletes it (``train.overwrite``), and a finished run's leftover state (a crash before its removal) goes.
    """
    from tether.track.progress import status

    run_dir = claim_run_dir(cfg.run_dir)
    settle_old(run_dir / STATE, run_dir / f"{STATE}.old")  # a crash between the swap's two renames
    shutil.rmtree(run_dir / f"{STATE}.tmp", ignore_errors=True)  # a crash while writing: the old state stands
    start = plan_sft_start(cfg, run_dir)
    if start.action == "resume":
        truncate_metrics(run_dir / "metrics.jsonl", start.step)
        status(f"resuming {run_dir} at step {start.step}")
    elif start.action == "finished":
        shutil.rmtree(run_dir / STATE, ignore_errors=True)
        status(f"{run_dir} holds a finished sft run (checkpoint, {SUMMARY}): nothing to do (train.resume=never "
               "train.overwrite=true trains it again, deleting it)")
    else:
        if start.overwrites:
            delete_earlier_run(run_dir)
        status(f"starting {run_dir}" + (" (the earlier run in it is deleted: train.overwrite)"
                                        if start.overwrites else ""))
    return run_dir, start


def write_summary(run_dir: Path, summary: dict[str, Any], state: SFTState) -> dict[str, Any]:
    """The end of a run: ``sft_summary.json`` (after ``run_dir/checkpoint``: the two mark a finished run), then the
    state goes. Returns the summary as written, strict JSON like ``summary.json``: a loss that is not a finite number
    (``val_loss`` without held-out examples) is None."""
    write_json_atomic(run_dir / SUMMARY, summary)
    state.remove()
    return finite_or_none(summary)
