"""Decoder layers are found by name, and checkpointing them recomputes activations without changing gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.activation_factor import micro_batch_bytes
from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.models.forward import response_log_probs
from tether.models.layers import (
    ACTIVATION_FACTOR,
    activation_bytes,
    checkpoint_layers,
    decoder_layers,
    head_logit_bytes,
)


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


PROMPTS = [[1, 2, 3], [4, 5]]
RESPONSE = torch.tensor([[7, 8, 9, 10], [11, 12, 0, 0]])
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])


def test_checkpointed_layers_give_the_same_gradients_and_keep_fewer_activations(tiny_policy):
    model, tok = tiny_policy
    model64 = copy.deepcopy(model).double()
    ckpt = copy.deepcopy(model64)
    checkpoint_layers(ckpt)
    loss, grads, saved = loss_and_saved_tensors(model64, PROMPTS, RESPONSE, MASK)
    loss_c, grads_c, saved_c = loss_and_saved_tensors(ckpt, PROMPTS, RESPONSE, MASK)
    torch.testing.assert_close(loss_c, loss, rtol=0, atol=0)
    assert max(g.abs().max() for g in grads) > 1e-3
    for g, g_c in zip(grads, grads_c, strict=True):  # float64: the recomputed forward is the same function
        torch.testing.assert_close(g_c, g, rtol=1e-12, atol=1e-15)
    assert saved_c < saved  # inside each layer only the checkpoint's inputs are kept
    # without autograd (decoding with a KV cache) the layers run as they are
    checkpoint_layers(ckpt := copy.deepcopy(model))
    params = SamplingParams(max_new_tokens=4)
    want = HFEngine(model, tok).generate(PROMPTS, params, seed=3)
    got = HFEngine(ckpt, tok).generate(PROMPTS, params, seed=3)
    assert torch.equal(got.response_ids, want.response_ids)


def test_the_switch_turns_recomputation_on_and_off(tiny_policy):
    model, _ = tiny_policy
    _, _, plain = loss_and_saved_tensors(copy.deepcopy(model), PROMPTS, RESPONSE, MASK)
    switch = checkpoint_layers(model, on=False)
    _, _, off = loss_and_saved_tensors(model, PROMPTS, RESPONSE, MASK)
    switch.on = True
    _, _, on = loss_and_saved_tensors(model, PROMPTS, RESPONSE, MASK)
    assert off == plain and on < off


def test_the_activation_estimate_is_linear_and_fits_the_saved_tensors(tiny_policy):
    """The estimate grows as tokens x hidden x layers, and so do the bytes autograd keeps in the tiny model."""
    model, _ = tiny_policy
    c = model.config
    one = activation_bytes(c, 100, 4)
    assert activation_bytes(c, 300, 4) == 3 * one and activation_bytes(c, 100, 2) == one / 2
    assert one == 100 * c.hidden_size * c.num_hidden_layers * ACTIVATION_FACTOR * 4
    wider = copy.copy(c)
    wider.num_hidden_layers, wider.hidden_size = 2 * c.num_hidden_layers, 3 * c.hidden_size
    assert activation_bytes(wider, 100, 4) == 6 * one
    # measured: each extra row of 3 + 12 tokens keeps the same bytes (linear in tokens), of the estimate's size
    saved = [micro_batch_bytes(model, rows, 3, 12) for rows in (2, 4, 6)]
    step = saved[1] - saved[0]
    assert saved[2] - saved[1] == pytest.approx(step, rel=0.02)
    assert 0.8 < step / activation_bytes(c, 2 * 15, 4) < 1.25  # 19.3 vectors per token and layer here


def test_the_head_logit_estimate_is_float32_per_token_and_vocabulary_entry():
    """The head keeps float32 log-probabilities whatever the parameters' width (bfloat16 ones included), float64
    for a float64 model."""
    assert head_logit_bytes(49_152, 10, 4) == 10 * 49_152 * 4
    assert head_logit_bytes(49_152, 10, 2) == head_logit_bytes(49_152, 10, 4)
    assert head_logit_bytes(49_152, 10, 8) == 2 * head_logit_bytes(49_152, 10, 4)
