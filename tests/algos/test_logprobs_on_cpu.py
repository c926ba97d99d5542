"""token_log_probs against a direct float64 reference: values, entropies and gradients, any chunking."""

from __future__ import annotations

import pytest
import torch

from tether.algos import token_log_probs


def _reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = logp.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


def _data(dtype=torch.float32, shape=(3, 10, 37), seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=g) * 4).to(dtype)
    targets = torch.randint(0, shape[-1], shape[:2], generator=g)
    return logits, targets


@pytest.mark.parametrize("chunk_size", [1, 3, 10, 128])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_float64_reference(chunk_size, temperature):
    logits, targets = _data()
    lp, ent = token_log_probs(logits, targets, temperature=temperature, chunk_size=chunk_size,
                              with_entropy=True)
    ref_lp, ref_ent = _reference(logits, targets, temperature)
    assert lp.dtype == torch.float32 and lp.shape == targets.shape
    torch.testing.assert_close(lp.double(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)


def test_float64_in_float64_out_exact():
    logits, targets = _data(torch.float64)
    lp, ent = token_log_probs(logits, targets, chunk_size=4, with_entropy=True)
    ref_lp, ref_ent = _reference(logits, targets, 1.0)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)


def test_bfloat16_logits_are_computed_in_float32():
    logits, targets = _data(torch.bfloat16)
    lp, _ = token_log_probs(logits, targets, chunk_size=4)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp.double(), _reference(logits.float(), targets, 1.0)[0], rtol=1e-5, atol=1e-5)


def test_entropy_is_optional():
    logits, targets = _data()
    assert token_log_probs(logits, targets)[1] is None


def test_gradients_match_reference():
    logits, targets = _data(torch.float64, shape=(2, 5, 7))
    leaf = logits.clone().requires_grad_()
    lp, ent = token_log_probs(leaf, targets, temperature=0.9, chunk_size=2, with_entropy=True)
    (lp.sum() + 0.3 * ent.sum()).backward()
    ref_leaf = logits.clone().requires_grad_()
    ref_lp, ref_ent = _reference(ref_leaf, targets, 0.9)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=0, atol=1e-12)


def test_gradcheck():
    logits, targets = _data(torch.float64, shape=(2, 3, 5))
    leaf = logits.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: token_log_probs(x, targets, chunk_size=2, with_entropy=True), (leaf,))


def test_shape_mismatch():
    logits, targets = _data()
    with pytest.raises(ValueError, match="disagree"):
        token_log_probs(logits, targets[:, :-1])


def test_masked_logits_give_finite_entropies_and_gradients():
    """A model that sets some vocabulary entries to -inf: they carry no probability, add nothing to the entropy
    (0 log 0 = 0) and get no gradient; the rest is the distribution over the others."""
    logits, targets = _data(torch.float64, shape=(2, 3, 7))
    masked = logits.clone()
    masked[..., 5:] = float("-inf")
    targets = targets % 5
    leaf = masked.clone().requires_grad_()
    lp, ent = token_log_probs(leaf, targets, chunk_size=2, with_entropy=True)
    (lp.sum() + 0.3 * ent.sum()).backward()
    ref_leaf = logits[..., :5].clone().requires_grad_()
    ref_lp, ref_ent = _reference(ref_leaf, targets, 1.0)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
    assert torch.isfinite(leaf.grad).all() and not leaf.grad[..., 5:].any()
    torch.testing.assert_close(leaf.grad[..., :5], ref_leaf.grad, rtol=0, atol=1e-12)
