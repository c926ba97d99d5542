"""What a method hook sees of a run: a :class:`StepContext`, never the trainer.

The trainer builds a fresh context for each phase of a step (:meth:`tether.trainer.Trainer.hook_context`), and its
:class:`~tether.methods.hooks.MethodSet` hands it to every method's hook of that phase, so its fields are the values
at that point of the step. A hook reads them; the one thing it may change in the run is the
reference policy, through :meth:`Reference.reset_to` (ARMOR's resets), which the trainer then checkpoints.

=================  ==============================================================================================
field              what it is
=================  ==============================================================================================
``step``           RL steps done: ``k`` during step ``k + 1``'s hooks, ``k + 1`` in its ``after_update``
``cfg``            the run's :class:`~tether.config.Config`
``device``         where the policy, the reference and the batch from scoring on live (``train.device``)
``run_dir``        the run directory, for a method's own files (``skills.jsonl``, ``eapo_injections.jsonl``)
``tokenizer``      the policy's tokenizer (or processor)
``policy``         the policy being trained (read it; the optimiser owns its weights)
``reference``      the reference policy as a :class:`Reference` (None when the run loads none)
``engine``         the engine the collector samples with, holding the policy's current weights
``sampling``       a training rollout's sampling parameters (``sampling_params(cfg.rollout)``)
``sample_groups``  the collector's ``generate(engine, items, n, params, seed, *, group_ids, source)`` when it is a
                   :class:`~tether.rollout.base.GroupSampler` (the single-turn collector): ``n`` scored samples per
                   task item (None under the agent loop, which is not one)
``log_probs``      ``log_probs(model, batch, prompt_ids=None)``: no-grad log-probs of the batch's response tokens
                   under ``model``, as the trainer scores (the update's micro-batches, precision and temperature)
``make_engine``    ``make_engine(model)``: the configured engine over another model (the reference, say)
``mini_batch``     in ``extra_loss`` only: the :class:`MiniBatch` the micro-batch belongs to
=================  ==============================================================================================

Sampling seeds come from :meth:`StepContext.seed_for`, the one formula of :mod:`tether.seeding`, as the trainer's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.models.lora import BaseModelView
from tether.seeding import step_seed

if TYPE_CHECKING:
    import torch

    from tether.config import Config
    from tether.engine.base import SamplingParams
    from tether.rollout.base import SampleGroups
    from tether.rollout.batch import RolloutBatch


class Reference:
    """The reference policy ``pi_ref``, and whether it has moved since it was loaded.

    A reference that never moves is the model it was loaded as, so checkpoints leave it out; one that a method reset
    is saved with the policy and restored on resume.

    Attributes:
        model: the reference model (frozen, in eval mode, on the trainer's device).
        moved: True once :meth:`reset_to` ran (or a resumed checkpoint held a moved reference).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.moved = False

    def reset_to(self, policy: Any) -> None:
        """``theta_ref <- theta``, copied in place (the reference keeps its own tensors, frozen, in eval mode; a LoRA
        run's reference takes the policy's adapters into its own, :class:`tether.models.lora.BaseModelView`); from
        now on checkpoints save the reference. The one write a method hook makes to the run's state."""
        if isinstance(self.model, BaseModelView):
            self.model.reset_to(policy)
        else:
            self.model.load_state_dict(policy.state_dict())
        self.moved = True


@dataclass(frozen=True)
class MiniBatch:
    """The mini-batch of the optimiser step a micro-batch belongs to, for terms normalised over all of it.

    Every rank holds the whole mini-batch (only its micro-batches are split between ranks), so a total over it needs
    no collective, and each micro-batch's share of it adds up to the mini-batch's value.

    Attributes:
        rows: its rows, as indices into the RL step's batch, in the order the trainer took them. [M] long
        num_tokens: response tokens the loss counts in the whole mini-batch (``LossInputs.num_tokens``): all of
            them, or with ``algorithm.mask_truncated`` those of the rows that did not hit ``rollout.max_new_tokens``.
        num_seqs: rows the loss counts in the whole mini-batch (``LossInputs.num_seqs``), likewise: those with at
            least one token in the loss.
        batch: the mini-batch itself, every row (``len(batch)`` of them); for totals of a method's own per-token
            tensors.
    """

    rows: torch.Tensor
    num_tokens: float
    num_seqs: int
    batch: RolloutBatch

    def token_sum(self, key: str) -> float:
        """The sum of ``batch.token[key]`` over the whole mini-batch (e.g. SEED's distillation-active tokens)."""
        return float(self.batch.token[key].sum())


@dataclass(frozen=True)
class StepContext:
    """The run as a method hook sees it (the module docstring's table describes each field)."""

    step: int
    cfg: Config
    device: torch.device
    run_dir: Path
    tokenizer: Any
    policy: Any
    reference: Reference | None
    engine: Any
    sampling: SamplingParams
    sample_groups: SampleGroups | None
    log_probs: Callable[..., torch.Tensor]
    make_engine: Callable[[Any], Any]
    mini_batch: MiniBatch | None = None

    def seed_for(self, purpose: str, k: int = 0) -> int:
        """The trainer's sampling seed for ``purpose`` at this step (:func:`tether.seeding.step_seed`)."""
        return step_seed(self.cfg.seed, self.step, purpose, k)
