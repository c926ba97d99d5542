"""The trainer's one handle on the health checks: where each check hooks into a step, and its verdict."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from tether.config import Config
from tether.files import append_jsonl
from tether.health.collapse import CollapseGuard
from tether.health.degenerate import DegenerateCheck
from tether.health.errors import CollapseError, HealthError
from tether.health.no_signal import NoSignalCheck
from tether.health.parity import ParityCheck
from tether.health.reward_audit import reward_audit
from tether.health.round_trip import RecordingEngine, Sample, check_round_trip
from tether.rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from tether.algos.rollout_correction import RolloutCorrection
    from tether.distributed.data_parallel import DataParallel


class HealthMonitor:
    """Runs the checks configured in ``cfg.health`` (docs/health.md).

    The trainer wraps its engine once (:meth:`wrap`) and calls, per step: :meth:`start_collection` before
    collection, :meth:`check_batch` before any training
    work, :meth:`observe` with each micro-batch's pi_old log-probs, :meth:`end_step` with the step's metrics and
    :meth:`stop_if_unhealthy` after logging them; per validation, :meth:`on_validation` and again
    :meth:`stop_if_unhealthy`.
    """

    def __init__(self, cfg: Config, run_dir: Path, tokenizer: Any, *, is_main: bool = True,
                 vocab_size: int | None = None) -> None:
        self.cfg, self.tokenizer, self.is_main = cfg.health, tokenizer, is_main
        self.dir = Path(run_dir) / "health"
        self.parity = ParityCheck(cfg.health.parity, cfg.rollout) if cfg.health.parity.enabled else None
        self.collapse = CollapseGuard(cfg.health.collapse, cfg.train.best_metric,
                                      Path(run_dir) / "checkpoints" / "best", from_step=cfg.train.best_from_step)
        self.degenerate = DegenerateCheck(cfg.health.degenerate, vocab_size)
        self.no_signal = NoSignalCheck(cfg.health.no_signal)
        self.samples: set[Sample] = set()
        self.warned_no_answer = False

    def wrap(self, engine: Any) -> Any:
        """The engine the run samples with: with the token round trip on, ``engine`` inside a recorder of what it
        samples (:class:`~tether.health.round_trip.RecordingEngine`), else ``engine`` itself. Called once per engine,
        by the trainer's ``use_engine``."""
        return RecordingEngine(engine, self.samples) if self.cfg.round_trip.enabled else engine

    def start_collection(self) -> None:
        """A step's collection begins: forget what the engine sampled before (the check reads this step's)."""
        self.samples.clear()

    def check_batch(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """The round trip (raises on a mismatch) and the reward audit, on the collected batch of ``step`` (the step
        under which its metrics are logged)."""
        if self.cfg.round_trip.enabled:
            check_round_trip(batch, self.samples, self.tokenizer)
        if not self.cfg.reward_audit.enabled:
            return {}
        metrics, missing = reward_audit(batch)
        self._report_no_answer(batch, missing, metrics, step)
        return metrics

    def observe(self, micro: RolloutBatch, trainer_log_probs: Tensor,
                correction: RolloutCorrection | None = None) -> None:
        """pi_old's log-probs of a micro-batch, before any optimiser step of this RL step, and the rollout
        correction the loss applies to it (parity then judges the gap the correction leaves)."""
        if self.parity is not None:
            self.parity.observe(micro, trainer_log_probs, correction)

    def end_step(self, metrics: dict[str, float], dp: DataParallel, step: int) -> dict[str, float]:
        """Parity's metrics and verdict for the step; the training reward for the collapse guard; the step's
        entropy and gradient norm for the collapsed-policy warning (the same on every rank, so it warns on rank 0
        alone)."""
        self.collapse.observe_train(metrics.get("train/reward_mean"))
        out = self.parity.finish(dp) if self.parity is not None else {}
        with warnings.catch_warnings():
            if not self.is_main:
                warnings.simplefilter("ignore")
            out.update(self.degenerate.observe(step, metrics))
            out.update(self.no_signal.observe(step, metrics))
        return out

    def on_validation(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return self.collapse.observe_val(step, metrics)

    def stop_if_unhealthy(self) -> None:
        if self.parity is not None and self.parity.failure is not None:
            raise HealthError(self.parity.failure)
        if self.no_signal.failure is not None:
            raise HealthError(self.no_signal.failure)
        if self.collapse.failure is not None:
            raise CollapseError(self.collapse.failure, step=self.collapse.failed_at, peak_step=self.collapse.peak_step)

    def state_dict(self) -> dict[str, Any]:
        return {"parity_bad_steps": self.parity.bad_steps if self.parity is not None else 0,
                "collapse": self.collapse.state_dict(), "warned_no_answer": self.warned_no_answer,
                "degenerate": self.degenerate.state_dict(), "no_signal": self.no_signal.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.parity is not None:
            self.parity.bad_steps = state.get("parity_bad_steps", 0)
        self.collapse.load_state_dict(state.get("collapse", {}))
        self.warned_no_answer = state.get("warned_no_answer", False)
        self.degenerate.load_state_dict(state.get("degenerate", {}))  # absent from checkpoints before the check
        self.no_signal.load_state_dict(state.get("no_signal", {}))

    def _report_no_answer(self, batch: RolloutBatch, missing: list[int], metrics: dict[str, float], step: int) -> None:
        """A few rows without an answer to ``health/no_answer.jsonl``; one warning when they dominate."""
        audit = self.cfg.reward_audit
        if not missing or not self.is_main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        items = batch.info.get("item", [None] * len(batch))
        truncated = batch.info.get("truncated", [None] * len(batch))
        append_jsonl(self.dir / "no_answer.jsonl",
                     ({"step": step, "item": getattr(items[i], "id", None), "prompt": getattr(items[i], "prompt", None),
                       "answer": getattr(items[i], "answer", None), "response": batch.info["text"][i],
                       "truncated": truncated[i]} for i in missing[:audit.examples]))
        share, wrong = metrics["reward/no_answer_frac"], metrics["reward/wrong_answer_frac"]
        if share >= audit.warn_no_answer_frac and share > wrong and not self.warned_no_answer:
            truncated = sum(bool(batch.info.get("truncated", [False] * len(batch))[i]) for i in missing)
            warnings.warn(f"step {step}: no answer could be extracted from {share:.0%} of the responses (wrong "
                          f"answers: {wrong:.0%}; {truncated} of the {len(missing)} hit rollout.max_new_tokens). "
                          "They get the wrong-answer reward, so the reward curve reads as a model that cannot solve "
                          "the task. Check the prompt's answer format and the task's extractor; examples in "
                          f"{self.dir / 'no_answer.jsonl'} (docs/health.md)", stacklevel=2)
            self.warned_no_answer = True
