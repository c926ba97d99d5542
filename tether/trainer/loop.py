"""The training loop: steps until ``train.steps``, the validation and save schedule, signals, the best checkpoint."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tether.errors import RefillShortfall, TrainingStopped
from tether.health import HealthError
from tether.start import StopSignals
from tether.track import finite_or_none, write_text_atomic
from tether.track.progress import counted

if TYPE_CHECKING:
    from tether.config import Config, ValConfig


def validation_scope(v: ValConfig) -> str:
    """What one validation samples, for its status line: ``all prompts x 1 sample``, ``8 prompts x 4 samples``."""
    prompts = counted(v.max_prompts, "prompt") if v.max_prompts else "all prompts"
    return f"{prompts} x {counted(1 if v.greedy else v.samples, 'sample')}"


class TrainingLoop:
    """:meth:`fit` and what it schedules around the steps: validation, checkpoints, the summary."""

    # what the loop reads and updates, built by tether.trainer.build.TrainerBuild
    cfg: Config
    run_dir: Path
    step: int
    best_value: float
    val_history: list[tuple[int, dict[str, float]]]

    def fit(self) -> dict[str, float]:
        """Train until ``train.steps``; validate and checkpoint on schedule. Returns the last metrics.

        Raises:
            TrainingStopped: SIGTERM or SIGINT arrived (the step under way was finished and saved first), or
                ``train.max_skipped_updates`` optimiser steps in a row were non-finite.
            HealthError: a health check stopped the run (docs/health.md); its metrics and ``summary.json`` are
                written first, and ``checkpoints/best`` keeps the validation peak.
        """
        try:
            return self._fit()
        except HealthError:
            self._finish()
            raise
        except RefillShortfall as err:  # one line naming where a resume starts and what it may change
            self.tracker.close()
            raise TrainingStopped(refill_stop_message(str(err), self.checkpoints.latest())) from None

    def _finish(self) -> None:
        """Close the metric sinks and write ``summary.json``: at the end, and when a health check stops the run."""
        self.tracker.close()
        if self.dp.is_main:
            write_text_atomic(self.run_dir / "summary.json", json.dumps(self.summary(), indent=2))

    def _fit(self) -> dict[str, float]:
        t = self.cfg.train
        last: dict[str, float] = {}
        if self.step == 0 and self.cfg.val.every:
            last.update(self.validate())
        from tether.track.progress import Progress

        with Progress(t.steps, start=self.step, enabled=self.cfg.logging.progress and self.dp.is_main) as bar, \
                StopSignals() as signals:
            saved_at = time.monotonic()
            while self.step < t.steps:
                metrics = self.train_step()
                if self.cfg.val.every and self.step % self.cfg.val.every == 0:
                    metrics.update(self.validate())
                save, stop = self._save_or_stop(saved_at, signals.signal is not None)
                if save:
                    path = self._said(f"saving the checkpoint of step {self.step}", self.save)
                    saved_at = time.monotonic()
                bar.update(self.step, metrics)
                last.update(metrics)
                if stop:
                    self.tracker.close()
                    signum = signals.signal or signal.SIGTERM  # under torchrun another rank may have had it
                    raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {self.step}, saved "
                                          f"in {path}; run the same command again to resume", 128 + signum)
        self._finish()
        return last

    def _save_or_stop(self, saved_at: float, signalled: bool) -> tuple[bool, bool]:
        """Whether to checkpoint now (the step schedule, ``train.save_every_s`` or a signal) and whether to stop.
        Every rank takes part in a save, so one rank's clock or signal decides for all."""
        t = self.cfg.train
        scheduled = self.step == t.steps or bool(t.save_every and self.step % t.save_every == 0)
        late = bool(t.save_every_s) and time.monotonic() - saved_at >= t.save_every_s
        votes = self.dp.sum_metrics({"late": float(late), "signalled": float(signalled)})
        return scheduled or votes["late"] > 0 or votes["signalled"] > 0, votes["signalled"] > 0

    def summary(self) -> dict[str, Any]:
        """First and last validation, the best value of ``train.best_metric``, steps done. Strict JSON: a value that
        is not a finite number is None (``best`` before any validation, ``val.every=0``, is -inf here; JSON has no
        ``-Infinity``, and readers such as ``jq`` refuse Python's)."""
        out: dict[str, Any] = {"steps": self.step, "best": {self.cfg.train.best_metric: self.best_value}}
        if self.val_history:
            out["first_val"] = {"step": self.val_history[0][0], **self.val_history[0][1]}
            out["last_val"] = {"step": self.val_history[-1][0], **self.val_history[-1][1]}
        return finite_or_none(out)

    def validate(self) -> dict[str, float]:
        v, start = self.cfg.val, time.monotonic()
        self.status(f"validating at step {self.step} on split {v.split!r} ({validation_scope(v)})")
        metrics = self.collector.validate(self.sampling_engine, self.seed_for("val"))
        self.status(f"validation at step {self.step}: {self.cfg.train.best_metric}="
                    f"{metrics.get(self.cfg.train.best_metric, float('nan')):.4f} ({time.monotonic() - start:.0f} s)")
        metrics.update(self.health.on_validation(self.step, metrics))  # the over-optimisation guard
        self.tracker.log(metrics, self.step)
        self.val_history.append((self.step, metrics))
        value = metrics.get(self.cfg.train.best_metric)
        if value is not None and self.step >= self.cfg.train.best_from_step and value > self.best_value:
            self.best_value = value
            writer = self._best_writer({"step": self.step, "metric": value, "name": self.cfg.train.best_metric})
            self._said(f"saving checkpoints/best ({self.cfg.train.best_metric}={value:.4f} at step {self.step})",
                       lambda: self.checkpoints.save_best(writer))
            if self.dp.is_main:
                write_text_atomic(self.run_dir / "best.txt",
                                  f"{self.cfg.train.best_metric}={value} step={self.step}\n")
        self.health.stop_if_unhealthy()
        return metrics

    def _said(self, what: str, save: Callable[[], Path]) -> Path:
        """Run ``save``, one status line before it and one with its path and seconds after: the weights, the optimiser
        state and the manifest's hashes take 10-20 s for 135M parameters on a CPU (minutes for billions), which read
        as a hang after the step's last line."""
        start = time.monotonic()
        self.status(what)
        path = save()
        self.status(f"saved {path} ({time.monotonic() - start:.0f} s)")
        return path

    def _best_writer(self, state: dict[str, Any]) -> Callable[[Path], None]:
        def write(directory: Path) -> None:  # every rank: a sharded policy is gathered to rank 0 first
            self.strategy.save_pretrained(directory, self.policy)
            if self.dp.is_main:
                self.tokenizer.save_pretrained(directory)
                torch.save(state, directory / "trainer_state.pt")

        return write


def refill_stop_message(shortfall: str, latest: Path | None) -> str:
    """The stop of a DAPO refill shortfall: what fell short, where the same command resumes, the settings a resume
    may change (neither is a setting that changes what the run means)."""
    change = "rollout.partial_batches=true (train on the groups that survived) or a larger rollout.max_gen_batches"
    if latest is None:
        return (f"{shortfall}; no checkpoint was written yet: run again with {change}, and train.overwrite=true (the "
                "run starts again at step 0)")
    return f"{shortfall}; the last checkpoint is {latest}: the same command with {change} resumes from it"
