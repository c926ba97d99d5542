"""Rollout correction: weights and masks for the gap between the distribution that sampled (the engine's ``mu``)
and the one the loss assumes (the trainer's ``pi_old``).

The engine records ``log mu(y_t)`` for every sampled token (``RolloutBatch.sample_log_probs``); the trainer has
``log pi_old(y_t)``. With the same weights the two differ only by precision (a bfloat16 engine against a float32
trainer), by kernels (vLLM against Hugging Face) or, with asynchronous rollouts, by the updates in between. Each
mode turns the per-token log ratio ``l_t = log pi_old(y_t) - log mu(y_t)`` (clamped to [-20, 20] before any
``exp``, as verl's ``SAFETY_BOUND``) into a per-token factor ``w_t`` of the policy loss, detached:

* ``tis``: truncated importance sampling per token, ``w_t = min(exp(l_t), cap)`` (Yao et al., "Your efficient RL
  framework secretly brings you off-policy RL training", 2025; verl ``rollout_is: token``).
* ``seq_is``: one weight per sequence, ``w_i = min(exp(sum_t l_t), cap)`` (verl ``rollout_is: sequence``).
* ``mask_token``: ``w_t = 1`` where ``lower <= exp(l_t) <= upper``, else 0 (verl ``rollout_rs: token``).
* ``mask_seq_mean``: the whole sequence kept (``w = 1``) when the mean over its tokens of the k3 divergence
  ``exp(l_t) - 1 - l_t`` is at most ``max_kl``, else 0 (verl ``rollout_rs: seq_mean_k3``).
* ``mask_geo_mean``: the sequence kept when its geometric-mean ratio ``exp(mean_t l_t)`` lies in
  ``[lower, upper]`` (verl ``rollout_rs: geometric``, later ``seq_mean_k1``).
* ``icepop``: ``w_t = exp(l_t)`` where ``lower <= exp(l_t) <= upper``, else 0: the untruncated token weight, with
  the tokens outside both bounds dropped (IcePop, from the Ling team's Ring-1T work, 2025, whose
  ``alpha = 0.5``, ``beta = 5`` are the defaults).

``lower`` defaults to ``1 / upper`` for ``mask_token`` and ``mask_geo_mean`` (verl's default). Only the tokens the
caller marks (``corrected``: on-policy tokens whose distribution no sampling intervention replaced) are corrected;
every other token keeps ``w = 1``. A dropped token (``w = 0``) still counts in the loss's normalisers, as in TRL's
``vllm_importance_sampling_mode``: the loss's scale does not jump with the share dropped.

The modes are registered like policy losses (:data:`ROLLOUT_CORRECTIONS`): ``fn(log_ratio, mask, *, <bound>=...)
-> weights [B, T]``, with ``mask`` the corrected tokens; ``per_token`` at registration says whether the weight
corrects each token's own gap (``tis``, ``icepop``), which health parity reads (docs/health.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tether.algos.aggregation import masked_max, masked_mean, masked_sum
from tether.algos.registry import function_registry

LOG_RATIO_BOUND = 20.0  # verl's SAFETY_BOUND: exp(+-20) stays finite in float32


def check_correction_signature(fn: Callable) -> None:
    """Raise TypeError unless ``fn`` is ``fn(log_ratio, mask, *, bound=default, ...)``."""
    params = list(inspect.signature(fn).parameters.values())
    if [p.name for p in params[:2]] != ["log_ratio", "mask"]:
        raise TypeError("it must take (log_ratio, mask, *, ...)")
    for p in params[2:]:
        if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
            raise TypeError(f"bound '{p.name}' must be keyword-only with a default")


ROLLOUT_CORRECTIONS = function_registry("rollout correction", check_correction_signature)
PER_TOKEN: set[str] = set()  # modes whose weight corrects each token's own gap


def register_rollout_correction(name: str, *, per_token: bool) -> Callable[[Callable], Callable]:
    """Decorator registering a correction mode; ``per_token``: its weight is the token's own ratio where kept."""

    def decorator(fn: Callable) -> Callable:
        ROLLOUT_CORRECTIONS.register(name)(fn)
        if per_token:
            PER_TOKEN.add(name)
        return fn

    return decorator


def _safe(log_ratio: Tensor) -> Tensor:
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _bounds(lower: float | None, upper: float) -> tuple[float, float]:
    """``(lower, upper)``, lower defaulting to ``1 / upper``; they must hold the on-policy ratio 1."""
    lower = 1.0 / upper if lower is None else lower
    if not 0.0 <= lower < 1.0 < upper:
        raise ValueError(f"the bounds must satisfy 0 <= lower < 1 < upper (a ratio of 1, on-policy, is kept); "
                         f"got lower={lower}, upper={upper}")
    return lower, upper


def _check_cap(cap: float) -> None:
    if cap < 1.0:
        raise ValueError(f"cap must be >= 1 (a smaller cap shrinks the weight of on-policy tokens), got {cap}")


def _sequence_sum(log_ratio: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(log_ratio, mask, dim=-1)[:, None]


@register_rollout_correction("none", per_token=False)
def no_correction(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Every weight 1: the loss treats the engine's samples as drawn from ``pi_old``."""
    return torch.ones_like(log_ratio)


@register_rollout_correction("tis", per_token=True)
def tis(log_ratio: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """Truncated importance sampling per token: ``min(exp(l_t), cap)`` (verl's default threshold 2)."""
    _check_cap(cap)
    return _safe(log_ratio).exp().clamp(max=cap)


@register_rollout_correction("seq_is", per_token=False)
def seq_is(log_ratio: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """Sequence-level truncated importance sampling: ``min(exp(sum_t l_t), cap)`` on every token of the row."""
    _check_cap(cap)
    return _safe(_sequence_sum(log_ratio, mask)).exp().clamp(max=cap).expand_as(log_ratio)


@register_rollout_correction("mask_token", per_token=False)
def mask_token(log_ratio: Tensor, mask: Tensor, *, lower: float | None = None, upper: float = 2.0) -> Tensor:
    """1 where the token's ratio lies in ``[lower, upper]``, else 0."""
    lower, upper = _bounds(lower, upper)
    ratio = _safe(log_ratio).exp()
    return ((ratio >= lower) & (ratio <= upper)).to(log_ratio.dtype)


@register_rollout_correction("mask_seq_mean", per_token=False)
def mask_seq_mean(log_ratio: Tensor, mask: Tensor, *, max_kl: float = 0.01) -> Tensor:
    """1 on the rows whose mean per-token k3 divergence ``exp(l) - 1 - l`` is at most ``max_kl``, else 0.

    ``max_kl = 0.01`` is tether's default, not a published value: about a ratio of ``exp(+-0.14)`` on every
    token."""
    if max_kl <= 0:
        raise ValueError(f"max_kl must be > 0, got {max_kl}")
    safe = _safe(log_ratio)
    k3 = safe.exp() - 1.0 - safe
    keep = masked_mean(k3, mask, dim=-1) <= max_kl
    return keep[:, None].to(log_ratio.dtype).expand_as(log_ratio)


@register_rollout_correction("mask_geo_mean", per_token=False)
def mask_geo_mean(log_ratio: Tensor, mask: Tensor, *, lower: float | None = None, upper: float = 2.0) -> Tensor:
    """1 on the rows whose geometric-mean ratio ``exp(mean_t l_t)`` lies in ``[lower, upper]``, else 0."""
    lower, upper = _bounds(lower, upper)
    geo = _safe(masked_mean(log_ratio, mask, dim=-1)).exp()
    keep = (geo >= lower) & (geo <= upper)
    return keep[:, None].to(log_ratio.dtype).expand_as(log_ratio)


@register_rollout_correction("icepop", per_token=True)
def icepop(log_ratio: Tensor, mask: Tensor, *, lower: float = 0.5, upper: float = 5.0) -> Tensor:
    """The token's ratio where it lies in ``[lower, upper]``, 0 outside (IcePop's double-sided mask)."""
    lower, upper = _bounds(lower, upper)
    ratio = _safe(log_ratio).exp()
    return torch.where((ratio >= lower) & (ratio <= upper), ratio, torch.zeros_like(ratio))


@dataclass
class RolloutCorrection:
    """What a correction mode made of one micro-batch (all detached).

    Attributes:
        weights: the factor of each token's policy loss, 1 on tokens not corrected, 0 on dropped ones. [B, T]
        dropped: corrected tokens the mode gave weight 0. [B, T] bool
        effective_log_probs: the log-prob of the distribution the weighted loss corrects each kept token to: ``log
            mu + log w`` for per-token modes (``log pi_old`` where the weight is not truncated), ``log mu``
            otherwise. Health parity measures the gap left after correction with it. [B, T]
        metrics: ``rollout_corr/weight_mean`` and ``weight_max`` (over corrected tokens), ``masked_frac`` (share
            of corrected tokens dropped), ``kl_k1`` and ``kl_k3`` (estimates of ``KL(mu || pi_old)`` from the
            engine's samples: ``mean(-l)`` and ``mean(exp(l) - 1 - l)``), ``corrected_frac`` (share of response
            tokens the correction applies to).
        counts: the corrected tokens, for the metrics that are means over them (``LossOutput.counts``).
    """

    weights: Tensor
    dropped: Tensor
    effective_log_probs: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    counts: dict[str, Tensor] = field(default_factory=dict)


def rollout_correction(mode: str, old_log_probs: Tensor, behaviour_log_probs: Tensor, response_mask: Tensor,
                       corrected: Tensor, **bounds: float) -> RolloutCorrection:
    """The weights of correction ``mode`` for one micro-batch.

    Args:
        mode: a registered mode (:data:`ROLLOUT_CORRECTIONS`).
        old_log_probs: ``log pi_old(y_t)``. [B, T]
        behaviour_log_probs: ``log mu(y_t)``, what the engine recorded. [B, T]
        response_mask: 1 on response tokens. [B, T]
        corrected: the tokens to correct (a subset of the response tokens); the others keep weight 1. [B, T] bool
        bounds: the mode's keyword arguments (``cap``, ``lower``, ``upper``, ``max_kl``).

    Returns:
        A :class:`RolloutCorrection`.
    """
    fn = ROLLOUT_CORRECTIONS[mode]
    with torch.no_grad():
        mask = (corrected & (response_mask > 0)).to(old_log_probs.dtype)
        keep = mask > 0
        # where(), not a product: log mu may be junk (or -inf) on tokens that are not corrected
        log_ratio = torch.where(keep, old_log_probs - behaviour_log_probs, torch.zeros_like(old_log_probs))
        raw = fn(log_ratio, mask, **bounds)
        weights = torch.where(keep, raw, torch.ones_like(raw))
        dropped = keep & (weights == 0)
        effective = behaviour_log_probs
        if mode in PER_TOKEN:
            effective = torch.where(keep & ~dropped, behaviour_log_probs + weights.clamp(min=1e-30).log(), effective)
        safe = _safe(log_ratio)
        metrics = {
            "rollout_corr/weight_mean": masked_mean(weights, mask),
            "rollout_corr/weight_max": masked_max(weights, mask),
            "rollout_corr/masked_frac": masked_mean(dropped.to(mask.dtype), mask),
            "rollout_corr/kl_k1": masked_mean(-log_ratio, mask),
            "rollout_corr/kl_k3": masked_mean(safe.exp() - 1.0 - safe, mask),
            "rollout_corr/corrected_frac": masked_mean(mask, response_mask),
        }
        corrected_tokens = mask.sum()
        counts = {k: corrected_tokens for k in ("rollout_corr/weight_mean", "rollout_corr/masked_frac",
                                                "rollout_corr/kl_k1", "rollout_corr/kl_k3")}
        # a share of the response tokens: folded by them, not by the loss's (algorithm.mask_truncated drops rows)
        counts["rollout_corr/corrected_frac"] = response_mask.sum()
    return RolloutCorrection(weights=weights, dropped=dropped, effective_log_probs=effective, metrics=metrics,
                             counts=counts)
