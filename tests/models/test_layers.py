"""Decoder layers are found by name, and checkpointing them recomputes activations without changing gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.models.forward import response_log_probs
from tether.models.layers import checkpoint_layers, decoder_layers


def loss_and_saved_tensors(model, prompts, response, mask):
    """The summed log-probs, their gradients, and how many tensors autograd saved for backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        log_probs, _ = response_log_probs(model, prompts, response, mask)
    loss = log_probs.sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], len(saved)


def test_decoder_layers_are_the_no_split_modules(tiny_policy):
    model, _ = tiny_policy
    assert decoder_layers(model) == list(model.model.layers)
    with pytest.raises(ValueError, match="cannot find the decoder layers"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_checkpointed_layers_give_the_same_gradients_and_keep_fewer_activations(tiny_policy):
    model, tok = tiny_policy
    ckpt = copy.deepcopy(model)
    checkpoint_layers(ckpt)
    prompts = [[1, 2, 3], [4, 5]]
    response = torch.tensor([[7, 8, 9, 10], [11, 12, 0, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    loss, grads, saved = loss_and_saved_tensors(model, prompts, response, mask)
    loss_c, grads_c, saved_c = loss_and_saved_tensors(ckpt, prompts, response, mask)
    torch.testing.assert_close(loss_c, loss, rtol=0, atol=0)
    for g, g_c in zip(grads, grads_c, strict=True):
        torch.testing.assert_close(g_c, g, rtol=1e-6, atol=1e-7)
    assert saved_c < saved  # inside each layer only the checkpoint's inputs are kept
    # without autograd (decoding with a KV cache) the layers run as they are
    params = SamplingParams(max_new_tokens=4)
    want = HFEngine(model, tok).generate(prompts, params, seed=3)
    got = HFEngine(ckpt, tok).generate(prompts, params, seed=3)
    assert torch.equal(got.response_ids, want.response_ids)
