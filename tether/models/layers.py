"""The decoder layers of a Hugging Face causal LM: the unit of sharding and of activation checkpointing."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tether.models.forward import CHECKPOINTED_LAYERS


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


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # scoring and decoding: nothing to recompute, and the KV cache must be written once
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_layers(model: nn.Module) -> None:
    """Recompute every decoder layer in backward instead of keeping its activations, in place.

    Hugging Face's ``gradient_checkpointing_enable`` only acts in ``train()`` mode, and tether keeps the
    policy in ``eval()`` (no dropout: old and new log-probs must be the same function), so each layer's
    ``forward`` is wrapped here instead. Module hooks (FSDP2's gather and reduce) stay outside the
    checkpoint and do not run again during the recomputation.
    """
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_checkpointed, layer.forward)
    setattr(model, CHECKPOINTED_LAYERS, True)  # the shared-prompt pass writes a KV cache: off under recomputation
