"""The LM head's log-probabilities of target tokens, with a backward written from the softmax.

``log softmax((hidden @ weight.T + bias) / T)[target]`` and the entropy of that distribution, for one chunk of
response tokens (:func:`tether.models.forward.head_log_probs` cuts them). Autograd through ``linear``,
``logsumexp``, ``gather`` and the entropy's ``softmax`` keeps or remakes several ``[tokens, vocab]`` tensors and
walks each of them a few times; here the gradient of the logits comes straight from the log-probabilities:

    d lp_t / d z_t   = onehot(target_t) - p_t
    d H_t / d z_t    = -p_t * (log p_t + H_t)

(``z`` the logits divided by ``T``, ``p = softmax(z)``). Backward either reuses the log-probabilities kept from
forward (``keep_logits``: ``tokens x vocab`` floats more memory, one matmul less) or recomputes them from the saved
hidden states, as checkpointing the chunk did before. At the quickstart's 768 response tokens and SmolLM2's 49k
vocabulary the head's forward and backward take 1.14 s kept and 1.56 s recomputed, against 1.86 s through autograd
with the chunk checkpointed (2 threads; docs/benchmarks.md, 2026-12-07).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The matmul's dtype: autocast's where it is on (what ``F.linear`` would run in: autocast leaves float64
    alone), else the weight's."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and torch.float64 not in (hidden.dtype, weight.dtype):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def _log_softmax(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float,
                 compute: torch.dtype) -> Tensor:
    """``log softmax((hidden @ weight.T + bias) / temperature)``, ``[M, V]``, float32 (float64 for float64)."""
    with torch.autocast(hidden.device.type, enabled=False):
        logits = F.linear(hidden.to(compute), weight.to(compute), None if bias is None else bias.to(compute))
    out = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(out)
    if temperature != 1.0:
        logits = logits.div_(temperature)
    return logits.log_softmax(-1)


class _LinearLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                with_entropy: bool, keep_logits: bool) -> tuple[Tensor, Tensor | None]:
        compute = _compute_dtype(hidden, weight)
        log_p = _log_softmax(hidden, weight, bias, temperature, compute)
        log_probs = log_p.gather(-1, targets[:, None]).squeeze(-1)
        entropy = log_p.exp().mul_(log_p).sum(-1).neg_() if with_entropy else None
        ctx.set_materialize_grads(False)  # an output the loss does not use (entropy as a metric) costs nothing
        ctx.save_for_backward(hidden, weight, bias, targets, log_p if keep_logits else None, entropy)
        ctx.temperature, ctx.compute = temperature, compute
        return log_probs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kept log-probabilities carry no graph
    def backward(ctx: Any, grad_log_probs: Tensor | None,
                 grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, log_p, entropy = ctx.saved_tensors
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None, None, None
        recomputed = log_p is None
        if recomputed:  # the chunk's logits were not kept: made again, and this backward's own to overwrite
            log_p = _log_softmax(hidden, weight, bias, ctx.temperature, ctx.compute)
        p = log_p.exp()
        grad = None
        if grad_entropy is not None:  # -g_H * p * (log p + H); the kept log_p is autograd's, not overwritten
            grad = (log_p.add_(entropy[:, None]) if recomputed else log_p + entropy[:, None])
            grad = grad.mul_(p).mul_(-grad_entropy[:, None])
        if grad_log_probs is not None:  # g_lp * (onehot - p)
            minus_p = p.mul_(-grad_log_probs[:, None])
            grad = minus_p if grad is None else grad.add_(minus_p)
            grad.scatter_add_(-1, targets[:, None], grad_log_probs[:, None].to(grad.dtype))
        if ctx.temperature != 1.0:
            grad = grad.div_(ctx.temperature)
        grad = grad.to(ctx.compute)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        with torch.autocast(hidden.device.type, enabled=False):
            grad_hidden = (grad @ weight.to(ctx.compute)).to(hidden.dtype) if need_hidden else None
            grad_weight = (grad.t() @ hidden.to(ctx.compute)).to(weight.dtype) if need_weight else None
        grad_bias = grad.sum(0).to(bias.dtype) if need_bias else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def linear_log_probs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                     temperature: float = 1.0, with_entropy: bool = False,
                     keep_logits: bool = False) -> tuple[Tensor, Tensor | None]:
    """log-probs of ``targets`` under ``softmax((hidden @ weight.T + bias) / temperature)``, and its entropies.

    Args:
        hidden: ``[M, H]`` hidden states (one per target).
        weight, bias: the LM head's, ``[V, H]`` and ``[V]`` or None.
        targets: ``[M]`` token ids.
        temperature: divides the logits (the sampling distribution's log-probs).
        with_entropy: also return each position's entropy.
        keep_logits: keep the ``[M, V]`` log-probabilities for backward (faster) instead of recomputing them from
            ``hidden`` (less memory).

    Returns:
        (log_probs ``[M]``, entropy ``[M]`` or None), float32 (float64 for a float64 head); differentiable in
        ``hidden``, ``weight`` and ``bias``, under autocast computed as ``F.linear`` would be.
    """
    return _LinearLogProbs.apply(hidden, weight, bias, targets, temperature, with_entropy, keep_logits)
