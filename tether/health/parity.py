"""Engine-trainer parity: does the engine sample from the weights the trainer is training?

The engine records ``log mu(y_t)``, the log-prob of each sampled token under the distribution it drew it from
(:attr:`tether.engine.base.Generation.sample_log_probs`). The trainer recomputes ``log pi_old(y_t)`` under the same
weights: the separate old-log-prob pass, or the update's own forward detached when there is one optimiser step per
RL step (docs/design.md), so the check costs no extra forward pass. Both divide the logits by
``rollout.temperature``, so with ``top_p = 1`` and ``top_k = 0`` the two are one number up to precision.

Top-p and top-k renormalise the engine's distribution over the tokens they keep, which raises each kept token's
log-prob by ``-log(kept mass)``: the gap ``log mu - log pi`` then lies in ``[0, -log top_p]`` (top-p alone; the
nucleus holds at least ``top_p`` of the mass) or ``[0, inf)`` (top-k). Only the gap's distance outside that interval
is held against the engine (:func:`parity_excess`), so like is compared with like without recomputing the
truncated distribution.

Compared tokens: response tokens of on-policy rows (``source == 0``: ARMOR's anchors come from the reference) where
no sampling intervention replaced the distribution (``gate_mask == 0``: at EAPO's gated steps the engine records the
log-prob of a mixture with the prior).

With a rollout correction (``rollout.correction``, :mod:`tether.algos.rollout_correction`) the verdict reads the gap
the correction leaves: a per-token weight ``w`` (``tis``, ``icepop``) moves the sampled distribution to ``mu w``, so
the gap judged is ``log mu + log w - log pi`` (0 where the weight is not truncated); a token the correction dropped
counts as a mismatch (the loss no longer learns from it, and a stale engine shows up as tokens dropped). The
``logprob_diff`` metrics stay those of the raw gap; ``health/logprob_residual_mean`` is the mean gap left.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from tether.config import ParityConfig, RolloutConfig
from tether.rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from tether.algos.rollout_correction import RolloutCorrection
    from tether.distributed.data_parallel import DataParallel


def allowed_gap(top_p: float, top_k: int) -> tuple[float, float]:
    """The interval ``log mu - log pi`` lies in when the engine samples from the trainer's weights.

    >>> allowed_gap(1.0, 0)
    (0.0, 0.0)
    >>> round(allowed_gap(0.5, 0)[1], 4)
    0.6931
    """
    if top_k > 0:
        return 0.0, math.inf
    return 0.0, -math.log(top_p)


def parity_excess(sample_log_probs: Tensor, trainer_log_probs: Tensor, low: float, high: float) -> Tensor:
    """How far each token's gap ``log mu - log pi`` falls outside ``[low, high]`` (0 inside), ``[N, T]``."""
    gap = sample_log_probs - trainer_log_probs
    return (low - gap).clamp(min=0) + (gap - high).clamp(min=0)


def compared_tokens(batch: RolloutBatch) -> Tensor:
    """``[N, T]`` bool: response tokens of on-policy rows that no intervention re-weighted."""
    mask = (batch.response_mask > 0) & (batch.source == 0)[:, None]
    gate = batch.token.get("gate_mask")
    return mask if gate is None else mask & (gate == 0)


class ParityCheck:
    """Accumulates a step's parity statistics over the micro-batches, then judges the step.

    ``observe`` adds device tensors only (no host sync); ``finish`` reads them once. A step is bad when more than
    ``max_mismatch_frac`` of its compared tokens exceed ``tolerance``; ``patience`` bad steps in a row set
    :attr:`failure`.
    """

    def __init__(self, cfg: ParityConfig, rollout: RolloutConfig) -> None:
        self.cfg = cfg
        self.low, self.high = allowed_gap(rollout.top_p, rollout.top_k)
        self.bad_steps = 0
        self.failure: str | None = None
        self._parts: list[Tensor] = []

    def observe(self, micro: RolloutBatch, trainer_log_probs: Tensor,
                correction: RolloutCorrection | None = None) -> None:
        """One micro-batch's recomputed log-probs (detached), under the weights the engine sampled with, and the
        rollout correction its loss applies (None: none)."""
        mask = compared_tokens(micro)
        trainer_log_probs = trainer_log_probs.detach().float()
        diff = (micro.sample_log_probs - trainer_log_probs).abs().masked_fill(~mask, 0.0)
        sampled = micro.sample_log_probs if correction is None else correction.effective_log_probs.float()
        over = (parity_excess(sampled, trainer_log_probs, self.low, self.high) > self.cfg.tolerance)
        parts = [diff.sum(), mask.sum().float(), (over & mask).sum().float(),
                 diff.max() if diff.numel() else diff.new_zeros(())]
        if correction is not None:
            kept = mask & ~correction.dropped
            over = (over & kept) | (correction.dropped & mask)
            residual = (sampled - trainer_log_probs).abs().masked_fill(~kept, 0.0)
            parts[2] = over.sum().float()
            parts += [residual.sum(), kept.sum().float()]
        self._parts.append(torch.stack(parts))

    def finish(self, dp: DataParallel) -> dict[str, float]:
        """The step's metrics (summed over data-parallel ranks; the max is this rank's); updates the verdict."""
        if not self._parts:
            return {}
        parts = torch.stack(self._parts)
        self._parts = []
        # the one host sync of the check
        abs_sum, tokens, over, local_max, *residual = torch.cat(
            [parts[:, :3].sum(0), parts[:, 3].max()[None], parts[:, 4:].sum(0)]).tolist()
        sums = dp.sum_metrics({"abs": abs_sum, "tokens": tokens, "over": over,
                               **({"residual": residual[0], "kept": residual[1]} if residual else {})})
        if sums["tokens"] == 0:
            return {}
        frac = sums["over"] / sums["tokens"]
        mean = sums["abs"] / sums["tokens"]
        self.bad_steps = self.bad_steps + 1 if frac > self.cfg.max_mismatch_frac else 0
        if self.cfg.patience and self.bad_steps >= self.cfg.patience:
            self.failure = self._message(frac, mean, local_max)
        out = {"health/logprob_diff_mean": mean, "health/logprob_diff_max": local_max,
               "health/logprob_mismatch_frac": frac}
        if residual:
            out["health/logprob_residual_mean"] = sums["residual"] / max(sums["kept"], 1.0)
        return out

    def _message(self, frac: float, mean: float, largest: float) -> str:
        c = self.cfg
        return (f"engine-trainer parity failed for {self.bad_steps} steps in a row: {frac:.1%} of the sampled tokens "
                f"have log-probs more than {c.tolerance} nats from the trainer's under the same weights (allowed: "
                f"{c.max_mismatch_frac:.1%}; mean |diff| {mean:.3g}, max {largest:.3g}). The engine is not sampling "
                "from the policy being trained. Likely causes: (1) the engine never received the new weights "
                "(engine.load_weights did nothing: a stale copy, an adapter merge that never ran); (2) the engine "
                "samples with other settings than rollout.temperature/top_p/top_k, or records log-probs of another "
                "distribution; (3) precision (a bfloat16 engine against a float32 trainer): if the mean |diff| is "
                "small, raise health.parity.tolerance, or correct the gap (rollout.correction, docs/engine.md). "
                "With a rollout correction, the tokens it dropped count as mismatches. health.parity.patience=0 "
                "only logs (docs/health.md).")
