"""The model-free pieces of a decoding loop, shared by the engines and by lock-step interventions (EAPO's prior):
the distribution a token is drawn from and the draw, left-padded prompt batches, the pad and EOS ids, the
bookkeeping of rows that leave the forward batch, and stop strings. The loop itself and the model's forward over a
KV cache are :mod:`tether.engine.hf`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tether.engine.base import SamplingParams


def process_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Log-probs of the distribution a token is sampled from: ``[N, V]`` float32, -inf on filtered tokens.

    Order as in Hugging Face: temperature, then top-k, then top-p (the smallest set of most likely
    tokens whose mass reaches ``top_p``). Greedy decoding ignores all three and returns the plain
    temperature-1 log-softmax.
    """
    logits = logits.float()
    if params.greedy:
        return F.log_softmax(logits, dim=-1)
    if params.temperature != 1.0:
        logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= params.top_p, float("-inf"))
        logits = sorted_logits.scatter(-1, order, sorted_logits)
    return F.log_softmax(logits, dim=-1)


def sample_tokens(log_probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row from ``exp(log_probs)`` by inverting the CDF (float64), ``[N, V] -> [N]``.

    Several times faster than ``torch.multinomial`` at a 49k vocabulary on CPU. Tokens of
    probability 0 (filtered by top-k / top-p) are never drawn.
    """
    u = torch.rand(log_probs.shape[0], 1, generator=generator, dtype=torch.float64, device=log_probs.device)
    return inverse_cdf_tokens(log_probs, u)


def inverse_cdf_tokens(log_probs: Tensor, u: Tensor) -> Tensor:
    """:func:`sample_tokens` with the uniform draws given: ``[N, V]``, ``[N, 1]`` float64 -> ``[N]``."""
    cdf = log_probs.exp().double().cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)


def choose_tokens(live_lp: Tensor, live: Tensor, n: int, params: SamplingParams, generator: torch.Generator) -> Tensor:
    """The policy's token of each row in the forward batch: argmax, or a draw.

    Every step draws one uniform for each of the N rows, finished or not, so which rows are still in
    the batch never shifts the random stream: a row's tokens do not depend on when others are dropped.
    """
    if params.greedy:
        return live_lp.argmax(-1)
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64, device=live_lp.device)
    return inverse_cdf_tokens(live_lp, u if len(live) == n else u[live])


def scatter_rows(x: Tensor, rows: Tensor, n: int, fill: float) -> Tensor:
    """``x`` holds rows ``rows`` of an ``n``-row tensor; the others get ``fill``."""
    if len(rows) == n:
        return x
    return x.new_full((n, *x.shape[1:]), fill).index_copy_(0, rows, x)


def fit_width(x: Tensor, width: int) -> Tensor:
    """Trim or right-pad (with zeros) the second dimension to ``width``."""
    if x.shape[1] >= width:
        return x[:, :width]
    return F.pad(x, (0, width - x.shape[1]))


def left_pad(prompt_ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``[pad ... pad prompt]`` rows: (input_ids, attention_mask long, position_ids), each ``[N, P]``."""
    lengths = torch.tensor([len(p) for p in prompt_ids], device=device)
    p_len = int(lengths.max())
    attention = (torch.arange(p_len, device=device)[None] >= (p_len - lengths)[:, None]).long()
    input_ids = torch.full((len(prompt_ids), p_len), pad_id, dtype=torch.long, device=device)
    input_ids[attention.bool()] = torch.tensor([t for p in prompt_ids for t in p], dtype=torch.long, device=device)
    return input_ids, attention, (attention.cumsum(1) - 1).clamp(min=0)


def pad_token_id(tokenizer: Any) -> int:
    """The id that pads responses: the tokenizer's pad token, else EOS, else 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad if pad is not None else 0)


def default_eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a response: the tokenizer's EOS and every EOS of the model's ``generation_config``."""
    eos = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return sorted(int(e) for e in eos)


def can_select_rows(cache: Any) -> bool:
    """Whether rows can be dropped from ``cache`` (a dynamic cache; a static one is allocated for good)."""
    from transformers import StaticCache

    return hasattr(cache, "batch_select_indices") and not isinstance(cache, StaticCache)


def stop_hits(tokenizer: Any, tokens: Tensor, t: int, active: Tensor, stop: Sequence[str]) -> Tensor:
    """Rows whose response now contains a stop string (decoded over a window of recent tokens)."""
    hits = torch.zeros_like(active)
    rows = active.nonzero().flatten().tolist()
    if not rows:
        return hits
    window = 4 * max(len(s) for s in stop) + 4  # a character can take up to 4 byte-level tokens
    texts = tokenizer.batch_decode(tokens[rows, max(0, t + 1 - window):t + 1].tolist(),
                                        skip_special_tokens=False)
    for row, text in zip(rows, texts, strict=True):
        hits[row] = any(s in text for s in stop)
    return hits

def response_texts(tokenizer: Any, tokens: Tensor, mask: Tensor, by_stop: Tensor,
               stop: Sequence[str]) -> list[str]:
    """Decoded responses without special tokens; a stopped row ends right after its stop string."""
    lengths = mask.sum(1).long().tolist()
    rows = [row[:k] for row, k in zip(tokens.tolist(), lengths, strict=True)]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    for i in by_stop.nonzero().flatten().tolist():
        ends = [texts[i].find(s) + len(s) for s in stop if s in texts[i]]
        if ends:
            texts[i] = texts[i][:min(ends)]
    return texts
