"""On-policy distillation terms: SEED's gated loss and plain per-token reverse-KL distillation.

Both score the tokens the student sampled under a teacher (for SEED, the same model with a hindsight
skill in its context), so no teacher sampling is needed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tether.algos.aggregation import aggregate, masked_mean
from tether.algos.types import LossOutput


def seed_opd_loss(log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor, *, beta: float = 5.0,
                  num_active_tokens: float | Tensor | None = None) -> LossOutput:
    """SEED's gated on-policy distillation loss (Wu et al., arXiv:2607.14777; code ``compute_opd_loss``).

    ``delta = sg(l_T - l)``, ``g = sigmoid(beta * delta)`` (no gradient),
    ``L = sum(m * g * (sg(l_T) - l)) / sum(m)``, and ``L = 0`` with zero gradient when ``sum(m) = 0``
    (seed.md Sec. 1.2(D)). The gradient on ``l`` is ``-g m / sum(m)``: a gate-weighted NLL that always
    pushes sampled tokens up, most where the skill context raised their probability.

    Args:
        log_probs: ``[B, T]`` student log-probs ``l``, with gradient.
        teacher_log_probs: ``[B, T]`` ``l_T``, the same tokens under the skill-augmented context
            (computed with the pre-update weights, as the SEED code does).
        mask: ``[B, T]`` ``m`` = response mask times the row's teacher-signal mask (1 iff its analysis
            produced a skill).
        beta: gate sharpness (SEED ``opd_gate_beta`` 5.0).
        num_active_tokens: optional global ``sum(m)`` of the mini-batch, so micro-batch losses sum to the
            full-batch loss; None divides by this call's ``sum(m)`` as the SEED code does.

    Returns:
        ``LossOutput`` with metrics ``seed/opd_delta_mean`` (mean ``delta``), ``seed/opd_gate_mean``,
        ``seed/opd_gate_active_ratio`` (fraction of active tokens the skill raised, ``g > 0.5``) and
        ``seed/opd_active_token_ratio`` (fraction of all ``[B, T]`` positions with ``m > 0``), each with its units
        (active tokens, positions) in ``counts``; all 0 if nothing is active.
    """
    teacher = teacher_log_probs.detach()
    with torch.no_grad():
        delta = teacher - log_probs
        gate = torch.sigmoid(beta * delta)
    per_token = gate * (teacher - log_probs)
    if num_active_tokens is None:
        loss = aggregate(per_token, mask, "token-mean")
    else:
        loss = aggregate(per_token, mask, "token-mean", num_tokens=num_active_tokens)
    metrics = {
        "seed/opd_delta_mean": masked_mean(delta, mask),
        "seed/opd_gate_mean": masked_mean(gate, mask),
        "seed/opd_gate_active_ratio": masked_mean((gate > 0.5).to(mask.dtype), mask),
        "seed/opd_active_token_ratio": (mask > 0).to(log_probs.dtype).mean(),
    }
    active = mask.sum()
    counts = {"seed/opd_delta_mean": active, "seed/opd_gate_mean": active, "seed/opd_gate_active_ratio": active,
              "seed/opd_active_token_ratio": mask.new_tensor(mask.numel())}
    return LossOutput(loss, metrics, counts)


def opd_advantages(log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Per-token advantage of plain on-policy distillation: ``sg(log pi_T - log pi_theta)``.

    Its negation is the k1 estimate of the per-token reverse KL ``KL(pi_theta || pi_T)`` on the
    student's own samples (Agarwal et al., arXiv:2306.13649; Thinking Machines, "On-Policy
    Distillation", 2025), so a policy-gradient step with it minimises that reverse KL. Use it in
    ``LossInputs.advantages`` (with any policy loss), or through :func:`opd_loss`.
    """
    return (teacher_log_probs - log_probs).detach()


def opd_loss(log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor, *, agg: str = "token-mean",
             num_tokens: float | Tensor | None = None, num_seqs: float | Tensor | None = None,
             max_response_len: float | Tensor | None = None) -> LossOutput:
    """Plain on-policy distillation: REINFORCE on :func:`opd_advantages`, aggregated with ``agg``.

    Per token ``-A * exp(l - sg(l))``: its value is ``-A = l - l_T`` (so the loss reads as the reverse
    KL estimate) and its gradient ``-A grad l``, the score-function gradient of the reverse KL.

    Returns:
        ``LossOutput`` with ``opd/reverse_kl`` (mean of ``l - l_T`` over ``mask``, its units in ``counts``).
    """
    adv = opd_advantages(log_probs, teacher_log_probs)
    per_token = -adv * (log_probs - log_probs.detach()).exp()
    loss = aggregate(per_token, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_response_len=max_response_len)
    return LossOutput(loss, {"opd/reverse_kl": masked_mean(-adv, mask)}, {"opd/reverse_kl": mask.sum()})
