"""ARMOR's mixed-ratio policy loss (Huang et al., arXiv:2607.10481, Sec. 4.2; code Hesse73/ARMOR).

The DAPO loss with ``r = pi_theta / pi_old`` replaced by the ratio of two mixtures with the reference:

    r_mix = (a pi_theta + (1-a) pi_ref) / (a pi_old + (1-a) pi_ref)            (Eqs. 4-5)

Setting ``r_mix = 1 +- eps`` gives ``pi_theta = (1 +- eps) pi_old +- eps (1-a)/a pi_ref`` (Eq. 6): the
trust region widens where the reference puts mass. At ``theta = theta_old`` the gradient of ``r_mix``
with respect to ``log pi_theta`` is ``a pi_old / (a pi_old + (1-a) pi_ref)``, in (0, 1)
(armor.md Sec. 1.4, a derivation rather than a claim of the paper).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tether.algos.aggregation import aggregate, masked_max, masked_mean, masked_min
from tether.algos.kl import forward_kl_estimate, reverse_kl_estimate
from tether.algos.policy_losses import agg_kwargs, clipped_surrogate, surrogate_metrics
from tether.algos.registry import register_policy_loss
from tether.algos.types import LossInputs, LossOutput

NO_MIX_ALPHA = 1.0 - 1e-6  # the ARMOR code mixes only if alpha < 1 - 1e-6


def mix_log_probs(log_probs: Tensor, ref_log_probs: Tensor, alpha: float) -> Tensor:
    """``log(a pi + (1-a) pi_ref)``, computed as ``logaddexp(log pi + log a, log pi_ref + log(1-a))``.

    Exact in log space and finite when one of the two is ``-inf`` (the ARMOR code's logsumexp).
    """
    return torch.logaddexp(log_probs + math.log(alpha), ref_log_probs + math.log1p(-alpha))


@register_policy_loss("armor")
def armor(inputs: LossInputs, *, agg: str = "token-mean", alpha: float = 0.9375, scope: str = "all",
          clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = 10.0) -> LossOutput:
    """ARMOR's mixed optimisation: the clipped (dual-clip) PPO loss on ``r_mix``.

    Defaults are the paper's Qwen2.5-Math-7B run (App. B): ``alpha = 15/16``, DAPO clip 0.2 / 0.28 and
    dual clip 10. ``alpha`` is a loss setting, decoupled from the fraction of anchors in the batch (the
    8B run uses 0.875 with 1 anchor in 16). With ``alpha >= 1 - 1e-6`` nothing is mixed and the loss is
    exactly :func:`tether.algos.policy_losses.ppo` with the same clip arguments.

    Args:
        inputs: needs ``ref_log_probs``; ``source`` (1 = anchor) when ``scope="anchors"``, and for the
            drift metrics.
        agg: aggregation mode.
        alpha: mixing weight ``a`` of the policy, in (0, 1].
        scope: ``"all"`` (every token; the released configuration) or ``"anchors"`` (only rows with
            ``source == 1``; the code's ``mix_probs_on_ref_only``).
        clip_low, clip_high, dual_clip: as in ``ppo``.

    Metrics, besides ``actor/*`` (whose ratio is ``r_mix``):
        ``armor/mix_ratio_{mean,min,max}``; ``armor/grad_weight_{mean,min}``, the weight
        ``a pi_theta / (a pi_theta + (1-a) pi_ref)`` that scales each token's gradient (1 where unmixed);
        ``armor/loss_kl_on_old`` (k1 reverse KL of pi_old to pi_ref over on-policy tokens), ``armor/loss_kl_on_ref``
        (k1 forward KL over anchor tokens), ``armor/anchor_frac`` (fraction of rows with source 1); the last three
        with their units in ``counts``.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"armor alpha must be in (0, 1], got {alpha}")
    if scope not in ("all", "anchors"):
        raise ValueError(f"armor scope must be 'all' or 'anchors', got '{scope}'")
    mask = inputs.response_mask
    ref = inputs.require("ref_log_probs", "armor")
    if scope == "anchors":
        inputs.require("source", "armor (scope='anchors')")
    source = inputs.source if inputs.source is not None else torch.zeros(mask.shape[0], device=mask.device)
    is_anchor = (source == 1)[:, None]
    new, old = inputs.log_probs, inputs.old_log_probs
    mixed = torch.ones_like(mask, dtype=torch.bool) if scope == "all" else is_anchor.expand_as(mask)
    if alpha < NO_MIX_ALPHA:
        new = torch.where(mixed, mix_log_probs(new, ref, alpha), new)
        old = torch.where(mixed, mix_log_probs(old, ref, alpha), old)
    else:
        mixed = torch.zeros_like(mixed)
    log_ratio = new - old
    s = clipped_surrogate(log_ratio, inputs.advantages, clip_low=clip_low, clip_high=clip_high,
                          dual_clip=dual_clip)
    loss = aggregate(inputs.weighted(s.loss), mask, agg, **agg_kwargs(inputs))
    metrics = surrogate_metrics(s, log_ratio.detach(), inputs.advantages, mask)
    with torch.no_grad():
        weight = torch.where(mixed, (inputs.log_probs + math.log(alpha) - new).exp(), torch.ones_like(new))
        anchor_tokens = mask * is_anchor
        policy_tokens = mask - anchor_tokens
        metrics.update({
            "armor/mix_ratio_mean": masked_mean(s.ratio, mask),
            "armor/mix_ratio_min": masked_min(s.ratio, mask),
            "armor/mix_ratio_max": masked_max(s.ratio, mask),
            "armor/grad_weight_mean": masked_mean(weight, mask),
            "armor/grad_weight_min": masked_min(weight, mask),
            "armor/loss_kl_on_old": reverse_kl_estimate(inputs.old_log_probs, ref, policy_tokens),
            "armor/loss_kl_on_ref": forward_kl_estimate(inputs.old_log_probs, ref, anchor_tokens),
            "armor/anchor_frac": (source == 1).to(mask.dtype).mean(),
        })
    counts = {"armor/anchor_frac": mask.new_tensor(mask.shape[0]), "armor/loss_kl_on_old": policy_tokens.sum(),
              "armor/loss_kl_on_ref": anchor_tokens.sum()}
    return LossOutput(loss, metrics, counts)
