"""A run's state on disk: what a checkpoint holds, and resuming from one exactly where it left off."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from tether.config import ConfigError
from tether.trainer.checkpoint import load_state, rng_state, set_rng_state


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
            "skipped_updates": self.skipped_updates,
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
        """Continue exactly where the checkpoint left off: weights, optimiser, schedule, data, RNG."""
        state = load_state(path)
        written_by = state.get("strategy", "replicate")  # checkpoints before sharding existed were replicated
        if written_by != self.strategy.name:
            raise ConfigError(f"{path} was written with distributed.strategy={written_by}; resume with that "
                              "strategy, or another run_dir (or train.resume=never train.overwrite=true: deletes this "
                              "run)")
        moved = self.strategy.load_training_state(path, state, self.policy, self.optimizer, self.ref_policy)
        if self.reference is not None:
            self.reference.moved = moved
        self.scheduler.load_state_dict(state["scheduler"])
        self.collector.load_state_dict(state["collector"])
        self.methods.load_state_dict(state["methods"])
        set_rng_state(state["rng"])
        self.health.load_state_dict(state.get("health", {}))  # checkpoints from before the checks have none
        self.step, self.best_value, self.val_history = state["step"], state["best_value"], state["val_history"]
        self.skipped_updates = state.get("skipped_updates", 0)  # absent from checkpoints before it was counted
        self.drop_best_of_lost_steps()
        self.push_weights()

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
