"""Log-probabilities of response tokens: the one forward pass behind scoring, old log-probs and the loss.

Layout: each row is ``[prompt | response]``, right-padded to the longest row, with position ids
counted from the attention mask. Only the hidden states of the T positions that predict response
tokens go through the LM head, in chunks; with autograd on, each chunk is checkpointed, so the
``[N, T, V]`` logits (196 KB per position at a 49k vocabulary) are never all held for backward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tether.algos.logprobs import token_log_probs

# Architectures whose logits are exactly ``lm_head(base_model(...).last_hidden_state)`` (no soft-capping,
# logit scaling or extra head): for these the LM head runs on response positions only.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "smollm3",
                                    "gpt2", "gpt_neox"})
# Attribute under which a sharded model carries its own (hooked) copy of plain_head_pass.
SHARDED_PASS = "tether_plain_head_pass"


def pack_prompt_response(prompt_ids: Sequence[Sequence[int]], response_ids: Tensor, response_mask: Tensor,
                         pad_id: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Right-padded ``[prompt | response]`` rows.

    Returns:
        input_ids ``[N, W]``, attention_mask ``[N, W]`` long, position_ids ``[N, W]``, and
        ``index [N, T]``: the column whose output predicts response token t (``len(prompt) - 1 + t``).
    """
    n, t = response_ids.shape
    if len(prompt_ids) != n:
        raise ValueError(f"{len(prompt_ids)} prompts for {n} responses")
    device = response_ids.device
    lengths = torch.tensor([len(p) for p in prompt_ids], device=device)
    if int(lengths.min()) < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lengths.max()) + t
    cols = torch.arange(width, device=device)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    prompt_part = cols[None] < lengths[:, None]
    flat = torch.tensor([tok for p in prompt_ids for tok in p], dtype=torch.long, device=device)
    input_ids[prompt_part] = flat
    index = lengths[:, None] - 1 + torch.arange(t, device=device)[None]  # [N, T]
    input_ids.scatter_(1, index + 1, response_ids.long())
    attention_mask = prompt_part.long()
    attention_mask.scatter_(1, index + 1, (response_mask > 0).long())
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, index


def _head_log_probs(head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float,
                    with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    return token_log_probs(head(hidden), targets, temperature=temperature, chunk_size=hidden.shape[1],
                           with_entropy=with_entropy)


def plain_head_pass(model: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, index: Tensor,
                    targets: Tensor, temperature: float, with_entropy: bool,
                    chunk_size: int) -> tuple[Tensor, Tensor | None]:
    """The decoder over the packed rows, then the LM head on response positions only, chunk by chunk.

    Returns:
        (log_probs ``[N, T]``, entropy ``[N, T]`` or None), not yet masked.
    """
    base = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    hidden = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False).last_hidden_state
    hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # [N, T, H]
    lps, ents = [], []
    for s in range(0, hidden.shape[1], chunk_size):
        chunk = slice(s, s + chunk_size)
        args = (head, hidden[:, chunk], targets[:, chunk], temperature, with_entropy)
        if torch.is_grad_enabled() and hidden.requires_grad:
            lp, ent = checkpoint(_head_log_probs, *args, use_reentrant=False)
        else:
            lp, ent = _head_log_probs(*args)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps, dim=1), (torch.cat(ents, dim=1) if with_entropy else None)


def response_log_probs(model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Tensor,
                       response_mask: Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                       chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | x, y_<t) / temperature-softmax for each response token, with autograd if it is on.

    Args:
        model: a Hugging Face causal LM (any; architectures in :data:`PLAIN_HEAD_MODEL_TYPES` skip the
            LM head on prompt positions).
        prompt_ids: unpadded prompt ids per row.
        response_ids: ``[N, T]`` response tokens, right-padded.
        response_mask: ``[N, T]``, 1 on response tokens (a prefix of each row).
        temperature: divides the logits, so the log-probs are those of the sampling distribution.
        with_entropy: also return the entropy of each position's distribution.
        chunk_size: response positions per LM-head chunk.

    Returns:
        (log_probs ``[N, T]``, entropy ``[N, T]`` or None), float32 (float64 for a float64 model),
        zero where ``response_mask`` is 0.
    """
    device = next(model.parameters()).device
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    if response_ids.shape[1] == 0:
        empty = torch.zeros(response_ids.shape, device=device)
        return empty, (empty.clone() if with_entropy else None)
    input_ids, attention_mask, position_ids, index = pack_prompt_response(prompt_ids, response_ids,
                                                                          response_mask)
    targets = response_ids.long()
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings()
    plain = getattr(model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
    if plain and base is not None and head is not None:
        # A sharded model carries this pass as one of its registered forward methods (see
        # tether.distributed.fsdp): the root's gather and gradient-reduce hooks must wrap it as they wrap model(...).
        run = getattr(model, SHARDED_PASS, None) or functools.partial(plain_head_pass, model)
        log_probs, entropy = run(input_ids, attention_mask, position_ids, index, targets, temperature, with_entropy,
                                 chunk_size)
    else:  # unknown architecture: full logits, whatever the model does after its head
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits
        logits = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
        log_probs, entropy = token_log_probs(logits, targets, temperature=temperature, chunk_size=chunk_size,
                                             with_entropy=with_entropy)
    mask = response_mask > 0
    log_probs = log_probs.masked_fill(~mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~mask, 0.0)
    return log_probs, entropy
