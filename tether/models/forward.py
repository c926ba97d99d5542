"""Log-probabilities of response tokens: the one forward pass behind scoring, old log-probs and the loss.

Layout where rows are not packed (below): each row is ``[prompt | response]``, right-padded to the longest
row, with position ids counted from the attention mask. Only the hidden states that predict real response
tokens (padding left out) go through the LM head, in chunks of ``chunk_size`` tokens across rows
(``train.logprob_chunk_tokens``), each with a backward written from the softmax (:mod:`tether.models.head`).
Under autograd a chunk either recomputes its logits in backward, so at most one chunk's ``[chunk, V]`` logits
exist at a time whatever the rows and the response length (196 KB per token at a 49k vocabulary: 1,024 tokens
are 201 MB, a 16 x 256 micro-batch's full logits 805 MB), or keeps them, one matmul less (``keep_head_logits``:
the trainer keeps them where memory allows, docs/design.md).

Rows that share a prompt (a GRPO group: n samples of one prompt) run packed: the prompt once, then each
response's tokens, in one sequence whose 4D mask lets each response see the prompt and its own earlier
tokens at the positions it would have alone (:func:`pack_rows`). The result is the same function of the
weights as one unpadded row at a time, with no padding between responses and no prompt recomputed: about
30% less decoder work than right-padded rows at the quickstart's lengths (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tether.algos.logprobs import token_log_probs
from tether.models.head import linear_log_probs
from tether.models.lora import BaseModelView
from tether.models.vision import check_vision_model, has_images, vision_logits

# Architectures whose logits are exactly ``lm_head(base_model(...).last_hidden_state)`` (no soft-capping,
# logit scaling or extra head): for these the LM head runs on response positions only.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "smollm3",
                                    "gpt2", "gpt_neox"})
# Attribute under which a sharded model carries its own (hooked) copy of plain_head_pass.
SHARDED_PASS = "tether_plain_head_pass"


def autocast(device: torch.device | str, enabled: bool) -> contextlib.AbstractContextManager:
    """``model.bf16_autocast``'s precision for forward passes on ``device``: bfloat16 autocast when ``enabled``, else
    nothing (the caller's own precision). The trainer's passes, the SFT loop's and the in-process engine's decoding
    all take it from here, so the engine samples in the precision the trainer scores in (health's parity compares
    the two)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


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


def model_cache_kwarg(model: Any) -> str:
    """The keyword a Hugging Face model's forward takes its KV cache by (renamed in transformers 5)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_kv_cache(config: Any) -> Any:
    """An empty dynamic KV cache for a model with this config."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


def distinct_prompts(prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """(the distinct prompts in first-seen order, the index of each row's prompt among them).

    Visual prompts are the same only with the same pixels (their ``pixels_key``): image tokens are
    placeholders, equal for any two images of one size.
    """
    first_seen: dict[tuple[Any, ...], int] = {}
    unique: list[list[int]] = []
    inverse = []
    for p in prompt_ids:
        key = (tuple(p), getattr(p, "pixels_key", None))
        if key not in first_seen:
            first_seen[key] = len(unique)
            unique.append(list(p))
        inverse.append(first_seen[key])
    return unique, inverse


# Longest packed row (tokens) that rows sharing a prompt fill before the next row repeats the prompt: a packed row
# attends densely over its width, so wider rows trade padding saved for attention spent on masked pairs.
PACK_TOKENS = 512


def _attention(model: Any) -> str:
    """The attention kernel a Hugging Face model runs (``config._attn_implementation``; eager when unset)."""
    return getattr(model.config, "_attn_implementation", None) or "eager"


def _can_pack(model: Any) -> bool:
    # A packed row needs a 4D mask: the eager and SDPA kernels take one, varlen flash-attention does not.
    return _attention(model) in ("eager", "sdpa")


def _prefix_masks(response_mask: Tensor) -> bool:
    """Whether each row's response tokens are a prefix of it (ones, then zeros): :func:`pack_rows` reads a row's
    tokens from its mask's sum. A mask with a hole (a token dropped mid-response) runs right-padded instead, where
    the attention mask leaves the hole out."""
    real = response_mask > 0
    return not bool((real[:, 1:] & ~real[:, :-1]).any())


@dataclass
class PackedRows:
    """Rows that share a prompt, packed into one sequence each: ``[prompt | y_a[:-1] | y_b[:-1] | ...]``.

    Each response sees the prompt and its own earlier tokens (``allowed``) at the positions it would have alone
    (``len(prompt) + t``), so its hidden states are those of the unpacked row, with no padding between responses
    and the prompt run once per packed row.
    """

    input_ids: Tensor  # [R, W]
    position_ids: Tensor  # [R, W]
    allowed: Tensor  # [R, W, W] bool: query column i may attend key column j
    row: Tensor  # [N, T] the packed row whose hidden state predicts response token t of row n
    col: Tensor  # [N, T] and its column (the prompt's last token for t = 0); 0 on padding


def _pack_plan(prompt_ids: Sequence[Sequence[int]], lengths: Sequence[int],
               capacity: int) -> tuple[list[list[int]], list[tuple[int, list[int]]], list[int]]:
    """(the distinct prompts, each packed row's distinct prompt and member rows, each packed row's tokens) for rows
    of ``lengths`` response tokens: a prompt's rows fill a packed row up to ``capacity``, then open another."""
    unique, inverse = distinct_prompts(prompt_ids)
    packed: list[tuple[int, list[int]]] = []
    open_row: dict[int, int] = {}  # distinct prompt -> its packed row being filled
    size: list[int] = []
    for n, u in enumerate(inverse):
        need = max(lengths[n] - 1, 0)
        r = open_row.get(u)
        if r is None or size[r] + need > capacity:
            r = open_row[u] = len(packed)
            packed.append((u, []))
            size.append(len(unique[u]))
        packed[r][1].append(n)
        size[r] += need
    return unique, packed, size


def pack_rows(prompt_ids: Sequence[Sequence[int]], response_ids: Tensor, response_mask: Tensor,
              capacity: int = PACK_TOKENS) -> PackedRows:
    """Rows grouped by distinct prompt (:func:`distinct_prompts`), each group packed into rows of at most
    ``capacity`` tokens (a longer single row stands alone); each response feeds all but its last real token.
    Each row's mask must be a prefix (:func:`_prefix_masks`)."""
    lengths = (response_mask > 0).sum(1).tolist()
    unique, packed, size = _pack_plan(prompt_ids, lengths, capacity)
    n_rows, t = response_ids.shape
    device = response_ids.device
    width = max(size)
    input_ids = torch.zeros(len(packed), width, dtype=torch.long, device=device)
    position_ids = torch.zeros(len(packed), width, dtype=torch.long, device=device)
    owner = torch.full((len(packed), width), -2, dtype=torch.long, device=device)  # -1 prompt, -2 padding
    row = torch.zeros(n_rows, t, dtype=torch.long, device=device)
    col = torch.zeros(n_rows, t, dtype=torch.long, device=device)
    for r, (u, members) in enumerate(packed):
        p = len(unique[u])
        input_ids[r, :p] = torch.tensor(unique[u], device=device)
        position_ids[r, :p] = torch.arange(p, device=device)
        owner[r, :p] = -1
        start = p
        for n in members:
            fed = max(lengths[n] - 1, 0)
            input_ids[r, start:start + fed] = response_ids[n, :fed]
            position_ids[r, start:start + fed] = torch.arange(p, p + fed, device=device)
            owner[r, start:start + fed] = n
            row[n] = r
            col[n, 0] = p - 1
            col[n, 1:fed + 1] = torch.arange(start, start + fed, device=device)
            start += fed
    # a query sees the prompt and its own response's earlier tokens (padding, owned by no row, sees padding: no
    # query is left without a key, and no real one sees it)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = causal & ((owner[:, None, :] == -1) | (owner[:, None, :] == owner[:, :, None]))  # [R, query, key]
    return PackedRows(input_ids, position_ids, allowed, row, col)


def _packs(model: Any, prompt_ids: Sequence[Sequence[int]], response_mask: Tensor) -> bool:
    """Whether :func:`response_log_probs` runs these rows packed (with ``pack=True``)."""
    plain = getattr(model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES and not has_images(prompt_ids)
    return plain and _can_pack(model) and _prefix_masks(response_mask)


def decoder_tokens(model: Any, prompt_ids: Sequence[Sequence[int]], response_mask: Tensor) -> int:
    """Tokens, padding included, that the decoder runs in a trainer forward over these rows: the packed rows'
    (:func:`pack_rows`) where they pack, else ``rows x (longest prompt + response columns)``. Activation memory
    grows with it (``train.gradient_checkpointing: auto`` estimates from it)."""
    if _packs(model, prompt_ids, response_mask):
        _, packed, size = _pack_plan(prompt_ids, (response_mask > 0).sum(1).tolist(), PACK_TOKENS)
        return len(packed) * max(size)
    return len(prompt_ids) * (max(len(p) for p in prompt_ids) + response_mask.shape[1])


def _packed_hidden(base: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Tensor,
                   response_mask: Tensor) -> Tensor:
    """Hidden states ``[N, T, H]`` that predict each response token, from one pass over :func:`pack_rows`."""
    packed = pack_rows(prompt_ids, response_ids, response_mask)
    mask = packed.allowed[:, None]
    if _attention(base) == "eager":  # eager adds its mask
        dtype = next(base.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    hidden = base(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                  use_cache=False).last_hidden_state
    return hidden[packed.row, packed.col]


def _head_log_probs(head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float,
                    with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """log-probs (and entropies) of ``targets [M]`` from ``hidden [M, H]``: one chunk's logits, ``[1, M, V]``."""
    lp, ent = token_log_probs(head(hidden[None]), targets[None], temperature=temperature, chunk_size=hidden.shape[0],
                              with_entropy=with_entropy)
    return lp[0], (ent[0] if ent is not None else None)


_LINEAR_FORWARD = torch.nn.Linear.forward
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _plain_linear_head(head: torch.nn.Module) -> bool:
    """Whether the head is an ``nn.Linear`` that nothing hooks, wraps or quantises:
    :func:`~tether.models.head.linear_log_probs` reads its weight without calling it, so a hook or a replaced
    ``forward`` would not run (such heads are called, in a checkpointed chunk)."""
    module_hooks = (head._forward_hooks, head._forward_pre_hooks, head._backward_hooks, head._backward_pre_hooks)
    # every module's hooks (register_module_forward_hook and the like); a torch without these names: not plain
    global_hooks = (getattr(torch.nn.modules.module, name, True) for name in _GLOBAL_HOOKS)
    return (type(head) is torch.nn.Linear and torch.nn.Linear.forward is _LINEAR_FORWARD
            and "forward" not in vars(head) and type(head.weight.data) is torch.Tensor
            and not any(module_hooks) and not any(global_hooks))


def _plain_head_pass(model: Any, images: bool) -> bool:
    """Whether :func:`response_log_probs` runs the decoder and then the head on response tokens only
    (:func:`plain_head_pass`), rather than the model's own forward over full logits; ``images``: whether the
    prompts carry pixels (:func:`~tether.models.vision.has_images`)."""
    plain_type = getattr(model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    return plain_type and not images and base is not None and model.get_output_embeddings() is not None


def head_logits_can_be_kept(model: Any, prompt_ids: Sequence[Sequence[int]]) -> bool:
    """Whether ``response_log_probs(..., keep_head_logits=True)`` keeps the head's logits for ``model`` and these
    prompts: the plain-head pass with a plain ``nn.Linear`` head (others ignore the flag)."""
    if isinstance(model, BaseModelView):
        model = model.policy
    return _plain_head_pass(model, has_images(prompt_ids)) and _plain_linear_head(model.get_output_embeddings())


def head_log_probs(head: torch.nn.Module, hidden: Tensor, targets: Tensor, response_mask: Tensor, *,
                   temperature: float, with_entropy: bool, chunk_size: int,
                   keep_logits: bool = False) -> tuple[Tensor, Tensor | None]:
    """The LM head over the real response tokens only, ``chunk_size`` tokens at a time.

    Args:
        head: the LM head (``model.get_output_embeddings()``).
        hidden: the hidden states that predict each response token. [N, T, H]
        targets: the response tokens. [N, T]
        response_mask: 1 on real response tokens; the others never reach the head and get 0. [N, T]
        temperature, with_entropy: as :func:`~tether.algos.logprobs.token_log_probs`.
        chunk_size: tokens (across rows) per LM-head call.
        keep_logits: under autograd, keep each chunk's ``[chunk, V]`` log-probabilities for backward instead of
            recomputing them there (:func:`~tether.models.head.linear_log_probs`); the trainer keeps them where
            memory allows (``train.gradient_checkpointing``, docs/design.md).

    Returns:
        (log_probs ``[N, T]``, entropy ``[N, T]`` or None), 0 where ``response_mask`` is 0.
    """
    keep = response_mask > 0
    if not bool(keep.any()):  # still one call of the head, so a lock-step pass has a graph to run backward through
        keep = torch.zeros_like(keep)
        keep[0, 0] = True
    flat_hidden, flat_targets = hidden[keep], targets[keep]  # [M, H], [M], row-major: masked_scatter's order
    plain = _plain_linear_head(head)
    lps, ents = [], []
    for s in range(0, flat_hidden.shape[0], chunk_size):
        chunk_hidden, chunk_targets = flat_hidden[s:s + chunk_size], flat_targets[s:s + chunk_size]
        if plain:
            lp, ent = linear_log_probs(chunk_hidden, head.weight, head.bias, chunk_targets, temperature=temperature,
                                       with_entropy=with_entropy, keep_logits=keep_logits)
        elif torch.is_grad_enabled() and flat_hidden.requires_grad:
            lp, ent = checkpoint(_head_log_probs, head, chunk_hidden, chunk_targets, temperature, with_entropy,
                                 use_reentrant=False)
        else:
            lp, ent = _head_log_probs(head, chunk_hidden, chunk_targets, temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    flat_lp = torch.cat(lps)
    log_probs = flat_lp.new_zeros(keep.shape).masked_scatter(keep, flat_lp)
    entropy = flat_lp.new_zeros(keep.shape).masked_scatter(keep, torch.cat(ents)) if with_entropy else None
    return log_probs, entropy


def plain_head_pass(model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Tensor, response_mask: Tensor,
                    temperature: float, with_entropy: bool, chunk_size: int, pack: bool,
                    keep_logits: bool) -> tuple[Tensor, Tensor | None]:
    """The decoder over the rows packed by prompt (:func:`pack_rows`), or over the right-padded rows, then the LM
    head on the real response tokens only, ``chunk_size`` tokens at a time (:func:`head_log_probs`).

    Returns:
        (log_probs ``[N, T]``, entropy ``[N, T]`` or None), 0 off the response.
    """
    base = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    if pack and _packs(model, prompt_ids, response_mask):
        hidden = _packed_hidden(base, prompt_ids, response_ids, response_mask)
    else:
        input_ids, attention_mask, position_ids, index = pack_prompt_response(prompt_ids, response_ids, response_mask)
        hidden = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # [N, T, H]
    return head_log_probs(head, hidden, response_ids.long(), response_mask, temperature=temperature,
                          with_entropy=with_entropy, chunk_size=chunk_size, keep_logits=keep_logits)


def response_log_probs(model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Tensor,
                       response_mask: Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                       chunk_size: int = 1024, pack: bool = True,
                       keep_head_logits: bool = False) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | x, y_<t) / temperature-softmax for each response token, with autograd if it is on.

    Args:
        model: a Hugging Face causal LM (any; architectures in :data:`PLAIN_HEAD_MODEL_TYPES` skip the
            LM head on prompt positions), or a vision-language model.
        prompt_ids: unpadded prompt ids per row; :class:`~tether.models.vision.VisionPrompt` rows add their
            pixel inputs (and a model without a vision tower is a ValueError).
        response_ids: ``[N, T]`` response tokens, right-padded.
        response_mask: ``[N, T]``, 1 on response tokens (a prefix of each row).
        temperature: divides the logits, so the log-probs are those of the sampling distribution.
        with_entropy: also return the entropy of each position's distribution.
        chunk_size: response tokens (across rows) per LM-head call, the largest logits tensor of the pass
            (``train.logprob_chunk_tokens``); positions per chunk on the full-logits path below.
        pack: run the rows that share a prompt as one packed sequence each, without padding
            (:func:`pack_rows`; plain-head architectures with eager or SDPA attention and prefix masks,
            otherwise ignored);
            False: right-padded rows (:func:`pack_prompt_response`).
        keep_head_logits: under autograd, keep the LM head's log-probabilities for backward instead of
            recomputing them (:func:`head_log_probs`; plain-head architectures): one matmul less, ``tokens x V``
            floats more.

    Returns:
        (log_probs ``[N, T]``, entropy ``[N, T]`` or None), float32 (float64 for a float64 model),
        zero where ``response_mask`` is 0.
    """
    if isinstance(model, BaseModelView):  # a LoRA policy's reference: the pass below reaches past model(...)
        with model.active():
            return response_log_probs(model.policy, prompt_ids, response_ids, response_mask, temperature=temperature,
                                      with_entropy=with_entropy, chunk_size=chunk_size, pack=pack,
                                      keep_head_logits=keep_head_logits)
    device = next(model.parameters()).device
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    if response_ids.shape[1] == 0:
        empty = torch.zeros(response_ids.shape, device=device)
        return empty, (empty.clone() if with_entropy else None)
    if len(prompt_ids) != response_ids.shape[0]:
        raise ValueError(f"{len(prompt_ids)} prompts for {response_ids.shape[0]} responses")
    images = has_images(prompt_ids)
    if images:
        check_vision_model(model)
    if _plain_head_pass(model, images):
        # A sharded model carries this pass as one of its registered forward methods (see
        # tether.distributed.fsdp): the root's gather and gradient-reduce hooks must wrap it as they wrap model(...).
        sharded = getattr(model, SHARDED_PASS, None)
        run = sharded or functools.partial(plain_head_pass, model)
        log_probs, entropy = run(prompt_ids, response_ids, response_mask, temperature, with_entropy, chunk_size,
                                 pack, keep_head_logits)
    else:  # unknown architecture, or images: full logits, whatever the model does after its head
        input_ids, attention_mask, position_ids, index = pack_prompt_response(prompt_ids, response_ids,
                                                                              response_mask)
        if images:
            prompt_part = torch.arange(input_ids.shape[1], device=device)[None] <= index[:, :1]
            logits = vision_logits(model, prompt_ids, input_ids, attention_mask, position_ids, prompt_part)
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=False).logits
        logits = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
        log_probs, entropy = token_log_probs(logits, response_ids.long(), temperature=temperature,
                                             chunk_size=chunk_size, with_entropy=with_entropy)
    mask = response_mask > 0
    log_probs = log_probs.masked_fill(~mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~mask, 0.0)
    return log_probs, entropy
