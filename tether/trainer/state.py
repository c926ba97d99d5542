"""A run's state on disk: what a checkpoint holds, and resuming from one exactly where it left off."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.config import ConfigError
from tether.models.lora import is_adapter_dir, is_lora
from tether.provenance import code_provenance, describe
from tether.trainer.checkpoint import dir_step, load_state, restore_rng_state, rng_state, say_not_restored

ANOTHER_RUN_DIR = "set another run_dir (or train.resume=never train.overwrite=true: deletes this run)"
RESUME_WAYS_OUT = ("resume with the settings of the run that wrote it (its config.yaml records them), or "
                   + ANOTHER_RUN_DIR)


def check_weights_fit(path: Path, *, lora: bool) -> None:
    """The checkpoint holds the kind of weights the run trains: a LoRA run's adapters alone, another run's full
    weights. The run's ``config.yaml`` refuses a changed ``model.lora`` before any model loads; once that file is
    deleted (which resumes without comparing settings), loading the other kind was a traceback from PEFT or
    Hugging Face (a Hub download of a folder that is not a model).

    Raises:
        ConfigError: the kinds differ; it says which the checkpoint holds.
    """
    adapters = is_adapter_dir(path)
    if adapters == lora or not (adapters or (path / "config.json").is_file()):  # fsdp2's step checkpoints hold
        return  # shards alone (torch.distributed.checkpoint checks their keys)
    holds = ("LoRA adapters alone (a run with model.lora wrote it)" if adapters else
             "full weights (a run without model.lora wrote it)")
    raise ConfigError(f"{path} holds {holds}, and this run {'sets' if lora else 'sets no'} model.lora; "
                      f"{RESUME_WAYS_OUT}")


class MissingState(KeyError):
    """A key ``trainer_state.pt`` lacks (``within``: the section of it that lacks ``key``, None at the top;
    ``written_by``: the provenance the file records, None for one written before checkpoints recorded it)."""

    def __init__(self, path: Path, key: Any, within: str | None = None,
                 written_by: dict[str, Any] | None = None) -> None:
        super().__init__(key)
        self.path, self.key, self.within, self.written_by = path, key, within, written_by

    def __str__(self) -> str:
        where = f" in its {self.within!r}" if self.within is not None else ""
        return (f"{self.path} lacks {self.key!r}{where}, which this tether needs to continue the run"
                f"{self._writer()}; {ANOTHER_RUN_DIR}")

    def _writer(self) -> str:
        """Who wrote the file, where that may be why it lacks the key: another tether version, or one from before
        checkpoints recorded their version. Nothing where this version wrote it."""
        if self.written_by is None:
            return " (it records no tether version: a tether from before checkpoints recorded one wrote it)"
        now = this_tether_if_other(self.written_by)
        return f" ({describe(self.written_by)} wrote it; this is {now})" if now else ""


class StateFile(dict):
    """``trainer_state.pt``'s dict: reading a key it lacks raises :class:`MissingState`, naming the key, the file
    and the tether that wrote it. A KeyError raised by what reads a value (torch's ``load_state_dict``) is named
    with its section when the value is read through :meth:`load` (the scheduler's, the collector's), and stays as it
    is otherwise (the strategy's loads of the optimiser and the reference: their dicts are torch's own, checksummed
    with the checkpoint)."""

    def __init__(self, state: dict[str, Any], path: Path) -> None:
        super().__init__(state)
        self.path = path

    def __missing__(self, key: Any) -> Any:
        raise MissingState(self.path, key, written_by=self.get("provenance"))

    def load(self, section: str, load: Callable[[Any], Any]) -> None:
        """``load(self[section])``, a key the section lacks named with it (the section's own ``load_state_dict``
        reads its keys)."""
        value = self[section]
        try:
            load(value)
        except KeyError as err:
            raise MissingState(self.path, err.args[0], within=section, written_by=self.get("provenance")) from None


def this_tether_if_other(written_by: dict[str, Any]) -> str | None:
    """This tether, described (:func:`~tether.provenance.describe`), when ``written_by`` (a checkpoint's
    provenance) names another tether version; None when it names this one."""
    now = code_provenance()
    return None if written_by.get("tether") == now["tether"] else describe(now)


def say_other_version(path: Path, written_by: dict[str, Any] | None) -> None:
    """One warning line when the checkpoint at ``path`` records a tether version other than this one: what differs
    in how the run continues is that version's change (none for a checkpoint that records none: older ones say so
    through what they lack, :func:`~tether.trainer.checkpoint.say_not_restored`)."""
    now = this_tether_if_other(written_by) if written_by is not None else None
    if now is not None:
        warnings.warn(f"{path} was written by {describe(written_by)}; this is {now}: the run continues with this "
                      "version's code", stacklevel=3)


class RunState:
    """Save and resume: weights and optimiser through the distributed strategy, the rest in ``trainer_state.pt``."""

    # what a checkpoint holds besides the weights, built by tether.trainer.build.TrainerBuild
    step: int
    best_value: float
    val_history: list[tuple[int, dict[str, float]]]
    skipped_updates: int

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state; weights and optimiser state go through the distributed strategy."""
        return {
            "step": self.step, "best_value": self.best_value, "val_history": self.val_history, "rng": rng_state(),
            "scheduler": self.scheduler.state_dict(), "collector": self.collector.state_dict(),
            "methods": self.methods.state_dict(), "strategy": self.strategy.name,
            "health": self.health.state_dict(),
            "skipped_updates": self.skipped_updates, "provenance": code_provenance(),
        }

    def save(self) -> Path:
        """Every rank writes its part of ``step_<step>/`` (rank 0 alone for a replicated model)."""

        def write(directory: Path) -> None:
            ref = self.ref_policy if self.ref_modified else None
            extra = self.strategy.save_training_state(directory, self.policy, self.optimizer, ref)
            if self.dp.is_main:
                self.tokenizer.save_pretrained(directory)
                torch.save({**self.state_dict(), **extra}, directory / "trainer_state.pt")

        return self.checkpoints.save(self.step, write)

    def resume(self, path: Path) -> None:
        """Continue exactly where the checkpoint left off: weights, optimiser, schedule, data, RNG.

        A checkpoint of an older tether may lack a field added since: one that can be derived is (the step from the
        directory's name, the best value from ``checkpoints/best``); the run goes on without the global generators,
        the validation history or a method's state, each at its default, said in one warning line
        (:func:`~tether.trainer.checkpoint.say_not_restored`); without the optimiser, the schedule or the data
        position it cannot continue, and the resume stops with one line. A checkpoint another tether version wrote
        (its ``provenance``) is said in one warning line (:func:`say_other_version`).

        Raises:
            ConfigError: another distributed strategy wrote it, or it lacks what the run cannot continue without.
        """
        state = StateFile(load_state(path), path / "trainer_state.pt")
        written_by = state.get("strategy", "replicate")  # checkpoints before sharding existed were replicated
        if written_by != self.strategy.name:
            raise ConfigError(f"{path} was written with distributed.strategy={written_by}; resume with that "
                              "strategy, or another run_dir (or train.resume=never train.overwrite=true: deletes this "
                              "run)")
        say_other_version(path, state.get("provenance"))
        check_weights_fit(path, lora=is_lora(self.policy))
        # A field this tether reads that the checkpoint lacks: the message names the key, the file, and the tether
        # version that wrote it where it is another (or records none).
        try:
            moved = self.strategy.load_training_state(path, state, self.policy, self.optimizer, self.ref_policy)
            state.load("scheduler", self.scheduler.load_state_dict)
            state.load("collector", self.collector.load_state_dict)
        except MissingState as err:
            raise ConfigError(str(err)) from None
        except ValueError as err:  # adapters of another rank or targets (load_adapter says so, naming the folder)
            raise ConfigError(f"{err}; {RESUME_WAYS_OUT}") from None
        if self.reference is not None:
            self.reference.moved = moved
        methods_lost = self.methods.load_state_dict(state.get("methods", {}))
        self.health.load_state_dict(state.get("health", {}))  # checkpoints from before the checks have none
        self.step = state.get("step", dir_step(path))
        self.best_value = state["best_value"] if "best_value" in state else self._saved_best()
        self.val_history = state.get("val_history", [])
        self.skipped_updates = state.get("skipped_updates", 0)  # absent from checkpoints before it was counted
        lost = restore_rng_state(state.get("rng", {}))
        if "val_history" not in state:
            lost.append("the validations before it (summary.json's first_val is the first after this resume)")
        if methods_lost:
            lost.append(f"{', '.join(methods_lost)} (each at the method's value for a checkpoint without it)")
        say_not_restored(path, lost)
        self.drop_best_of_lost_steps()
        self.push_weights()

    def _saved_best(self) -> float:
        """The value ``checkpoints/best`` was saved with, or -inf without one: the best value of a checkpoint that
        lacks it."""
        best = self.checkpoints.root / "best"
        if not (best / "trainer_state.pt").is_file():
            return float("-inf")
        return float(load_state(best).get("metric", float("-inf")))

    def drop_best_of_lost_steps(self) -> None:
        """``checkpoints/best`` written after the checkpoint resumed from (a validation saved it, then the run died
        before its step checkpoint) holds weights of steps the resumed run replays: the replay reaches them again only
        where it is bit-exact, and ``best.txt`` would keep naming them (the lab evaluates it). They are removed and
        the best value restarts, so the next validation writes a best of this run's own steps."""
        best = self.checkpoints.root / "best"
        if not (best / "trainer_state.pt").is_file():
            return
        lost = load_state(best).get("step", -1)
        if lost <= self.step:
            return
        if self.dp.is_main:
            shutil.rmtree(best)
            (self.run_dir / "best.txt").unlink(missing_ok=True)
        self.dp.barrier()
        self.best_value = float("-inf")
        warnings.warn(f"checkpoints/best held step {lost}, validated before the run stopped and after the step "
                      f"{self.step} checkpoint it resumes from: removed, since the replayed steps need not reach it "
                      "again; the next validation writes checkpoints/best and best.txt", stacklevel=2)
