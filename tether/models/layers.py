"""The decoder layers of a Hugging Face causal LM: the unit of sharding and of activation checkpointing."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

# Activation memory of the training forward, in hidden-size vectors that autograd keeps per token and decoder
# layer (norm inputs and outputs, queries, keys, values, attention output, the MLP's gate, up and product at
# 2.7x hidden, residuals). Measured on SmolLM2-135M-Instruct in float32 (30 layers, hidden 576, intermediate
# 1536, SDPA): 19.47 to 19.49 for rows of 64 to 256 tokens, by benchmarks/activation_factor.py, which sums the
# storages autograd saves for two row counts of one width and divides the difference by the extra tokens, layers,
# hidden size and element size (docs/design.md).
ACTIVATION_FACTOR = 19.5


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``: modules whose class is named in its ``_no_split_modules``.

    Hugging Face lists there the blocks that must stay whole on one device (``LlamaDecoderLayer``,
    ``Qwen2DecoderLayer``, ...), which are exactly the decoder layers.

    Raises:
        ValueError: the model names no such class, or none of its modules has one.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}: its _no_split_modules "
                         f"({sorted(names) or 'none'}) names no class of its modules")
    return layers


class LayerCheckpointing:
    """The switch of a model whose decoder layers :func:`checkpoint_layers` wrapped: while ``on``, each layer is
    recomputed in backward. ``train.gradient_checkpointing: auto`` flips it per micro-batch."""

    def __init__(self, on: bool) -> None:
        self.on = on


def _checkpointed(switch: LayerCheckpointing, forward: Any, *args: Any, **kwargs: Any) -> Any:
    # scoring and decoding: nothing to recompute, and the KV cache must be written once
    if not (switch.on and torch.is_grad_enabled()):
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_layers(model: nn.Module, on: bool = True) -> LayerCheckpointing:
    """Recompute every decoder layer in backward instead of keeping its activations, in place, while the
    returned switch is on.

    Hugging Face's ``gradient_checkpointing_enable`` only acts in ``train()`` mode, and tether keeps the
    policy in ``eval()`` (no dropout: old and new log-probs must be the same function), so each layer's
    ``forward`` is wrapped here instead. Module hooks (FSDP2's gather and reduce) stay outside the
    checkpoint and do not run again during the recomputation.
    """
    switch = LayerCheckpointing(on)
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_checkpointed, switch, layer.forward)
    return switch


def activation_bytes(config: Any, tokens: int, element_size: int) -> float:
    """Estimated bytes autograd keeps for backward in a training forward over ``tokens`` tokens, padding included
    (:func:`tether.models.forward.decoder_tokens`).

    ``tokens x hidden x layers x`` :data:`ACTIVATION_FACTOR` ``x element_size``: linear in each, as the
    activations of a decoder are. The LM head's are :func:`head_logit_bytes`; the transient buffers of backward
    are left out. Under bf16 autocast, pass the parameters' element size: an over-estimate.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config  # a VLM's decoder
    return float(tokens) * text.hidden_size * text.num_hidden_layers * ACTIVATION_FACTOR * element_size


def head_logit_bytes(vocab_size: int, response_tokens: int, element_size: int) -> float:
    """Bytes the LM head keeps for backward when it keeps its logits (``keep_head_logits``,
    :func:`tether.models.head.linear_log_probs`): one float32 (float64 for a float64 model) log-probability per
    response token and vocabulary entry (the head's output features), 196 KB per token at SmolLM2's 49,152."""
    return float(response_tokens) * vocab_size * max(4, element_size)
