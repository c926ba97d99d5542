"""EAPO's behaviour-corrected policy loss (Lu et al., arXiv:2606.30420). RECONSTRUCTED, not published.

Only EAPO's abstract was available (see ../shared/research/eapo.md): a prior policy ``pi_E`` takes over
some tokens at gated "critical decision points" during rollout, and an "adapted importance sampling"
keeps learning from those rollouts stable and unbiased. A token sampled at a gated position came from
the behaviour distribution ``mu`` (``LossInputs.behaviour_log_probs``), not from ``pi_old``, so the
PPO term is reweighted by ``rho = pi_old / mu`` (1 at ungated positions, where ``mu = pi_old``).
The variants (eapo.md Sec. 1.4-1.5, the paper's formula unknown):

* ``seq_gated`` (default; eapo.md variant C): ``W_i = min(prod_{t gated} rho_{i,t}, C)`` multiplies
  every token of sequence ``i``. The gate depends on the prefix only, so ``prod_t pi_old / mu`` over the
  whole sequence reduces to the gated factors and the uncapped estimator is exactly unbiased.
* ``token`` (variant A, truncated IS as in verl's rollout correction): ``w_t = min(rho_t, C)`` at gated
  positions, 1 elsewhere. Biased: it ignores how earlier injections shift later states.
* ``split`` (variant B, LUFFY arXiv:2504.14945 ``compute_token_on_off_policy_loss``): injected tokens
  use ``-A f(pi_theta / mu)`` with ``f(x) = x / (x + gamma)`` and no clip; the others clipped PPO.
* ``none``: plain PPO (treats the rollouts as on-policy; biased, MENTOR-style).

Weights are computed without gradient (stop-grad).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import Tensor

from tether.algos.aggregation import aggregate, masked_max, masked_mean
from tether.algos.policy_losses import LOG_RATIO_CLAMP, agg_kwargs, clipped_surrogate, surrogate_metrics
from tether.algos.registry import register_policy_loss
from tether.algos.types import LossInputs, LossOutput

CORRECTIONS = ("seq_gated", "token", "split", "none")


def _correction_weights(inputs: LossInputs, correction: str, cap: float) -> tuple[Tensor, Tensor, Tensor]:
    """(truncated weights ``[B, T]``, untruncated weights, the units the weights are counted over)."""
    mask = inputs.response_mask
    if correction == "none":
        return torch.ones_like(mask), torch.ones_like(mask), mask
    gated = (inputs.require("gate_mask", "eapo") > 0) & (mask > 0)
    behaviour = inputs.require("behaviour_log_probs", "eapo")
    # where(), not a product with the gate: mu may be -inf or junk at positions that do not count.
    log_rho = torch.where(gated, inputs.old_log_probs - behaviour, torch.zeros_like(mask))
    if correction == "token":
        raw = log_rho.exp()
        return raw.clamp(max=cap), raw, mask
    raw = log_rho.sum(-1, keepdim=True).exp().expand_as(mask)  # W_i: product over gated positions
    units = torch.zeros_like(mask)
    units[:, 0] = (mask.sum(-1) > 0).to(mask.dtype)  # W_i is constant along the row: count it once
    return raw.clamp(max=cap), raw, units


Metrics = tuple[dict[str, Tensor], dict[str, Tensor]]  # metrics and the units of each mean (LossOutput.counts)


Number = TypeVar("Number", float, Tensor)


def normalised_ess(metrics: Mapping[str, Number]) -> Number:
    """``(sum w)^2 / (n sum w^2) = mean(w)^2 / mean(w^2)``, from the means of the weights and of their squares (0
    without weights): of the step's folded floats (``LossOutput.derived``) and of one call's tensors alike."""
    second = metrics["eapo/is_weight_sq_mean"]
    # Weights are >= 0, so mean(w^2) == 0 means mean(w) == 0: the divisor 1 then gives 0. No branch on the value,
    # so a call's tensors are never read back to the host.
    return metrics["eapo/is_weight_mean"] ** 2 / (second + (second == 0))


def _weight_metrics(weights: Tensor, raw: Tensor, cap: float, units: Tensor) -> Metrics:
    """Mean, mean square, max, normalised ESS ``(sum w)^2 / (n sum w^2)`` and truncated fraction over ``units``."""
    means = {
        "eapo/is_weight_mean": masked_mean(weights, units),
        "eapo/is_weight_sq_mean": masked_mean(weights.square(), units),
        "eapo/is_trunc_frac": masked_mean((raw > cap).to(units.dtype), units),
    }
    metrics = {**means, "eapo/is_weight_max": masked_max(weights, units), "eapo/is_ess": normalised_ess(means)}
    return metrics, dict.fromkeys(means, units.sum())


def _fraction_metrics(inputs: LossInputs, guided: Tensor) -> Metrics:
    """``eapo/gated_frac`` and ``eapo/injected_frac`` over ``guided`` tokens."""
    metrics, counts = {}, {}
    for name, field in (("gated_frac", "gate_mask"), ("injected_frac", "injected_mask")):
        value = inputs.tokens.get(field)
        metrics[f"eapo/{name}"] = masked_mean((value > 0).to(guided.dtype), guided) if value is not None \
            else guided.new_zeros(())
        counts[f"eapo/{name}"] = guided.sum()
    return metrics, counts


@register_policy_loss("eapo")
def eapo(inputs: LossInputs, *, agg: str = "token-mean", correction: str = "seq_gated", cap: float = 2.0,
         gamma: float = 0.1, clip_low: float = 0.2, clip_high: float = 0.2,
         dual_clip: float | None = None) -> LossOutput:
    """Clipped PPO with a behaviour correction for experience-augmented rollouts (reconstructed).

    Args:
        inputs: needs ``behaviour_log_probs`` (log mu of each sampled token) unless ``correction="none"``;
            ``gate_mask`` for ``seq_gated`` / ``token``; ``injected_mask`` for ``split``.
        agg: aggregation mode.
        correction: one of ``seq_gated``, ``token``, ``split``, ``none`` (module docstring).
        cap: truncation ``C`` of the importance weight (verl's rollout-correction example value 2.0).
        gamma: ``split``'s shaping constant (LUFFY's ``p_div_p_0.1``).
        clip_low, clip_high, dual_clip: as in ``ppo`` (EAPO's values are unknown; PPO's defaults).

    Metrics, besides ``actor/*``: ``eapo/is_weight_{mean,sq_mean,max}``, ``eapo/is_ess`` (normalised effective
    sample size, ``mean(w)^2 / mean(w^2)``: :func:`normalised_ess`, ``LossOutput.derived``) and
    ``eapo/is_trunc_frac`` (weights above ``cap`` before truncation), over sequences
    for ``seq_gated``, tokens for ``token`` and ``none``, and of ``pi_theta / mu`` over injected tokens
    for ``split`` (never truncated); ``eapo/gated_frac`` and ``eapo/injected_frac`` of response tokens. All of
    them count only the rows the policy sampled (``source`` 0, every row when ``source`` is None): the prior gated
    those, while the rows another sampler drew (ARMOR's anchors, ``source`` 1) have weight 1 by construction.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"eapo correction must be one of {', '.join(CORRECTIONS)}; got '{correction}'")
    if cap <= 0:
        raise ValueError(f"eapo cap must be > 0 (it truncates importance weights), got {cap}")
    mask = inputs.response_mask
    log_ratio = inputs.log_probs - inputs.old_log_probs
    s = clipped_surrogate(log_ratio, inputs.advantages, clip_low=clip_low, clip_high=clip_high,
                          dual_clip=dual_clip)
    if correction == "split":
        injected = (inputs.require("injected_mask", "eapo") > 0) & (mask > 0)
        behaviour = inputs.require("behaviour_log_probs", "eapo")
        off_log_ratio = torch.where(injected, inputs.log_probs - behaviour, torch.zeros_like(mask))
        x = off_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        loss_mat = torch.where(injected, -inputs.advantages * x / (x + gamma), s.loss)
        weights = raw = x.detach()
        units, cap = injected.to(mask.dtype), float("inf")  # pi/mu is shaped, never truncated
    else:
        with torch.no_grad():
            weights, raw, units = _correction_weights(inputs, correction, cap)
        loss_mat = weights * s.loss
    loss = aggregate(inputs.weighted(loss_mat), mask, agg, **agg_kwargs(inputs))
    metrics = surrogate_metrics(s, log_ratio.detach(), inputs.advantages, mask)
    with torch.no_grad():
        policy_rows = mask.new_ones(mask.shape[0]) if inputs.source is None else (inputs.source == 0).to(mask.dtype)
        is_metrics, is_counts = _weight_metrics(weights, raw, cap, units * policy_rows[:, None])
        fractions, fraction_counts = _fraction_metrics(inputs, mask * policy_rows[:, None])
    # is_ess is a ratio of two means: the step's is computed once from the step's means, never averaged
    return LossOutput(loss, {**metrics, **is_metrics, **fractions}, {**is_counts, **fraction_counts},
                      derived={"eapo/is_ess": normalised_ess})
