"""EAPO's gate and mixture: the math of the prior injection (``tether.methods.eapo``), pure functions of the two
next-token distributions.

At a decoding step, with ``p`` the policy's and ``q`` the prior's processed next-token distribution
(log-probabilities ``[N, V]``), the gate statistic says how much they disagree (:func:`gate_statistic`), and a gated
token is drawn from the mixture ``(1 - lambda) p + lambda q`` (:func:`mixture_log_probs`), ``lambda`` on its
schedule (:func:`scheduled_lambda`). The loss that corrects for the mixture is ``tether.algos.eapo_loss``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LN2 = math.log(2.0)  # the largest JS divergence, in nats
GATES = ("js", "entropy", "max_log_ratio")


def _plogp_terms(log_a: Tensor, log_b: Tensor) -> Tensor:
    """``sum_v a_v (log a_v - log b_v)`` per row, with ``0 log 0 = 0``. [N]"""
    terms = torch.where(torch.isfinite(log_a), log_a.exp() * (log_a - log_b), torch.zeros_like(log_a))
    return terms.sum(-1)


def js_divergence(policy_log_probs: Tensor, prior_log_probs: Tensor) -> Tensor:
    """Jensen-Shannon divergence ``JS(p, q)`` per row in nats, in ``[0, ln 2]``. Inputs ``[N, V]``."""
    log_m = torch.logaddexp(policy_log_probs, prior_log_probs) - LN2
    js = 0.5 * _plogp_terms(policy_log_probs, log_m) + 0.5 * _plogp_terms(prior_log_probs, log_m)
    return js.clamp(0.0, LN2)


def gate_statistic(kind: str, policy_log_probs: Tensor, prior_log_probs: Tensor) -> Tensor:
    """The critical-point statistic of each row from the two next-token distributions only. [N]

    * ``js``: ``JS(p, q)`` (the distributional disagreement of the "Sparse but Critical" line of work);
    * ``entropy``: ``H(p)`` of the policy (MENTOR's gate; the prior is not consulted);
    * ``max_log_ratio``: ``max_v |log q_v - log p_v|`` over the tokens both distributions allow
      (``inf`` if they share none). Tail tokens dominate it; see docs/methods/eapo.md.
    """
    dtype = torch.promote_types(policy_log_probs.dtype, prior_log_probs.dtype)
    dtype = torch.promote_types(dtype, torch.float32)  # at least float32
    p, q = policy_log_probs.to(dtype), prior_log_probs.to(dtype)
    if kind == "js":
        return js_divergence(p, q)
    if kind == "entropy":
        return -torch.where(torch.isfinite(p), p.exp() * p, torch.zeros_like(p)).sum(-1)
    if kind == "max_log_ratio":
        both = torch.isfinite(p) & torch.isfinite(q)
        ratio = torch.where(both, (q - p).abs(), torch.zeros_like(p)).amax(-1)
        return ratio.where(both.any(-1), torch.full_like(ratio, math.inf))
    raise ValueError(f"eapo gate must be one of {', '.join(GATES)}; got '{kind}'")


def mixture_log_probs(policy_log_probs: Tensor, prior_log_probs: Tensor, mix_lambda: float) -> Tensor:
    """``log((1 - lambda) p + lambda q)``, elementwise over ``[N, V]``; exactly ``log q`` at lambda = 1."""
    if mix_lambda >= 1.0:
        return prior_log_probs
    if mix_lambda <= 0.0:
        return policy_log_probs
    return torch.logaddexp(policy_log_probs + math.log1p(-mix_lambda), prior_log_probs + math.log(mix_lambda))


def scheduled_lambda(mix_lambda: float, schedule: str, step: int, decay_steps: int) -> float:
    """``lambda`` at RL step ``step`` (0-based): constant, or cosine from ``mix_lambda`` down to 0.

    Cosine: ``lambda_s = mix_lambda * (1 + cos(pi * min(s, N) / N)) / 2`` (MENTOR's expert-weight decay).
    """
    if schedule == "constant":
        return mix_lambda
    if schedule == "cosine":
        return mix_lambda * 0.5 * (1.0 + math.cos(math.pi * min(step, decay_steps) / decay_steps))
    raise ValueError(f"eapo schedule must be 'constant' or 'cosine'; got '{schedule}'")
