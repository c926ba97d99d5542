"""KL estimators k1/k2/k3 and the forward/reverse diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import KL_KINDS, forward_kl_estimate, kl_estimate, reverse_kl_estimate


def _dists(seed: int = 0, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(0.7 * torch.randn(1, vocab, dtype=torch.float64, generator=g), -1)
    q = torch.softmax(0.7 * torch.randn(1, vocab, dtype=torch.float64, generator=g), -1)
    # Close enough that k3's [-10, 10] clamp never binds (it would bias the estimate).
    assert (kl_estimate(p.log(), q.log(), "k3") < 10).all()
    assert (kl_estimate(q.log(), p.log(), "k3") < 10).all()
    return p, q


def test_hand_computed():
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    x = math.log(2)
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(x)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * x * x)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + x - 1)


def test_k3_is_nonnegative_and_clamped():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, dtype=torch.float64, generator=g) * 8
    k3 = kl_estimate(x[None], torch.zeros_like(x)[None], "k3")
    assert (k3 >= 0).all() and (k3 <= 10).all()
    assert kl_estimate(torch.tensor([[-40.0]]), torch.tensor([[0.0]]), "k3").item() == 10.0  # verl's clamp


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_estimators_average_to_the_exact_kl(kind):
    # Averaging over tokens sampled from p, exactly: sum_y p(y) k(y) = KL(p || q) for k1 and k3.
    p, q = _dists()
    exact = (p * (p / q).log()).sum()
    torch.testing.assert_close((p * kl_estimate(p.log(), q.log(), kind)).sum(), exact)


def test_k2_is_biased_but_close_for_near_distributions():
    p, _ = _dists()
    noise = torch.randn(p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    q = torch.softmax(p.log() + 0.01 * noise, -1)
    exact = (p * (p / q).log()).sum()
    k2 = (p * kl_estimate(p.log(), q.log(), "k2")).sum()
    assert k2 != exact and k2.item() == pytest.approx(exact.item(), rel=0.05)


def test_k3_gradient():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
    kl_estimate(lp, ref, "k3").sum().backward()
    torch.testing.assert_close(lp.grad, 1 - (ref - lp.detach()).exp())  # d/dx of exp(-x) + x - 1


@pytest.mark.parametrize("kind", KL_KINDS)
def test_gradcheck(kind):
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(2, 3, dtype=torch.float64, generator=g).requires_grad_()
    ref = torch.randn(2, 3, dtype=torch.float64, generator=g)
    assert torch.autograd.gradcheck(lambda x: kl_estimate(x, ref, kind), (lp,))


def test_reverse_and_forward_diagnostics_are_exact_under_their_sampling_distribution():
    # A mask may carry weights, so weighting by the sampling probabilities gives the exact expectation.
    p, q = _dists(seed=1)
    torch.testing.assert_close(reverse_kl_estimate(p.log(), q.log(), p), (p * (p / q).log()).sum())
    torch.testing.assert_close(forward_kl_estimate(p.log(), q.log(), q), (q * (q / p).log()).sum())
    torch.testing.assert_close(forward_kl_estimate(p.log(), q.log(), q, kind="k3"), (q * (q / p).log()).sum())


def test_diagnostics_of_an_empty_mask_are_zero():
    p, q = _dists()
    assert reverse_kl_estimate(p.log(), q.log(), torch.zeros_like(p)).item() == 0.0


def test_unknown_kind():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "low_var_kl")
