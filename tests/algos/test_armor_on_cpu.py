"""ARMOR (arXiv:2607.10481): the properties of armor.md Sec. 5, checked on the loss itself."""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos import AdvantageInputs, LossInputs, armor, grpo, mix_log_probs, ppo, qae

DAPO = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 10.0}


def _inputs(log_probs, old, ref, adv, source=None) -> LossInputs:
    return LossInputs(log_probs=log_probs.clone().requires_grad_(), old_log_probs=old, advantages=adv,
                      response_mask=torch.ones_like(old), ref_log_probs=ref, source=source)


def _grad(out, inputs):
    (grad,) = torch.autograd.grad(out.loss, inputs.log_probs)
    return grad


def test_hand_computed():
    # a = 1/2, pi_theta = 0.6, pi_old = 0.4, pi_ref = 0.2: r_mix = (0.3 + 0.1) / (0.2 + 0.1) = 4/3.
    pi = torch.tensor([[0.6, 0.6]], dtype=torch.float64)
    old, ref = torch.full_like(pi, 0.4), torch.full_like(pi, 0.2)
    inputs = _inputs(pi.log(), old.log(), ref.log(), torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    out = armor(inputs, alpha=0.5)
    # A = +1: 4/3 > 1.28, clipped: -1.28. A = -1: max(4/3, 1.28) = 4/3 (dual clip 10 does not bind).
    assert out.loss.item() == pytest.approx((-1.28 + 4 / 3) / 2)
    assert out.metrics["armor/mix_ratio_mean"].item() == pytest.approx(4 / 3)
    assert out.metrics["actor/pg_clipfrac_upper"].item() == pytest.approx(0.5)
    # d r_mix / d log pi_theta = (a pi_theta / mix_theta) r_mix = (0.3 / 0.4) * 4/3 = 1.
    torch.testing.assert_close(_grad(out, inputs), torch.tensor([[0.0, 1.0 / 2]], dtype=torch.float64))
    assert out.metrics["armor/grad_weight_mean"].item() == pytest.approx(0.75)


@pytest.mark.parametrize("alpha", [1.0, 1.0 - 1e-7])
def test_alpha_one_is_exactly_dapo(alpha, make_inputs):
    inputs = make_inputs(seed=1)
    a, p = armor(inputs, alpha=alpha), ppo(inputs, **DAPO)
    assert torch.equal(a.loss, p.loss)
    assert torch.equal(_grad(a, inputs), _grad(p, inputs))
    assert a.metrics["armor/grad_weight_mean"] == 1.0


def test_log_space_mixture_equals_direct_formula():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(50, dtype=torch.float64, generator=g) * 8
    ref = -torch.rand(50, dtype=torch.float64, generator=g) * 8
    for alpha in (0.5, 0.875, 0.9375):
        direct = torch.log(alpha * lp.exp() + (1 - alpha) * ref.exp())
        torch.testing.assert_close(mix_log_probs(lp, ref, alpha), direct, rtol=0, atol=1e-12)
    # Finite when one side has probability 0, where the direct formula would take log of a sum anyway.
    mixed = mix_log_probs(torch.tensor([-math.inf, -2.0]), torch.tensor([-1.0, -math.inf]), 0.75)
    torch.testing.assert_close(mixed, torch.tensor([-1.0 + math.log(0.25), -2.0 + math.log(0.75)]))


def test_mixed_ratio_is_one_at_theta_old(make_inputs):
    inputs = make_inputs(seed=2, drift=0.0)
    out = armor(inputs, alpha=0.8)
    for key in ("armor/mix_ratio_mean", "armor/mix_ratio_min", "armor/mix_ratio_max"):
        assert out.metrics[key].item() == pytest.approx(1.0, abs=1e-12)
    mask = inputs.response_mask
    expected = -(inputs.advantages * mask).sum() / mask.sum()
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("scope", ["all", "anchors"])
def test_ratio_and_gradient_weight_metrics_away_from_theta_old(scope, make_inputs):
    # Perturbed log-probs (drift 0.3), so the ratios spread around 1; computed in probability space, not log.
    inputs = make_inputs(seed=7)
    alpha = 0.75
    out = armor(inputs, alpha=alpha, scope=scope)
    pi, pi_old, pi_ref = (t.detach().exp() for t in (inputs.log_probs, inputs.old_log_probs, inputs.ref_log_probs))
    mixed = torch.ones_like(pi, dtype=torch.bool) if scope == "all" else (inputs.source == 1)[:, None].expand_as(pi)
    ratio = torch.where(mixed, (alpha * pi + (1 - alpha) * pi_ref) / (alpha * pi_old + (1 - alpha) * pi_ref),
                        pi / pi_old)
    weight = torch.where(mixed, alpha * pi / (alpha * pi + (1 - alpha) * pi_ref), torch.ones_like(pi))
    real = inputs.response_mask > 0
    ratio, weight = ratio[real], weight[real]
    assert ratio.min() < 0.9 and ratio.max() > 1.1 and weight.min() < 0.9  # the metrics are not pinned at 1
    expected = {"armor/mix_ratio_mean": ratio.mean(), "armor/mix_ratio_min": ratio.min(),
                "armor/mix_ratio_max": ratio.max(), "armor/grad_weight_mean": weight.mean(),
                "armor/grad_weight_min": weight.min()}
    for key, value in expected.items():
        assert out.metrics[key].item() == pytest.approx(value.item(), rel=1e-12, abs=0), key


@pytest.mark.parametrize("alpha", [0.5, 0.875])
def test_clip_boundary_of_eq6(alpha):
    # Eq. 6: r_mix = 1 + eps  <=>  pi = (1 + eps) pi_old + eps (1 - a)/a pi_ref (and the mirror for 1 - eps).
    eps_high, eps_low = 0.28, 0.2
    pi_old = torch.tensor([[0.3, 0.4]], dtype=torch.float64)
    pi_ref = torch.tensor([[0.2, 0.05]], dtype=torch.float64)
    upper = (1 + eps_high) * pi_old + eps_high * (1 - alpha) / alpha * pi_ref
    lower = (1 - eps_low) * pi_old - eps_low * (1 - alpha) / alpha * pi_ref
    for edge, adv, target in ((upper, 1.0, 1 + eps_high), (lower, -1.0, 1 - eps_low)):
        at = armor(_inputs(edge.log(), pi_old.log(), pi_ref.log(), torch.full_like(pi_old, adv)), alpha=alpha)
        assert at.metrics["armor/mix_ratio_mean"].item() == pytest.approx(target, abs=1e-12)
        # Just inside the band the token still has a gradient; just outside, the clip removes it.
        for factor, inside in ((1 - 1e-3, adv > 0), (1 + 1e-3, adv < 0)):
            inputs = _inputs((edge * factor).log(), pi_old.log(), pi_ref.log(), torch.full_like(pi_old, adv))
            grad = _grad(armor(inputs, alpha=alpha), inputs)
            assert bool((grad != 0).all()) == inside
    # The band is wider than DAPO's in pi-space exactly by eps (1 - a)/a pi_ref.
    assert (upper > (1 + eps_high) * pi_old).all() and (lower < (1 - eps_low) * pi_old).all()


def test_reference_equal_to_old_gives_affine_ratio(make_inputs):
    inputs = make_inputs(seed=4)
    old, lp = inputs.old_log_probs, inputs.log_probs.detach()
    alpha = 0.875
    r_mix = (mix_log_probs(lp, old, alpha) - mix_log_probs(old, old, alpha)).exp()
    torch.testing.assert_close(r_mix, alpha * (lp - old).exp() + 1 - alpha)
    same = LossInputs(**{**inputs.__dict__, "ref_log_probs": old})
    out = armor(same, alpha=alpha)
    mask = inputs.response_mask
    expected = ((alpha * (lp - old).exp() + 1 - alpha) * mask).sum() / mask.sum()
    torch.testing.assert_close(out.metrics["armor/mix_ratio_mean"], expected)
    # So the clip edges in plain r are 1 +- eps / a (the "static clip expansion" of Fig. 3b).
    pi_old = torch.tensor([[0.4]], dtype=torch.float64)
    for factor, has_grad in ((1 + 0.28 / alpha - 1e-4, True), (1 + 0.28 / alpha + 1e-4, False)):
        one = _inputs((pi_old * factor).log(), pi_old.log(), pi_old.log(), torch.ones_like(pi_old))
        assert bool(_grad(armor(one, alpha=alpha), one).ne(0).all()) == has_grad


def test_gradient_weight_at_theta_old(make_inputs):
    inputs = make_inputs(seed=5, drift=0.0)
    alpha = 0.9375
    a, p = armor(inputs, alpha=alpha), ppo(inputs, **DAPO)
    mask = inputs.response_mask > 0
    ratio = _grad(a, inputs)[mask] / _grad(p, inputs)[mask]
    pi_old, pi_ref = inputs.old_log_probs.exp()[mask], inputs.ref_log_probs.exp()[mask]
    expected = alpha * pi_old / (alpha * pi_old + (1 - alpha) * pi_ref)
    torch.testing.assert_close(ratio, expected)
    assert ((ratio > 0) & (ratio < 1)).all()
    torch.testing.assert_close(a.metrics["armor/grad_weight_mean"], expected.mean())


def test_scope_anchors_mixes_anchor_rows_only(make_inputs):
    inputs = make_inputs(seed=6)
    anchor = inputs.source == 1
    assert anchor.any() and (~anchor).any()
    only = _grad(armor(inputs, alpha=0.8, scope="anchors"), inputs)
    everywhere = _grad(armor(inputs, alpha=0.8), inputs)
    plain = _grad(ppo(inputs, **DAPO), inputs)
    torch.testing.assert_close(only[anchor], everywhere[anchor])
    torch.testing.assert_close(only[~anchor], plain[~anchor])
    with pytest.raises(ValueError, match="scope"):
        armor(inputs, scope="prompts")
    with pytest.raises(ValueError, match="source"):
        armor(LossInputs(**{**inputs.__dict__, "source": None}), scope="anchors")


def test_drift_metrics():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.2]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.4, 0.4]], dtype=torch.float64))
    inputs = _inputs(old, old, ref, torch.zeros_like(old), source=torch.tensor([0, 1]))
    m = armor(inputs).metrics
    assert m["armor/loss_kl_on_old"].item() == pytest.approx(math.log(2))  # log pi_old - log pi_ref, row 0
    assert m["armor/loss_kl_on_ref"].item() == pytest.approx(math.log(2))  # log pi_ref - log pi_old, row 1
    assert m["armor/anchor_frac"].item() == pytest.approx(0.5)


def test_anchor_advantage_grpo_positive_qae_zero():
    # An easy group: 12 of 15 on-policy answers correct (+1), 3 wrong (-1), plus one correct anchor.
    rewards = torch.tensor([1.0] * 12 + [-1.0] * 3 + [1.0], dtype=torch.float64)
    groups = torch.zeros(16, dtype=torch.long)
    inputs = AdvantageInputs(rewards, groups)
    assert grpo(inputs).advantages[-1] > 0
    assert qae(inputs).advantages[-1] == 0.0  # the 0.45-quantile is +1: the anchor is masked (footnote 4)


def test_needs_reference_and_valid_alpha(make_inputs):
    inputs = make_inputs()
    with pytest.raises(ValueError, match="ref_log_probs"):
        armor(LossInputs(**{**inputs.__dict__, "ref_log_probs": None}))
    with pytest.raises(ValueError, match="alpha"):
        armor(inputs, alpha=0.0)
