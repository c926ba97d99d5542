"""EAPO (reconstructed; eapo.md Sec. 1.4 and 5): reductions to PPO, weight bounds, exact unbiasedness."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.algos.conftest import random_inputs, select_rows
from tether.algos import LossInputs, eapo, ppo
from tether.algos.eapo_loss import normalised_ess
from tether.trainer.step import add_micro_metrics, step_values

METHOD_TENSORS = ("gate_mask", "injected_mask")


def _grad(out, inputs):
    (grad,) = torch.autograd.grad(out.loss, inputs.log_probs)
    return grad


def _with(inputs: LossInputs, **changes) -> LossInputs:
    """``inputs`` with fields or per-token tensors (``gate_mask``, ``injected_mask``) replaced; None drops a tensor."""
    tokens = {**inputs.tokens, **{k: v for k, v in changes.items() if k in METHOD_TENSORS}}
    fields = {k: v for k, v in changes.items() if k not in METHOD_TENSORS}
    return LossInputs(**{**inputs.__dict__, **fields, "tokens": {k: v for k, v in tokens.items() if v is not None}})


@pytest.mark.parametrize("correction", ["seq_gated", "token", "split", "none"])
def test_no_gated_token_is_exactly_ppo(correction, make_inputs):
    inputs = make_inputs(seed=1)
    quiet = _with(inputs, gate_mask=torch.zeros_like(inputs.tokens["gate_mask"]),
                  injected_mask=torch.zeros_like(inputs.tokens["injected_mask"]))
    e, p = eapo(quiet, correction=correction), ppo(quiet)
    assert torch.equal(e.loss, p.loss)
    assert torch.equal(_grad(e, quiet), _grad(p, quiet))
    assert e.metrics["eapo/is_weight_mean"] == (0.0 if correction == "split" else 1.0)  # split: no units


@pytest.mark.parametrize("correction", ["seq_gated", "token"])
def test_identical_prior_gives_weights_one(correction, make_inputs):
    # The prior equals pi_old, so the sampling distribution mu is pi_old and every rho is 1.
    inputs = make_inputs(seed=2)
    same = _with(inputs, behaviour_log_probs=inputs.old_log_probs.clone())
    e = eapo(same, correction=correction)
    assert e.metrics["eapo/is_weight_mean"] == 1.0 and e.metrics["eapo/is_weight_max"] == 1.0
    assert e.metrics["eapo/is_ess"] == 1.0
    assert torch.equal(e.loss, ppo(same).loss)


@pytest.mark.parametrize("correction", ["seq_gated", "token"])
def test_weights_never_exceed_cap(correction, make_inputs):
    inputs = make_inputs(seed=3)
    noise = torch.rand(inputs.old_log_probs.shape, generator=torch.Generator().manual_seed(3),
                       dtype=inputs.old_log_probs.dtype)
    lower = inputs.old_log_probs - 1.0 - 2.0 * noise  # mu < pi_old / e on every token: each gated rho > e > cap
    far = _with(inputs, behaviour_log_probs=lower)
    e, p = eapo(far, correction=correction, cap=1.5), ppo(far)
    assert e.metrics["eapo/is_weight_max"] > 1.0 and e.metrics["eapo/is_weight_max"] <= 1.5
    assert e.metrics["eapo/is_trunc_frac"] > 0
    ge, gp = _grad(e, far), _grad(p, far)
    nonzero = gp != 0
    assert (ge[nonzero] / gp[nonzero] <= 1.5 + 1e-12).all()


def test_hand_computed_weights():
    old = torch.log(torch.tensor([[0.6, 0.5, 0.3]], dtype=torch.float64))
    # rho = pi_old / mu: 0.6/0.4 = 1.5 (gated), 0.5/0.25 = 2 (not gated: ignored), 0.3/0.25 = 1.2 (gated).
    behaviour = torch.log(torch.tensor([[0.4, 0.25, 0.25]], dtype=torch.float64))
    gate = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    inputs = LossInputs(log_probs=old.clone().requires_grad_(), old_log_probs=old,
                        advantages=torch.ones_like(old), response_mask=torch.ones_like(old),
                        behaviour_log_probs=behaviour, tokens={"gate_mask": gate, "injected_mask": gate})
    seq = eapo(inputs, correction="seq_gated")  # W = 1.5 * 1.2 = 1.8 on every token; r = 1
    assert seq.loss.item() == pytest.approx(-1.8)
    # W is a constant (stop-grad): the gradient is W times PPO's, -A r / 3 per token.
    torch.testing.assert_close(_grad(seq, inputs), torch.full_like(old, -1.8 / 3))
    assert seq.metrics["eapo/is_weight_mean"].item() == pytest.approx(1.8)
    assert eapo(inputs, correction="seq_gated", cap=1.6).loss.item() == pytest.approx(-1.6)
    token = eapo(inputs, correction="token")  # weights 1.5, 1, 1.2
    assert token.loss.item() == pytest.approx(-(1.5 + 1.0 + 1.2) / 3)
    assert token.metrics["eapo/gated_frac"].item() == pytest.approx(2 / 3)
    # split: injected tokens give -A f(pi/mu) with f(x) = x / (x + 0.1) and pi = pi_old here.
    split = eapo(inputs, correction="split")
    expected = -(1.5 / 1.6 + 1.0 + 1.2 / 1.3) / 3
    assert split.loss.item() == pytest.approx(expected)
    # d/dlog pi of -f(x) is -gamma x / (x + gamma)^2 on injected tokens; PPO's -A r = -1 elsewhere.
    grad = _grad(split, inputs) * 3
    f_prime = [-0.1 * x / (x + 0.1) ** 2 for x in (1.5, 1.2)]
    torch.testing.assert_close(grad, torch.tensor([[f_prime[0], -1.0, f_prime[1]]], dtype=torch.float64))


def test_hand_computed_weight_metrics():
    # The inputs of test_hand_computed_weights (gated rho 1.5 and 1.2, ungated 2 ignored), then two more rows
    # for seq_gated: W = 0.3/0.25 = 1.2 (above 1, below the cap) and W = 0.2/0.4 = 0.5 (its last token padded).
    old = torch.log(torch.tensor([[0.6, 0.5, 0.3], [0.3, 0.5, 0.5], [0.2, 0.5, 0.5]], dtype=torch.float64))
    behaviour = torch.log(torch.tensor([[0.4, 0.25, 0.25], [0.25, 0.1, 0.5], [0.4, 0.5, 0.1]], dtype=torch.float64))
    gate = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)

    def inputs(rows):
        return LossInputs(log_probs=old[rows].clone().requires_grad_(), old_log_probs=old[rows],
                          advantages=torch.ones_like(old[rows]), response_mask=mask[rows],
                          behaviour_log_probs=behaviour[rows], tokens={"gate_mask": gate[rows]})

    # token, row 0: weights 1.5, 1, 1.2 (cap 2 never binds). ESS = (sum w)^2 / (n sum w^2).
    m = eapo(inputs(slice(0, 1)), correction="token").metrics
    assert m["eapo/is_ess"].item() == pytest.approx(3.7**2 / (3 * (2.25 + 1.0 + 1.44)), rel=1e-12)
    assert m["eapo/is_weight_mean"].item() == pytest.approx(3.7 / 3, rel=1e-12)
    assert m["eapo/is_weight_max"].item() == pytest.approx(1.5, rel=1e-12)
    assert m["eapo/is_trunc_frac"].item() == 0.0
    # cap 1.3 between the weights: 1.5 is truncated (1 token of 3), the ESS is of the truncated 1.3, 1, 1.2.
    m = eapo(inputs(slice(0, 1)), correction="token", cap=1.3).metrics
    assert m["eapo/is_trunc_frac"].item() == pytest.approx(1 / 3, rel=1e-12)
    assert m["eapo/is_ess"].item() == pytest.approx(3.5**2 / (3 * (1.69 + 1.0 + 1.44)), rel=1e-12)
    assert m["eapo/is_weight_max"].item() == pytest.approx(1.3, rel=1e-12)

    # seq_gated, one unit per row: raw W = 1.8, 1.2, 0.5; cap 1.6 truncates the first only.
    m = eapo(inputs(slice(None)), correction="seq_gated", cap=1.6).metrics
    assert m["eapo/is_trunc_frac"].item() == pytest.approx(1 / 3, rel=1e-12)
    assert m["eapo/is_weight_mean"].item() == pytest.approx((1.6 + 1.2 + 0.5) / 3, rel=1e-12)
    assert m["eapo/is_ess"].item() == pytest.approx(3.3**2 / (3 * (2.56 + 1.44 + 0.25)), rel=1e-12)
    # token over the 8 real tokens: 1.5, 1, 1.2 | 1.2, 1, 1 | 0.5, 1 (row 2's gated padding does not count).
    w = torch.tensor([1.5, 1.0, 1.2, 1.2, 1.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    m = eapo(inputs(slice(None)), correction="token", cap=1.3).metrics
    assert m["eapo/is_trunc_frac"].item() == pytest.approx(1 / 8, rel=1e-12)
    wt = w.clamp(max=1.3)
    assert m["eapo/is_ess"].item() == pytest.approx((wt.sum() ** 2 / (8 * (wt**2).sum())).item(), rel=1e-12)


def test_a_calls_is_ess_is_the_steps_formula_even_for_tiny_weights():
    # Two gated tokens of rho = e^-40 each: W = e^-80 (~1.8e-35), W^2 ~ 3e-70, one row, so ESS = W^2 / W^2 = 1. The
    # call's value is normalised_ess of the call's means, as the step's is; a floor on mean(w^2) (1e-30) gave ~3e-40.
    old = torch.zeros(1, 3, dtype=torch.float64)
    inputs = LossInputs(log_probs=old.clone().requires_grad_(), old_log_probs=old, advantages=torch.ones_like(old),
                        response_mask=torch.ones_like(old), behaviour_log_probs=torch.tensor([[40.0, 40.0, 0.0]],
                                                                                             dtype=torch.float64),
                        tokens={"gate_mask": torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)})
    m = eapo(inputs, correction="seq_gated").metrics
    assert m["eapo/is_weight_mean"].item() == pytest.approx(math.exp(-80), rel=1e-12)
    assert m["eapo/is_ess"].item() == pytest.approx(1.0, rel=1e-12)
    assert m["eapo/is_ess"].item() == normalised_ess({k: v.item() for k, v in m.items()})


def test_missing_fields_and_bad_correction(make_inputs):
    inputs = make_inputs()
    with pytest.raises(ValueError, match="gate_mask"):
        eapo(_with(inputs, gate_mask=None))
    with pytest.raises(ValueError, match="behaviour_log_probs"):
        eapo(_with(inputs, behaviour_log_probs=None), correction="token")
    with pytest.raises(ValueError, match="injected_mask"):
        eapo(_with(inputs, injected_mask=None), correction="split")
    eapo(_with(inputs, gate_mask=None, behaviour_log_probs=None), correction="none")
    with pytest.raises(ValueError, match="seq_gated"):
        eapo(inputs, correction="sequence")


def _tabular_problem(vocab: int = 3, length: int = 3, mix: float = 0.6, seed: int = 0):
    """Every sequence of a tabular policy, with a prefix-only gate and the mixture mu it samples from."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [p for n in range(length) for p in itertools.product(range(vocab), repeat=n)]
    index = {p: i for i, p in enumerate(prefixes)}
    theta = torch.randn(len(prefixes), vocab, dtype=torch.float64, generator=g).requires_grad_()
    prior = torch.softmax(2 * torch.randn(len(prefixes), vocab, dtype=torch.float64, generator=g), -1)
    gate = (torch.rand(len(prefixes), generator=g) < 0.5).double()  # a function of the prefix only
    pi_old = torch.softmax(theta.detach(), -1)
    mu = (1 - mix * gate[:, None]) * pi_old + mix * gate[:, None] * prior
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    prefix_idx = torch.tensor([[index[tuple(s[:t].tolist())] for t in range(length)] for s in seqs])
    rewards = torch.rand(len(seqs), dtype=torch.float64, generator=g)
    return theta, seqs, prefix_idx, gate, mu, rewards


@pytest.mark.parametrize("seed", [0, 1])
def test_expected_seq_gated_gradient_is_the_policy_gradient(seed):
    theta, seqs, prefix_idx, gate, mu, rewards = _tabular_problem(seed=seed)
    log_pi = torch.log_softmax(theta, -1)[prefix_idx, seqs]  # [S, T], with gradient
    log_mu = mu.log()[prefix_idx, seqs]
    seq_prob_mu = log_mu.sum(-1).exp()  # probability of each whole sequence under mu

    # True gradient of J(theta) = sum_y pi_theta(y) R(y).
    (true_grad,) = torch.autograd.grad((log_pi.sum(-1).exp() * rewards).sum(), theta, retain_graph=True)

    def expected_gradient(correction: str) -> torch.Tensor:
        # E_mu[grad loss_y] = sum_y mu(y) grad loss_y. The loss is linear in A at theta = theta_old
        # (r = 1, inside the clip), so weighting A by mu(y) gives the expectation in one pass.
        inputs = LossInputs(
            log_probs=log_pi, old_log_probs=log_pi.detach(),
            advantages=(seq_prob_mu * rewards)[:, None].expand_as(log_pi),
            response_mask=torch.ones_like(log_mu), behaviour_log_probs=log_mu,
            tokens={"gate_mask": gate[prefix_idx]}, num_seqs=1.0)
        loss = eapo(inputs, agg="seq-mean-token-sum", correction=correction, cap=math.inf).loss
        (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
        return -grad  # the loss is minus the objective

    torch.testing.assert_close(expected_gradient("seq_gated"), true_grad, rtol=0, atol=1e-12)
    assert (expected_gradient("none") - true_grad).abs().max() > 1e-3
    assert (expected_gradient("token") - true_grad).abs().max() > 1e-3
    assert mu.ne(torch.softmax(theta.detach(), -1)).any()  # the problem really is off-policy


def _direct_weights(inputs: LossInputs, correction: str, cap: float) -> torch.Tensor:
    """Every importance weight of the policy's rows over its units, written out row by row (float64)."""
    weights = []
    gate, mask = inputs.tokens["gate_mask"], inputs.response_mask
    for i in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        if inputs.source[i] != 0 or not tokens:
            continue
        rho = [math.exp(inputs.old_log_probs[i, t] - inputs.behaviour_log_probs[i, t]) if gate[i, t] > 0 else 1.0
               for t in tokens]
        weights += [min(math.prod(rho), cap)] if correction == "seq_gated" else [min(r, cap) for r in rho]
    return torch.tensor(weights, dtype=torch.float64)


@pytest.mark.parametrize("correction", ["seq_gated", "token"])
def test_the_steps_is_ess_is_over_every_weight_whatever_the_micro_batches(correction):
    """``eapo/is_ess = (sum w)^2 / (n sum w^2)`` over all of the step's weights. A ratio is no mean: averaged over
    micro-batches by their units it was 1 for one-row micro-batches of seq_gated (one weight each) whatever the
    weights. Now the loss gives the mean of w^2 too and the fold computes the ratio once (LossOutput.derived)."""
    inputs = random_inputs(batch=9, seed=5)
    w = _direct_weights(inputs, "seq_gated" if correction == "seq_gated" else "token", cap=2.0)
    direct = float(w.sum() ** 2 / (len(w) * w.square().sum()))
    assert len(w) >= 5 and direct < 0.96  # the weights differ, so the ESS is below 1
    lp = inputs.log_probs.detach()
    for size in (1, 3, 9):
        folded, derived = {}, {}
        for start in range(0, 9, size):
            micro = select_rows(inputs, slice(start, start + size), lp)
            add_micro_metrics(folded, eapo(micro, correction=correction), tokens=micro.response_mask.sum(),
                              derived=derived)
        got = step_values({k: float(v) for k, v in folded.items()}, dict.fromkeys(folded, 1), derived)
        assert got["eapo/is_ess"] == pytest.approx(direct, rel=1e-6), size  # the fold sums in float32
        assert got["eapo/is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-6), size
