"""linear_log_probs: the LM head's log-probs and entropies with a backward written from the softmax, against
autograd through linear -> log_softmax in float64, finite differences, and itself (kept against recomputed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tether.models.head import linear_log_probs

M, H, V = 7, 5, 11


def _inputs(dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, b, targets


def _reference(hidden, weight, bias, targets, temperature):
    """Autograd through the plain formula."""
    log_p = (F.linear(hidden, weight, bias) / temperature).log_softmax(-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("keep_logits", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_float64(keep_logits, temperature):
    hidden, weight, bias, targets = _inputs()

    def fn(h, w, b):
        return linear_log_probs(h, w, b, targets, temperature=temperature, with_entropy=True,
                                keep_logits=keep_logits)

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("keep_logits", [False, True])
@pytest.mark.parametrize("use", ["log_probs", "entropy", "both"])
def test_values_and_gradients_equal_autograd_float64(keep_logits, use, temperature=0.7):
    """Either output alone or both in the loss (the trainer's entropy is often a metric: no gradient reaches it)."""
    weights = {"log_probs": (1.0, 0.0), "entropy": (0.0, 1.0), "both": (1.0, -0.3)}[use]
    results = []
    for fn in (_reference, lambda *a: linear_log_probs(*a[:4], temperature=a[4], with_entropy=True,
                                                        keep_logits=keep_logits)):
        hidden, weight, bias, targets = _inputs()
        lp, ent = fn(hidden, weight, bias, targets, temperature)
        g = torch.Generator().manual_seed(1)
        r_lp, r_ent = torch.randn(M, generator=g, dtype=torch.float64), torch.randn(M, generator=g, dtype=torch.float64)
        loss = 0.0  # an output left out of the loss gets no gradient at all (None), not a zero one
        if weights[0]:
            loss = loss + weights[0] * (lp * r_lp).sum()
        if weights[1]:
            loss = loss + weights[1] * (ent * r_ent).sum()
        loss.backward()
        results.append((lp.detach(), ent.detach(), hidden.grad, weight.grad, bias.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    assert results[0][2].abs().max() > 1e-2  # a gradient that can tell them apart


def test_kept_and_recomputed_logits_give_bit_identical_float32_gradients():
    grads = []
    for keep in (False, True):
        hidden, weight, bias, targets = _inputs(torch.float32)
        lp, ent = linear_log_probs(hidden, weight, bias, targets, temperature=0.7, with_entropy=True,
                                   keep_logits=keep)
        (lp.sum() + 0.1 * ent.sum()).backward()
        grads.append((lp, hidden.grad, weight.grad, bias.grad))
    for kept, recomputed in zip(*grads, strict=True):
        assert torch.equal(kept, recomputed)


def backward_matmuls(loss: torch.Tensor) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()
    return sum(event.name == "aten::mm" for event in prof.events())


@pytest.mark.parametrize("frozen", [True, False])
def test_a_frozen_head_makes_no_weight_gradient_and_passes_the_hidden_one(frozen):
    """A LoRA policy's head: backward runs one matmul (the hidden states' gradient), not two, and that gradient is
    autograd's. Kept logits: no recomputing matmul either."""
    hidden, weight, _, targets = _inputs(bias=False)
    weight.requires_grad_(not frozen)
    lp, _ = linear_log_probs(hidden, weight, None, targets, keep_logits=True)
    assert backward_matmuls(lp.sum()) == (1 if frozen else 2)
    got = hidden.grad.clone()
    hidden.grad = None
    _reference(hidden, weight, None, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(got, hidden.grad, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("keep_logits", [False, True])
def test_only_kept_logits_are_saved_for_backward(keep_logits):
    """What the activation estimate counts (tether.models.layers.head_logit_bytes): one [M, V] tensor saved when
    the logits are kept, none when they are recomputed."""
    hidden, weight, bias, targets = _inputs()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        linear_log_probs(hidden, weight, bias, targets, with_entropy=True, keep_logits=keep_logits)
    assert saved.count(torch.Size([M, V])) == int(keep_logits)
    assert torch.Size([M, H]) in saved and torch.Size([V, H]) in saved  # what recomputing needs


def test_without_autograd_the_values_equal_the_reference():
    hidden, weight, bias, targets = _inputs(torch.float32)
    with torch.no_grad():
        lp, ent = linear_log_probs(hidden, weight, bias, targets, temperature=1.3, with_entropy=True)
        ref_lp, ref_ent = _reference(hidden.double(), weight.double(), bias.double(), targets, 1.3)
    assert lp.dtype == torch.float32 and not lp.requires_grad
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    assert linear_log_probs(hidden, weight, bias, targets)[1] is None


def _autograd_linear(hidden, weight, bias, targets):
    log_p = F.linear(hidden, weight, bias).float().log_softmax(-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("keep_logits", [False, True])
def test_under_bf16_autocast_it_computes_what_autograd_through_linear_does(keep_logits):
    """The matmul in bfloat16 as autocast's F.linear runs it, forward and (recomputed or not) in backward, the
    softmax in float32, and gradients of the same dtypes as autograd's: equal up to float32 summation order."""
    results = []
    for fused in (False, True):
        hidden, weight, bias, targets = _inputs(torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                lp, ent = linear_log_probs(hidden, weight, bias, targets, with_entropy=True, keep_logits=keep_logits)
            else:
                lp, ent = _autograd_linear(hidden, weight, bias, targets)
        (lp.sum() + 0.5 * ent.sum()).backward()
        results.append((lp, ent, hidden.grad, weight.grad, bias.grad))
    assert results[1][0].dtype == torch.float32
    for got, want in zip(results[1], results[0], strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    # and not what float32 arithmetic gives: the matmul did run in bfloat16
    hidden, weight, bias, targets = _inputs(torch.float32)
    assert not torch.allclose(linear_log_probs(hidden, weight, bias, targets)[0], results[1][0], rtol=0, atol=1e-6)


def test_autocast_leaves_a_float64_head_in_float64():
    """As F.linear: autocast does not cast float64, so a float64 head stays exact under it."""
    hidden, weight, bias, targets = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = linear_log_probs(hidden, weight, bias, targets, with_entropy=True)
    ref_lp, ref_ent = _reference(hidden, weight, bias, targets, 1.0)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)


def test_bf16_weights_without_autocast_as_fsdp_mixed_precision_gathers_them():
    """bfloat16 hidden states and weight, autocast off: the matmul in bfloat16, the softmax in float32, bfloat16
    gradients, as autograd through F.linear."""
    results = []
    for fused in (False, True):
        hidden, weight, bias, targets = (t.to(torch.bfloat16).detach().requires_grad_() if t.is_floating_point()
                                         else t for t in _inputs(torch.float32))
        lp, ent = (linear_log_probs(hidden, weight, bias, targets, with_entropy=True) if fused
                   else _autograd_linear(hidden, weight, bias, targets))
        (lp.sum() + 0.5 * ent.sum()).backward()
        results.append((lp, ent, hidden.grad, weight.grad, bias.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert results[1][2].dtype == torch.bfloat16
