"""``tether eval``: the validation of a checkpoint, exactly as the run validated at the checkpoint's step.

The same collector call as the trainer's validation (:meth:`~tether.rollout.base.Collector.validate`), on the same
engine (:func:`~tether.trainer.build.configured_engine`: ``rollout.dtype`` included), with the seed the run used at
that step (:mod:`tether.seeding`): evaluating ``checkpoints/step_N`` (or ``checkpoints/best``)
of a run reproduces the validation metrics its ``metrics.jsonl`` logged at step ``N``. A model that no run saved
(no ``trainer_state.pt``) is evaluated as at step 0.
"""

from __future__ import annotations

from pathlib import Path

from tether.config import Config
from tether.models import load_policy
from tether.models.policy import model_load_errors
from tether.seeding import step_seed
from tether.start import start_run
from tether.track.progress import status
from tether.trainer.build import build_collector, configured_engine
from tether.trainer.checkpoint import load_state
from tether.trainer.loop import validation_scope


def checkpoint_step(path: str | Path) -> int:
    """The RL step a checkpoint directory was saved at (its ``trainer_state.pt``); 0 for any other model."""
    if not (Path(path) / "trainer_state.pt").is_file():
        return 0
    return int(load_state(Path(path))["step"])


def evaluate(cfg: Config) -> dict[str, float]:
    """Validation metrics of ``cfg.model.name`` (a checkpoint directory, say) on the held-out set."""
    # a missing GPU fails now, then the checks (not those about training: eval only samples), before any model loads
    device = start_run(cfg, training=False)
    status(f"loading {cfg.model.name}")
    with model_load_errors("model.name", cfg.model.name):
        policy, tokenizer = load_policy(cfg.model.name)
    policy.to(device).eval()
    status(f"evaluating on split {cfg.val.split!r} ({validation_scope(cfg.val)})")
    engine = configured_engine(policy, tokenizer, cfg)  # rollout.dtype too: the run validated in it
    seed = step_seed(cfg.seed, checkpoint_step(cfg.model.name), "val")  # the run's validation seed at that step
    return build_collector(cfg, tokenizer).validate(engine, seed)
