"""Log-probabilities and entropies of target tokens from logits, chunked over the sequence.

A 49k vocabulary at float32 costs 196 KB per position; a full ``log_softmax`` over ``[B, T, V]``
doubles the logits' memory. Chunking over T keeps the extra memory at ``B * chunk * V``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_log_probs(logits: Tensor, targets: Tensor, *, temperature: float = 1.0, chunk_size: int = 128,
                    with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits / temperature)[targets], and optionally the entropy of that distribution.

    Args:
        logits: ``[B, T, V]`` (any float dtype; computed in float32 or higher).
        targets: ``[B, T]`` token ids.
        temperature: the sampling temperature, so the log-probs are those of the sampled distribution.
        chunk_size: positions per chunk along T.
        with_entropy: also return the per-position entropy ``[B, T]``.

    Returns:
        (log_probs ``[B, T]``, entropy ``[B, T]`` or None), in float32 (float64 if logits are float64).
    """
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         "disagree on [B, T]")
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out_lp, out_ent = [], []
    for start in range(0, logits.shape[1], chunk_size):
        block = logits[:, start:start + chunk_size].to(dtype)
        if temperature != 1.0:
            block = block / temperature
        log_p = block.log_softmax(-1)
        out_lp.append(log_p.gather(-1, targets[:, start:start + chunk_size, None]).squeeze(-1))
        if with_entropy:  # -sum p log p, as tether.models.head computes it; 0 log 0 = 0 for masked (-inf) logits
            out_ent.append(-(log_p.exp() * log_p.masked_fill(log_p.isneginf(), 0.0)).sum(-1))
    log_probs = torch.cat(out_lp, dim=1)
    entropy = torch.cat(out_ent, dim=1) if with_entropy else None
    return log_probs, entropy
