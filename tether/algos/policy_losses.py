"""Clipped policy-gradient losses: the shared PPO surrogate, ``ppo`` and ``gspo``.

Losses are quantities to minimise (``-A * r``). ARMOR and EAPO reuse :func:`clipped_surrogate` from
their own modules (``armor_loss.py``, ``eapo_loss.py``), so all four share one clip and one set of
metric definitions.

Metrics (local to the micro-batch, masked means over response tokens):

* ``actor/pg_clipfrac``: tokens whose gradient the clip removes (verl's definition);
* ``actor/pg_clipfrac_upper`` / ``actor/pg_clipfrac_lower``: the same, split into ``A > 0, r > 1 + eps_high``
  and ``A < 0, r < 1 - eps_low``;
* ``actor/pg_clipfrac_dual``: tokens where the dual clip binds (``A < 0, r > c``; verl logs this as
  ``pg_clipfrac_lower``);
* ``actor/ppo_kl``: ``mean(log pi_old - log pi_theta)``, the k1 estimate of ``KL(pi_old || pi_theta)``;
* ``actor/ratio_mean`` / ``actor/ratio_max``: of the ratio the clip sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tether.algos.aggregation import aggregate, masked_max, masked_mean
from tether.algos.registry import register_policy_loss
from tether.algos.types import LossInputs, LossOutput

LOG_RATIO_CLAMP = 20.0  # verl clamps log pi/pi_old to [-20, 20] before exp


@dataclass
class Surrogate:
    """Per-token output of :func:`clipped_surrogate` (all ``[B, T]``)."""

    loss: Tensor
    ratio: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def clipped_surrogate(log_ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float,
                      dual_clip: float | None = None) -> Surrogate:
    """PPO's clipped objective per token, as a loss: ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))``.

    Schulman et al. 2017 (arXiv:1707.06347) Eq. 7; asymmetric clip-higher from DAPO (arXiv:2503.14476
    Sec. 3.1); dual clip from Ye et al. 2020 (arXiv:1912.09729): for ``A < 0`` the loss is capped at
    ``-A c``, so a huge ratio on a bad token cannot blow up the step. Follows verl
    ``compute_policy_loss_vanilla``.

    Args:
        log_ratio: ``log r``, ``[B, T]``, with gradient (clamped to [-20, 20] here).
        advantages: ``[B, T]``.
        clip_low: ``eps_low``; the ratio is clipped below at ``1 - eps_low``.
        clip_high: ``eps_high``; the ratio is clipped above at ``1 + eps_high``.
        dual_clip: ``c > 1``, or None for no dual clip.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if not 0.0 <= clip_low <= 1.0:  # the ratio's lower bound 1 - clip_low must lie in [0, 1]
        raise ValueError(f"clip_low must be in [0, 1], got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    return Surrogate(loss=loss, ratio=ratio, clipped=clipped, dual_clipped=dual_clipped)


def surrogate_metrics(s: Surrogate, log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The ``actor/*`` metrics of the module docstring, detached."""
    with torch.no_grad():
        clipped = s.clipped.to(mask.dtype)
        return {
            "actor/pg_clipfrac": masked_mean(clipped, mask),
            "actor/pg_clipfrac_upper": masked_mean(clipped * (advantages > 0), mask),
            "actor/pg_clipfrac_lower": masked_mean(clipped * (advantages < 0), mask),
            "actor/pg_clipfrac_dual": masked_mean(s.dual_clipped.to(mask.dtype), mask),
            "actor/ppo_kl": masked_mean(-log_ratio, mask),
            "actor/ratio_mean": masked_mean(s.ratio, mask),
            "actor/ratio_max": masked_max(s.ratio, mask),
        }


def agg_kwargs(inputs: LossInputs) -> dict:
    """The global normalisers of ``inputs``, as keyword arguments of :func:`aggregate`."""
    return {"num_tokens": inputs.num_tokens, "num_seqs": inputs.num_seqs,
            "max_response_len": inputs.max_response_len}


@register_policy_loss("ppo")
def ppo(inputs: LossInputs, *, agg: str = "token-mean", clip_low: float = 0.2, clip_high: float = 0.2,
        dual_clip: float | None = None) -> LossOutput:
    """Clipped PPO / GRPO / DAPO policy loss on ``r = pi_theta / pi_old``.

    ``clip_low = clip_high = 0.2`` is PPO; DAPO's clip-higher sets ``clip_high = 0.28`` (arXiv:2503.14476
    Sec. 3.1); ARMOR and SEED add ``dual_clip`` (10.0 and 3.0).

    Args:
        inputs: needs ``log_probs``, ``old_log_probs``, ``advantages``, ``response_mask``.
        agg: aggregation mode (:func:`tether.algos.aggregate`).
        clip_low: ``eps_low``.
        clip_high: ``eps_high``.
        dual_clip: ``c`` of dual-clip PPO, or None.
    """
    log_ratio = inputs.log_probs - inputs.old_log_probs
    s = clipped_surrogate(log_ratio, inputs.advantages, clip_low=clip_low, clip_high=clip_high,
                          dual_clip=dual_clip)
    loss = aggregate(inputs.weighted(s.loss), inputs.response_mask, agg, **agg_kwargs(inputs))
    return LossOutput(loss, surrogate_metrics(s, log_ratio, inputs.advantages, inputs.response_mask))


@register_policy_loss("gspo")
def gspo(inputs: LossInputs, *, agg: str = "token-mean", clip_low: float = 3e-4,
         clip_high: float = 4e-4) -> LossOutput:
    """GSPO: the clip acts on a sequence-level ratio (Zheng et al., arXiv:2507.18071, Sec. 4.1).

    ``s_i = exp(mean_t log(pi_theta / pi_old))`` (length-normalised), used per token in GSPO-token form
    ``s_{i,t} = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t))`` (Sec. 4.3): equal in value to ``s_i``, its
    gradient spreads ``s_i A_i`` over the tokens. The paper's objective is ``agg="seq-mean-token-mean"``
    (verl ``compute_policy_loss_gspo`` forces it); the defaults ``3e-4 / 4e-4`` are the paper's Sec. 5.1.
    """
    mask = inputs.response_mask
    token_log_ratio = inputs.log_probs - inputs.old_log_probs
    seq_log_ratio = masked_mean(token_log_ratio.detach(), mask, dim=-1)
    log_ratio = inputs.log_probs - inputs.log_probs.detach() + seq_log_ratio[:, None]
    s = clipped_surrogate(log_ratio, inputs.advantages, clip_low=clip_low, clip_high=clip_high)
    loss = aggregate(inputs.weighted(s.loss), mask, agg, **agg_kwargs(inputs))
    return LossOutput(loss, surrogate_metrics(s, log_ratio.detach(), inputs.advantages, mask))
